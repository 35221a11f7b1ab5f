"""One boto3 S3 client per process, set up for S3-compatible servers, and its errors as one line.

Why boto3 (the ``s3`` extra) and not another client: it is AWS's own,
maintained with the service, and depends only on botocore, jmespath and
s3transfer. s3fs pins fsspec to its own calendar version while
``datasets`` caps fsspec, and its aiobotocore pins botocore tightly, so
the two fight over versions; pyarrow's S3 filesystem can deadlock at
interpreter exit (apache/arrow#50188).

The client is set up so that MinIO, Ceph, Cloudflare R2 and moto work as
AWS does:

* the endpoint comes from ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``
  (unset: AWS itself), with path-style addressing (``host/bucket/key``:
  no DNS name per bucket);
* checksums are computed and validated only when an operation requires
  them (``when_required``): botocore's newer default sends CRC headers
  that several S3-compatible servers reject (boto/boto3#4392); dlm checks
  every file's sha256 against ``meta.json`` itself;
* retries are botocore's ``adaptive`` mode (exponential backoff with
  jitter, plus client-side rate limiting when throttled), ``DLM_S3_MAX_ATTEMPTS``
  attempts in all (default 5); connect and read time out after
  ``DLM_S3_TIMEOUT`` seconds (default 60);
* credentials come from the standard AWS chain (``AWS_ACCESS_KEY_ID`` /
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE`` and ``~/.aws``, instance roles);
  the region from ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` / the profile,
  else ``us-east-1`` (an S3-compatible server ignores it but a signature
  needs one).

A client belongs to the process that made it: it is keyed by the process
id (a forked child, a DataLoader worker, never reuses its parent's
connection pool) and by the environment above (a changed endpoint or key
gets a new client). boto3 clients are thread-safe, so the threads of one
process share it. boto3 is imported here only, inside functions, so
``dlm --help`` and a local build never load it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from dlmstore.errors import ObjectStoreError

#: Attempts per request (the first and its retries), unless ``DLM_S3_MAX_ATTEMPTS`` says otherwise.
DEFAULT_MAX_ATTEMPTS = 5
#: Seconds to connect and to wait for each read, unless ``DLM_S3_TIMEOUT`` says otherwise.
DEFAULT_TIMEOUT_S = 60.0
#: Connections per client: the upload and download threads share one pool.
POOL_CONNECTIONS = 16
INSTALL_HINT = "pip install 'dlmstore[s3]'"

#: The environment a client is made from: a change makes another client.
_ENVIRONMENT = (
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "DLM_S3_MAX_ATTEMPTS",
    "DLM_S3_TIMEOUT",
)

_clients: dict[tuple[object, ...], Any] = {}
_lock = threading.Lock()


def _forget_after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # a parent's thread may have held it at the fork
    _clients.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def endpoint_url() -> str | None:
    """The S3 endpoint: ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``, else ``None`` (AWS)."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def max_attempts() -> int:
    """Attempts per request: ``DLM_S3_MAX_ATTEMPTS`` (at least 1), else :data:`DEFAULT_MAX_ATTEMPTS`."""
    return int(_number("DLM_S3_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS, integer=True))


def timeout_s() -> float:
    """Connect and read timeout: ``DLM_S3_TIMEOUT`` seconds, else :data:`DEFAULT_TIMEOUT_S`."""
    return _number("DLM_S3_TIMEOUT", DEFAULT_TIMEOUT_S, integer=False)


def _number(name: str, default: float, *, integer: bool) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        value = 0
    if value <= 0:
        kind = "a whole number" if integer else "a number of seconds"
        raise ObjectStoreError(f"{name}={text!r} is not {kind} above 0", hint=f"unset {name} or fix it")
    return value


def s3_client() -> Any:
    """This process's boto3 S3 client for the current environment (made on first use).

    Call it inside the ``try`` whose failures go through :func:`object_failure`:
    botocore checks the credentials' configuration as it makes the client.

    Raises:
        ObjectStoreError: boto3 is not installed, or ``DLM_S3_MAX_ATTEMPTS`` /
            ``DLM_S3_TIMEOUT`` is not a positive number.
        botocore.exceptions.BotoCoreError: half the credentials are set
            (``PartialCredentialsError``) or the profile is unknown.
    """
    key = (os.getpid(), *(os.environ.get(name) for name in _ENVIRONMENT))
    client = _clients.get(key)
    if client is not None:
        return client
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _make_client()
            _clients[key] = client
    return client


def _make_client() -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise ObjectStoreError(
            "object storage (s3://) needs boto3, which is not installed", hint=INSTALL_HINT
        ) from None
    timeout = timeout_s()
    config = Config(
        s3={"addressing_style": "path"},
        retries={"mode": "adaptive", "total_max_attempts": max_attempts()},  # the first one included
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        connect_timeout=timeout,
        read_timeout=timeout,
        max_pool_connections=POOL_CONNECTIONS,
    )
    session = boto3.session.Session()
    return session.client(
        "s3",
        endpoint_url=endpoint_url(),
        region_name=session.region_name or "us-east-1",
        config=config,
    )


_WRONG_CREDENTIALS = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidClientTokenId", "InvalidToken", "ExpiredToken"}
)
_DENIED = frozenset({"AccessDenied", "AllAccessDisabled"})
#: A HEAD request's refusal carries no body: wrong credentials and a denial look the same.
_FORBIDDEN = frozenset({"403", "Forbidden"})
_MISSING = frozenset({"NoSuchKey", "404", "NotFound"})


def is_missing(exc: Exception) -> bool:
    """Whether ``exc`` is the store saying that the object (or key) asked for does not exist."""
    from botocore.exceptions import ClientError

    return isinstance(exc, ClientError) and str(exc.response.get("Error", {}).get("Code", "")) in _MISSING


def object_failure(exc: Exception, url: str) -> ObjectStoreError:
    """``exc`` (raised by boto3 or botocore for ``url``) as one line naming the URL and what to do."""
    from botocore import exceptions as botocore_errors

    if isinstance(exc, ObjectStoreError):
        return exc
    if isinstance(exc, botocore_errors.NoCredentialsError | botocore_errors.PartialCredentialsError):
        return ObjectStoreError(
            f"no credentials for {url}: {exc}",
            hint="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE",
        )
    if isinstance(exc, botocore_errors.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        detail = _first_line(str(error.get("Message") or ""), code or type(exc).__name__)
        if code in _WRONG_CREDENTIALS:
            return ObjectStoreError(
                f"the object store refused the credentials for {url}: {detail}",
                hint="check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for this endpoint",
            )
        if code == "NoSuchBucket":
            return ObjectStoreError(
                f"{url}: the bucket {_bucket(url)} does not exist",
                hint="create the bucket first, or check the URL and AWS_ENDPOINT_URL_S3",
            )
        if code in _DENIED:
            return ObjectStoreError(
                f"access to {url} is denied: {detail}",
                hint="give these credentials read and write access to the bucket",
            )
        if code in _FORBIDDEN:
            return ObjectStoreError(
                f"the object store refused access to {url} (HTTP 403)",
                hint="check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for this endpoint, "
                "and that they may read and write the bucket",
            )
        if code in _MISSING:
            return ObjectStoreError(f"{url} does not exist", hint="check the URL")
        return ObjectStoreError(f"the object store failed on {url}: {code}: {detail}")
    where = endpoint_url() or "AWS"
    reason = _first_line(str(exc), type(exc).__name__)
    if isinstance(exc, botocore_errors.ConnectTimeoutError | botocore_errors.ReadTimeoutError):
        return ObjectStoreError(
            f"the object store at {where} did not answer for {url} within {timeout_s():g} s, "
            f"{max_attempts()} attempts: {reason}",
            hint="check that the server is up and not overloaded, or raise DLM_S3_TIMEOUT (seconds per "
            "request), then run the command again",
        )
    if isinstance(
        exc,
        botocore_errors.EndpointConnectionError
        | botocore_errors.ConnectionClosedError
        | botocore_errors.HTTPClientError,
    ):
        return ObjectStoreError(
            f"cannot reach the object store at {where} for {url} after {max_attempts()} attempts: {reason}",
            hint="check AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL) and that the server is up, then run "
            "the command again",
        )
    return ObjectStoreError(f"the object store failed on {url}: {reason}")


def _first_line(text: str, fallback: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else fallback


def _bucket(url: str) -> str:
    return url.removeprefix("s3://").partition("/")[0]

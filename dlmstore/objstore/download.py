"""One object of a dataset into a local file: resumable, hashed on the way, verified before it is named.

The node cache (:mod:`.node_cache`) calls :func:`download_file` once per
file ``meta.json`` lists. The bytes go to ``NAME.part`` beside the final
name; the sha256 is computed while they are written (a resumed part's
bytes are hashed from disk first), and only a part of exactly the size and
sha256 ``meta.json`` records is fsynced and renamed to ``NAME``. So a file
of the cache under its own name is always a whole, verified file:

* **resumable**: a part left by an interrupted download (a killed process,
  a connection cut mid-body) is continued with an HTTP ``Range`` request
  from its size, not fetched again;
* **retried**: a body cut mid-stream is resumed after a backoff (0.5 s,
  1 s, 2 s ... capped at 8 s), up to ``DLM_S3_MAX_ATTEMPTS`` times
  (:func:`dlmstore.objstore.client.max_attempts`); a request that cannot
  be sent at all was retried by botocore already (adaptive mode), so its
  failure ends the download with one line naming the URL;
* **verified**: an object whose size differs from ``meta.json``'s is
  refused before its body is read; one whose sha256 differs is refused
  once its bytes are in (a resumed part is first fetched again from
  scratch once: the stale part may be what differs). The part is deleted
  either way, and the message names the object's URL;
* **disk full**: ``ENOSPC``/``EDQUOT`` while writing deletes the part and
  says which folder ran out.

Only the process that calls it talks to the server, through its own
client (:func:`dlmstore.objstore.client.s3_client`, keyed by process id):
nothing here runs inside a DataLoader worker or after a fork.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
from pathlib import Path
from typing import Any

from dlmstore.errors import ObjectStoreError
from dlmstore.objstore.uri import ObjectURI

#: Bytes read from a response body at a time (and hashed, and written).
CHUNK = 1 << 18
#: Backoff before resuming a cut body: BASE * 2**(failures - 1), at most CAP seconds.
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 8.0
PART_SUFFIX = ".part"

_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


class _Cut(Exception):
    """The body of a response ended before its length (the connection dropped or timed out)."""


def download_file(client: Any, uri: ObjectURI, name: str, target: Path, *, size: int, sha256: str) -> int:
    """Fetch object ``name`` of ``uri`` into ``target``, verified against ``size`` and ``sha256``.

    Args:
        client: this process's S3 client.
        uri: the dataset's URL.
        name: the file's path inside the dataset, as meta.json lists it.
        target: where the verified file goes (its folder exists).
        size, sha256: what meta.json records for it (``sha256:<hex>``).

    Returns:
        The bytes transferred from the server by this call (a resumed part's
        earlier bytes are not counted).

    Raises:
        ObjectStoreError: the object is missing, differs from meta.json (its
            URL named), cannot be fetched after the retries, or the disk is full.
    """
    from dlmstore.objstore.client import max_attempts

    url = uri.url(name)
    part = target.with_name(target.name + PART_SUFFIX)
    transferred = 0
    failures = 0
    fresh_retry_left = True
    while True:
        hasher, have = _resume(part, size)
        resumed = have > 0
        if have < size or (size == 0 and not part.exists()):
            try:
                transferred += _fetch_into(client, uri, name, part, hasher, have, size)
            except _Cut as cut:
                failures += 1
                if failures >= max_attempts():
                    raise ObjectStoreError(
                        f"{url}: the object store stopped sending it after {failures} attempts "
                        f"({_size(part)} of {size} bytes in): {cut}",
                        hint="check that the server is up, then run the command again: it resumes the "
                        "download where it stopped",
                    ) from None
                time.sleep(min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (failures - 1)))
                continue
        digest = "sha256:" + hasher.hexdigest()
        if digest == sha256 and _size(part) == size:
            _publish(part, target)
            return transferred
        part.unlink(missing_ok=True)
        if resumed and fresh_retry_left:  # the part an earlier download left may be what differs
            fresh_retry_left = False
            continue
        raise ObjectStoreError(
            f"{url}: sha256 {digest} differs from meta.json's {sha256}",
            hint="the object changed after its dataset's meta.json was written; rebuild the dataset "
            "(`dlm data build ... --out s3://...`) or restore the object. Nothing was trained on it",
        )


def _resume(part: Path, size: int) -> tuple[Any, int]:
    """A sha256 fed with ``part``'s bytes, and their number (0 and no part when it is longer than ``size``)."""
    hasher = hashlib.sha256()
    try:
        have = part.stat().st_size
    except FileNotFoundError:
        return hasher, 0
    if have > size:
        part.unlink()
        return hasher, 0
    left = have
    with open(part, "rb") as handle:
        while left and (block := handle.read(min(CHUNK, left))):
            hasher.update(block)
            left -= len(block)
    return hasher, have


def _fetch_into(client: Any, uri: ObjectURI, name: str, part: Path, hasher: Any, have: int, size: int) -> int:
    """Append the object's bytes from ``have`` to ``part``; the bytes written, or :class:`_Cut`."""
    from botocore import exceptions as botocore_errors

    from dlmstore.objstore.client import object_failure

    url = uri.url(name)
    request: dict[str, Any] = {"Bucket": uri.bucket, "Key": uri.key(name)}
    if have:
        request["Range"] = f"bytes={have}-"
    try:
        response = client.get_object(**request)
    except botocore_errors.BotoCoreError as exc:
        if isinstance(exc, botocore_errors.ResponseStreamingError | botocore_errors.IncompleteReadError):
            raise _Cut(str(exc)) from None
        raise object_failure(exc, url) from None
    except botocore_errors.ClientError as exc:
        raise object_failure(exc, url) from None
    total = _object_size(response, have)
    if total != size:
        response["Body"].close()
        part.unlink(missing_ok=True)
        raise ObjectStoreError(
            f"{url}: {total} bytes, but meta.json lists {size}",
            hint="the object changed after its dataset's meta.json was written; rebuild the dataset "
            "(`dlm data build ... --out s3://...`) or restore the object. Nothing was trained on it",
        )
    written = 0
    body = response["Body"]
    try:
        with open(part, "ab") as out:
            try:
                while True:
                    try:
                        block = body.read(CHUNK)
                    except (
                        botocore_errors.ResponseStreamingError,
                        botocore_errors.IncompleteReadError,
                        botocore_errors.ReadTimeoutError,
                        botocore_errors.ConnectionClosedError,
                        ConnectionError,
                    ) as exc:
                        raise _Cut(str(exc) or type(exc).__name__) from None
                    if not block:
                        break
                    out.write(block)
                    hasher.update(block)
                    written += len(block)
            finally:
                out.flush()
    except OSError as exc:
        if exc.errno in _DISK_FULL:
            part.unlink(missing_ok=True)
            raise ObjectStoreError(
                f"no space left in {part.parent} while downloading {url} ({size} bytes)",
                hint="free space on that disk, move the node cache with DLM_OBJECT_CACHE, or lower "
                "DLM_OBJECT_CACHE_BYTES so older entries are evicted first",
            ) from None
        raise
    finally:
        body.close()
    if have + written < size:
        raise _Cut(f"the response ended after {have + written} of {size} bytes")
    return written


def _object_size(response: dict[str, Any], have: int) -> int:
    """The object's whole size, from ``Content-Range`` (a ranged GET) or ``Content-Length``."""
    content_range = response.get("ContentRange")
    if content_range and "/" in content_range:
        total = content_range.rpartition("/")[2]
        if total.isdigit():
            return int(total)
    return int(response.get("ContentLength", 0)) + (have if content_range else 0)


def _publish(part: Path, target: Path) -> None:
    """fsync ``part`` and rename it to ``target``."""
    fd = os.open(part, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(part, 0o644)
    os.replace(part, target)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0

"""Object storage's core: s3:// URLs, the one client of a process, its failures as one line.

Everything talks to a real S3-protocol server on 127.0.0.1 (the ``s3``
fixture), over HTTP, through dlm's own client.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dlmstore.errors import ObjectStoreError
from dlmstore.objstore.client import object_failure, s3_client
from dlmstore.objstore.uri import ObjectURI, is_object_uri

from .s3_server import S3Bucket


def test_an_s3_url_parses_into_bucket_and_prefix_without_outer_slashes() -> None:
    uri = ObjectURI.parse("s3://tokens-1/web/2024/")
    assert uri == ObjectURI("tokens-1", "web/2024")
    assert uri.key("train/shard_00000.bin") == "web/2024/train/shard_00000.bin"
    assert uri.url("meta.json") == "s3://tokens-1/web/2024/meta.json"
    assert str(uri) == "s3://tokens-1/web/2024"


def test_a_bucket_alone_has_an_empty_prefix_and_keys_at_its_root() -> None:
    uri = ObjectURI.parse("s3://tokens")
    assert (uri.prefix, uri.key("meta.json"), str(uri)) == ("", "meta.json", "s3://tokens")
    assert ObjectURI.parse("s3://tokens/") == uri


def test_only_s3_urls_are_object_uris() -> None:
    assert is_object_uri("s3://b/p")
    assert not any(is_object_uri(text) for text in ("gs://b/p", "data/s3://x", "/tmp/ds", "S3://b/p"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("s3://", "'s3://' names no bucket"),
        ("s3:///prefix", "'s3:///prefix' names no bucket"),
        ("gs://bucket/p", "'gs://bucket/p' is not an s3:// URL"),
        (
            "s3://Bucket/p",
            "'s3://Bucket/p': 'Bucket' is not a bucket name (3 to 63 lowercase letters, digits, dots "
            "and hyphens, starting and ending with a letter or digit)",
        ),
        (
            "s3://ab/p",
            "'s3://ab/p': 'ab' is not a bucket name (3 to 63 lowercase letters, digits, dots "
            "and hyphens, starting and ending with a letter or digit)",
        ),
        ("s3://bucket/a//b", "'s3://bucket/a//b': the prefix 'a//b' has an empty, '.' or '..' segment"),
        ("s3://bucket/a/../b", "'s3://bucket/a/../b': the prefix 'a/../b' has an empty, '.' or '..' segment"),
    ],
)
def test_a_malformed_url_is_refused_by_name(text: str, message: str) -> None:
    with pytest.raises(ObjectStoreError) as caught:
        ObjectURI.parse(text)
    assert caught.value.message == message


def test_an_object_round_trips_through_the_server(s3: S3Bucket) -> None:
    client = s3_client()
    client.put_object(Bucket=s3.bucket, Key="ds/meta.json", Body=b'{"format": 1}')
    assert s3.read("ds/meta.json") == b'{"format": 1}'
    assert client.get_object(Bucket=s3.bucket, Key="ds/meta.json")["Body"].read() == b'{"format": 1}'


def test_the_client_is_set_up_for_s3_compatible_servers(s3: S3Bucket) -> None:
    client = s3_client()
    config = client.meta.config
    assert client.meta.endpoint_url == s3.endpoint
    assert config.s3["addressing_style"] == "path"
    assert config.request_checksum_calculation == "when_required"
    assert config.response_checksum_validation == "when_required"
    assert config.retries == {"mode": "adaptive", "total_max_attempts": 5}


def test_a_request_goes_path_style_and_without_checksum_headers(s3: S3Bucket) -> None:
    seen: list[tuple[str, dict[str, str]]] = []
    client = s3_client()

    def record(request: object, **_: object) -> None:
        seen.append((request.url, dict(request.headers)))  # type: ignore[attr-defined]

    client.meta.events.register("before-send.s3.PutObject", record)
    try:
        client.put_object(Bucket=s3.bucket, Key="k", Body=b"x")
    finally:
        client.meta.events.unregister("before-send.s3.PutObject", record)
    url, headers = seen[0]
    assert url == f"{s3.endpoint}/{s3.bucket}/k"
    assert not [name for name in headers if name.lower().startswith("x-amz-checksum")]


def test_the_s3_endpoint_wins_over_the_general_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:10")
    assert s3_client().meta.endpoint_url == "http://127.0.0.1:9"
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    assert s3_client().meta.endpoint_url == "http://127.0.0.1:10"


def test_attempts_and_timeout_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLM_S3_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("DLM_S3_TIMEOUT", "3.5")
    config = s3_client().meta.config
    assert (config.retries["total_max_attempts"], config.connect_timeout, config.read_timeout) == (
        2,
        3.5,
        3.5,
    )


def test_a_bad_attempt_count_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLM_S3_MAX_ATTEMPTS", "zero")
    with pytest.raises(ObjectStoreError) as caught:
        s3_client()
    assert caught.value.message == "DLM_S3_MAX_ATTEMPTS='zero' is not a whole number above 0"


def test_one_process_keeps_one_client_and_a_forked_child_makes_its_own(s3: S3Bucket) -> None:
    parent = s3_client()
    assert s3_client() is parent
    pid = os.fork()
    if pid == 0:  # the child: a client of its own, which works
        try:
            child = s3_client()
            child.head_bucket(Bucket=s3.bucket)
            os._exit(0 if child is not parent else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_without_boto3_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)
    monkeypatch.setenv("DLM_S3_TIMEOUT", "7")  # an environment no client was made for yet
    with pytest.raises(ObjectStoreError) as caught:
        s3_client()
    assert (caught.value.message, caught.value.hint) == (
        "object storage (s3://) needs boto3, which is not installed",
        "pip install 'dlmstore[s3]'",
    )


def test_importing_the_client_does_not_load_boto3() -> None:
    code = "import sys, dlmstore.objstore.client, dlmstore.objstore.uri; print('boto3' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def _failure(call: object, url: str) -> ObjectStoreError:
    try:
        call()  # type: ignore[operator]
    except Exception as exc:
        return object_failure(exc, url)
    raise AssertionError("the call succeeded")


def test_wrong_credentials_are_one_line_naming_the_url(s3: S3Bucket, monkeypatch: pytest.MonkeyPatch) -> None:
    s3.server.require_auth()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
    error = _failure(lambda: s3_client().list_objects_v2(Bucket=s3.bucket, Prefix="ds/"), "s3://dlm-test/ds")
    assert (error.message, error.hint) == (
        "the object store refused the credentials for s3://dlm-test/ds: "
        "The AWS Access Key Id you provided does not exist in our records.",
        "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for this endpoint",
    )


def test_a_refused_head_request_is_named_as_a_refusal(s3: S3Bucket, monkeypatch: pytest.MonkeyPatch) -> None:
    s3.server.require_auth()
    error = _failure(
        lambda: s3_client().head_object(Bucket=s3.bucket, Key="ds/meta.json"), "s3://dlm-test/ds"
    )
    assert (error.message, error.hint) == (
        "the object store refused access to s3://dlm-test/ds (HTTP 403)",
        "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for this endpoint, "
        "and that they may read and write the bucket",
    )


def test_half_the_credentials_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    error = _failure(lambda: s3_client().head_bucket(Bucket="dlm-test"), "s3://dlm-test/ds")
    assert (error.message, error.hint) == (
        "no credentials for s3://dlm-test/ds: Partial credentials found in env, missing: AWS_SECRET_ACCESS_KEY",
        "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE",
    )


def test_a_missing_bucket_is_named(s3: S3Bucket) -> None:
    error = _failure(
        lambda: s3_client().list_objects_v2(Bucket="no-such-bucket", Prefix="ds/"), "s3://no-such-bucket/ds"
    )
    assert (error.message, error.hint) == (
        "s3://no-such-bucket/ds: the bucket no-such-bucket does not exist",
        "create the bucket first, or check the URL and AWS_ENDPOINT_URL_S3",
    )


def test_a_missing_object_is_named(s3: S3Bucket) -> None:
    error = _failure(
        lambda: s3_client().get_object(Bucket=s3.bucket, Key="ds/meta.json"), "s3://dlm-test/ds/meta.json"
    )
    assert (error.message, error.hint) == ("s3://dlm-test/ds/meta.json does not exist", "check the URL")


def test_an_endpoint_that_refuses_connections_is_named_after_the_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DLM_S3_MAX_ATTEMPTS", "2")
    endpoint = os.environ["AWS_ENDPOINT_URL_S3"]  # the session's closed port
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    error = _failure(lambda: s3_client().head_bucket(Bucket="dlm-test"), "s3://dlm-test/ds")
    assert error.message == (
        f"cannot reach the object store at {endpoint} for s3://dlm-test/ds after 2 attempts: "
        f'Could not connect to the endpoint URL: "{endpoint}/dlm-test"'
    )
    assert error.hint == (
        "check AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL) and that the server is up, then run the command again"
    )


def test_no_credentials_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    error = _failure(lambda: s3_client().head_bucket(Bucket="dlm-test"), "s3://dlm-test/ds")
    assert (error.message, error.hint) == (
        "no credentials for s3://dlm-test/ds: Unable to locate credentials",
        "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE",
    )


def test_outside_the_s3_fixture_the_environment_points_at_a_closed_local_port() -> None:
    import socket

    endpoint = os.environ["AWS_ENDPOINT_URL_S3"]
    assert endpoint == os.environ["AWS_ENDPOINT_URL"]
    assert endpoint.startswith("http://127.0.0.1:")
    assert "AWS_PROFILE" not in os.environ and "AWS_ACCESS_KEY_ID" not in os.environ
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", int(endpoint.rsplit(":", 1)[1])), timeout=5)

"""`dlm data build ... --out s3://bucket/prefix`: the same bytes as a local --out, meta.json last.

Every build here talks to a real S3-protocol server on 127.0.0.1 (the
``s3`` fixture) over HTTP; each fault is provoked for real (a stopped
server, refused credentials, a missing bucket, a file changed under the
upload) and must end in one ``error:`` line naming the URL, with no
``meta.json`` left under the prefix.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.errors import ObjectStoreError
from dlmstore.objstore import transfer
from dlmstore.objstore.transfer import LocalFile, put_file
from dlmstore.objstore.uri import ObjectURI

from .helpers import file_hashes
from .s3_server import CutProxy, S3Bucket


@pytest.fixture
def texts(tmp_path: Path) -> Path:
    """Forty short documents in a folder."""
    folder = tmp_path / "texts"
    folder.mkdir()
    for i in range(40):
        (folder / f"doc{i:02}.txt").write_text(
            f"Document {i} talks about the number {i} and its square {i * i}.\n"
        )
    return folder


@pytest.fixture
def chats(tmp_path: Path) -> Path:
    path = tmp_path / "chats.jsonl"
    with open(path, "w") as out:
        for i in range(12):
            messages = [
                {"role": "user", "content": f"Ping {i}"},
                {"role": "assistant", "content": f"Pong {i}"},
            ]
            out.write(json.dumps({"messages": messages}) + "\n")
    return path


def _build(kind: str, source: Path, out: str, *extra: str) -> Any:
    return CliRunner().invoke(
        cli, ["data", "build", kind, "--from", str(source), "--out", out, "--name", "ds", *extra]
    )


def _objects(s3: S3Bucket, prefix: str) -> dict[str, str]:
    """``name -> sha256:<hex>`` of every object under ``prefix``."""
    return {
        key[len(prefix) + 1 :]: "sha256:" + hashlib.sha256(s3.read(key)).hexdigest()
        for key in s3.keys(prefix + "/")
    }


def _staged(home: Path) -> list[Path]:
    """The staging folders left under the node cache (their lock files stay, as a store's do)."""
    return [path for path in (home / "cache" / "objects" / "builds").iterdir() if path.is_dir()]


@pytest.mark.parametrize(
    ("kind", "extra"), [("pretrain", ["--shard-bytes", "64", "--val-frac", "0.2"]), ("sft", [])]
)
def test_a_build_to_a_bucket_uploads_the_local_builds_bytes_and_registers_its_url(
    kind: str, extra: list[str], s3: S3Bucket, texts: Path, chats: Path, tmp_path: Path, dlm_home: Path
) -> None:
    source = texts if kind == "pretrain" else chats
    local = _build(kind, source, str(tmp_path / "local"), "--store", str(tmp_path / "elsewhere"), *extra)
    assert local.exit_code == 0, local.output
    remote = _build(kind, source, s3.url("tokens/ds"), *extra)
    assert remote.exit_code == 0, remote.output
    assert _objects(s3, "tokens/ds") == file_hashes(tmp_path / "local")
    assert f"built {kind} dataset ds at s3://dlm-test/tokens/ds in " in remote.output
    assert "to s3://dlm-test/tokens/ds in " in remote.output
    db = dlm_home / "datasets" / "store.db"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT name, path FROM datasets").fetchall() == [
            ("ds", "s3://dlm-test/tokens/ds")
        ]
    assert _staged(dlm_home) == []


def test_the_json_of_a_bucket_build_carries_the_upload(s3: S3Bucket, texts: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = _build("pretrain", texts, s3.url("ds"), "--store", str(store), "--json")
    assert result.exit_code == 0, result.output
    done = json.loads(result.output)
    uploaded = done["uploaded"]
    keys = s3.keys("ds/")
    assert uploaded["url"] == "s3://dlm-test/ds" and uploaded["files"] == len(keys)
    assert uploaded["bytes"] == sum(len(s3.read(key)) for key in keys)
    assert done["build"]["path"] == done["registered"]["path"] == "s3://dlm-test/ds"
    assert done["registered"]["db_path"] == str(store / "store.db")


def test_a_rebuild_with_fewer_shards_deletes_the_stale_ones_and_keeps_other_objects(
    s3: S3Bucket, texts: Path
) -> None:
    assert _build("pretrain", texts, s3.url("ds"), "--shard-bytes", "64").exit_code == 0
    many = s3.keys("ds/train/")
    s3.put("ds/README.md", b"mine")
    again = _build("pretrain", texts, s3.url("ds"), "--shard-bytes", "1MiB")
    assert again.exit_code == 0, again.output
    assert len(many) > 2 and s3.keys("ds/train/") == [
        "ds/train/shard_00000.bin",
        "ds/train/shard_00000.docs.npy",
    ]
    assert "stale objects removed" in again.output
    assert s3.read("ds/README.md") == b"mine"
    meta = json.loads(s3.read("ds/meta.json"))
    assert sorted(f["path"] for f in meta["files"]) == sorted(
        k[3:] for k in s3.keys("ds/") if k[3:] not in ("meta.json", "README.md")
    )


def test_a_prefix_holding_other_objects_is_refused_by_name_unless_forced(s3: S3Bucket, texts: Path) -> None:
    s3.put("mine/notes.txt", b"keep me")
    s3.put("mine/photos/a.jpg", b"\xff")
    refused = _build("pretrain", texts, s3.url("mine"))
    assert refused.exit_code == 1
    assert refused.output.splitlines()[-2:] == [
        "error: s3://dlm-test/mine is not a prefix dlm wrote: it holds notes.txt and photos/, and no "
        "meta.json of a dlm dataset",
        "hint: choose a new or empty prefix, or pass --force to let dlm replace the dataset files there "
        "(meta.json, train/ and val/ shards; nothing else is removed)",
    ]
    assert s3.keys("mine/") == ["mine/notes.txt", "mine/photos/a.jpg"]
    forced = _build("pretrain", texts, s3.url("mine"), "--force")
    assert forced.exit_code == 0, forced.output
    assert s3.read("mine/notes.txt") == b"keep me" and "mine/meta.json" in s3.keys("mine/")


def test_a_missing_bucket_is_one_line_before_anything_is_built(
    texts: Path, s3: S3Bucket, dlm_home: Path
) -> None:
    result = _build("pretrain", texts, "s3://no-such-bucket/ds")
    assert result.exit_code == 1
    assert result.output.splitlines()[-2:] == [
        "error: s3://no-such-bucket/ds: the bucket no-such-bucket does not exist",
        "hint: create the bucket first, or check the URL and AWS_ENDPOINT_URL_S3",
    ]
    assert not (dlm_home / "cache").exists() and not (dlm_home / "datasets").exists()


def test_wrong_credentials_are_one_line_naming_the_url(
    texts: Path, s3: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3.server.require_auth()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    result = _build("pretrain", texts, s3.url("ds"))
    assert result.exit_code == 1
    assert result.output.splitlines()[-2:] == [
        "error: the object store refused the credentials for s3://dlm-test/ds: "
        "The AWS Access Key Id you provided does not exist in our records.",
        "hint: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for this endpoint",
    ]


def test_a_server_gone_mid_upload_is_one_line_and_leaves_no_meta_json(
    texts: Path, s3: S3Bucket, monkeypatch: pytest.MonkeyPatch, dlm_home: Path
) -> None:
    proxy = CutProxy(int(s3.endpoint.rsplit(":", 1)[1]), allow=6000)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
    monkeypatch.setenv("DLM_S3_MAX_ATTEMPTS", "2")
    result = _build("pretrain", texts, s3.url("ds"), "--shard-bytes", "64")
    assert proxy.cut.is_set()
    assert result.exit_code == 1, result.output
    error, hint = result.output.splitlines()[-2:]
    assert error.startswith(f"error: cannot reach the object store at {proxy.endpoint} for s3://dlm-test/ds")
    assert " after 2 attempts: " in error
    assert hint == (
        "hint: check AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL) and that the server is up, then run the "
        "command again"
    )
    keys = s3.keys("ds/")
    assert "ds/meta.json" not in keys and "ds/.build/dlm-build" in keys  # dlm's, unfinished
    assert _staged(dlm_home) == []
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)  # the server is back: the build resumes there
    again = _build("pretrain", texts, s3.url("ds"), "--shard-bytes", "64")
    assert again.exit_code == 0, again.output
    assert "ds/meta.json" in s3.keys("ds/") and "ds/.build/dlm-build" not in s3.keys("ds/")


def test_a_server_that_stops_answering_mid_upload_is_one_line_after_the_timeouts(
    texts: Path, s3: S3Bucket, monkeypatch: pytest.MonkeyPatch, dlm_home: Path
) -> None:
    proxy = CutProxy(int(s3.endpoint.rsplit(":", 1)[1]), allow=6000, hang=True)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
    monkeypatch.setenv("DLM_S3_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("DLM_S3_TIMEOUT", "1")
    try:
        result = _build("pretrain", texts, s3.url("ds"), "--shard-bytes", "64")
    finally:
        proxy.close()
    assert result.exit_code == 1, result.output
    error, hint = result.output.splitlines()[-2:]
    assert error.startswith(
        f"error: the object store at {proxy.endpoint} did not answer for s3://dlm-test/ds"
    )
    assert " within 1 s, 2 attempts: Read timeout on endpoint URL: " in error
    assert hint == (
        "hint: check that the server is up and not overloaded, or raise DLM_S3_TIMEOUT (seconds per "
        "request), then run the command again"
    )
    assert "ds/meta.json" not in s3.keys("ds/")
    assert _staged(dlm_home) == []


def test_a_file_changed_after_it_was_built_is_refused_and_not_stored(s3: S3Bucket, tmp_path: Path) -> None:
    path = tmp_path / "shard.bin"
    path.write_bytes(b"built bytes")
    built = "sha256:" + hashlib.sha256(b"built bytes").hexdigest()
    path.write_bytes(b"other bytes")
    uri = ObjectURI(s3.bucket, "ds")
    with pytest.raises(ObjectStoreError) as caught:
        put_file(uri, LocalFile("train/shard.bin", path, 11, built))
    changed = "sha256:" + hashlib.sha256(b"other bytes").hexdigest()
    assert caught.value.message == (
        f"{path} has sha256 {changed} but {built} was built; it was not uploaded to s3://dlm-test/ds/train/shard.bin"
    )
    assert s3.keys("ds/") == []


def test_a_large_file_goes_up_in_parts_and_a_changed_one_leaves_no_object_or_upload(
    s3: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transfer, "MULTIPART_THRESHOLD", 5 << 20)
    monkeypatch.setattr(transfer, "PART_BYTES", 5 << 20)  # S3's smallest part
    data = bytes(range(256)) * ((11 << 20) // 256)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    uri = ObjectURI(s3.bucket, "ds")
    put_file(uri, LocalFile("train/big.bin", path, len(data), digest))
    assert s3.read("ds/train/big.bin") == data
    with pytest.raises(ObjectStoreError) as caught:
        put_file(uri, LocalFile("train/bad.bin", path, len(data), "sha256:" + "0" * 64))
    assert caught.value.message.endswith("was built; it was not uploaded to s3://dlm-test/ds/train/bad.bin")
    assert s3.keys("ds/") == ["ds/train/big.bin"]
    assert s3.client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []) == []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("s3://AB/ds", "'s3://AB/ds': 'AB' is not a bucket name (3 to 63 lowercase letters, digits, dots and "
         "hyphens, starting and ending with a letter or digit)"),
        ("gs://bucket/ds", "'gs://bucket/ds' is a URL; of object storage only s3:// is supported (any "
         "S3-compatible server), so give s3://bucket/prefix or a local path"),
    ],
)  # fmt: skip
def test_a_malformed_or_other_url_given_to_out_is_a_usage_error(url: str, message: str, texts: Path) -> None:
    result = _build("pretrain", texts, url)
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == f"Error: Invalid value for '--out': {message}"


@pytest.mark.slow  # starts a local Ray with two workers: seconds
@pytest.mark.parametrize("kind", ["pretrain", "sft"])
def test_a_ray_build_to_a_bucket_has_its_tasks_upload_the_local_engines_bytes(
    kind: str,
    s3: S3Bucket,
    texts: Path,
    chats: Path,
    tmp_path: Path,
    dlm_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("ray")
    from dlmstore.datasets.build import recipes

    source, extra = (texts, ["--shard-bytes", "64"]) if kind == "pretrain" else (chats, [])
    local = _build(kind, source, str(tmp_path / "local"), "--store", str(tmp_path / "st"), *extra)
    assert local.exit_code == 0, local.output

    def staged_upload(*_: object, **__: object) -> None:
        raise AssertionError("the driver uploaded a staged copy")

    monkeypatch.setattr(recipes, "publish", staged_upload)  # the driver (this process) must not upload
    remote = _build(kind, source, s3.url("ray/ds"), *extra, "--engine", "ray", "--workers", "2", "--json")
    assert remote.exit_code == 0, remote.output
    assert _objects(s3, "ray/ds") == file_hashes(tmp_path / "local")  # no spill object, no marker left
    done = json.loads(remote.output)
    assert done["uploaded"]["files"] == len(s3.keys("ray/ds/"))
    assert done["uploaded"]["bytes"] == sum(len(s3.read(key)) for key in s3.keys("ray/ds/"))
    assert done["build"]["path"] == done["registered"]["path"] == "s3://dlm-test/ray/ds"
    assert done["build"]["driver_bytes"]["read"] == 0
    assert _staged(dlm_home) == []


@pytest.mark.slow  # two local Ray builds with two workers: seconds
def test_a_ray_task_whose_upload_fails_fails_the_build_in_one_line_and_the_rerun_checks_its_blocks(
    s3: S3Bucket, texts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray")
    # 20 000 request bytes: past the block's spill object (~8 KB with the claim and the marker),
    # inside the 50 shard and index uploads (~35 KB)
    proxy = CutProxy(int(s3.endpoint.rsplit(":", 1)[1]), allow=20000)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)  # the Ray workers inherit it
    monkeypatch.setenv("DLM_S3_MAX_ATTEMPTS", "2")
    ray = ["--shard-bytes", "64", "--engine", "ray", "--workers", "2"]
    result = _build("pretrain", texts, s3.url("ds"), *ray)
    assert proxy.cut.is_set()
    assert result.exit_code == 1, result.output
    error, hint = result.output.splitlines()[-2:]
    assert error.startswith(f"error: cannot reach the object store at {proxy.endpoint} for s3://dlm-test/ds/")
    assert hint.startswith("hint: check AWS_ENDPOINT_URL_S3")
    keys = s3.keys("ds/")
    assert "ds/meta.json" not in keys and "ds/.build/dlm-build" in keys  # dlm's, unfinished
    spills = [key for key in keys if key.startswith("ds/.build/blocks/")]
    assert spills  # the tokenized block was stored before the shards' uploads were cut off
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)  # the server is back: the build resumes there
    s3.client.put_object(Bucket=s3.bucket, Key=spills[0], Body=s3.read(spills[0])[:-10])  # cut short
    local = _build(
        "pretrain", texts, str(tmp_path / "local"), "--store", str(tmp_path / "st"), "--shard-bytes", "64"
    )
    assert local.exit_code == 0, local.output
    again = _build("pretrain", texts, s3.url("ds"), *ray)
    assert again.exit_code == 0, again.output
    assert _objects(s3, "ds") == file_hashes(tmp_path / "local")  # the damaged block tokenized again


def test_a_spill_object_loads_only_when_it_is_complete(s3: S3Bucket) -> None:
    from dlmstore.datasets.build.blocks import load_spill, save_spill, spill_object

    url = spill_object(s3.url("ds"), "k" * 32)
    assert url == f"s3://dlm-test/ds/.build/blocks/{'k' * 32}.npz"
    assert load_spill(url) is None
    save_spill(url, lengths=np.array([2, 3]), tokens=np.arange(5, dtype=np.uint16))
    loaded = load_spill(url)
    assert loaded is not None and loaded["lengths"].tolist() == [2, 3]
    assert loaded["tokens"].tolist() == [0, 1, 2, 3, 4]
    key = f"ds/.build/blocks/{'k' * 32}.npz"
    data = bytearray(s3.read(key))
    data[-60] ^= 0xFF  # a flipped bit inside the archive: its CRC or structure no longer holds
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(data[:-5]))
    assert load_spill(url) is None


def test_a_second_build_for_the_same_url_is_refused_while_one_is_staged(
    s3: S3Bucket, texts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlmstore.datasets.publish import staging_for

    monkeypatch.setenv("DLM_BUILD_STAGING", str(tmp_path / "shared-staging"))
    with staging_for(ObjectURI(s3.bucket, "ds")) as held:
        assert held.parent == tmp_path / "shared-staging"
        result = _build("pretrain", texts, s3.url("ds"))
    assert result.exit_code == 1
    assert result.output.splitlines()[-2:] == [
        f"error: another build for s3://dlm-test/ds is running on this machine (it holds {held})",
        "hint: wait for it to finish, or build to another prefix",
    ]
    assert s3.keys("ds/") == []

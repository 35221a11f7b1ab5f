"""The node-local cache of datasets in a bucket: one verified copy per node, against a real S3 server."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlmstore.errors import ObjectStoreError
from dlmstore.objstore.node_cache import cache_root, local_copy, release_copies
from dlmstore.objstore.uri import ObjectURI
from tests.helpers import file_hashes

from .s3_server import CutProxy, S3Bucket


class BodyCutProxy(CutProxy):
    """A :class:`CutProxy` counting the server's bytes, so it cuts a download mid-body."""

    def _pipe(self, source: Any, sink: Any, counted: bool) -> None:
        super()._pipe(source, sink, not counted)


@pytest.fixture(autouse=True)
def _let_go() -> Any:
    yield
    release_copies()


def fake_dataset(folder: Path, sizes: dict[str, int], seed: int = 0) -> Path:
    """A folder with a meta.json of dlm's format listing files of random bytes (the cache checks no more)."""
    rng = __import__("random").Random(seed)
    files = []
    for name, size in sizes.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        data = rng.randbytes(size)
        (folder / name).write_bytes(data)
        files.append({"path": name, "bytes": size, "sha256": "sha256:" + hashlib.sha256(data).hexdigest()})
    meta = {"format": "dlm-token-dataset/1", "files": files, "seed": seed}
    (folder / "meta.json").write_text(json.dumps(meta, sort_keys=True, indent=2) + "\n")
    return folder


def put_folder(s3: S3Bucket, folder: Path, prefix: str) -> str:
    """Every file of ``folder`` as an object under ``prefix``, meta.json last; the dataset's URL."""
    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    for name in sorted(names, key=lambda n: n == "meta.json"):
        s3.put(f"{prefix}/{name}", (folder / name).read_bytes())
    return s3.url(prefix)


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return fake_dataset(tmp_path / "ds", {"train/shard_00000.bin": 300_000, "train/shard_00001.bin": 5_000})


def test_a_dataset_in_a_bucket_is_copied_whole_and_keyed_by_its_meta_json_sha256(
    s3: S3Bucket, dataset: Path
) -> None:
    url = put_folder(s3, dataset, "tokens/web")
    copy = local_copy(ObjectURI.parse(url))
    meta_hex = hashlib.sha256((dataset / "meta.json").read_bytes()).hexdigest()
    assert copy.path == cache_root() / meta_hex
    assert copy.meta_sha256 == f"sha256:{meta_hex}"
    assert file_hashes(copy.path) == file_hashes(dataset) | {".source": file_hashes(copy.path)[".source"]}
    assert copy.downloaded_bytes == sum(p.stat().st_size for p in dataset.rglob("*") if p.is_file())
    again = local_copy(ObjectURI.parse(url))
    assert (again.path, again.downloaded_bytes) == (copy.path, 0)


def test_the_cache_root_is_under_the_home_unless_dlm_object_cache_moves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cache_root() == Path(os.environ["DLM_HOME"]) / "cache" / "objects"
    monkeypatch.setenv("DLM_OBJECT_CACHE", str(tmp_path / "elsewhere"))
    assert cache_root() == tmp_path / "elsewhere"


def test_a_shard_changed_on_the_server_after_meta_json_is_refused_by_its_url_and_not_kept(
    s3: S3Bucket, dataset: Path
) -> None:
    url = put_folder(s3, dataset, "tokens/web")
    swapped = bytearray((dataset / "train/shard_00001.bin").read_bytes())
    swapped[10] ^= 0xFF
    s3.put("tokens/web/train/shard_00001.bin", bytes(swapped))
    meta = json.loads((dataset / "meta.json").read_text())
    with pytest.raises(ObjectStoreError) as caught:
        local_copy(ObjectURI.parse(url), where="--dataset")
    assert caught.value.message == (
        f"--dataset: {url}/train/shard_00001.bin: sha256 sha256:{hashlib.sha256(swapped).hexdigest()} "
        f"differs from meta.json's {meta['files'][1]['sha256']}"
    )
    (entry,) = [p for p in cache_root().iterdir() if p.is_dir()]
    assert not (entry / "meta.json").exists()
    assert not list(entry.rglob("shard_00001.bin*"))  # neither the file nor its part


def test_a_shard_of_another_size_is_refused_before_its_body_is_read(s3: S3Bucket, dataset: Path) -> None:
    url = put_folder(s3, dataset, "tokens/web")
    s3.put("tokens/web/train/shard_00000.bin", b"short")
    with pytest.raises(ObjectStoreError) as caught:
        local_copy(ObjectURI.parse(url))
    assert caught.value.message == f"{url}/train/shard_00000.bin: 5 bytes, but meta.json lists 300000"


def test_a_missing_dataset_and_a_prefix_that_is_not_a_dlm_dataset_are_one_line_each(s3: S3Bucket) -> None:
    with pytest.raises(ObjectStoreError) as caught:
        local_copy(ObjectURI.parse(s3.url("nothing/here")))
    assert caught.value.message == (
        f"{s3.url('nothing/here')}/meta.json does not exist: {s3.url('nothing/here')} is not a dataset "
        "(or its upload did not finish)"
    )
    s3.put("other/meta.json", b'{"files": []}')
    with pytest.raises(ObjectStoreError) as caught:
        local_copy(ObjectURI.parse(s3.url("other")))
    assert caught.value.message == (
        f"{s3.url('other')}/meta.json is not the meta.json of a dlm token dataset "
        "(no format 'dlm-token-dataset/1')"
    )


def test_a_meta_json_listing_a_path_outside_its_folder_is_refused_before_anything_is_written(
    s3: S3Bucket, tmp_path: Path
) -> None:
    meta = {
        "format": "dlm-token-dataset/1",
        "files": [{"path": "../../escape", "bytes": 1, "sha256": "sha256:" + "0" * 64}],
    }
    s3.put("evil/meta.json", json.dumps(meta).encode())
    with pytest.raises(ObjectStoreError) as caught:
        local_copy(ObjectURI.parse(s3.url("evil")))
    assert caught.value.message == (
        f"{s3.url('evil')}/meta.json: files[0] path '../../escape' is not a plain relative file name "
        "of the dataset"
    )
    assert not cache_root().exists() or not any(cache_root().iterdir())


def test_a_server_that_stops_mid_download_is_one_line_and_a_rerun_resumes_the_part_to_the_right_bytes(
    s3: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = fake_dataset(tmp_path / "big", {"train/shard_00000.bin": 3_000_000})
    url = put_folder(s3, dataset, "tokens/web")
    port = int(s3.endpoint.rpartition(":")[2])
    proxy = BodyCutProxy(port, allow=1_500_000)  # meta.json and about half of the shard get through
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
    monkeypatch.setenv("DLM_S3_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("DLM_S3_TIMEOUT", "1")  # a retry that finds no answer gives up fast
    try:
        with pytest.raises(ObjectStoreError) as caught:
            local_copy(ObjectURI.parse(url))
    finally:
        proxy.close()
    message = caught.value.message
    assert message.startswith(
        f"cannot reach the object store at {proxy.endpoint} for {url}/train/shard_00000.bin"
    )
    assert "after 2 attempts" in message
    kept = sum(p.stat().st_size for p in cache_root().rglob("*.part"))
    assert 0 < kept < 3_000_000
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)
    copy = local_copy(ObjectURI.parse(url))
    assert file_hashes(copy.path / "train") == file_hashes(dataset / "train")
    total = sum(p.stat().st_size for p in dataset.rglob("*") if p.is_file())
    assert copy.downloaded_bytes <= total - kept  # the part was continued, not fetched again


def test_a_dataset_larger_than_the_cap_is_refused_before_a_byte_of_it_is_fetched(
    s3: S3Bucket, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = put_folder(s3, dataset, "tokens/web")
    monkeypatch.setenv("DLM_OBJECT_CACHE_BYTES", "100KB")
    with pytest.raises(ObjectStoreError) as caught:
        local_copy(ObjectURI.parse(url))
    need = sum(p.stat().st_size for p in dataset.rglob("*") if p.is_file())
    assert caught.value.message == (
        f"{url}: the dataset needs {need} bytes, more than the node cache {cache_root()} may hold (100000 bytes)"
    )
    assert not list(cache_root().rglob("*.bin*"))


def test_the_cache_disk_full_while_writing_is_one_line_naming_the_folder_and_the_part_is_deleted(
    s3: S3Bucket, dataset: Path
) -> None:
    url = put_folder(s3, dataset, "tokens/web")
    entry = cache_root() / hashlib.sha256((dataset / "meta.json").read_bytes()).hexdigest()
    (entry / "train").mkdir(parents=True)
    # /dev/full fails every write with ENOSPC: the part the download appends to is a disk that is full
    (entry / "train" / "shard_00000.bin.part").symlink_to("/dev/full")
    with pytest.raises(ObjectStoreError) as caught:
        local_copy(ObjectURI.parse(url))
    assert caught.value.message == (
        f"no space left in {entry / 'train'} while downloading {url}/train/shard_00000.bin (300000 bytes)"
    )
    assert not (entry / "train" / "shard_00000.bin.part").exists()
    assert not (entry / "meta.json").exists()


def test_eviction_drops_the_least_recently_used_entry_never_one_in_use_nor_the_only_copy(
    s3: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    urls = {
        name: put_folder(s3, fake_dataset(tmp_path / name, {"train/shard_00000.bin": 40_000}, seed=i), name)
        for i, name in enumerate(("old", "gone", "used", "new"))
    }
    copies = {name: local_copy(ObjectURI.parse(urls[name])) for name in ("old", "gone", "used")}
    release_copies()
    s3.client.delete_object(Bucket=s3.bucket, Key="gone/meta.json")  # the cache holds the only copy now
    held = local_copy(ObjectURI.parse(urls["used"]))  # in use by this process from here on
    for name, when in (("gone", 1), ("used", 2), ("old", 3)):  # least recently used first
        os.utime(copies[name].path.with_suffix(".lock"), (when, when))
    monkeypatch.setenv("DLM_OBJECT_CACHE_BYTES", "130000")  # room for three entries of 40 KB, not four
    new = local_copy(ObjectURI.parse(urls["new"]))
    # "gone" is the oldest but the only copy, "used" is in use: "old" goes
    assert sorted(p.name for p in cache_root().iterdir() if p.is_dir()) == sorted(
        [copies["gone"].path.name, held.path.name, new.path.name]
    )
    monkeypatch.setenv("DLM_OBJECT_CACHE_BYTES", "90000")
    with pytest.raises(ObjectStoreError) as caught:
        local_copy(ObjectURI.parse(urls["old"]))
    assert "in 3 entries in use or kept as the only copy" in caught.value.message


_RACE = """
import json, sys
from dlmstore.objstore.node_cache import local_copy
from dlmstore.objstore.uri import ObjectURI
copy = local_copy(ObjectURI.parse(sys.argv[1]))
print(json.dumps({"path": str(copy.path), "downloaded": copy.downloaded_bytes}))
"""


@pytest.mark.slow
def test_two_processes_asking_for_one_dataset_at_once_download_it_once_and_both_get_it(
    s3: S3Bucket, tmp_path: Path
) -> None:
    dataset = fake_dataset(tmp_path / "big", {f"train/shard_{i:05d}.bin": 2_000_000 for i in range(4)})
    url = put_folder(s3, dataset, "big")
    procs = [
        subprocess.Popen([sys.executable, "-c", _RACE, url], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [json.loads(proc.communicate(timeout=120)[0]) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    assert results[0]["path"] == results[1]["path"]
    total = sum(p.stat().st_size for p in dataset.rglob("*") if p.is_file())
    assert sorted(r["downloaded"] for r in results) == [0, total]
    assert file_hashes(Path(results[0]["path"]) / "train") == file_hashes(dataset / "train")

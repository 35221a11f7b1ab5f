"""Training, `dlm eval`, `dlm data show` and `dlm data validate` on a dataset in a bucket (a real S3 server)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.objstore.node_cache import cache_root, release_copies
from dlmstore.store.digests import file_sha256
from tests.test_train_datasets import build_pretrain, dataset_doc

from .s3_server import S3Bucket

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def _let_go() -> object:
    yield
    release_copies()


def upload(dataset: Path, s3: S3Bucket, prefix: str = "tokens/notes") -> str:
    """The local dataset's files as objects under ``prefix`` (meta.json last); its URL."""
    names = sorted(p.relative_to(dataset).as_posix() for p in dataset.rglob("*") if p.is_file())
    for name in sorted((n for n in names if not n.startswith(".")), key=lambda n: n == "meta.json"):
        s3.put(f"{prefix}/{name}", (dataset / name).read_bytes())
    return s3.url(prefix)


@pytest.fixture
def pretrain(tmp_path: Path, tiny_base: Path) -> Path:
    return build_pretrain(tmp_path, tiny_base)


def test_a_dataset_in_a_bucket_trains_to_the_adapter_bytes_of_its_local_copy_and_records_its_url(
    tmp_path: Path, tiny_base: Path, pretrain: Path, s3: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = upload(pretrain, s3)
    remote = dataset_doc(tmp_path, tiny_base, f"  datasets:\n    - path: {url}\n      weight: 2\n")
    result = CliRunner().invoke(cli, ["train", str(remote), "--json"])
    assert result.exit_code == 0, result.output
    from_bucket = json.loads(result.stdout)
    (use,) = from_bucket["datasets"]
    assert (use["path"], use["weight"]) == (url, 2.0)
    (db,) = Path(os.environ["DLM_HOME"]).glob("store/*/store.db")
    assert sqlite3.connect(db).execute("SELECT path, meta_sha256 FROM run_datasets").fetchall() == [
        (url, file_sha256(pretrain / "meta.json"))
    ]
    lock = json.loads((db.parent / "dlm.lock").read_text())
    assert list(lock["datasets"]) == [f"{url}#train"]
    meta_hex = hashlib.sha256((pretrain / "meta.json").read_bytes()).hexdigest()
    assert (cache_root() / meta_hex / "meta.json").read_bytes() == (pretrain / "meta.json").read_bytes()

    # dlm eval reads the token datasets' val split through the same cache
    result = CliRunner().invoke(cli, ["eval", str(remote), "--json"])
    assert result.exit_code == 0, result.output

    # the same document on the local copy, in a fresh home: the same adapter bytes
    monkeypatch.setenv("DLM_HOME", str(tmp_path / "local-home"))
    (tmp_path / "local-home").mkdir()
    (tmp_path / "local-home" / "bases").symlink_to(Path(os.environ["DLM_HOME"]).parent / "dlm-home" / "bases")
    local = remote.read_text().replace(url, str(pretrain))
    remote.write_text(local)
    result = CliRunner().invoke(cli, ["train", str(remote), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["adapter_sha256"] == from_bucket["adapter_sha256"]


def test_a_shard_changed_on_the_server_is_refused_by_name_and_nothing_trains(
    tmp_path: Path, tiny_base: Path, pretrain: Path, s3: S3Bucket
) -> None:
    url = upload(pretrain, s3)
    shard = pretrain / "train" / "shard_00000.bin"
    swapped = bytearray(shard.read_bytes())
    swapped[0] ^= 1
    s3.put("tokens/notes/train/shard_00000.bin", bytes(swapped))
    doc = dataset_doc(tmp_path, tiny_base)
    result = CliRunner().invoke(cli, ["train", str(doc), "--dataset", f"{url}:0.5"])
    assert result.exit_code == 1
    recorded = next(
        f
        for f in json.loads((pretrain / "meta.json").read_text())["files"]
        if f["path"] == "train/shard_00000.bin"
    )
    assert result.output.splitlines()[0] == (
        f"error: --dataset: {url}/train/shard_00000.bin: sha256 sha256:{hashlib.sha256(swapped).hexdigest()} "
        f"differs from meta.json's {recorded['sha256']}"
    )
    (db,) = Path(os.environ["DLM_HOME"]).glob("store/*/store.db")
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT status FROM runs").fetchall() == [("failed",)]
    assert conn.execute("SELECT COUNT(*) FROM adapters").fetchone() == (0,)


def test_data_show_reads_only_meta_json_from_the_bucket(pretrain: Path, s3: S3Bucket) -> None:
    url = upload(pretrain, s3)
    local = json.loads(CliRunner().invoke(cli, ["data", "show", str(pretrain), "--json"]).stdout)
    result = CliRunner().invoke(cli, ["data", "show", url, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["path"] == url
    (dataset,) = shown["datasets"]
    assert dataset == {**local["datasets"][0], "path": url}
    assert not cache_root().exists()  # no shard was downloaded


def test_data_validate_checks_this_nodes_copy_and_names_the_url(pretrain: Path, s3: S3Bucket) -> None:
    url = upload(pretrain, s3)
    result = CliRunner().invoke(cli, ["data", "validate", url, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["path"], report["ok"], report["deep"]) == (url, True, True)
    assert report["reader"]["train"].startswith(f"dlm train DOC --dataset {url}")
    result = CliRunner().invoke(cli, ["data", "validate", url])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"ok: {url} (pretrain ")


def test_a_dataset_that_is_not_in_the_bucket_is_one_line(
    tmp_path: Path, tiny_base: Path, s3: S3Bucket
) -> None:
    doc = dataset_doc(tmp_path, tiny_base, f"  datasets:\n    - path: {s3.url('absent')}\n")
    result = CliRunner().invoke(cli, ["train", str(doc)])
    assert result.exit_code == 1
    assert result.output.splitlines()[0] == (
        f"error: training.datasets[0]: {s3.url('absent')}/meta.json does not exist: {s3.url('absent')} is not "
        "a dataset (or its upload did not finish)"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("gs://bucket/ds", "'gs://bucket/ds' is a URL; of object storage only s3:// is supported"),
        ("s3://B/ds:2", "'s3://B/ds': 'B' is not a bucket name"),
    ],
)
def test_dataset_takes_s3_and_refuses_other_schemes_and_bad_buckets(
    tmp_path: Path, value: str, message: str
) -> None:
    result = CliRunner().invoke(cli, ["train", str(tmp_path / "doc.dlm"), "--dataset", value])
    assert result.exit_code == 2
    assert message in result.output


@pytest.mark.slow
def test_two_ranks_train_from_a_bucket_each_reading_this_nodes_copy(
    tmp_path: Path, tiny_base: Path, s3: S3Bucket
) -> None:
    dataset = build_pretrain(tmp_path, tiny_base, name="many", notes_count=40)
    url = upload(dataset, s3, "tokens/many")
    doc = dataset_doc(tmp_path, tiny_base, f"  datasets:\n    - path: {url}\n")
    result = CliRunner().invoke(cli, ["train", str(doc), "--nproc", "2"], env={"OMP_NUM_THREADS": "1"})
    assert result.exit_code == 0, result.output
    (db,) = Path(os.environ["DLM_HOME"]).glob("store/*/store.db")
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT status, world_size FROM runs").fetchall() == [("completed", 2)]
    ((path, samples),) = conn.execute("SELECT path, samples_used FROM run_datasets").fetchall()
    assert path == url and samples > 0
    (entry,) = [p for p in cache_root().iterdir() if p.is_dir()]  # one copy on this node, both ranks read it
    assert (entry / "meta.json").read_bytes() == (dataset / "meta.json").read_bytes()


def test_a_rank_whose_copy_is_not_the_dataset_rank_0_checked_fails_in_one_line(
    pretrain: Path, s3: S3Bucket
) -> None:
    from dlmstore.errors import TrainingError
    from dlmstore.train.data.inputs import DatasetInput, local_inputs

    url = upload(pretrain, s3)
    checked = DatasetInput(
        path=url, kind="pretrain", name="notes-ds", split="train", weight=1.0, meta_sha256="sha256:" + "0" * 64,
        tokenizer_sha256="sha256:x", token_dtype="uint16", tokens=1, eos_token_id=2, local="/rank0/copy",
    )  # fmt: skip
    with pytest.raises(TrainingError) as caught:
        local_inputs([checked])
    assert caught.value.message == (
        f"{url}: its meta.json is {file_sha256(pretrain / 'meta.json')} now, not the sha256:{'0' * 64} rank 0 "
        "checked (the dataset was rebuilt there during the run)"
    )
    same = dataclasses.replace(checked, meta_sha256=file_sha256(pretrain / "meta.json"))
    (mine,) = local_inputs([same, dataclasses.replace(same, path=str(pretrain), local=None)])[:1]
    assert mine.local == str(cache_root() / mine.meta_sha256.removeprefix("sha256:"))
    assert local_inputs([dataclasses.replace(same, path=str(pretrain), local=None)])[0].folder() == str(
        pretrain
    )

"""`dlm train` verifies each token dataset when it opens it: kinds, sizes, sha256, document index, token ids.

Every case damages a dataset the way a copy, a disk or a hand can, trains
on it, and expects one error line naming the dataset and the file, exit 1,
before the model loads, and nothing recorded (no ``run_datasets`` row, no
lock).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.datasets.validate import check_dataset
from dlmstore.store.digests import file_sha256
from tests.test_train_datasets import build_pretrain, build_sft, dataset_doc, load_model_is_never_called

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HINT = "hint: `dlm data validate {}` lists every problem; rebuild the dataset with `dlm data build`"


@pytest.fixture
def sharded(tmp_path: Path, tiny_base: Path) -> Path:
    """A pretrain dataset of several 256-token shards (the last one shorter)."""
    dataset = build_pretrain(tmp_path, tiny_base, notes_count=60)
    meta = json.loads((dataset / "meta.json").read_text())
    shards = [f for f in meta["files"] if f["split"] == "train" and f["role"] == "tokens"]
    assert len(shards) >= 3 and shards[0]["bytes"] == shards[1]["bytes"]
    return dataset


def train(tmp_path: Path, tiny_base: Path, dataset: Path) -> tuple[int, list[str]]:
    """The exit code and what ``dlm train --dataset`` said besides its progress lines."""
    result = CliRunner().invoke(
        cli, ["train", str(dataset_doc(tmp_path, tiny_base)), "--dataset", str(dataset)]
    )
    assert "Traceback" not in result.output
    said = [line for line in result.stderr.splitlines() if not line.startswith(("verifying ", "loading "))]
    return result.exit_code, said


def nothing_recorded() -> None:
    for db in Path(os.environ["DLM_HOME"]).glob("store/*/store.db"):
        conn = sqlite3.connect(db)
        assert conn.execute("SELECT count(*) FROM run_datasets").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM lock_records").fetchone() == (0,)
        assert not (db.parent / "dlm.lock").exists()


def shard(dataset: Path, index: int) -> Path:
    return dataset / "train" / f"shard_{index:05d}.bin"


def test_a_shard_replaced_by_a_fifo_is_refused_by_its_kind_before_the_model_loads(
    tmp_path: Path, tiny_base: Path, sharded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard(sharded, 1).unlink()
    os.mkfifo(shard(sharded, 1))
    load_model_is_never_called(monkeypatch)
    assert train(tmp_path, tiny_base, sharded) == (
        1,
        [
            f"error: --dataset {sharded}: {shard(sharded, 1)} is a FIFO, not a regular file",
            HINT.format(sharded),
        ],
    )
    nothing_recorded()


def test_a_reader_refuses_a_fifo_among_the_shards_instead_of_reading_the_others(sharded: Path) -> None:
    from dlmstore.datasets.read.mmap_dataset import MemoryMappedDataset
    from dlmstore.errors import DatasetFileError

    shard(sharded, 1).unlink()
    os.mkfifo(shard(sharded, 1))
    with pytest.raises(DatasetFileError) as info:
        MemoryMappedDataset(sharded / "train", 64, "shard_*.bin", pack_sequences=True)
    assert info.value.message == f"{shard(sharded, 1)} is a FIFO, not a regular file"
    assert info.value.hint == (
        f"a token file is a regular file; run `dlm data validate {sharded}` or rebuild the dataset"
    )


def test_a_stray_fifo_among_the_shards_is_refused_before_the_model_loads(
    tmp_path: Path, tiny_base: Path, sharded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stray = sharded / "train" / "shard_00099.bin"
    os.mkfifo(stray)
    load_model_is_never_called(monkeypatch)
    code, lines = train(tmp_path, tiny_base, sharded)
    assert (code, lines[0]) == (
        1,
        f"error: --dataset {sharded}: {stray} is not listed in meta.json (left over from another build?)",
    )


def test_a_symlink_to_a_fifo_in_place_of_a_document_index_is_refused_by_its_kind(
    tmp_path: Path, tiny_base: Path, sharded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = sharded / "train" / "shard_00000.docs.npy"
    index.unlink()
    os.mkfifo(tmp_path / "pipe")
    index.symlink_to(tmp_path / "pipe")
    load_model_is_never_called(monkeypatch)
    code, lines = train(tmp_path, tiny_base, sharded)
    assert (code, lines[0]) == (1, f"error: --dataset {sharded}: {index} is a FIFO, not a regular file")


def swap_two_shards(dataset: Path) -> None:
    first, second = shard(dataset, 0).read_bytes(), shard(dataset, 1).read_bytes()
    shard(dataset, 0).write_bytes(second)
    shard(dataset, 1).write_bytes(first)


def rewrite_ids_inside_the_vocabulary(dataset: Path) -> None:
    tokens = np.fromfile(shard(dataset, 1), dtype="<u2")
    tokens[5] = (int(tokens[5]) + 1) % 1000 + 3  # another real word, still a valid id
    tokens.tofile(shard(dataset, 1))


def damage_a_document_index(dataset: Path) -> None:
    index = dataset / "train" / "shard_00001.docs.npy"
    data = bytearray(index.read_bytes())
    data[-1] ^= 0x40  # the last start, far past the shard: same size, still a valid .npy
    index.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "changed", "more"),
    [
        (swap_two_shards, "train/shard_00000.bin", " (and 3 more problems)"),  # shard 1; starts after no EOS
        (rewrite_ids_inside_the_vocabulary, "train/shard_00001.bin", ""),
        (damage_a_document_index, "train/shard_00001.docs.npy", " (and 1 more problem)"),  # past the shard
    ],
    ids=["swapped-shards", "wrong-ids", "damaged-doc-index"],
)
def test_a_shard_or_document_index_whose_bytes_changed_at_the_same_size_is_refused_before_the_model_loads(
    tmp_path: Path,
    tiny_base: Path,
    sharded: Path,
    monkeypatch: pytest.MonkeyPatch,
    damage: Callable[[Path], None],
    changed: str,
    more: str,
) -> None:
    damage(sharded)
    load_model_is_never_called(monkeypatch)
    assert train(tmp_path, tiny_base, sharded) == (
        1,
        [
            f"error: --dataset {sharded}: {sharded / changed}: sha256 differs from meta.json (the file changed)"
            + more,
            HINT.format(sharded),
        ],
    )
    nothing_recorded()


def test_the_damaged_document_index_is_also_reported_as_one_that_leaves_its_shard(sharded: Path) -> None:
    damage_a_document_index(sharded)
    index = sharded / "train" / "shard_00001.docs.npy"
    assert check_dataset(sharded).problems == [
        f"{index}: sha256 differs from meta.json (the file changed)",
        f"{index}: document starts are not increasing positions inside the shard",
    ]


def test_token_ids_past_the_training_vocabulary_are_refused_naming_the_shard_before_the_model_loads(
    tmp_path: Path, tiny_base: Path, sharded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A dataset consistent with its own meta.json (another build recorded a larger
    # vocabulary) whose ids the training tokenizer has no embedding for.
    tokens = np.fromfile(shard(sharded, 2), dtype="<u2")
    tokens[7] = 49_200
    tokens.tofile(shard(sharded, 2))
    meta = json.loads((sharded / "meta.json").read_text())
    meta["vocab_size"] = 50_000
    for entry in meta["files"]:
        if entry["path"] == "train/shard_00002.bin":
            entry["sha256"] = file_sha256(shard(sharded, 2))
    (sharded / "meta.json").write_text(json.dumps(meta))
    assert check_dataset(sharded).ok  # ids below the recorded vocabulary
    load_model_is_never_called(monkeypatch)
    assert train(tmp_path, tiny_base, sharded) == (
        1,
        [
            f"error: --dataset {sharded}: {shard(sharded, 2)}: token id 49200 is not below the vocabulary "
            "size 49152",
            HINT.format(sharded),
        ],
    )
    nothing_recorded()


def test_an_sft_mask_whose_bytes_changed_is_refused_before_the_model_loads(
    tmp_path: Path, tiny_base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chats = build_sft(tmp_path, tiny_base)
    mask = chats / "train_mask.bin"
    data = bytearray(mask.read_bytes())
    data[0] ^= 1  # a prompt token now trained
    mask.write_bytes(bytes(data))
    load_model_is_never_called(monkeypatch)
    assert train(tmp_path, tiny_base, chats) == (
        1,
        [
            f"error: --dataset {chats}: {mask}: sha256 differs from meta.json (the file changed)",
            HINT.format(chats),
        ],
    )


def test_a_verified_dataset_trains_and_the_run_records_its_meta_sha256(
    tmp_path: Path, tiny_base: Path, sharded: Path
) -> None:
    code, lines = train(tmp_path, tiny_base, sharded)
    assert code == 0, lines
    (db,) = Path(os.environ["DLM_HOME"]).glob("store/*/store.db")
    rows = sqlite3.connect(db).execute("SELECT path, meta_sha256 FROM run_datasets").fetchall()
    assert rows == [(str(sharded), file_sha256(sharded / "meta.json"))]

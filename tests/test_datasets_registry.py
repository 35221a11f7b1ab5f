"""Registering datasets in a store database, and the validator's verdict and reader configuration."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch

from dlmstore.datasets.build.pretrain import build_pretrain_cache
from dlmstore.datasets.build.sft import build_sft_cache
from dlmstore.datasets.registry import register_in
from dlmstore.datasets.validate import check_dataset
from dlmstore.errors import DatasetFileError

from .helpers import WORD_SHA, WordTokenizer, words


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    texts = [words(*range(10 * i + 1, 10 * i + 9)) for i in range(30)]
    build_pretrain_cache(
        texts,
        tmp_path / "cache" / "pretrain" / "toy",
        tokenizer=WordTokenizer(),
        tokenizer_sha256=WORD_SHA,
        val_frac=0.2,
        shard_bytes=64,
        seed=0,
        name="toy",
    )
    return tmp_path / "cache"


def query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_registering_records_every_file_and_sqlite_answers_which_shards_and_how_many_tokens(
    cache: Path,
) -> None:
    result = register_in(cache, cache / "pretrain" / "toy")
    meta = json.loads((cache / "pretrain" / "toy" / "meta.json").read_text())
    db = cache / "store.db"
    assert result.db_path == str(db) and result.files == len(meta["files"])
    totals = query(
        db, "SELECT name, kind, split, token_files, tokens FROM dataset_split_totals ORDER BY split"
    )
    assert totals == [
        (
            "toy",
            "pretrain",
            "train",
            len(list((cache / "pretrain/toy/train").glob("*.bin"))),
            meta["totals"]["train_tokens"],
        ),
        (
            "toy",
            "pretrain",
            "val",
            len(list((cache / "pretrain/toy/val").glob("*.bin"))),
            meta["totals"]["val_tokens"],
        ),
    ]
    row = query(db, "SELECT path, tokenizer_sha256, token_dtype, vocab_size, seed FROM datasets")[0]
    assert row == (str((cache / "pretrain" / "toy").resolve()), WORD_SHA, "uint16", 1000, 0)
    shards = query(
        db,
        "SELECT path, token_offset, token_count, sha256 FROM dataset_files "
        "WHERE role = 'tokens' AND split = 'train' ORDER BY shard_index",
    )
    assert shards[0][:2] == ("train/shard_00000.bin", 0) and shards[1][1] == shards[0][2]
    assert all(sha.startswith("sha256:") for *_, sha in shards)


def test_registering_again_replaces_the_rows_in_one_transaction(cache: Path) -> None:
    first = register_in(cache, cache / "pretrain" / "toy")
    build_pretrain_cache(
        [words(1, 2, 3)],
        cache / "pretrain" / "toy",
        tokenizer=WordTokenizer(),
        tokenizer_sha256=WORD_SHA,
        val_frac=0.0,
        name="toy",
    )
    second = register_in(cache, cache / "pretrain" / "toy")
    db = cache / "store.db"
    assert query(db, "SELECT count(*) FROM datasets") == [(1,)]
    assert query(db, "SELECT count(*) FROM dataset_files") == [(2,)]  # one train shard and its index
    assert list((cache / "pretrain" / "toy" / "val").iterdir()) == []  # the old val shards are gone
    assert query(db, "SELECT split, tokens FROM dataset_split_totals") == [("train", 4)]
    assert second.dataset_id != first.dataset_id


def test_a_file_missing_since_the_build_is_not_registered(cache: Path) -> None:
    (cache / "pretrain" / "toy" / "train" / "shard_00001.bin").unlink()
    with pytest.raises(DatasetFileError) as info:
        register_in(cache, cache / "pretrain" / "toy")
    assert info.value.message == (
        f"{(cache / 'pretrain/toy/train/shard_00001.bin').resolve()} is listed in meta.json but missing"
    )


def test_a_valid_dataset_passes_and_its_printed_reader_snippet_runs(cache: Path) -> None:
    report = check_dataset(cache / "pretrain" / "toy")
    assert report.ok and report.problems == [] and report.deep
    assert report.reader is not None
    assert "--data.file_pattern='shard_*.bin'" in report.reader.flags
    assert "--data.token_dtype=uint16" in report.reader.flags
    assert report.reader.train.startswith(f"dlm train DOC --dataset {(cache / 'pretrain' / 'toy').resolve()}")
    scope: dict[str, Any] = {"T": 8, "device": "cpu"}
    exec(report.reader.python, scope)
    x, y = scope["train"].get_batch(B=2, generator=torch.Generator().manual_seed(0))
    assert x.shape == (2, 8) and len(scope["windows"]) > 0


def test_an_sft_dataset_validates_and_its_snippet_runs(tmp_path: Path, encoder: Any) -> None:
    chats = [
        [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "hello"}] for i in range(12)
    ]
    build_sft_cache(chats, tmp_path / "sft", tokenizer=encoder, val_frac=0.2, seed=1)
    report = check_dataset(tmp_path / "sft", tokenizer_sha256=encoder.tokenizer_sha256)
    assert report.ok, report.problems
    assert report.totals["train_examples"] + report.totals["val_examples"] == 12
    scope: dict[str, Any] = {"T": 16, "device": "cpu"}
    assert report.reader is not None
    exec(report.reader.python, scope)
    x, y, y_masked = scope["train"].get_batch(B=2, generator=torch.Generator().manual_seed(0))
    assert y_masked.shape == (2, 16)


def test_an_sft_mask_that_trains_nothing_for_an_example_is_reported(tmp_path: Path, encoder: Any) -> None:
    chats = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}] for _ in range(3)]
    build_sft_cache(chats, tmp_path / "sft", tokenizer=encoder, val_frac=0.0, seed=1)
    mask = tmp_path / "sft" / "train_mask.bin"
    mask.write_bytes(b"\0" * mask.stat().st_size)
    problems = check_dataset(tmp_path / "sft").problems
    assert f"{mask}: no token trained in 3 examples" in problems

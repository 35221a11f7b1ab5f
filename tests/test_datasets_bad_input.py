"""Bad input: each case is one clear error from the readers and one problem from the validator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dlmstore.datasets.build.pretrain import build_pretrain_cache
from dlmstore.datasets.read.mmap_dataset import MemoryMappedDataset
from dlmstore.datasets.read.pretrain_dataset import PretrainTokenStreamDataset
from dlmstore.datasets.read.sft_dataset import SFTExampleDataset
from dlmstore.datasets.validate import check_dataset
from dlmstore.errors import DatasetError, DatasetFileError

from .helpers import REPO, WORD_SHA, WordTokenizer, words

OTHER_SHA = "sha256:" + "1" * 64


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    texts = [words(*range(10 * i + 1, 10 * i + 9)) for i in range(20)]
    build_pretrain_cache(
        texts,
        tmp_path / "ds",
        tokenizer=WordTokenizer(),
        tokenizer_sha256=WORD_SHA,
        val_frac=0.0,
        shard_bytes=64,
        seed=0,
    )
    return tmp_path / "ds"


def shard(dataset: Path) -> Path:
    return dataset / "train" / "shard_00000.bin"


def test_a_truncated_shard_is_refused_by_readers_and_reported_by_the_validator(dataset: Path) -> None:
    data = shard(dataset).read_bytes()
    shard(dataset).write_bytes(data[:40])
    with pytest.raises(DatasetFileError) as info:
        PretrainTokenStreamDataset(dataset / "train", T=4)
    assert info.value.message == f"{shard(dataset)} holds 20 items but meta.json records 32 (truncated)"
    report = check_dataset(dataset, deep=False)
    assert not report.ok and report.problems[0] == info.value.message and report.reader is None


def test_a_shard_with_an_odd_byte_count_is_refused(dataset: Path) -> None:
    shard(dataset).write_bytes(shard(dataset).read_bytes()[:63])
    with pytest.raises(DatasetFileError) as info:
        MemoryMappedDataset(dataset / "train", 8, "shard_*.bin")
    assert info.value.message == (
        f"{shard(dataset)} has 63 bytes, not a multiple of 2 (uint16): the file is cut mid-token"
    )
    assert info.value.message in check_dataset(dataset, deep=False).problems


def test_a_dataset_without_meta_json_is_refused_instead_of_guessing_the_dtype(dataset: Path) -> None:
    (dataset / "meta.json").unlink()
    with pytest.raises(DatasetFileError) as info:
        PretrainTokenStreamDataset(dataset / "train", T=4)
    assert info.value.message == (
        f"{shard(dataset)}: the dtype of a raw token file must be given, not guessed from its size"
    )
    assert info.value.hint == "keep the dataset's meta.json beside it, or pass dtype='uint16' / 'uint32'"
    report = check_dataset(dataset)
    assert report.problems == [
        f"{dataset / 'meta.json'} is missing: {dataset} is not a built dataset (or its build did not finish)"
    ]


def test_a_dataset_built_by_another_tokenizer_is_refused(dataset: Path) -> None:
    with pytest.raises(DatasetError) as info:
        MemoryMappedDataset(dataset / "train", 8, "shard_*.bin", tokenizer_sha256=OTHER_SHA)
    assert info.value.message == (
        f"{dataset / 'meta.json'}: built with tokenizer {WORD_SHA} (word-tokenizer), "
        f"but the tokenizer in use is {OTHER_SHA}"
    )
    assert check_dataset(dataset, tokenizer_sha256=OTHER_SHA).problems == [info.value.message]
    assert check_dataset(dataset, tokenizer_sha256=WORD_SHA).ok


def test_uint16_shards_recorded_with_a_vocabulary_larger_than_uint16_are_refused(dataset: Path) -> None:
    meta = json.loads((dataset / "meta.json").read_text())
    meta["vocab_size"] = 100_000
    (dataset / "meta.json").write_text(json.dumps(meta))
    expected = f"{dataset / 'meta.json'}: a vocabulary of 100000 tokens does not fit uint16 (ids up to 65535)"
    with pytest.raises(DatasetFileError) as info:
        PretrainTokenStreamDataset(dataset / "train", T=4)
    assert info.value.message == expected
    assert check_dataset(dataset).problems == [expected]


def test_token_ids_at_or_above_the_vocabulary_size_are_reported(dataset: Path) -> None:
    tokens = np.fromfile(shard(dataset), dtype="<u2")
    tokens[3] = 1000
    meta = json.loads((dataset / "meta.json").read_text())
    tokens.tofile(shard(dataset))
    problems = check_dataset(dataset).problems
    assert f"{shard(dataset)}: token id 1000 is not below the vocabulary size 1000" in problems
    assert f"{shard(dataset)}: sha256 differs from meta.json (the file changed)" in problems
    assert meta["vocab_size"] == 1000


def test_a_stray_shard_and_a_broken_document_index_are_reported(dataset: Path) -> None:
    (dataset / "train" / "shard_00099.bin").write_bytes(b"\0\0")
    np.save(dataset / "train" / "shard_00000.docs.npy", np.array([5, 2], dtype=np.int64))
    problems = check_dataset(dataset, deep=False).problems
    assert (
        f"{dataset / 'train' / 'shard_00099.bin'} is not listed in meta.json (left over from another build?)"
        in problems
    )
    assert any("shard_00000.docs.npy has" in p and "bytes but meta.json records" in p for p in problems)


def test_an_sft_tokens_file_without_mask_or_sentinel_is_refused(tmp_path: Path) -> None:
    np.arange(1, 9, dtype="<u2").tofile(tmp_path / "x_tokens.bin")
    np.save(tmp_path / "x_idx.npy", np.array([0, 4], dtype=np.int64))
    with pytest.raises(DatasetError) as info:
        SFTExampleDataset(tmp_path / "x_tokens.bin", tmp_path / "x_idx.npy", T=4, eot_id=2, dtype="uint16")
    assert info.value.message == (
        f"no loss mask for {tmp_path / 'x_tokens.bin'}: no x_mask.bin beside it and no assistant_start given"
    )


def test_sft_offsets_that_do_not_fit_the_tokens_are_refused(tmp_path: Path) -> None:
    np.arange(1, 9, dtype="<u2").tofile(tmp_path / "x_tokens.bin")
    np.save(tmp_path / "x_idx.npy", np.array([0, 9], dtype=np.int64))
    with pytest.raises(DatasetFileError) as info:
        SFTExampleDataset(
            tmp_path / "x_tokens.bin",
            tmp_path / "x_idx.npy",
            T=4,
            eot_id=2,
            dtype="uint16",
            assistant_start=[3],
        )
    assert (
        info.value.message
        == f"{tmp_path / 'x_idx.npy'} does not hold increasing offsets from 0 into 8 tokens"
    )


def test_a_window_longer_than_every_shard_is_refused(dataset: Path) -> None:
    with pytest.raises(DatasetFileError) as info:
        PretrainTokenStreamDataset(dataset / "train", T=64)
    assert info.value.message == f"no shard in {dataset / 'train'} holds T + 1 = 65 tokens"
    assert torch.is_tensor(
        PretrainTokenStreamDataset(dataset / "train", T=8).get_batch(
            B=1, generator=torch.Generator().manual_seed(0)
        )[0]
    )


# -- FIFOs: a blocking read would wait forever, so validate runs in a subprocess with a timeout --


def validate_in_subprocess(dataset: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    dlm = str(Path(sys.executable).with_name("dlm"))
    result = subprocess.run(
        [dlm, "data", "validate", str(dataset)], capture_output=True, text=True, timeout=120, env=env
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_validate_refuses_a_meta_json_that_is_a_fifo_without_hanging(dataset: Path) -> None:
    meta = dataset / "meta.json"
    meta.unlink()
    os.mkfifo(meta)
    result = validate_in_subprocess(dataset)
    assert result.returncode == 1
    assert result.stdout == f"problem: cannot read {meta}: a FIFO, not a regular file\n"
    assert result.stderr.startswith(f"error: {dataset}: 1 problem\n")


@pytest.mark.parametrize("name", ["shard_00000.bin", "shard_00000.docs.npy"])
def test_validate_reports_a_shard_that_is_a_fifo_without_hanging(dataset: Path, name: str) -> None:
    shard = dataset / "train" / name
    shard.unlink()
    os.mkfifo(shard)
    result = validate_in_subprocess(dataset)
    assert result.returncode == 1
    assert f"problem: {shard} is a FIFO, not a regular file\n" in result.stdout

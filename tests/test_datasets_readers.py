"""MemoryMappedDataset and PretrainTokenStreamDataset: windows, packing, invariants, memory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmstore.datasets.build.pretrain import build_pretrain_cache
from dlmstore.datasets.formats import ResidencyBudget, TokenFile
from dlmstore.datasets.read.mmap_dataset import MemoryMappedDataset
from dlmstore.datasets.read.packing import (
    IGNORE_INDEX,
    WindowStarts,
    boundaries_from_eos,
    boundaries_from_starts,
    doc_ids_from_eos,
    doc_ids_from_starts,
    pack_window,
)
from dlmstore.datasets.read.pretrain_dataset import PretrainTokenStreamDataset
from dlmstore.errors import DatasetError, ResumeError

from .helpers import WORD_SHA, WordTokenizer, words

EOS = 0


def packed_by_loop(window: list[int], eos: int) -> tuple[list[int], list[int]]:
    """The per-token reference: labels and doc ids, a document owning its closing EOS."""
    doc, doc_ids = 0, []
    for token in window:
        doc_ids.append(doc)
        if token == eos:
            doc += 1
    labels = [window[i + 1] if doc_ids[i] == doc_ids[i + 1] else IGNORE_INDEX for i in range(len(window) - 1)]
    return labels, doc_ids[:-1]


@pytest.fixture
def word_dataset(tmp_path: Path) -> Path:
    """A small pretrain dataset: 40 documents of 3..9 tokens, shards of 32 tokens."""
    texts = [words(*range(100 * i + 1, 100 * i + 3 + i % 7)) for i in range(40)]
    build_pretrain_cache(
        texts,
        tmp_path / "ds",
        tokenizer=WordTokenizer(5000),
        tokenizer_sha256=WORD_SHA,
        val_frac=0.0,
        shard_bytes=64,
        seed=0,
    )
    return tmp_path / "ds"


def test_windows_come_from_sorted_files_with_remainders_unused(tmp_path: Path) -> None:
    np.save(tmp_path / "b.npy", np.arange(100, 111, dtype=np.uint32))  # 11 tokens: 2 windows of 5
    np.save(tmp_path / "a.npy", np.arange(0, 7, dtype=np.uint32))  # 7 tokens: 1 window
    dataset = MemoryMappedDataset(tmp_path, seq_len=5, file_pattern="*.npy")
    assert len(dataset) == 3
    items = [dataset[i] for i in range(3)]
    assert items[0]["input_ids"].tolist() == [0, 1, 2, 3] and items[0]["labels"].tolist() == [1, 2, 3, 4]
    assert items[2]["input_ids"].tolist() == [105, 106, 107, 108]
    assert items[1]["input_ids"].dtype == torch.int64
    with pytest.raises(IndexError):
        dataset[3]


def test_raw_bin_files_take_their_dtype_from_the_caller_or_meta(tmp_path: Path, word_dataset: Path) -> None:
    np.arange(10, dtype="<u2").tofile(tmp_path / "x.bin")
    dataset = MemoryMappedDataset(tmp_path, seq_len=4, file_pattern="x.bin", dtype="uint16")
    assert dataset[1]["input_ids"].tolist() == [4, 5, 6]
    recorded = MemoryMappedDataset(word_dataset / "train", seq_len=8, file_pattern="shard_*.bin")
    assert recorded.files[0].dtype == np.dtype("<u2") and len(recorded.files) > 3


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([EOS, 1, 2, 3]), min_size=2, max_size=60))
def test_vectorised_packing_matches_the_per_token_loop(window: list[int]) -> None:
    array = np.asarray(window, dtype=np.int64)
    packed = pack_window(array, boundaries_from_eos(array, EOS))
    labels, ids = packed_by_loop(window, EOS)
    assert doc_ids_from_eos(array, EOS)[:-1].tolist() == ids
    assert packed["labels"].tolist() == labels and packed["doc_ids"].tolist() == ids
    assert packed["input_ids"].tolist() == window[:-1]


@pytest.mark.parametrize("starts_bytes", [64 << 20, 0], ids=["precomputed-starts", "searched-per-item"])
def test_packing_from_the_document_index_agrees_with_packing_from_eos(
    word_dataset: Path, starts_bytes: int
) -> None:
    indexed = MemoryMappedDataset(
        word_dataset / "train", 9, "shard_*.bin", pack_sequences=True, starts_bytes=starts_bytes
    )
    assert indexed.doc_indexes is not None and indexed._precompute_starts == (starts_bytes > 0)
    for index in range(len(indexed)):
        item = indexed[index]
        window = indexed.window(index)
        labels, doc_ids = packed_by_loop(window.tolist(), EOS)
        assert item["labels"].tolist() == labels and item["doc_ids"].tolist() == doc_ids


@settings(max_examples=80, deadline=None)
@given(st.sets(st.integers(0, 120), max_size=40), st.integers(2, 17))
def test_precomputed_window_starts_match_a_search_per_window(positions: set[int], length: int) -> None:
    starts = np.array(sorted(positions | {0}), dtype=np.int64)
    windows = 121 // length
    precomputed = WindowStarts(starts, length, windows)
    for k in range(windows):
        expected = boundaries_from_starts(starts, k * length, length)
        assert precomputed.boundaries(k).tolist() == expected.tolist()


def test_document_ids_from_starts_are_window_relative() -> None:
    starts = np.array([0, 4, 6, 20], dtype=np.int64)
    assert doc_ids_from_starts(starts, 3, 6).tolist() == [0, 1, 1, 2, 2, 2]
    assert doc_ids_from_starts(starts, 4, 3).tolist() == [0, 0, 1]


def test_packing_without_an_index_or_eos_id_is_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(10, dtype=np.uint16))
    with pytest.raises(DatasetError) as info:
        MemoryMappedDataset(tmp_path, 4, "*.npy", pack_sequences=True)
    assert str(info.value) == (
        f"pack_sequences needs document boundaries: {tmp_path} has no .docs.npy indexes and no eos_token_id was given"
    )
    packed = MemoryMappedDataset(tmp_path, 4, "*.npy", pack_sequences=True, eos_token_id=2)
    assert packed[0]["labels"].tolist() == [1, 2, IGNORE_INDEX]


def test_state_dict_records_the_epoch_and_size_and_refuses_another_size(word_dataset: Path) -> None:
    dataset = MemoryMappedDataset(word_dataset / "train", 8)
    dataset.set_epoch(3)
    state = dataset.state_dict()
    assert state == {"epoch": 3, "total_samples": len(dataset)}
    fresh = MemoryMappedDataset(word_dataset / "train", 8)
    fresh.load_state_dict(state)
    assert fresh.epoch == 3
    with pytest.raises(ResumeError) as info:
        MemoryMappedDataset(word_dataset / "train", 4).load_state_dict(state)
    assert "cannot resume: the checkpoint's dataset had" in str(info.value)


def test_pretrain_window_sampling_keeps_the_shift_invariant_and_ids_in_vocab(
    tmp_path: Path, encoder: Any
) -> None:
    """Acceptance 2: y[:, :-1] == x[:, 1:] always, and every id is below the vocabulary size."""
    texts = [f"Window test document {i}: " + "one two three four " * (i % 9) for i in range(200)]
    build_pretrain_cache(texts, tmp_path / "ds", tokenizer=encoder, val_frac=0.1, shard_bytes=2048, seed=5)
    dataset = PretrainTokenStreamDataset(tmp_path / "ds" / "train", T=32)
    assert len(dataset.files) > 2 and dataset.vocab_size == 49152
    generator = torch.Generator().manual_seed(0)
    shards = [f.array for f in dataset.files]
    for _ in range(20):
        x, y = dataset.get_batch(B=8, generator=generator)
        assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
        assert torch.equal(y[:, :-1], x[:, 1:])
        assert int(x.min()) >= 0 and int(torch.maximum(x, y).max()) < dataset.vocab_size
        row = torch.cat([x[0], y[0, -1:]]).numpy()
        assert any(np.array_equal(s[o : o + 33], row) for s in shards for o in np.flatnonzero(s == row[0]))


def test_the_same_generator_seed_gives_the_same_batches(word_dataset: Path) -> None:
    dataset = PretrainTokenStreamDataset(word_dataset / "train", T=8)
    a = dataset.get_batch(B=4, generator=torch.Generator().manual_seed(9))
    b = dataset.get_batch(B=4, generator=torch.Generator().manual_seed(9))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def mapped_rss_kib(path: Path) -> int:
    """Resident KiB of this process's mappings of ``path`` (from /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                inside = fields[-1] == str(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc/self/smaps")
def test_reading_releases_mapped_pages_so_resident_memory_does_not_grow_with_the_data(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    np.arange(4 << 20, dtype="<u2").tofile(path)  # 8 MiB
    kept, released = TokenFile(path, np.dtype("<u2")), TokenFile(path, np.dtype("<u2"))
    budget = ResidencyBudget(1 << 20)
    budget.files.append(released)
    for token_file in (kept, released):
        array = token_file.array
        for start in range(0, len(array), 1 << 16):
            int(array[start : start + (1 << 16)].sum())
            if token_file is released:
                budget.note(1 << 17)
        if token_file is kept:
            assert mapped_rss_kib(path) >= 7 * 1024  # plain mmap: every page read stays resident
            kept.release()
    assert mapped_rss_kib(path) <= 2 * 1024


def test_datasets_pickle_without_their_memory_maps_for_dataloader_workers(word_dataset: Path) -> None:
    import pickle

    windows = MemoryMappedDataset(word_dataset / "train", 9, "shard_*.bin", pack_sequences=True)
    stream = PretrainTokenStreamDataset(word_dataset / "train", T=8)
    first = windows[2]
    stream.get_batch(B=1, generator=torch.Generator().manual_seed(0))
    copy = pickle.loads(pickle.dumps(windows))
    assert all(torch.equal(first[key], copy[2][key]) for key in first)
    again = pickle.loads(pickle.dumps(stream)).get_batch(B=2, generator=torch.Generator().manual_seed(3))
    assert torch.equal(again[0], stream.get_batch(B=2, generator=torch.Generator().manual_seed(3))[0])

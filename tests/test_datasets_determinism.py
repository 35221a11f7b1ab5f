"""Acceptance 4: same input and seed -> byte-identical caches; the seed, and only it, moves the split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlmstore.datasets.build.pretrain import build_pretrain_cache
from dlmstore.datasets.build.sft import build_sft_cache

from .helpers import file_hashes

TEXTS = [f"Synthetic document {i}. " + "alpha beta gamma " * (i % 5 + 1) for i in range(60)]
CHATS = [
    [{"role": "user", "content": f"What is {i} + {i}?"}, {"role": "assistant", "content": f"{2 * i}."}]
    for i in range(30)
]


def pretrain(out: Path, enc: Any, seed: int, batch_docs: int = 16) -> dict[str, str]:
    build_pretrain_cache(
        iter(TEXTS),
        out,
        tokenizer=enc,
        val_frac=0.3,
        seed=seed,
        shard_bytes=256,
        batch_docs=batch_docs,
        name="synthetic",
        tokenizer_name="smollm2-135m",
    )
    return file_hashes(out)


def sft(out: Path, enc: Any, seed: int, batch_examples: int = 8) -> dict[str, str]:
    build_sft_cache(
        iter(CHATS),
        out,
        tokenizer=enc,
        val_frac=0.3,
        seed=seed,
        batch_examples=batch_examples,
        name="sums",
        tokenizer_name="smollm2-135m",
    )
    return file_hashes(out)


def test_pretrain_caches_of_the_same_input_and_seed_are_byte_identical(tmp_path: Path, encoder: Any) -> None:
    first = pretrain(tmp_path / "a", encoder, seed=42)
    second = pretrain(tmp_path / "b", encoder, seed=42)
    assert first == second and "meta.json" in first and len(first) > 4


def test_sft_caches_of_the_same_input_and_seed_are_byte_identical(tmp_path: Path, encoder: Any) -> None:
    first = sft(tmp_path / "a", encoder, seed=42)
    assert first == sft(tmp_path / "b", encoder, seed=42)
    assert set(first) == {
        "meta.json",
        "train_tokens.bin",
        "train_idx.npy",
        "train_mask.bin",
        "val_tokens.bin",
        "val_idx.npy",
        "val_mask.bin",
    }


def test_how_the_builder_batches_the_tokenizer_does_not_change_a_byte(tmp_path: Path, encoder: Any) -> None:
    assert pretrain(tmp_path / "a", encoder, 42, batch_docs=7) == pretrain(
        tmp_path / "b", encoder, 42, batch_docs=64
    )
    assert sft(tmp_path / "c", encoder, 42, batch_examples=3) == sft(
        tmp_path / "d", encoder, 42, batch_examples=100
    )


def test_another_seed_gives_another_split(tmp_path: Path, encoder: Any) -> None:
    a, b = pretrain(tmp_path / "a", encoder, seed=1), pretrain(tmp_path / "b", encoder, seed=2)
    assert a["train/shard_00000.bin"] != b["train/shard_00000.bin"]
    c, d = sft(tmp_path / "c", encoder, seed=1), sft(tmp_path / "d", encoder, seed=2)
    assert c["train_idx.npy"] != d["train_idx.npy"]

"""Shared fixtures for the token-dataset tests (imported by the other test_datasets_* files).

The real SmolLM2 tokenizer is loaded once per session; ``WordTokenizer``
is a tiny stand-in whose ids are readable (``w17`` -> 17) and whose
vocabulary size is whatever a test needs (e.g. more than uint16 holds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest


@pytest.fixture(scope="session")
def tokenizer(session_bases: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The real SmolLM2-135M-Instruct tokenizer, loaded once, offline."""
    home = tmp_path_factory.mktemp("datasets-home")
    (home / "bases").symlink_to(session_bases, target_is_directory=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DLM_HOME", str(home))
        from dlmstore.bases import load_tokenizer, resolve_base

        return load_tokenizer(resolve_base("smollm2-135m"))


@pytest.fixture(scope="session")
def encoder(tokenizer: Any) -> Any:
    """A TextEncoder over the real tokenizer, shared so builds skip re-cloning it."""
    from dlmstore.datasets.encoding import TextEncoder

    return TextEncoder(tokenizer)


class WordTokenizer:
    """Whitespace 'tokenizer': ``w<N>`` -> N, ``<eos>`` -> 0; any vocabulary size."""

    name_or_path = "word-tokenizer"
    eos_token = "<eos>"
    eos_token_id = 0
    chat_template = None

    def __init__(self, vocab_size: int = 1000) -> None:
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.vocab_size

    def _ids(self, text: str) -> list[int]:
        return [0 if word == "<eos>" else int(word[1:]) for word in text.split()]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._ids(text)

    def __call__(self, texts: list[str], **_: Any) -> dict[str, list[list[int]]]:
        return {"input_ids": [self._ids(t) for t in texts]}


WORD_SHA = "sha256:" + "0" * 64


def words(*ids: int) -> str:
    """The WordTokenizer text of ``ids``."""
    return " ".join(f"w{i}" for i in ids)


def file_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory`` (relative path -> sha256:...)."""
    from dlmstore.datasets.meta import sha256_file

    return {
        str(p.relative_to(directory)): sha256_file(p) for p in sorted(directory.rglob("*")) if p.is_file()
    }


def split_tokens(directory: Path, split: str, dtype: str = "<u2") -> np.ndarray[Any, Any]:
    """All tokens of a pretrain split, shards concatenated in order."""
    shards = sorted((directory / split).glob("shard_*.bin"))
    if not shards:
        return np.zeros(0, dtype=dtype)
    return np.concatenate([np.fromfile(p, dtype=dtype) for p in shards])


def test_the_shared_tokenizer_is_smollm2_with_chatml_tokens(tokenizer: Any) -> None:
    assert len(tokenizer) == 49152
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]

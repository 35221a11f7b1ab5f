"""Spill files of a parallel build: a complete one is reused, anything else is tokenized again; no task reaches store.db.

A rerun of an interrupted `--engine ray` build trusts only the blocks whose
spill file loads with every member's CRC-32 intact (`dlmstore.datasets.build.blocks`);
these tests call the block function a Ray task runs, without Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grimp
import numpy as np
import pytest

from dlmstore.datasets.build.blocks import block_key, encode_pretrain_block, load_spill, spill_path
from dlmstore.datasets.build.encoding import TextEncoder

TEXTS = [f"Document {i}: " + "lorem ipsum dolor " * (i % 5) for i in range(40)]


class CountingEncoder(TextEncoder):
    """Counts the documents it tokenizes."""

    encoded = 0

    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        self.encoded += len(texts)
        return super().encode_texts(texts)


@pytest.fixture
def counting(tokenizer: Any) -> CountingEncoder:
    return CountingEncoder(tokenizer)


def spill(tmp_path: Path) -> Path:
    return spill_path(tmp_path, block_key({"kind": "pretrain", "dtype": "uint16"}, TEXTS))


def test_a_complete_spill_file_is_loaded_instead_of_tokenizing_the_block_again(
    tmp_path: Path, counting: CountingEncoder
) -> None:
    path = spill(tmp_path)
    first = encode_pretrain_block(counting, TEXTS, path, "uint16")
    again = encode_pretrain_block(counting, TEXTS, path, "uint16")
    assert counting.encoded == len(TEXTS) and np.array_equal(first, again)


@pytest.mark.parametrize("damage", ["cut short", "one byte changed"])
def test_a_damaged_spill_file_is_tokenized_again_into_the_same_bytes(
    tmp_path: Path, counting: CountingEncoder, damage: str
) -> None:
    path = spill(tmp_path)
    encode_pretrain_block(counting, TEXTS, path, "uint16")
    good = path.read_bytes()
    if damage == "cut short":
        path.write_bytes(good[: len(good) // 2])
    else:
        data = bytearray(good)
        data[good.index(b"tokens.npy") + 200] ^= 0xFF  # inside the tokens array, past its header
        path.write_bytes(bytes(data))
    assert load_spill(path) is None
    encode_pretrain_block(counting, TEXTS, path, "uint16")
    assert counting.encoded == 2 * len(TEXTS) and path.read_bytes() == good


def test_the_code_a_ray_task_runs_cannot_open_store_db() -> None:
    # A Ray task is handed descriptors, spill paths and the output folder; registering the
    # dataset is the driver's one transaction. What tasks run imports nothing that opens a store.
    graph = grimp.build_graph("dlmstore", cache_dir=None, include_external_packages=True)
    tasks = ["ray_build", "blocks", "local", "routing", "writers", "chat", "encoding"]
    reached = {
        module
        for name in [*(f"dlmstore.datasets.build.{task}" for task in tasks), "dlmstore.objstore.reading"]
        for module in graph.find_upstream_modules(name)
    }
    assert "dlmstore.store.atomic" in reached  # the graph is the real one: spills are written atomically
    assert reached.isdisjoint({"dlmstore.store.database", "dlmstore.store.connection", "sqlite3"})

"""``PretrainTokenStreamDataset``: random windows from memory-mapped pretrain shards.

``get_batch(B=, generator=)`` draws ``B`` window starts uniformly over
every position of every shard that leaves room for ``T + 1`` tokens (so a
shard is chosen in proportion to its size, and a window never crosses
shards), copies the windows into one ``(B, T + 1)`` int64 array, and
returns ``x = buf[:, :-1]`` and ``y = buf[:, 1:]`` as views of it. The
invariant ``y[:, :-1] == x[:, 1:]`` holds by construction.

Why views: the copy from the page cache is the whole cost of a batch, and
building ``x`` and ``y`` separately would copy every token twice (and move
it to the device twice). The views are not contiguous: use
``y.reshape(-1)``, not ``y.view(-1)``, or call ``.contiguous()``. The
benchmark (``bench/bench_datasets.py``) compares this against bare
``np.memmap`` slicing of the same windows into a preallocated array.

The only randomness is ``torch.randint`` with the caller's generator, so
a seeded generator reproduces the batch sequence exactly.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from dlmstore.datasets.formats import RELEASE_BYTES, ResidencyBudget
from dlmstore.datasets.read.opening import glob_token_files, open_token_files
from dlmstore.errors import DatasetError, DatasetFileError


class PretrainTokenStreamDataset:
    """Random ``(B, T)`` windows from the ``shard_*.bin`` files of one split.

    Args:
        shards_dir: a split directory (``<dataset>/train``).
        T: tokens per row of ``x`` and ``y``.
        device: where the batches go.
        dtype: dtype of raw shards without a meta.json.
        tokenizer_sha256: refuse shards built by another tokenizer.
        file_pattern: glob of the shards.
        release_bytes: release mapped pages after reading this many bytes.
    """

    def __init__(
        self,
        shards_dir: str | os.PathLike[str],
        *,
        T: int,
        device: str | torch.device = "cpu",
        dtype: str | None = None,
        tokenizer_sha256: str | None = None,
        file_pattern: str = "shard_*.bin",
        release_bytes: int | None = RELEASE_BYTES,
    ) -> None:
        if T < 1:
            raise DatasetError(f"T must be at least 1, not {T}")
        paths = glob_token_files(shards_dir, file_pattern)
        opened = open_token_files(paths, directory=shards_dir, dtype=dtype, tokenizer_sha256=tokenizer_sha256)
        self.T = T
        self.device = torch.device(device)
        self.vocab_size = opened.meta.vocab_size if opened.meta is not None else None
        self.files = [f for f in opened.files if len(f) >= T + 1]
        if not self.files:
            raise DatasetFileError(
                f"no shard in {shards_dir} holds T + 1 = {T + 1} tokens",
                hint="use a smaller T, or build the split with more tokens",
            )
        self._arrays: list[np.ndarray[Any, Any]] | None = None
        starts = np.array([len(f) - T for f in self.files], dtype=np.int64)
        self._cumulative = np.cumsum(starts)
        self._first = self._cumulative - starts
        self.windows = int(self._cumulative[-1])
        self.budget = ResidencyBudget(release_bytes)
        self.budget.files.extend(self.files)
        self._itemsize = self.files[0].dtype.itemsize

    def get_batch(self, *, B: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)``, each ``(B, T)`` int64 on the device, with ``y[:, :-1] == x[:, 1:]``."""
        positions = torch.randint(0, self.windows, (B,), generator=generator).numpy()
        shards = np.searchsorted(self._cumulative, positions, side="right")
        offsets = (positions - self._first[shards]).tolist()
        if self._arrays is None:
            self._arrays = [f.array for f in self.files]
        arrays = self._arrays
        width = self.T + 1
        buffer = np.empty((B, width), dtype=np.int64)
        for row, (shard, offset) in enumerate(zip(shards.tolist(), offsets, strict=True)):
            buffer[row] = arrays[shard][offset : offset + width]
        self.budget.note(B * width * self._itemsize)
        batch = torch.from_numpy(buffer)
        if self.device.type != "cpu":
            batch = batch.pin_memory().to(self.device, non_blocking=True)
        return batch[:, :-1], batch[:, 1:]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_arrays"] = None
        return state

"""``MemoryMappedDataset``: fixed windows over memory-mapped token shards.

The fastest path for pre-tokenized data: the files of ``data_dir`` matching
``file_pattern`` are sorted (so every rank sees the same order), mapped
read-only, and carved into ``len(file) // seq_len`` windows of ``seq_len``
tokens each; a file's remainder is unused, windows never cross files.
Item ``i`` is found by a binary search over the cumulative window counts
and returned as ``{"input_ids": w[:-1], "labels": w[1:]}`` (so pass
``seq_len = T + 1`` to train on ``T`` tokens).

``.npy`` files carry their dtype in the header; a raw ``.bin`` file's dtype
comes from the dataset's ``meta.json`` (in ``data_dir`` or its parent) or
the ``dtype`` argument, never from its size. With ``pack_sequences=True``
each item also has ``doc_ids`` and ``-100`` labels across documents
(:mod:`.packing`); boundaries come from the shards' ``.docs.npy`` indexes
(found once per shard for all its windows while that fits ``starts_bytes``),
or from ``eos_token_id`` (argument, else meta.json) for shards built
elsewhere.

The dataset holds no position: ``state_dict()`` is ``{"epoch",
"total_samples"}`` and the sampler/loader track where an epoch is
(:mod:`.sampler`, :mod:`.loader`). Pages read are released from the
process every ``release_bytes`` (:class:`~dlmstore.datasets.formats.ResidencyBudget`), so
RSS stays flat however large the dataset.
"""

from __future__ import annotations

import bisect
import itertools
import os
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from dlmstore.datasets.formats import RELEASE_BYTES, ResidencyBudget, TokenFile, doc_index_for
from dlmstore.datasets.read.opening import glob_token_files, open_token_files
from dlmstore.datasets.read.packing import (
    WindowStarts,
    boundaries_from_eos,
    boundaries_from_starts,
    packed_arrays,
)
from dlmstore.errors import DatasetError, ResumeError

STARTS_BYTES = 64 * 1024 * 1024  # heap for precomputed window starts before searching per item


class MemoryMappedDataset(Dataset[dict[str, torch.Tensor]]):
    """Windows of ``seq_len`` tokens from memory-mapped shards (see the module docstring).

    Args:
        data_dir: directory of token files (e.g. ``<dataset>/train``).
        seq_len: tokens per window; items are ``seq_len - 1`` long.
        file_pattern: glob of the token files (``*.bin`` or ``*.npy``).
        pack_sequences: add ``doc_ids`` and mask cross-document labels.
        eos_token_id: document separator when there is no document index.
        dtype: dtype of raw files without a meta.json.
        tokenizer_sha256: refuse a dataset built by another tokenizer.
        release_bytes: release mapped pages after reading this many bytes
            (``None``: never).
        starts_bytes: with packing, precompute every window's document
            starts (:class:`~.packing.WindowStarts`) when they fit in this
            many bytes of heap; a larger dataset searches its document index
            per item instead (slightly slower per item; ``bench/bench_datasets.py``
            prints both paths), so RSS stays flat at any size.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        seq_len: int,
        file_pattern: str = "*.bin",
        pack_sequences: bool = False,
        eos_token_id: int | None = None,
        *,
        dtype: str | None = None,
        tokenizer_sha256: str | None = None,
        release_bytes: int | None = RELEASE_BYTES,
        starts_bytes: int = STARTS_BYTES,
    ) -> None:
        if seq_len < 2:
            raise DatasetError(f"seq_len must be at least 2 (inputs and labels), not {seq_len}")
        paths = glob_token_files(data_dir, file_pattern)
        opened = open_token_files(paths, directory=data_dir, dtype=dtype, tokenizer_sha256=tokenizer_sha256)
        self.data_dir = str(data_dir)
        self.seq_len = seq_len
        self.pack_sequences = pack_sequences
        self.files = opened.files
        self.budget = ResidencyBudget(release_bytes)
        self.budget.files.extend(self.files)
        counts = [len(f) // seq_len for f in self.files]
        self._cumulative = list(itertools.accumulate(counts))
        self._first = [total - count for total, count in zip(self._cumulative, counts, strict=True)]
        self.epoch = 0
        self.doc_indexes: tuple[TokenFile, ...] | None = None
        self.eos_token_id = eos_token_id
        self._starts: list[WindowStarts | None] = [None] * len(self.files)
        self._precompute_starts = False
        if pack_sequences:
            indexes = [doc_index_for(f.path) for f in self.files]
            if all(p.is_file() for p in indexes):
                self.doc_indexes = tuple(TokenFile(p) for p in indexes)
                self.budget.files.extend(self.doc_indexes)
                heap = sum(
                    8 * len(index) + 16 * count for index, count in zip(self.doc_indexes, counts, strict=True)
                )
                self._precompute_starts = heap <= starts_bytes
            else:
                if eos_token_id is None and opened.meta is not None:
                    self.eos_token_id = opened.meta.raw.get("eos_token_id")
                if self.eos_token_id is None:
                    raise DatasetError(
                        f"pack_sequences needs document boundaries: {data_dir} has no .docs.npy "
                        "indexes and no eos_token_id was given",
                        hint="pass eos_token_id=<the tokenizer's EOS id>, or build with `dlm data build pretrain`",
                    )

    def __len__(self) -> int:
        return self._cumulative[-1] if self._cumulative else 0

    def _locate(self, index: int) -> tuple[int, int]:
        total = self._cumulative[-1] if self._cumulative else 0
        if index < 0:
            index += total
        if not 0 <= index < total:
            raise IndexError(f"index {index} out of range for {total} windows")
        which = bisect.bisect_right(self._cumulative, index)
        return which, (index - self._first[which]) * self.seq_len

    def window(self, index: int) -> np.ndarray[Any, Any]:
        """The raw ``seq_len`` tokens of item ``index`` (a read-only view)."""
        which, start = self._locate(index)
        self.budget.note(self.seq_len * self.files[which].dtype.itemsize)
        return self.files[which].array[start : start + self.seq_len]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        which, start = self._locate(index)
        token_file = self.files[which]
        self.budget.note(self.seq_len * token_file.dtype.itemsize)
        window = token_file.array[start : start + self.seq_len]
        if not self.pack_sequences:
            window = window.astype(np.int64)
            return {
                "input_ids": torch.from_numpy(window[:-1]),
                "labels": torch.from_numpy(window[1:]),
            }
        if self._precompute_starts:
            starts = self._starts[which] or self._window_starts(which)
            boundaries = starts.boundaries(start // self.seq_len)
        elif self.doc_indexes is not None:
            boundaries = boundaries_from_starts(self.doc_indexes[which].array, start, self.seq_len)
        else:
            assert self.eos_token_id is not None  # checked in __init__
            boundaries = boundaries_from_eos(window, self.eos_token_id)
        input_ids, labels, doc_ids = packed_arrays(window, boundaries)
        return {
            "input_ids": torch.from_numpy(input_ids),
            "labels": torch.from_numpy(labels),
            "doc_ids": torch.from_numpy(doc_ids),
        }

    def _window_starts(self, which: int) -> WindowStarts:
        """Document starts per window of file ``which``, found on the file's first packed item."""
        assert self.doc_indexes is not None
        count = self._cumulative[which] - self._first[which]
        starts = self._starts[which] = WindowStarts(self.doc_indexes[which].array, self.seq_len, count)
        return starts

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "total_samples"}``; the position within an epoch is the loader's."""
        return {"epoch": self.epoch, "total_samples": len(self)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore the epoch; refuse a checkpoint of a dataset with another size."""
        if state.get("total_samples", len(self)) != len(self):
            raise ResumeError(
                f"cannot resume: the checkpoint's dataset had {state['total_samples']} windows, "
                f"{self.data_dir} with seq_len={self.seq_len} has {len(self)}",
                hint="resume with the same files and seq_len, or start a new run",
            )
        self.epoch = int(state["epoch"])

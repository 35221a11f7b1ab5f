"""``SFTExampleDataset``: whole conversations, truncated or padded, with assistant-only targets.

``get_batch(B=, generator=)`` picks ``B`` examples uniformly (``torch.randint``
with the caller's generator) and turns each into one row:

* its tokens, truncated to the first ``T + 1`` or padded with ``eot_id``
  up to ``T + 1``;
* ``x = seq[:-1]``, ``y = seq[1:]``;
* ``y_masked`` equal to ``y`` where the target is inside an assistant span
  (the tokens after the assistant's turn opener up to and including the
  next EOT) and ``-100`` everywhere else, padding included.

Which targets are trained comes from the dataset's stored loss mask
(``{split}_mask.bin``, built from the message structure) when there is
one; for token files without a mask, pass ``assistant_start`` (the token
ids that open an assistant turn) and spans are found from the tokens
(:func:`~.packing.loss_mask_from_tokens`). Gathering is one fancy-index
read per batch from the memory maps, no Python loop per token.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dlmstore.datasets.formats import MASK_DTYPE, TokenFile
from dlmstore.datasets.read.opening import open_token_files
from dlmstore.datasets.read.packing import IGNORE_INDEX, loss_mask_from_tokens
from dlmstore.errors import DatasetError, DatasetFileError


class SFTExampleDataset:
    """Batches of SFT examples (see the module docstring).

    Args:
        tokens_path: ``{split}_tokens.bin``.
        idx_path: ``{split}_idx.npy``, int64 start offsets.
        T: tokens per row.
        device: where batches go.
        eot_id: the turn-closing token, also used as padding.
        mask_path: the loss mask; default ``{split}_mask.bin`` beside the
            tokens when it exists.
        assistant_start: ids opening an assistant turn, to find spans from
            the tokens when there is no mask file.
        dtype: dtype of the tokens file when there is no meta.json.
        tokenizer_sha256: refuse a dataset built by another tokenizer.
    """

    def __init__(
        self,
        tokens_path: str | os.PathLike[str],
        idx_path: str | os.PathLike[str],
        *,
        T: int,
        device: str | torch.device = "cpu",
        eot_id: int,
        mask_path: str | os.PathLike[str] | None = None,
        assistant_start: Sequence[int] | None = None,
        dtype: str | None = None,
        tokenizer_sha256: str | None = None,
    ) -> None:
        if T < 1:
            raise DatasetError(f"T must be at least 1, not {T}")
        tokens_file = Path(tokens_path)
        opened = open_token_files(
            [tokens_file], directory=tokens_file.parent, dtype=dtype, tokenizer_sha256=tokenizer_sha256
        )
        self.tokens = opened.files[0]
        self.T = T
        self.device = torch.device(device)
        self.eot_id = eot_id
        offsets = TokenFile(idx_path)
        if offsets.dtype != np.dtype("<i8"):
            raise DatasetFileError(f"{idx_path} holds {offsets.dtype} offsets, not int64")
        self.offsets = np.array(offsets.array, dtype=np.int64)
        _check_offsets(self.offsets, len(self.tokens), Path(idx_path))
        self.lengths = np.diff(np.append(self.offsets, len(self.tokens)))
        if mask_path is None and tokens_file.name.endswith("_tokens.bin"):
            sibling = tokens_file.with_name(tokens_file.name.replace("_tokens.bin", "_mask.bin"))
            mask_path = sibling if sibling.is_file() else None
        self.mask: TokenFile | None = None
        self.assistant_start = tuple(assistant_start) if assistant_start is not None else None
        if mask_path is not None:
            self.mask = TokenFile(mask_path, MASK_DTYPE, expected_count=len(self.tokens))
        elif self.assistant_start is None:
            raise DatasetError(
                f"no loss mask for {tokens_file}: no {tokens_file.name.replace('_tokens.bin', '_mask.bin')} "
                "beside it and no assistant_start given",
                hint="pass mask_path=, or assistant_start=<ids of the assistant turn opener>",
            )

    def __len__(self) -> int:
        return len(self.offsets)

    def get_batch(
        self, *, B: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(x, y, y_masked)``, each ``(B, T)`` int64 on the device."""
        rows = torch.randint(0, len(self.offsets), (B,), generator=generator).numpy()
        return self.batch_of(rows)

    def batch_of(
        self, rows: Sequence[int] | np.ndarray[Any, Any]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch made of examples ``rows`` (for evaluation passes in order)."""
        rows = np.asarray(rows, dtype=np.int64)
        width = self.T + 1
        steps = np.arange(width, dtype=np.int64)
        valid = steps[None, :] < np.minimum(self.lengths[rows], width)[:, None]
        positions = np.where(valid, self.offsets[rows][:, None] + steps[None, :], 0)
        seq = np.where(valid, self.tokens.array[positions], self.eot_id).astype(np.int64)
        if self.mask is not None:
            trained = self.mask.array[positions].astype(bool) & valid
        else:
            assert self.assistant_start is not None  # checked in __init__
            trained = (
                np.stack([loss_mask_from_tokens(row, self.assistant_start, self.eot_id) for row in seq])
                & valid
            )
        y = seq[:, 1:]
        y_masked = np.where(trained[:, 1:], y, IGNORE_INDEX)
        out = [torch.from_numpy(np.ascontiguousarray(a)) for a in (seq[:, :-1], y, y_masked)]
        if self.device.type != "cpu":
            out = [t.to(self.device) for t in out]
        return out[0], out[1], out[2]


def _check_offsets(offsets: np.ndarray[Any, Any], total: int, path: Path) -> None:
    if len(offsets) == 0:
        raise DatasetFileError(f"{path} lists no examples", hint="this split is empty; use the other split")
    if offsets[0] != 0 or np.any(np.diff(offsets) <= 0) or offsets[-1] >= total:
        raise DatasetFileError(
            f"{path} does not hold increasing offsets from 0 into {total} tokens",
            hint="rebuild the dataset; the offsets do not belong to this tokens file",
        )

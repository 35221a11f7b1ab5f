"""What a tokenize pass returns: the token arrays of its rows, its event and counts.

Kept apart from the pass (:mod:`dlmstore.corpus.tokenize`) because a pass
answered from a snapshot (:mod:`dlmstore.corpus.snapshot`) returns the same
result without running the pass, and the pass itself takes snapshots: both
import this module, neither imports the other back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dlmstore.cache.preferences import TokenizedPreferences
from dlmstore.prefix.stats import PrefixCacheStats
from dlmstore.store.events import TokenizationEvent

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class TokenizedRows:
    """Token ids of the tokenized rows in corpus order: ``values[offsets[i]:offsets[i+1]]``."""

    row_keys: tuple[str, ...]
    kinds: tuple[str, ...]
    offsets: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.row_keys)

    def input_ids(self, index: int) -> np.ndarray:
        return self.values[self.offsets[index] : self.offsets[index + 1]]

    @property
    def token_count(self) -> int:
        return int(self.offsets[-1])

    def take(self, order: Sequence[int]) -> TokenizedRows:
        """The rows at ``order``, in that order (an index may repeat): one gather, no per-row copy."""
        import numpy as np

        index = np.asarray(order, dtype=np.int64)
        lengths = np.diff(self.offsets).astype(np.int64)[index]
        offsets = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        starts = self.offsets[:-1].astype(np.int64)[index]
        positions = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        return TokenizedRows(
            tuple(self.row_keys[i] for i in order),
            tuple(self.kinds[i] for i in order),
            offsets,
            self.values[positions],
        )

    def to_arrow(self) -> Any:
        """A pyarrow table with ``input_ids``, ``attention_mask`` and ``labels`` list columns, zero-copy where possible."""
        import numpy as np
        import pyarrow as pa

        offsets = pa.array(self.offsets.astype(np.int32 if self.token_count < 2**31 else np.int64))
        ids = pa.array(self.values)  # uint16/uint32 as stored: no copy, no widening
        ones = pa.array(np.ones(len(self.values), dtype=np.uint8))
        list_type = pa.ListArray if offsets.type == pa.int32() else pa.LargeListArray
        input_ids = list_type.from_arrays(offsets, ids)
        # labels == input_ids (TRL shifts them in the loss). Giving them here
        # spares TRL its per-token Python pass that builds them row by row.
        return pa.table(
            {
                "input_ids": input_ids,
                "attention_mask": list_type.from_arrays(offsets, ones),
                "labels": input_ids,
            }
        )

    def to_dataset(self) -> Any:
        """A Hugging Face ``datasets.Dataset`` for ``SFTTrainer`` (built from the arrays)."""
        import datasets

        return datasets.Dataset(self.to_arrow())


@dataclass(frozen=True)
class PassResult:
    """Everything a tokenize pass returns."""

    event: TokenizationEvent
    rows: TokenizedRows | None  # None unless the pass was asked to materialize
    token_count: int  # tokens of ``rows``
    preference_rows: int
    preference_tokens: int  # tokens of the chosen and rejected conversations
    preferences: TokenizedPreferences | None  # None unless the pass was asked to materialize
    damaged_entries: int
    evicted_entries: int
    tokenizer_sha256: str
    warnings: tuple[str, ...] = field(default=())
    prefix_cache: PrefixCacheStats | None = None
    #: Ids of every cache entry the rows now have, and ``cache_totals.changes``
    #: read when the found ones were found; ``None`` when the pass bypassed
    #: the cache or some row's entry was not registered by this pass
    #: (``dlmstore.corpus.snapshot`` needs all of them).
    entry_ids: list[int] | None = None
    cache_changes: int | None = None

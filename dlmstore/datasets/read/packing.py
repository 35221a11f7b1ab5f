"""Document-aware packing and loss masks, vectorised with numpy.

A window of packed pretraining tokens can hold the end of one document and
the start of the next. Packing gives each token a window-relative document
id and masks (``-100``, PyTorch's ``ignore_index``) every label that
belongs to another document than its input, so the model is never asked to
predict a new document from the previous one; ``doc_ids`` also lets the
attention layer stop at document boundaries.

Where a document starts comes from the shard's document index when there is
one (:func:`doc_ids_from_starts`, no scan of the tokens) and from EOS
tokens otherwise (:func:`doc_ids_from_eos`, for shards built elsewhere).
Both follow one convention: a document *owns* the EOS that ends it, so
predicting EOS after a document's last token is trained and predicting the
next document's first token from that EOS is masked. (The spec's
``_compute_packed_output`` increments the id *at* the EOS instead, which
masks the EOS prediction; we keep the EOS target because it teaches the
model to stop.)

Every function is O(window) numpy work: the boundaries come from two
``searchsorted`` calls on the index (:class:`WindowStarts` makes them once
per shard for all its windows) or one comparison with EOS, the document ids
from one ``bincount`` and a running sum (``np.repeat`` over long arrays),
and only the boundary labels are written; never a Python loop per token
(the benchmark compares against one).
The SFT counterpart, :func:`loss_mask_from_tokens`, finds assistant spans
from their opening sentinel to the next EOT for token files built without
a stored mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

IGNORE_INDEX = -100
Array = np.ndarray[Any, Any]


def boundaries_from_starts(starts: Array, begin: int, length: int) -> Array:
    """Positions in window ``[begin, begin + length)`` of a shard where a new document starts.

    ``starts`` are the sorted (int64) positions in the shard where documents
    start; position 0 of the window is never a boundary (ids are window-relative).
    """
    lo = starts.searchsorted(begin + 1)
    hi = starts.searchsorted(begin + length)
    return starts[lo:hi] - begin


class WindowStarts:
    """Where documents start inside each fixed window of one shard, found once for all windows.

    Window ``k`` covers tokens ``[k * length, (k + 1) * length)``;
    :meth:`boundaries` returns what :func:`boundaries_from_starts` would, as
    a slice of one precomputed array (two ``searchsorted`` calls over all
    windows, instead of two calls and a subtraction per item). Memory is
    two integers per window and one per document of the shard, kept only
    for shards that are read.
    """

    __slots__ = ("lo", "hi", "offsets")

    def __init__(self, starts: Array, length: int, windows: int) -> None:
        begins = np.arange(windows, dtype=np.int64) * length
        self.lo = starts.searchsorted(begins + 1)
        self.hi = starts.searchsorted(begins + length)
        self.offsets = (starts % length).astype(np.intp)  # the index type: no cast per item

    def boundaries(self, k: int) -> Array:
        """Window-relative positions in window ``k`` where a new document starts."""
        return self.offsets[self.lo[k] : self.hi[k]]


def boundaries_from_eos(window: Array, eos_token_id: int) -> Array:
    """Positions in ``window`` where a new document starts: right after each EOS."""
    return np.flatnonzero(window[:-1] == eos_token_id) + 1


def doc_ids_from_boundaries(boundaries: Array, length: int) -> Array:
    """Window-relative document ids: 0 up to the first boundary, 1 up to the next, ..."""
    if len(boundaries) == 0:
        return np.zeros(length, dtype=np.int64)
    if length <= 1 << 14:  # a training window: fewest numpy calls wins
        return np.add.accumulate(np.bincount(boundaries, minlength=length)[:length])
    edges = np.empty(len(boundaries) + 2, dtype=np.int64)  # a long array: O(documents) work
    edges[0], edges[-1] = 0, length
    edges[1:-1] = boundaries
    counts = np.minimum(edges[1:], length) - np.minimum(edges[:-1], length)
    return np.repeat(np.arange(len(counts), dtype=np.int64), counts)


def doc_ids_from_starts(starts: Array, begin: int, length: int) -> Array:
    """Window-relative document ids of tokens ``[begin, begin + length)`` of a shard."""
    return doc_ids_from_boundaries(boundaries_from_starts(starts, begin, length), length)


def doc_ids_from_eos(window: Array, eos_token_id: int) -> Array:
    """Window-relative document ids, a new document starting after each EOS."""
    return doc_ids_from_boundaries(boundaries_from_eos(window, eos_token_id), len(window))


def pack_window(window: Array, boundaries: Array) -> dict[str, Array]:
    """Inputs, next-token labels (``-100`` across documents) and per-input doc ids.

    ``window`` holds ``n`` tokens; each output has ``n - 1`` (int64). Only
    the few boundary labels are written, never a mask over the window.
    """
    input_ids, labels, doc_ids = packed_arrays(window, boundaries)
    return {"input_ids": input_ids, "labels": labels, "doc_ids": doc_ids}


def packed_arrays(window: Array, boundaries: Array) -> tuple[Array, Array, Array]:
    """:func:`pack_window` as a tuple ``(input_ids, labels, doc_ids)``, the per-item hot path."""
    ids = window.astype(np.int64)  # one widening pass
    shifted = ids.copy()  # labels are shifted[1:]: the label before boundary b sits at shifted[b]
    if len(boundaries):  # a window inside one long document has none
        shifted[boundaries] = IGNORE_INDEX
    return ids[:-1], shifted[1:], doc_ids_from_boundaries(boundaries, len(ids) - 1)


def loss_mask_from_tokens(tokens: Array, assistant_start: Sequence[int], eot_id: int) -> Array:
    """True on the tokens after each ``assistant_start`` sentinel up to and including the next EOT.

    A span with no EOT runs to the end of ``tokens``.
    """
    tokens = np.asarray(tokens)
    n, k = len(tokens), len(assistant_start)
    mask = np.zeros(n, dtype=bool)
    if k == 0 or n <= k:
        return mask
    hits = np.ones(n - k + 1, dtype=bool)
    for j, token in enumerate(assistant_start):
        hits &= tokens[j : n - k + 1 + j] == token
    span_starts = np.flatnonzero(hits) + k
    span_starts = span_starts[span_starts < n]
    if len(span_starts) == 0:
        return mask
    eots = np.append(np.flatnonzero(tokens == eot_id), n - 1)  # a span without EOT ends at the end
    ends = eots[np.searchsorted(eots, span_starts)]
    edges = np.zeros(n + 1, dtype=np.int64)
    np.add.at(edges, span_starts, 1)
    np.add.at(edges, ends + 1, -1)
    return np.cumsum(edges[:n]) > 0

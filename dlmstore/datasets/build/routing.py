"""Which split a document goes to, and which documents a budget keeps: pure rules.

Both build engines (one process, or Ray workers) apply these rules, so
they must not depend on the order in which documents are *tokenized*, only
on each document's position in the input and the seed:

* **The draw.** Document ``i`` (0-based, counting every document the
  input yields, empty ones too) gets the uniform float
  ``u_i = torch.rand(4096, dtype=float64, generator=G(seed, i // 4096))[i % 4096]``,
  where ``G(seed, c)`` is a ``torch.Generator`` seeded with the first 63
  bits of ``sha256("dlm-draw/1:{seed}:{c}")``. Any worker computes the draw
  of any position in constant time (no generator to replay from the
  start). It goes to ``val`` when ``u_i < val_frac``. Datasets built
  before this rule (meta.json without ``draw_rule``) drew from one
  generator, one value per non-empty document in order.
* **The budgets** (pretrain). Documents are taken in position order; a
  document joins its split while the split holds fewer tokens than its
  budget (so the last one may overshoot), else it is counted in
  ``over_budget_docs``. Reading stops as soon as every split is full
  (when every split has a budget): right after the document that fills
  the last one. A source's own split
  (``val_texts``) stops being read once that split is full; its remaining
  documents are not counted.

:class:`PretrainRouter` applies the budget rule to documents fed in
position order in any grouping (the local engine feeds its tokenizer
batches, the Ray driver the blocks workers return), and gives the same
answer for every grouping (``tests/test_datasets_routing.py`` checks it
against a one-document-at-a-time reading of the rule).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DRAW_CHUNK = 4096
DRAW_RULE = "dlm-draw/1"
#: What meta.json records under ``draw_rule`` (the rule above, in words and by name).
DRAW_RULE_TEXT = (
    f"{DRAW_RULE}: document i (every input document counted, empty ones too) draws "
    f"torch.rand({DRAW_CHUNK}, float64, generator seeded with the first 63 bits of "
    f"sha256('{DRAW_RULE}:<seed>:<i // {DRAW_CHUNK}>'))[i % {DRAW_CHUNK}]"
)


def chunk_seed(seed: int, chunk: int) -> int:
    """The torch seed of draw chunk ``chunk`` (positions ``chunk * 4096`` onwards)."""
    digest = hashlib.sha256(f"{DRAW_RULE}:{seed}:{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


class TorchGenerator:
    """``torch.Generator().manual_seed(seed)`` on the CPU, drawn from without loading torch.

    A build tokenizes and never runs a model, so it does not load torch
    (dlmstore/torch_loader.py), yet its draws stay the ones meta.json's
    ``draw_rule`` names, torch's, bit for bit (``tests/test_datasets_routing.py``
    checks each against torch). torch's CPU generator is MT19937 seeded with
    the low 32 bits of the seed: the state NumPy's legacy ``RandomState``
    starts from for that integer, a stream NumPy keeps stable (NEP 19), so
    a full-range uint32 draw of it is the generator's raw output.
    """

    def __init__(self, seed: int) -> None:
        self._state = np.random.RandomState(seed & 0xFFFFFFFF)

    def words(self, count: int) -> np.ndarray[Any, Any]:
        """The next ``count`` 32-bit outputs (``generator->random()``)."""
        return self._state.randint(0, 2**32, size=count, dtype=np.uint32)

    def rand(self, count: int) -> np.ndarray[Any, Any]:
        """``torch.rand(count, dtype=torch.float64, generator=...)``: two outputs per value, the
        first the high word, the low 53 bits of the 64 over 2**53 (``at::uniform_real_distribution``)."""
        words = self.words(2 * count)
        bits = (words[0::2].astype(np.uint64) << np.uint64(32)) | words[1::2].astype(np.uint64)
        return (bits & np.uint64((1 << 53) - 1)).astype(np.float64) * (1.0 / (1 << 53))


def seeded_permutation(n: int, seed: int) -> list[int]:
    """``torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()``, without torch.

    torch's CPU randperm below 2**32 / 20 elements: a Fisher-Yates pass from
    the front, position ``i`` swapped with ``i + word % (n - i)``.
    """
    order = list(range(n))
    for i, word in enumerate(TorchGenerator(seed).words(max(n - 1, 0)).tolist()):
        z = i + word % (n - i)
        order[i], order[z] = order[z], order[i]
    return order


@functools.lru_cache(maxsize=8)
def _chunk(seed: int, chunk: int) -> np.ndarray[Any, Any]:
    """``torch.rand(4096, dtype=float64, generator=G(seed, chunk))`` (:class:`TorchGenerator`)."""
    values = TorchGenerator(chunk_seed(seed, chunk)).rand(DRAW_CHUNK)
    values.setflags(write=False)
    return values


def position_draws(seed: int, start: int, count: int) -> np.ndarray[Any, Any]:
    """The uniform draws of positions ``start .. start + count - 1`` (float64)."""
    if count <= 0:
        return np.zeros(0, dtype=np.float64)
    first, last = start // DRAW_CHUNK, (start + count - 1) // DRAW_CHUNK
    values = np.concatenate([_chunk(seed, c) for c in range(first, last + 1)])
    offset = start - first * DRAW_CHUNK
    return values[offset : offset + count]


def draw_splits(seed: int, start: int, count: int, val_frac: float) -> np.ndarray[Any, Any]:
    """Per position: ``True`` for val, ``False`` for train."""
    return position_draws(seed, start, count) < val_frac


@dataclass
class PretrainRouter:
    """The budget rule, applied to documents in position order.

    Args:
        budgets: tokens per split (``None``: no limit).

    ``held`` counts tokens per split (EOS included); ``stopped`` turns true
    once every split is full, after which nothing more is read. A run of
    documents is routed with numpy (prefix sums per split), not one
    document at a time: the Ray driver routes every document of a corpus.
    """

    budgets: dict[str, int | None]
    held: dict[str, int] = field(default_factory=dict)
    docs: dict[str, int] = field(default_factory=dict)
    skipped_empty_docs: int = 0
    over_budget_docs: int = 0
    read: int = 0
    stopped: bool = False

    def __post_init__(self) -> None:
        for split in self.budgets:
            self.held.setdefault(split, 0)
            self.docs.setdefault(split, 0)

    def full(self, split: str) -> bool:
        budget = self.budgets[split]
        return budget is not None and self.held[split] >= budget

    def route(self, lengths: np.ndarray[Any, Any], to_val: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Route a run of consecutive drawn documents; returns the indexes (in the run) taken.

        Args:
            lengths: token count of each document (EOS not included; 0 = empty).
            to_val: each document's draw decision (true: val).
        """
        return self._route(np.asarray(lengths, dtype=np.int64), np.asarray(to_val, dtype=bool), None)

    def route_fixed(self, lengths: np.ndarray[Any, Any], split: str) -> np.ndarray[Any, Any]:
        """Route documents of a source's own ``split``; reading stops (uncounted) once it is full."""
        lengths = np.asarray(lengths, dtype=np.int64)
        return self._route(lengths, np.full(len(lengths), split == "val"), split)

    def _route(
        self, lengths: np.ndarray[Any, Any], to_val: np.ndarray[Any, Any], fixed: str | None
    ) -> np.ndarray[Any, Any]:
        none = np.zeros(0, dtype=np.int64)
        if self.stopped or len(lengths) == 0 or (fixed is not None and self.full(fixed)):
            return none
        nonempty = lengths > 0
        end = len(lengths)  # documents read: those before the point where reading stops
        taken: dict[str, np.ndarray[Any, Any]] = {}
        cost: dict[str, np.ndarray[Any, Any]] = {}
        filled_at: dict[str, int] = {}
        for split, mine in (("train", ~to_val), ("val", to_val)):
            candidates = np.flatnonzero(nonempty & mine)
            costs = lengths[candidates] + 1
            budget = self.budgets[split]
            if budget is not None:
                before = self.held[split] + np.cumsum(costs) - costs
                keep = before < budget
                candidates, costs = candidates[keep], costs[keep]
                if self.held[split] + int(costs.sum()) >= budget:
                    filled_at[split] = int(candidates[-1]) if len(candidates) else -1
            taken[split], cost[split] = candidates, costs
        if len(filled_at) == len(self.budgets):  # every split full: reading stops here
            end = max(filled_at.values()) + 1
            self.stopped = True
        elif fixed is not None and fixed in filled_at:  # this source's split is full: it ends here
            end = filled_at[fixed] + 1
        chosen = []
        for split in ("train", "val"):
            inside = taken[split] < end
            self.held[split] += int(cost[split][inside].sum())
            self.docs[split] += int(inside.sum())
            chosen.append(taken[split][inside])
        result = np.sort(np.concatenate(chosen))
        self.read += end
        self.skipped_empty_docs += int((~nonempty[:end]).sum())
        self.over_budget_docs += int(nonempty[:end].sum()) - len(result)
        return result

    def counts(self) -> dict[str, int]:
        """What meta.json records under ``totals`` besides tokens and documents."""
        return {"skipped_empty_docs": self.skipped_empty_docs, "over_budget_docs": self.over_budget_docs}

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
  ``over_budget_docs``. Reading stops right after the document that fills
  the last split (when every split has a budget). A source's own split
  (``val_texts``) stops being read once that split is full; its remaining
  documents are not counted.

:class:`PretrainRouter` applies the budget rule to documents fed in
position order in any grouping (the local engine feeds its tokenizer
batches, the Ray driver the blocks workers return), and gives the same
answer for every grouping.
"""

from __future__ import annotations

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


def position_draws(seed: int, start: int, count: int) -> np.ndarray[Any, Any]:
    """The uniform draws of positions ``start .. start + count - 1`` (float64)."""
    import torch

    if count <= 0:
        return np.zeros(0, dtype=np.float64)
    first, last = start // DRAW_CHUNK, (start + count - 1) // DRAW_CHUNK
    chunks = [
        torch.rand(
            DRAW_CHUNK, generator=torch.Generator().manual_seed(chunk_seed(seed, c)), dtype=torch.float64
        ).numpy()
        for c in range(first, last + 1)
    ]
    values = np.concatenate(chunks)
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
    once every split is full, after which nothing more is read.
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

    def route(self, lengths: np.ndarray[Any, Any], splits: list[str] | np.ndarray[Any, Any]) -> list[int]:
        """Route one run of consecutive documents; returns the indexes (in the run) taken.

        Args:
            lengths: token count of each document (EOS not included; 0 = empty).
            splits: each document's split, ``"train"``/``"val"`` (or, for a
                drawn run, a bool array: true for val).

        A document of a source's own split that is already full is not
        read (that stream has ended); the caller reads :attr:`ended`.
        """
        taken: list[int] = []
        for index in range(len(lengths)):
            if self.stopped:
                break
            split = splits[index]
            if not isinstance(split, str):
                split = "val" if split else "train"
            length = int(lengths[index])
            self.read += 1
            if length == 0:
                self.skipped_empty_docs += 1
                continue
            if self.full(split):
                self.over_budget_docs += 1
                continue
            taken.append(index)
            self.held[split] += length + 1
            self.docs[split] += 1
            if all(self.full(s) for s in self.budgets):
                self.stopped = True
        return taken

    def route_fixed(self, lengths: np.ndarray[Any, Any], split: str) -> list[int]:
        """Route documents of a source's own ``split``; stops (uncounted) once it is full."""
        taken: list[int] = []
        for index in range(len(lengths)):
            if self.stopped or self.full(split):
                break
            taken.extend(index + t for t in self.route(lengths[index : index + 1], [split]))
        return taken

    def counts(self) -> dict[str, int]:
        """What meta.json records under ``totals`` besides tokens and documents."""
        return {"skipped_empty_docs": self.skipped_empty_docs, "over_budget_docs": self.over_budget_docs}

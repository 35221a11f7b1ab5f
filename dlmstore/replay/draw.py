"""The replay draw: how many history rows a run replays, how each is weighed, which are taken.

DLM's rule, in rows: a run that trains ``n`` rows new to history replays
``max(min_rows, factor * n)`` of the candidates (``max(preference_min,
factor * n)`` preference triples for the preference phase), all of them
when there are fewer (``dlmstore.replay.candidates`` says which rows are
candidates). A candidate last trained in generation ``h`` weighs
``max(1 / (1 + (g - h)), weight_floor)``, ``g`` the generation the run
will have: the version before the current one weighs 1/2, older ones less,
never below the floor.

The selection is Efraimidis and Spirakis' weighted sampling without
replacement (A-ES; DLM's A-ExpJ is its reservoir form and draws the same
distribution): each candidate gets ``ln(u) / w``, ``u`` uniform in (0, 1],
and the ``k`` largest are taken. ``u`` comes from ``random.Random`` seeded
with the string ``f"{seed}:{g}"`` (a string seed hashes with SHA-512: the
same numbers on every Python version), one number per candidate in
``row_key`` order.

Why it is a pure function of the versions trained and the seed: the
candidates are a function of the history rows and the current document;
history rows, their last generations and ``g`` change only when a run
trains another row set (``dlmstore.replay.history``: an unchanged retrain
joins its generation); the order the numbers are drawn in is the row keys'
order, not the order anything was read in; and nothing reads a clock.
DLM's draw weighs by age in days and seeds with the adapter version, so the
same document trained on another day, or once more, drew other rows.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dlmstore.document.frontmatter import ReplaySettings


def size(new_rows: int, candidates: int, settings: ReplaySettings, *, preference: bool = False) -> int:
    """How many candidates a run replays: DLM's ``max(minimum, factor * new)``, all when fewer."""
    minimum = settings.preference_min if preference else settings.min_rows
    return min(candidates, max(minimum, settings.factor * new_rows))


def weight(last_generation: int, generation: int, floor: float) -> float:
    """A candidate's weight: ``max(1 / (1 + (generation - last_generation)), floor)``."""
    return max(1.0 / (1 + (generation - last_generation)), floor)


@dataclass(frozen=True)
class Drawn:
    """The draw: the keys taken, in ``row_key`` order."""

    row_keys: tuple[str, ...]


def draw(candidates: Sequence[tuple[str, int]], k: int, *, generation: int, seed: int, floor: float) -> Drawn:
    """Take ``k`` of ``candidates`` (``(row_key, last_generation)`` pairs), weighted by recency.

    A pure function of its arguments: the input's order does not matter
    (the candidates are sorted by key first), and the same arguments always
    take the same rows.
    """
    import numpy as np

    ordered = sorted(candidates)
    if k >= len(ordered):
        return Drawn(tuple(key for key, _ in ordered))
    if k <= 0:
        return Drawn(())
    rng = random.Random(f"{seed}:{generation}")
    uniform = rng.random
    log = math.log
    by_generation: dict[int, float] = {}
    weights = np.fromiter(
        (
            by_generation.get(last) or by_generation.setdefault(last, weight(last, generation, floor))
            for _, last in ordered
        ),
        dtype=np.float64,
        count=len(ordered),
    )
    # 1 - random() is in (0, 1]: ln never sees 0. math.log per number, then IEEE division (exact
    # on every machine): no vectorised log, whose last bit may differ between CPUs.
    logs = np.fromiter((log(1.0 - uniform()) for _ in ordered), dtype=np.float64, count=len(ordered))
    scores = logs / weights
    # The k largest scores; ties (measure zero) go to the smaller key (the earlier position).
    top = np.lexsort((np.arange(len(ordered)), -scores))[:k]
    return Drawn(tuple(sorted(ordered[int(index)][0] for index in top)))

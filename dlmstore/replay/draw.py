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
and the ``k`` largest are taken (ties, of measure zero, to the smaller key).

``u`` is a hash of the candidate's key under a salt, the sha256 of
``f"{seed}:{g}"``: the key's four 64-bit words are mixed in one after
another, each followed by MurmurHash3's 64-bit finaliser, and the top 53
bits of the result, plus one, over 2**53 are ``u``. Every step is integer
arithmetic modulo 2**64 (numpy, vectorised over the candidates) and an
exact conversion, so ``u`` is the same on every machine; a counter-based
draw like this needs no order of the candidates, so nothing is sorted.
numpy's SIMD ``log`` may differ from ``math.log`` in the last bits, and
between CPUs, so it only narrows the choice: the ``k``-th largest of its
scores is found (``partition``); a candidate scoring more than a
relative 1e-9 above it is taken and one more than that below is not (the
logs differ by some 1e-16 relative: neither can cross); the few in
between get ``math.log`` and the IEEE division, and the rest of the ``k``
is taken among them by those exact scores. The rows taken are exactly the
``k`` largest exact scores, on every machine.

Why it is a pure function of the versions trained and the seed: the
candidates are a function of the history rows and the current document;
history rows, their last generations and ``g`` change only when a run
trains another row set (``dlmstore.replay.history``: an unchanged retrain
joins its generation); ``u`` is a function of the key, the seed and ``g``,
never of the order anything was read in; and nothing reads a clock.
DLM's draw weighs by age in days and seeds with the adapter version, so the
same document trained on another day, or once more, drew other rows.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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


@dataclass(frozen=True)
class Pool:
    """Candidates as arrays: what :func:`draw` takes (``dlmstore.replay.candidates`` reads one).

    Attributes:
        keys: ``(n, 32)`` uint8, the row keys' sha256 digests.
        generations: ``(n,)`` int64, the latest generation that trained each.
    """

    keys: Any
    generations: Any

    @classmethod
    def of(cls, pairs: Sequence[tuple[str, int]]) -> Pool:
        """The pool of ``(row_key, last_generation)`` pairs."""
        import numpy as np

        keys = b"".join(bytes.fromhex(key.removeprefix("sha256:")) for key, _ in pairs)
        return cls(
            np.frombuffer(keys, dtype=np.uint8).reshape(len(pairs), 32),
            np.fromiter((last for _, last in pairs), dtype=np.int64, count=len(pairs)),
        )

    def __len__(self) -> int:
        return int(self.generations.shape[0])


_M1 = 0xFF51AFD7ED558CCD
_M2 = 0xC4CEB9FE1A85EC53


def uniforms(keys: Any, *, generation: int, seed: int) -> Any:
    """The 53-bit integers ``u * 2**53`` (1 to 2**53) of ``keys`` (``(n, 32)`` uint8) for this draw."""
    import numpy as np

    salt = np.frombuffer(hashlib.sha256(f"{seed}:{generation}".encode()).digest(), dtype="<u8")
    words = np.ascontiguousarray(keys).view(np.dtype("<u8"))
    h = np.zeros(words.shape[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in range(4):
            h ^= words[:, column] ^ salt[column]
            h ^= h >> np.uint64(33)
            h *= np.uint64(_M1)
            h ^= h >> np.uint64(33)
            h *= np.uint64(_M2)
            h ^= h >> np.uint64(33)
    return (h >> np.uint64(11)) + np.uint64(1)


def draw(
    candidates: Pool | Sequence[tuple[str, int]], k: int, *, generation: int, seed: int, floor: float
) -> Drawn:
    """Take ``k`` of ``candidates`` (a :class:`Pool`, or ``(row_key, last_generation)`` pairs),
    weighted by recency.

    A pure function of its arguments: the input's order does not matter,
    and the same arguments always take the same rows.
    """
    import numpy as np

    pool = candidates if isinstance(candidates, Pool) else Pool.of(candidates)
    n = len(pool)
    if k >= n:
        return Drawn(_sorted_keys(pool.keys))
    if k <= 0:
        return Drawn(())
    u = uniforms(pool.keys, generation=generation, seed=seed)
    scale = 2.0**-53
    # Each weight as Python computes it: 1 / (1 + age) and the floor are IEEE operations numpy does alike.
    weights = np.maximum(1.0 / (1 + (generation - pool.generations)).astype(np.float64), floor)
    approx = np.log(u.astype(np.float64) * scale) / weights  # numpy's log: within a few ulp of math.log
    threshold = float(np.partition(approx, n - k)[n - k])  # the k-th largest score, nearly
    margin = 1e-9 * abs(threshold)  # a million times any difference between the two logs
    inside = np.flatnonzero(approx > threshold + margin)  # above the k-th exact score whatever the ulps
    border = np.flatnonzero(np.abs(approx - threshold) <= margin)
    log = math.log
    exact = np.array(
        [
            log(value * scale) / weight
            for value, weight in zip(u[border].tolist(), weights[border].tolist(), strict=True)
        ],
        dtype=np.float64,
    )
    words = np.ascontiguousarray(pool.keys[border]).view(">u8")
    # The rest of the k among the border, by exact score; ties go to the smaller key (big-endian words
    # compare as the bytes do).
    order = np.lexsort((words[:, 3], words[:, 2], words[:, 1], words[:, 0], -exact))[: k - len(inside)]
    return Drawn(_sorted_keys(pool.keys[np.concatenate([inside, border[order]])]))


def _sorted_keys(keys: Any) -> tuple[str, ...]:
    return tuple(sorted("sha256:" + bytes(row).hex() for row in keys))

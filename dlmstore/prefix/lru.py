"""A memory-capped map from digests to token arrays, evicting by sampled LRU.

Exact LRU needs a linked list touched on every hit; this store keeps one
integer "last used" tick per entry instead and, when it needs room, draws
``sample`` distinct entries at random and evicts the least recently used of
them (the approach of Redis's ``allkeys-lru``). Each eviction costs
O(sample), never O(entries), and because the draw is without replacement
the ``sample - 1`` most recently used entries are never evicted while older
ones remain. With ``sample`` at least the number of entries it is exact LRU.

Sampling needs random access to keys, which a dict lacks, so keys also live
in a list; each entry remembers its slot there and removal swaps the last
key into the hole (O(1)).

Memory is accounted honestly, per entry: the token array as
``sys.getsizeof`` reports it (header and buffer), the 32-byte digest key,
the entry object with its integers, and the dict and list slots that hold
it (:data:`ENTRY_OVERHEAD`). ``memory_bytes`` never exceeds ``max_bytes``:
room is made before an entry goes in, and an entry larger than the cap is
not stored. The store is not thread-safe; its owner holds a lock.
"""

from __future__ import annotations

import random
import sys
from array import array


class Entry:
    """One cached token array and its bookkeeping."""

    __slots__ = ("tokens", "tick", "slot", "size", "level")

    def __init__(self, tokens: array[int], tick: int, slot: int, size: int, level: int) -> None:
        self.tokens = tokens
        self.tick = tick
        self.slot = slot
        self.size = size
        self.level = level


def _overhead() -> int:
    big = 2**40  # ticks, slots and sizes are separate int objects once past the small-int cache
    entry = Entry(array("H"), big, big + 1, big + 2, 0)
    # dict: a 24-byte entry plus an 8-byte index slot at up to 2/3 load;
    # list: an 8-byte pointer with 1/8 over-allocation.
    container_slots = 48 + 9
    return sys.getsizeof(entry) + sys.getsizeof(b"\0" * 32) + 3 * sys.getsizeof(big) + container_slots


#: Bytes each entry costs beyond its token array.
ENTRY_OVERHEAD = _overhead()
_ARRAY_HEADER = sys.getsizeof(array("H"))


def entry_bytes(length: int, itemsize: int) -> int:
    """What an entry of ``length`` ids costs, for an array allocated to fit.

    Arrays built from a list, sliced or added are allocated to fit; one grown
    by ``append``/``extend`` may hold spare capacity, which :meth:`SampledLRU.put`
    counts (it asks ``sys.getsizeof``).
    """
    return _ARRAY_HEADER + length * itemsize + ENTRY_OVERHEAD


class SampledLRU:
    """Digest -> token array, at most ``max_bytes`` in all.

    ``level`` tags each entry (0: whole text, 1: prefix) so that entry
    counts can be reported per level.
    """

    def __init__(self, max_bytes: int, sample: int) -> None:
        self.max_bytes = max_bytes
        self.sample = sample
        self.entries: dict[bytes, Entry] = {}
        self.keys: list[bytes] = []
        self.memory = 0
        self.evictions = 0
        self.per_level = [0, 0]
        self._tick = 0
        self._rng = random.Random()

    def get(self, key: bytes) -> Entry | None:
        """The entry for ``key``, marked as just used; ``None`` when absent."""
        entry = self.entries.get(key)
        if entry is not None:
            self._tick += 1
            entry.tick = self._tick
        return entry

    def put(self, key: bytes, tokens: array[int], level: int) -> None:
        """Store ``tokens`` under ``key``, evicting as needed; a present key is only marked used."""
        if self.get(key) is not None:
            return  # a concurrent caller stored the same prefix first; tokens are equal
        size = sys.getsizeof(tokens) + ENTRY_OVERHEAD  # == entry_bytes() for a fitted array
        if size > self.max_bytes:
            return
        while self.memory + size > self.max_bytes:
            self._evict_one()
        self._tick += 1
        self.entries[key] = Entry(tokens, self._tick, len(self.keys), size, level)
        self.keys.append(key)
        self.memory += size
        self.per_level[level] += 1

    def clear(self) -> None:
        """Drop every entry and zero the eviction count."""
        self.entries.clear()
        self.keys.clear()
        self.memory = 0
        self.evictions = 0
        self.per_level = [0, 0]

    def _evict_one(self) -> None:
        if len(self.keys) <= self.sample:
            candidates = self.keys
        else:
            candidates = self._rng.sample(self.keys, self.sample)
        victim = min(candidates, key=lambda key: self.entries[key].tick)
        self._remove(victim)
        self.evictions += 1

    def _remove(self, key: bytes) -> None:
        entry = self.entries.pop(key)
        last = self.keys.pop()
        if entry.slot < len(self.keys):
            self.keys[entry.slot] = last
            self.entries[last].slot = entry.slot
        self.memory -= entry.size
        self.per_level[entry.level] -= 1

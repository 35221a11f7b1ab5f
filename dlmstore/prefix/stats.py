"""What a prefix cache reports: :class:`PrefixCacheStats`.

A module of its own so that code which only carries the numbers (the
``dlm tokenize`` summary) need not import the cache itself, its seam checks
and its store: a warm ``dlm tokenize`` never tokenizes, so never builds one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixCacheStats:
    """Counters and state of a :class:`PrefixCachedTokenizer`; JSON-ready with ``dataclasses.asdict``.

    Attributes:
        hits: ``encode`` calls served at least partly from the cache (``l0_hits + l1_hits``).
        misses: calls that tokenized the whole text.
        hit_rate: ``hits / (hits + misses)``; 0.0 before the first call.
        l0_hits: calls answered whole from L0 (no tokenization).
        l1_hits: calls that reused a cached prefix and tokenized only the rest.
        entries: cached entries in both levels (``l0_entries + l1_entries``).
        l0_entries: whole texts cached.
        l1_entries: prefixes cached.
        memory_bytes: bytes held by the entries (token arrays, keys, bookkeeping).
        max_bytes: the memory cap; ``memory_bytes`` never exceeds it.
        evictions: entries evicted to stay under the cap.
        tokens_reused: token ids copied from the cache instead of being tokenized.
        l0_enabled: whether whole texts are cached (off only for a random tokenizer).
        l1_enabled: whether prefixes are cached.
        disabled_reason: why a level is off; ``None`` when both are on.
    """

    hits: int
    misses: int
    hit_rate: float
    l0_hits: int
    l1_hits: int
    entries: int
    l0_entries: int
    l1_entries: int
    memory_bytes: int
    max_bytes: int
    evictions: int
    tokens_reused: int
    l0_enabled: bool
    l1_enabled: bool
    disabled_reason: str | None

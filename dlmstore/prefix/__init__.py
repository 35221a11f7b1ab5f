"""Prefix cache for tokenization: reuse the tokens of text already seen.

Chat prompts repeat themselves: every turn of a conversation re-sends the
whole conversation so far, and many rows of a dataset share one long system
prompt. :class:`PrefixCachedTokenizer` wraps a tokenizer with two in-memory
caches so that only new text is tokenized:

* **L0** maps a whole text (and ``add_special_tokens``) to its ids;
* **L1** maps each prefix that ends right after a special token
  (``<|im_start|>``, ``<|im_end|>``, ...) to its ids. A new text is cut at
  the same places; the longest cached prefix is reused and only the rest is
  tokenized, piece by piece, and cached in turn.

The output always equals the wrapped tokenizer's. Cutting is exact only
when the tokenizer treats the special token as an isolated piece and
nothing else depends on where a piece sits in the text; ``seams.py`` checks
this at construction, statically and by probing, and turns L1 off with a
logged reason where it does not hold (e.g. SentencePiece-style Metaspace
with ``prepend_scheme="first"``). Both levels share one memory cap with
sampled-LRU eviction (``lru.py``). See ``docs/prefix-cache.md`` for the
design, the guarantees and the benchmark (``bench/bench_prefix.py``).

Modules: ``cached.py`` (the wrapper), ``stats.py`` (its counters),
``seams.py`` (when a cut is safe), ``lru.py`` (the memory-capped store).
The wrapper is imported on first use: code that only carries the counters
(the ``dlm tokenize`` summary) loads ``stats.py`` alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dlmstore.prefix.stats import PrefixCacheStats

if TYPE_CHECKING:
    from dlmstore.prefix.cached import DEFAULT_MAX_BYTES, PrefixCachedTokenizer

__all__ = ["DEFAULT_MAX_BYTES", "PrefixCacheStats", "PrefixCachedTokenizer"]

_LAZY = ("DEFAULT_MAX_BYTES", "PrefixCachedTokenizer")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from dlmstore.prefix import cached

        return getattr(cached, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

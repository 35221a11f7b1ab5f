"""PrefixCachedTokenizer: a tokenizer wrapper with a whole-text (L0) and a prefix (L1) cache.

``encode(text)`` returns exactly ``tokenizer(text, add_special_tokens=...)["input_ids"]``
and does, in one pass over the UTF-8 bytes of ``text``:

1. find every cut (the end of each boundary-token occurrence, except one
   that only follows the previous cut or the start of the text, like the
   leading ``<|im_start|>`` of every chat) with one compiled regex, and feed the bytes between cuts to one incremental
   SHA-256, taking a digest at each cut and one at the end: the digest of
   every prefix costs O(len(text)) in all, not O(cuts x len(text));
2. look the whole-text digest up in L0 (a hit returns the stored ids), then
   the prefix digests from the longest down in L1;
3. tokenize only the pieces after the longest cached prefix, each piece
   once and without special tokens, and append them to the cached ids;
   ``add_special_tokens=True`` adds the tokenizer's fixed head (a BOS) once,
   in front of the first prefix, and its fixed tail (an EOS) once, at the
   end, so neither is ever duplicated at a cut;
4. store the whole result in L0 and every new prefix in L1, as slices of
   the result: each piece was tokenized once, so a miss costs O(N)
   tokenization, not O(cuts x N). Each L1 entry owns its ids (no sharing
   between entries, so evicting one frees exactly what it accounts for);
   the new entries of one call are limited to one cap's worth of bytes,
   longest prefixes first, so a text with thousands of cuts cannot build
   O(cuts x N) arrays only to evict them.

Keys are ``sha256("dlm-prefix-v1" \\0 tokenizer fingerprint \\0 add_special_tokens \\0 bytes)``;
the whole-text key appends a 0xFF byte, which never occurs in UTF-8, so it
can never equal a prefix key. SHA-256 rather than BLAKE3: it is in the
standard library and, with the SHA extensions of current x86 and ARM CPUs,
it is faster than ``hashlib.blake2b`` and a small fraction of the cost of
tokenizing the same bytes (``bench/bench_prefix.py`` times the cache, hashing
included, against the bare tokenizer).

Token ids are stored as ``array("H")`` when every id fits in 16 bits (as
for SmolLM2's 49,152 ids), else ``array("I")``. Both levels share one
memory cap and one sampled-LRU eviction (``dlmstore.prefix.lru``).

The wrapper takes a private copy of the tokenizer's `tokenizers` backend at
construction (its truncation and padding off) and encodes with it, after
checking that it gives the same ids as calling the tokenizer; later changes
to the wrapped tokenizer (added tokens, a new post-processor) are not seen.
A tokenizer whose class overrides how it encodes is called as is; one
without a `tokenizers` backend is called as is and gets L0 only.

Thread safety: one lock guards the store and the counters; hashing and
tokenizing happen outside it, so threads tokenize in parallel. Two threads
missing on the same text both tokenize it; the second insert is a no-op.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from array import array
from collections.abc import Sequence
from typing import Any

from dlmstore.fingerprint import fingerprint_tokenizer
from dlmstore.prefix.lru import SampledLRU, entry_bytes
from dlmstore.prefix.seams import SeamPlan, plan_seams
from dlmstore.prefix.stats import PrefixCacheStats

_log = logging.getLogger(__name__)

SCHEME = "dlm-prefix-v1"
DEFAULT_MAX_BYTES = 50 * 2**20
_WHOLE = b"\xff"  # never part of UTF-8: separates whole-text keys from prefix keys


class _BackendEncoder:
    """Encodes with a private copy of a `tokenizers.Tokenizer`."""

    def __init__(self, serialized: str, split_special_tokens: bool) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_str(serialized)
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self._tokenizer.encode_special_tokens = split_special_tokens

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        # encode_batch, like transformers does: it is faster than encode and releases the GIL.
        return list(self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)

    def encode_many(self, texts: Sequence[str], add_special_tokens: bool) -> list[list[int]]:
        if not texts:
            return []
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [list(e.ids) for e in encodings]


class _CallEncoder:
    """Encodes by calling the wrapped tokenizer itself."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def encode_many(self, texts: Sequence[str], add_special_tokens: bool) -> list[list[int]]:
        if not texts:
            return []
        rows = self._tokenizer(list(texts), add_special_tokens=add_special_tokens)["input_ids"]
        return [list(row) for row in rows]


class PrefixCachedTokenizer:
    """Tokenize with a whole-text cache and a cache of prefixes cut after special tokens.

    Output always equals ``tokenizer(text, add_special_tokens=...)["input_ids"]``;
    where cutting at special tokens could change tokens (see
    ``dlmstore.prefix.seams``) the prefix level is off and
    ``stats().disabled_reason`` says why.

    Example::

        cached = PrefixCachedTokenizer(tokenizer)
        ids = cached.encode(tokenizer.apply_chat_template(messages, tokenize=False),
                            add_special_tokens=False)
        print(dataclasses.asdict(cached.stats()))

    Args:
        tokenizer: a transformers tokenizer (callable, returning ``input_ids``).
        max_bytes: memory cap for both levels together (default 50 MiB).
        special_tokens: tokens to cut after; default: every added token
            marked special that is a safe cut. Each must be an added token.
        eviction_sample: entries sampled per eviction; the least recently
            used of them goes. Larger is closer to exact LRU, and slower.
        fingerprint: the tokenizer's identity for cache keys; default
            :func:`dlmstore.fingerprint.fingerprint_tokenizer` of ``tokenizer``.

    Attributes:
        tokenizer: the wrapped tokenizer.
        fingerprint: the tokenizer identity that every cache key includes.

    Raises:
        ValueError: ``max_bytes`` < 0, ``eviction_sample`` < 1, or a token in
            ``special_tokens`` that is not an added token of ``tokenizer``.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        special_tokens: Sequence[str] | None = None,
        eviction_sample: int = 16,
        fingerprint: str | None = None,
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, not {max_bytes}")
        if eviction_sample < 1:
            raise ValueError(f"eviction_sample must be >= 1, not {eviction_sample}")
        if isinstance(special_tokens, str):
            raise ValueError("special_tokens must be a sequence of tokens, not one string")
        self.tokenizer = tokenizer
        self.fingerprint = fingerprint or fingerprint_tokenizer(tokenizer)
        serialized, backend = _backend_of(tokenizer)
        random_reason = _random_reason(backend)
        self._encoder: _BackendEncoder | _CallEncoder
        if random_reason is not None:
            self._encoder = _CallEncoder(tokenizer)
            plan = SeamPlan((), (), (), (), random_reason)
        else:
            self._encoder = _choose_encoder(tokenizer, serialized, backend)
            plan = plan_seams(tokenizer, backend, self._encoder.encode_many, special_tokens)
        if plan.l1_disabled_reason is not None:
            _log.warning("prefix cache: prefix level (L1) off: %s", plan.l1_disabled_reason)
        self._plan = plan
        self._l0_enabled = random_reason is None
        self._seam_re = (
            re.compile(b"|".join(re.escape(t.encode("utf-8")) for t in plan.boundary_tokens))
            if plan.boundary_tokens
            else None
        )
        self._around = {False: ((), ()), True: (plan.head, plan.tail)}
        self._seeds = {
            add: hashlib.sha256(f"{SCHEME}\0{self.fingerprint}\0{int(add)}\0".encode())
            for add in (False, True)
        }
        self._typecode = "H" if _max_id(tokenizer) < 2**16 else _typecode_32()
        self._store = SampledLRU(max_bytes, eviction_sample)
        self._lock = threading.Lock()
        self._reset_counters()

    @property
    def boundary_tokens(self) -> tuple[str, ...]:
        """The special tokens text is cut after (empty when L1 is off)."""
        return self._plan.boundary_tokens

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``, equal to ``tokenizer(text, add_special_tokens=...)["input_ids"]``.

        Args:
            text: the text to tokenize.
            add_special_tokens: whether the tokenizer's BOS/EOS are added.

        Returns:
            A new list the caller may keep or change.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode takes one str, not {type(text).__name__}")
        add = bool(add_special_tokens)
        if not self._l0_enabled:
            ids = self._encoder.encode(text, add)
            with self._lock:
                self._misses += 1
            return ids
        data = text.encode("utf-8", "surrogatepass")
        view = memoryview(data)
        hasher = self._seeds[add].copy()
        cuts: list[int] = []
        keys: list[bytes] = []
        start = 0
        if self._seam_re is not None:
            for match in self._seam_re.finditer(data):
                if match.start() == start:
                    # A piece of nothing but this token (the text's leading "<|im_start|>",
                    # the second of two adjacent tokens): a prefix one token longer than
                    # the last is not worth an entry, and would make every chat a "hit".
                    continue
                end = match.end()
                hasher.update(view[start:end])
                keys.append(hasher.digest())
                cuts.append(end)
                start = end
        hasher.update(view[start:])
        hasher.update(_WHOLE)
        whole_key = hasher.digest()

        hit = -1
        base: array[int] | None = None
        with self._lock:
            entry = self._store.get(whole_key)
            if entry is not None:
                self._l0_hits += 1
                self._tokens_reused += len(entry.tokens)
            else:
                for i in range(len(keys) - 1, -1, -1):
                    prefix = self._store.get(keys[i])
                    if prefix is not None:
                        hit, base = i, prefix.tokens
                        break
        if entry is not None:
            return entry.tokens.tolist()  # stored arrays are never mutated: no lock needed
        if not cuts:
            ids = self._encoder.encode(text, add)
            with self._lock:
                self._store.put(whole_key, array(self._typecode, ids), 0)  # fitted: built from a list
                self._misses += 1
            return ids
        return self._encode_after(data, cuts, keys, whole_key, hit, base, add)

    def _encode_after(
        self,
        data: bytes,
        cuts: list[int],
        keys: list[bytes],
        whole_key: bytes,
        hit: int,
        base: array[int] | None,
        add: bool,
    ) -> list[int]:
        """Tokenize the pieces after cut ``hit`` (-1: from the start) and cache the new prefixes."""
        new_cuts = cuts[hit + 1 :]
        start = cuts[hit] if hit >= 0 else 0
        pieces = []
        for end in new_cuts:
            pieces.append(data[start:end].decode("utf-8", "surrogatepass"))
            start = end
        rest = data[start:].decode("utf-8", "surrogatepass")
        if rest:
            pieces.append(rest)
        piece_ids = self._encoder.encode_many(pieces, False)
        head, tail = self._around[add]
        typecode = self._typecode
        flat: list[int] = []
        ends: list[int] = []  # len(flat) at each new cut
        for ids in piece_ids:
            flat.extend(ids)
            ends.append(len(flat))
        prefix = base if base is not None else array(typecode, head)
        body = prefix + array(typecode, flat)  # a new array: cached ones are never changed
        whole = body + array(typecode, tail) if tail else body
        # New prefixes are slices of `body`, longest first, within one cap's worth of
        # bytes: more could not be kept anyway, and a text with many cuts would
        # otherwise build O(cuts x length) of arrays only to evict them.
        budget = self._store.max_bytes - entry_bytes(len(whole), whole.itemsize)
        fresh: list[tuple[bytes, array[int]]] = []
        for j in range(len(new_cuts) - 1, -1, -1):
            length = len(prefix) + ends[j]
            size = entry_bytes(length, whole.itemsize)
            if size <= budget:
                budget -= size
                fresh.append((keys[hit + 1 + j], body[:length]))
        with self._lock:
            for key, tokens in reversed(fresh):  # shortest first: the longest is the most recent
                self._store.put(key, tokens, 1)
            self._store.put(whole_key, whole, 0)
            if base is not None:
                self._l1_hits += 1
                self._tokens_reused += len(base)
            else:
                self._misses += 1
        return whole.tolist()

    def stats(self) -> PrefixCacheStats:
        """A snapshot of the counters and of the memory held."""
        with self._lock:
            hits = self._l0_hits + self._l1_hits
            calls = hits + self._misses
            store = self._store
            return PrefixCacheStats(
                hits=hits,
                misses=self._misses,
                hit_rate=hits / calls if calls else 0.0,
                l0_hits=self._l0_hits,
                l1_hits=self._l1_hits,
                entries=len(store.entries),
                l0_entries=store.per_level[0],
                l1_entries=store.per_level[1],
                memory_bytes=store.memory,
                max_bytes=store.max_bytes,
                evictions=store.evictions,
                tokens_reused=self._tokens_reused,
                l0_enabled=self._l0_enabled,
                l1_enabled=self._plan.l1_disabled_reason is None,
                disabled_reason=self._plan.l1_disabled_reason,
            )

    def clear(self) -> None:
        """Drop every cached entry and zero the counters."""
        with self._lock:
            self._store.clear()
            self._reset_counters()

    def _reset_counters(self) -> None:
        self._l0_hits = 0
        self._l1_hits = 0
        self._misses = 0
        self._tokens_reused = 0


def _backend_of(tokenizer: Any) -> tuple[str | None, dict[str, Any] | None]:
    """The serialized and parsed `tokenizers` backend of ``tokenizer``, if it has one."""
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover - transformers depends on it
        return None, None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        return None, None
    serialized = backend.to_str()
    return serialized, json.loads(serialized)


def _stock_encoding(tokenizer: Any) -> bool:
    """Whether calling ``tokenizer`` is exactly its backend's ``encode_batch`` (no override)."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    cls = type(tokenizer)
    return (
        isinstance(tokenizer, TokenizersBackend)
        and getattr(cls, "_encode_plus", None) is TokenizersBackend._encode_plus
        and getattr(cls, "__call__", None) is PreTrainedTokenizerBase.__call__  # noqa: B004 - identity, not callability
    )


def _choose_encoder(
    tokenizer: Any, serialized: str | None, backend: dict[str, Any] | None
) -> _BackendEncoder | _CallEncoder:
    """The backend copy when it provably encodes like the tokenizer, else the tokenizer itself."""
    call = _CallEncoder(tokenizer)
    if serialized is None or backend is None or not _stock_encoding(tokenizer):
        return call
    fast = _BackendEncoder(serialized, bool(getattr(tokenizer, "split_special_tokens", False)))
    added = [str(t["content"]) for t in backend.get("added_tokens") or []][:16]
    samples = ["", "Hello world", " x\n\ty  z", "中文 é \u2581", *(f"a{t} b{t}" for t in added)]
    for add in (False, True):
        if fast.encode_many(samples, add) != call.encode_many(samples, add):
            _log.warning("prefix cache: the backend copy encodes differently; calling the tokenizer instead")
            return call
    return fast


def _random_reason(backend: dict[str, Any] | None) -> str | None:
    """Why the tokenizer is random (and so uncacheable), or ``None``."""
    model = (backend or {}).get("model") or {}
    dropout = model.get("dropout")
    if dropout:
        return f"the BPE model has dropout={dropout}: its tokens are random, so nothing is cached"
    return None


def _max_id(tokenizer: Any) -> int:
    """The largest token id ``tokenizer`` can produce (2**32 - 1 when unknown)."""
    try:
        vocab = tokenizer.get_vocab()
        return max(vocab.values(), default=0)
    except Exception:  # any tokenizer without a usable vocabulary: take the wide type
        return 2**32 - 1


def _typecode_32() -> str:
    return "I" if array("I").itemsize == 4 else "L"

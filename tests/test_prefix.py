"""The prefix cache (dlmstore.prefix): L0/L1 hits, BOS/EOS, eviction, stats, threads, fallbacks.

Besides the real SmolLM2 tokenizer (byte-level BPE, ChatML specials, no
BOS) these tests build small tokenizers offline with the `tokenizers`
library, so each behaviour that matters has a tokenizer that shows it: a
SentencePiece-style Unigram with a Metaspace pre-tokenizer and a BOS head,
a byte-level BPE with BOS and EOS, and tokens with unsafe flags.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import subprocess
import sys
import threading
import tracemalloc
from array import array
from typing import Any

import pytest

from dlmstore.prefix import PrefixCachedTokenizer, PrefixCacheStats
from dlmstore.prefix import seams as seams_module
from dlmstore.prefix.lru import ENTRY_OVERHEAD, SampledLRU

from .helpers import byte_level_tokenizer, reference, sentencepiece_tokenizer


def chatml(*turns: str) -> str:
    roles = ("system", "user", "assistant")
    return "".join(
        f"<|im_start|>{roles[0] if i == 0 else roles[1 + (i - 1) % 2]}\n{t}<|im_end|>\n"
        for i, t in enumerate(turns)
    )


SYSTEM = "You are a helpful assistant. " * 20
CONVO = chatml(SYSTEM, "What is 2+2?", "4.", "And 3+3?")


# --- L0 and L1 --------------------------------------------------------------------------


def test_a_repeated_text_is_answered_whole_from_l0(smollm2_tokenizer):
    cached = PrefixCachedTokenizer(smollm2_tokenizer)
    first = cached.encode(CONVO)
    second = cached.encode(CONVO)
    assert first == second == reference(smollm2_tokenizer, CONVO)
    stats = cached.stats()
    assert (stats.misses, stats.l0_hits, stats.l1_hits) == (1, 1, 0)
    assert stats.tokens_reused == len(first)


def test_the_longest_cached_prefix_is_reused_and_only_the_rest_tokenized(smollm2_tokenizer):
    cached = PrefixCachedTokenizer(smollm2_tokenizer)
    cached.encode(chatml(SYSTEM, "What is 2+2?"))  # caches the prefix after each special token
    cached.encode(CONVO)  # longest shared prefix: through "What is 2+2?<|im_end|>"
    longest = chatml(SYSTEM, "What is 2+2?")[: -len("\n")]
    assert cached.stats().tokens_reused == len(reference(smollm2_tokenizer, longest)) == 137
    assert cached.stats().l1_hits == 1

    other = chatml(SYSTEM, "Something else entirely")  # shares only the system turn
    assert cached.encode(other) == reference(smollm2_tokenizer, other)
    system_only = chatml(SYSTEM) + "<|im_start|>"
    assert cached.stats().tokens_reused == 137 + len(reference(smollm2_tokenizer, system_only)) == 137 + 127
    assert cached.stats().l1_hits == 2


def test_a_text_ending_at_a_cached_cut_needs_no_tokenization(smollm2_tokenizer):
    cached = PrefixCachedTokenizer(smollm2_tokenizer)
    cached.encode(CONVO)
    prefix = chatml(SYSTEM)[: -len("\n")]  # ends with <|im_end|>: a cut of CONVO
    ids = cached.encode(prefix)
    assert ids == reference(smollm2_tokenizer, prefix)
    assert cached.stats().tokens_reused == len(ids)


def test_a_bos_is_added_once_however_the_text_is_cut():
    tokenizer = sentencepiece_tokenizer("always", template="<s> $A")
    bos = tokenizer.convert_tokens_to_ids("<s>")
    cached = PrefixCachedTokenizer(tokenizer)
    assert cached.stats().l1_enabled
    short, long = chatml("Be brief.", "hello world"), chatml("Be brief.", "hello world", "the answer", "why?")
    for text in (short, long, long):
        ids = cached.encode(text)
        assert ids == reference(tokenizer, text)
        assert ids.count(bos) == 1 and ids[0] == bos
    bare = cached.encode(long, add_special_tokens=False)
    assert bare == reference(tokenizer, long, add_special_tokens=False) and bos not in bare
    assert (cached.stats().l1_hits, cached.stats().l0_hits) == (1, 1)


def test_an_eos_tail_is_added_once_at_the_very_end():
    tokenizer = byte_level_tokenizer("<s> $A </s>")
    eos = tokenizer.convert_tokens_to_ids("</s>")
    cached = PrefixCachedTokenizer(tokenizer)
    cached.encode(chatml("Be brief.", "hello"))
    text = chatml("Be brief.", "hello", "world")
    ids = cached.encode(text)
    assert ids == reference(tokenizer, text)
    assert ids.count(eos) == 1 and ids[-1] == eos
    assert cached.stats().l1_hits == 1


def test_cache_keys_depend_on_add_special_tokens_and_on_the_tokenizer_fingerprint():
    tokenizer = sentencepiece_tokenizer("always")
    text = chatml("Be brief.", "hello")

    def keys(cached: PrefixCachedTokenizer) -> set[bytes]:
        return set(cached._store.entries)

    one = PrefixCachedTokenizer(tokenizer, fingerprint="sha256:one")
    one.encode(text, add_special_tokens=True)
    with_bos = keys(one)
    one.encode(text, add_special_tokens=False)
    assert one.stats().misses == 2 and keys(one) > with_bos
    two = PrefixCachedTokenizer(tokenizer, fingerprint="sha256:two")
    two.encode(text, add_special_tokens=True)
    # cuts after the 1st <|im_end|>, the 2nd <|im_start|> and the 2nd <|im_end|>, plus the whole text
    assert keys(two).isdisjoint(with_bos) and len(keys(two)) == len(with_bos) == 4


def test_the_default_fingerprint_is_the_tokenizer_fingerprint(smollm2_tokenizer):
    from dlmstore.fingerprint import fingerprint_tokenizer

    cached = PrefixCachedTokenizer(smollm2_tokenizer)
    assert cached.fingerprint == fingerprint_tokenizer(smollm2_tokenizer)
    assert cached.boundary_tokens[:3] == ("<jupyter_output>", "<jupyter_script>", "<issue_comment>")
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>"} <= set(cached.boundary_tokens)


# --- eviction and memory ------------------------------------------------------------------


def _tokens(n: int) -> array[int]:
    return array("H", range(n))


def test_eviction_removes_the_least_recently_used_entry_and_respects_the_cap():
    size = sys.getsizeof(_tokens(100)) + ENTRY_OVERHEAD
    store = SampledLRU(max_bytes=3 * size, sample=16)  # sample >= entries: exact LRU
    for key in (b"a", b"b", b"c"):
        store.put(key, _tokens(100), 1)
    assert store.get(b"a") is not None  # a is now the most recently used
    store.put(b"d", _tokens(100), 1)
    assert sorted(store.entries) == [b"a", b"c", b"d"]
    assert (store.memory, store.evictions) == (3 * size, 1)
    store.put(b"huge", _tokens(10_000), 1)  # larger than the cap: not stored, nothing evicted
    assert sorted(store.entries) == [b"a", b"c", b"d"] and store.memory == 3 * size


def test_sampled_eviction_never_evicts_the_sample_minus_one_most_recent_entries():
    size = sys.getsizeof(_tokens(10)) + ENTRY_OVERHEAD
    store = SampledLRU(max_bytes=200 * size, sample=16)
    for i in range(200):
        store.put(b"cold%d" % i, _tokens(10), 1)
    hot = [b"cold%d" % i for i in range(0, 200, 14)][:15]  # spread over the key list
    for round_ in range(400):  # touch the hot ones, so they are the 15 most recent; insert one
        for key in hot:
            assert store.get(key) is not None
        store.put(b"new%d" % round_, _tokens(10), 1)
        assert store.memory <= store.max_bytes
    assert all(key in store.entries for key in hot)
    assert store.evictions == 400 and len(store.entries) == 200 == len(store.keys)
    assert all(store.keys[e.slot] == k for k, e in store.entries.items())


def test_the_wrapper_stays_under_its_cap_and_keeps_the_text_it_just_saw(smollm2_tokenizer):
    cached = PrefixCachedTokenizer(smollm2_tokenizer, max_bytes=64 * 1024)
    peak = 0
    for i in range(60):
        text = chatml(f"System prompt {i}. " * 30, f"question {i}", f"answer {i}")
        assert cached.encode(text) == reference(smollm2_tokenizer, text)
        peak = max(peak, cached.stats().memory_bytes)
        cached.encode(text)  # the entry just stored is the most recent: an L0 hit
    stats = cached.stats()
    assert peak <= 64 * 1024 and stats.evictions > 0
    assert (stats.l0_hits, stats.l1_hits, stats.misses) == (60, 0, 60)


def test_memory_bytes_matches_what_tracemalloc_measures(smollm2_tokenizer):
    cached = PrefixCachedTokenizer(smollm2_tokenizer)
    texts = [chatml(f"System {i}. " * 20, f"question {i} " * (i % 7 + 1), "answer") for i in range(300)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for text in texts:
            cached.encode(text)
        measured = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    reported = cached.stats().memory_bytes
    assert cached.stats().entries == 300 * (5 + 1)  # 5 cuts (not the leading <|im_start|>) + L0
    assert 0.9 < measured / reported < 1.1, (measured, reported)


# --- stats and clear -----------------------------------------------------------------------


def test_stats_count_hits_misses_entries_and_exact_memory(smollm2_tokenizer):
    cached = PrefixCachedTokenizer(smollm2_tokenizer)
    assert cached.stats() == PrefixCacheStats(
        hits=0,
        misses=0,
        hit_rate=0.0,
        l0_hits=0,
        l1_hits=0,
        entries=0,
        l0_entries=0,
        l1_entries=0,
        memory_bytes=0,
        max_bytes=50 * 2**20,
        evictions=0,
        tokens_reused=0,
        l0_enabled=True,
        l1_enabled=True,
        disabled_reason=None,
    )
    text = "<|im_start|>user\nHi<|im_end|>\n"
    ids = cached.encode(text)
    assert ids == [1, 4093, 198, 26843, 2, 198]
    cached.encode(text)
    cached.encode(text + "<|im_start|>assistant\n")
    # Cuts after <|im_end|> and "\n<|im_start|>"; not after the leading <|im_start|>.
    prefixes = [[1, 4093, 198, 26843, 2], ids + [1]]
    wholes = [ids, ids + [1, 520, 9531, 198]]
    memory = sum(sys.getsizeof(array("H", t)) + ENTRY_OVERHEAD for t in prefixes + wholes)
    stats = cached.stats()
    assert dataclasses.asdict(stats) == {
        "hits": 2,
        "misses": 1,
        "hit_rate": 2 / 3,
        "l0_hits": 1,
        "l1_hits": 1,
        "entries": 4,
        "l0_entries": 2,
        "l1_entries": 2,
        "memory_bytes": memory,
        "max_bytes": 50 * 2**20,
        "evictions": 0,
        "tokens_reused": 6 + 5,
        "l0_enabled": True,
        "l1_enabled": True,
        "disabled_reason": None,
    }
    assert json.loads(json.dumps(dataclasses.asdict(stats)))["memory_bytes"] == memory


def test_clear_empties_both_levels_and_zeroes_the_counters(smollm2_tokenizer):
    cached = PrefixCachedTokenizer(smollm2_tokenizer, max_bytes=4096)
    for i in range(20):
        cached.encode(chatml(f"system {i}", "hello"))
    assert cached.stats().entries > 0 and cached.stats().evictions > 0
    cached.clear()
    assert cached.stats() == PrefixCacheStats(
        hits=0,
        misses=0,
        hit_rate=0.0,
        l0_hits=0,
        l1_hits=0,
        entries=0,
        l0_entries=0,
        l1_entries=0,
        memory_bytes=0,
        max_bytes=4096,
        evictions=0,
        tokens_reused=0,
        l0_enabled=True,
        l1_enabled=True,
        disabled_reason=None,
    )
    assert cached.encode(CONVO) == reference(smollm2_tokenizer, CONVO)
    assert cached.stats().misses == 1


# --- threads -------------------------------------------------------------------------------


def test_ten_threads_get_correct_ids_and_the_accounting_stays_consistent(smollm2_tokenizer):
    texts = [
        chatml(SYSTEM, *[f"thread {t} turn {k}" for k in range(turns)])
        for t in range(10)
        for turns in range(1, 6)
    ]
    expected = {text: reference(smollm2_tokenizer, text) for text in texts}
    cached = PrefixCachedTokenizer(smollm2_tokenizer, max_bytes=96 * 1024)  # evicts while threads run
    failures: list[str] = []
    start = threading.Barrier(10)

    def work(t: int) -> None:
        rng = random.Random(t)
        start.wait()
        for _ in range(40):
            text = rng.choice(texts)
            if cached.encode(text) != expected[text]:
                failures.append(text)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    stats = cached.stats()
    store = cached._store
    assert stats.hits + stats.misses == 400 and stats.hits > 0
    assert stats.memory_bytes == sum(e.size for e in store.entries.values()) <= 96 * 1024
    assert stats.entries == len(store.keys) == stats.l0_entries + stats.l1_entries


# --- when L1 is off -----------------------------------------------------------------------


PREPEND_FIRST = (
    'the Metaspace pre-tokenizer has prepend_scheme="first": it adds "▁" only at the start '
    "of the whole text, so a suffix tokenized on its own would gain one"
)


def test_metaspace_prepend_first_turns_l1_off_with_a_logged_reason(caplog):
    tokenizer = sentencepiece_tokenizer("first")
    with caplog.at_level(logging.WARNING, logger="dlmstore.prefix"):
        cached = PrefixCachedTokenizer(tokenizer)
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("dlmstore.prefix")]
    assert ours == [f"prefix cache: prefix level (L1) off: {PREPEND_FIRST}"]
    stats = cached.stats()
    assert (stats.l0_enabled, stats.l1_enabled, stats.disabled_reason) == (True, False, PREPEND_FIRST)
    assert cached.boundary_tokens == ()
    short, long = chatml("Be brief.", "hello"), chatml("Be brief.", "hello", "world")
    for text in (short, long, long):
        assert cached.encode(text) == reference(tokenizer, text)
    assert (cached.stats().l1_hits, cached.stats().l0_hits, cached.stats().l1_entries) == (0, 1, 0)


def test_the_probe_alone_catches_prepend_first(monkeypatch):
    monkeypatch.setattr(seams_module, "_pre_tokenizer_reason", lambda node: None)
    cached = PrefixCachedTokenizer(sentencepiece_tokenizer("first"))
    reason = cached.stats().disabled_reason
    assert (
        reason is not None
        and reason.startswith("cutting '")
        and reason.endswith("' after its special tokens changes its tokens")
    )


@pytest.mark.parametrize(
    ("token", "why"),
    [
        (
            {"content": "<sep>", "rstrip": True},
            "it swallows neighbouring whitespace (lstrip/rstrip), so its match extends across the cut",
        ),
        (
            {"content": "<sep>", "lstrip": True},
            "it swallows neighbouring whitespace (lstrip/rstrip), so its match extends across the cut",
        ),
        (
            {"content": "<sep>", "normalized": True},
            "it is matched after normalization (normalized=True), so its match can depend on the text after it",
        ),
        (
            {"content": "<sep>", "single_word": True},
            "it matches only as a whole word (single_word=True), so its match depends on the text after it",
        ),
    ],
)
def test_a_special_token_with_unsafe_flags_is_not_a_cut(token: dict[str, Any], why: str):
    from tokenizers import AddedToken

    flags = {"rstrip": False, "lstrip": False, "normalized": False, "single_word": False, **token}
    tokenizer = sentencepiece_tokenizer("always")
    tokenizer.add_tokens([AddedToken(special=True, **flags)], special_tokens=True)
    cached = PrefixCachedTokenizer(tokenizer)
    assert "<sep>" not in cached.boundary_tokens and "<|im_end|>" in cached.boundary_tokens
    assert ("<sep>", why) in cached._plan.dropped
    for text in ("a <sep>  b", chatml("x <sep>\n y", "<sep> hi"), chatml("x <sep>\n y", "<sep> hi", "z")):
        assert cached.encode(text) == reference(tokenizer, text)


def test_a_special_token_inside_another_added_token_is_not_a_cut():
    from tokenizers import AddedToken

    tokenizer = sentencepiece_tokenizer("always", extra=[AddedToken("<|im_end|>!", normalized=False)])
    cached = PrefixCachedTokenizer(tokenizer)
    assert ("<|im_end|>", "it occurs inside the added token '<|im_end|>!'") in cached._plan.dropped
    assert "<|im_start|>" in cached.boundary_tokens
    for text in (chatml("hi!", "x") + "<|im_end|>!", chatml("a", "b") + "<|im_end|>!<|im_end|>"):
        assert cached.encode(text) == reference(tokenizer, text)


def test_a_token_another_can_overlap_is_not_a_cut():
    from tokenizers import AddedToken

    tokenizer = sentencepiece_tokenizer("always", extra=[AddedToken("ab<|im", normalized=False)])
    cached = PrefixCachedTokenizer(tokenizer)
    assert ("<|im_start|>", "the added token 'ab<|im' can overlap its start and be matched instead") in (
        cached._plan.dropped
    )
    text = "xab<|im_start|>user\nhi<|im_end|>\n"
    assert cached.encode(text) == reference(tokenizer, text)


def test_split_special_tokens_turns_l1_off(smollm2_tokenizer):
    smollm2_tokenizer.split_special_tokens = True
    cached = PrefixCachedTokenizer(smollm2_tokenizer)
    assert cached.stats().disabled_reason == (
        "split_special_tokens=True: special tokens are tokenized as plain text, so they are no seams"
    )
    assert cached.encode(CONVO) == reference(smollm2_tokenizer, CONVO)


def test_bpe_dropout_turns_both_levels_off():
    tokenizer = byte_level_tokenizer()
    tokenizer.backend_tokenizer.model.dropout = 0.5
    cached = PrefixCachedTokenizer(tokenizer)
    stats = cached.stats()
    assert (stats.l0_enabled, stats.l1_enabled) == (False, False)
    assert (
        stats.disabled_reason == "the BPE model has dropout=0.5: its tokens are random, so nothing is cached"
    )
    cached.encode("hello")
    assert (cached.stats().misses, cached.stats().entries) == (1, 0)


def test_a_tokenizer_without_a_tokenizers_backend_gets_l0_only():
    class Whitespace:
        """A tokenizer without a `tokenizers` backend: ids are word lengths."""

        name_or_path = ""

        def __call__(self, text: Any, add_special_tokens: bool = True) -> dict[str, Any]:
            texts = [text] if isinstance(text, str) else text
            rows = [[len(w) for w in t.split()] for t in texts]
            return {"input_ids": rows[0] if isinstance(text, str) else rows}

        def get_vocab(self) -> dict[str, int]:
            return {"x": 100}

    cached = PrefixCachedTokenizer(Whitespace(), fingerprint="sha256:words")
    assert cached.stats().disabled_reason == (
        "the tokenizer has no `tokenizers` backend whose special-token handling can be checked"
    )
    assert cached.encode("ab cde f") == cached.encode("ab cde f") == [2, 3, 1]
    assert cached.stats().l0_hits == 1


def test_special_tokens_must_be_added_tokens(smollm2_tokenizer):
    with pytest.raises(ValueError) as info:
        PrefixCachedTokenizer(smollm2_tokenizer, special_tokens=["<|im_end|>", "</turn>"])
    assert str(info.value) == (
        "'</turn>' is not an added token of this tokenizer, so text around it can merge across it; "
        "pass only added tokens as special_tokens"
    )


def test_chosen_special_tokens_are_the_only_cuts(smollm2_tokenizer):
    cached = PrefixCachedTokenizer(smollm2_tokenizer, special_tokens=["<|im_end|>"])
    assert cached.boundary_tokens == ("<|im_end|>",)
    cached.encode(CONVO)
    assert cached.stats().l1_entries == 4  # one per <|im_end|>


def test_encode_takes_one_string(smollm2_tokenizer):
    cached = PrefixCachedTokenizer(smollm2_tokenizer)
    with pytest.raises(TypeError) as info:
        cached.encode(["a", "b"])  # type: ignore[arg-type]
    assert str(info.value) == "encode takes one str, not list"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_bytes": -1}, "max_bytes must be >= 0, not -1"),
        ({"eviction_sample": 0}, "eviction_sample must be >= 1, not 0"),
        ({"special_tokens": "<|im_end|>"}, "special_tokens must be a sequence of tokens, not one string"),
    ],
)
def test_bad_arguments_are_refused(smollm2_tokenizer, kwargs: dict[str, Any], message: str):
    with pytest.raises(ValueError) as info:
        PrefixCachedTokenizer(smollm2_tokenizer, **kwargs)
    assert str(info.value) == message


def test_a_text_with_many_cuts_keeps_its_longest_prefixes_within_the_cap(smollm2_tokenizer):
    cached = PrefixCachedTokenizer(smollm2_tokenizer, max_bytes=64 * 1024)
    docs = "".join(f"document {i} has a few words<|endoftext|>" for i in range(400))
    assert cached.encode(docs + "tail") == reference(smollm2_tokenizer, docs + "tail")
    stats = cached.stats()
    assert stats.memory_bytes <= 64 * 1024 and stats.evictions == 0  # never built more than fits
    assert (stats.l1_entries, stats.l0_entries) == (8, 1)  # the 8 longest of 400 prefixes fit
    other = docs + "another tail"
    assert cached.encode(other) == reference(smollm2_tokenizer, other)
    assert cached.stats().tokens_reused == len(reference(smollm2_tokenizer, docs))


def test_the_prefix_cache_counters_load_without_the_cache_itself() -> None:
    code = (
        "import sys; import dlmstore.prefix; from dlmstore.prefix.stats import PrefixCacheStats\n"
        "print(sorted(m for m in sys.modules if m.startswith('dlmstore.prefix.')))\n"
        "from dlmstore.prefix import DEFAULT_MAX_BYTES, PrefixCachedTokenizer\n"
        "print(PrefixCachedTokenizer.__module__, DEFAULT_MAX_BYTES)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["['dlmstore.prefix.stats']", f"dlmstore.prefix.cached {50 * 2**20}"]

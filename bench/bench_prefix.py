"""Benchmark: the prefix cache (dlmstore.prefix) against the uncached tokenizer.

Three workloads on the real SmolLM2-135M-Instruct tokenizer, each timed in
the same run against ``tokenizer(text, add_special_tokens=False)["input_ids"]``,
median of ``--repeat`` runs, the two timed alternately, text by text, so
that load from other processes falls on both alike. Every output of the cache is checked equal to
the uncached one.

1. **chat**: ``--conversations`` conversations of ``--turns`` turns share a
   ~8K-token system prompt; each turn adds a user message, renders the whole
   conversation with the chat template (``add_generation_prompt=True``) and
   tokenizes it, then adds the assistant's reply. Target: >= 5x faster.
2. **no reuse**: distinct texts, so the cache only costs: chats with their
   own system prompts (cut and inserted into L1, never reused) under the
   default cap and under a cap so small that every insert evicts, and plain
   prose without special tokens (L0 only). Target: overhead <= 10%.
3. **memory**: texts sharing a 2K-token system prompt, each with its own
   question, are encoded until the prefixes inserted (measured by an
   uncapped twin cache) reach 10x the cap. Target: ``memory_bytes`` never
   above the cap (read after every call; the store makes room before each
   insert, so no intermediate state is higher).

Texts are rendered before timing; the wrapper is built before timing (its
construction, fingerprint and probes included, is printed separately) and
is new in every repeat, so the first conversation pays its cold start.
``TOKENIZERS_PARALLELISM`` is false unless ``--parallel``, so that neither
side gets a second core from the tokenizer's thread pool.

    python bench/bench_prefix.py [--repeat 5] [--conversations 4] [--turns 20] [--check]

``--check`` exits 1 when a target is missed (off by default: the machine is shared).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one "
    "had by word but not what all were we when your can said there use an each which she do how their "
    "if will up other about out many then them these so some her would make like him into time has look "
    "two more write go see number no way could people my than first water been call who oil its now find "
    "long down day did get come made may part over new sound take only little work know place year live "
    "me back give most very after thing our just name good sentence man think say great where help through "
    "much before line right too mean old any same tell boy follow came want show also around form three "
    "small set put end does another well large must big even such because turn here why ask went men read "
    "need land different home us move try kind hand picture again change off play spell air away animal "
    "house point page letter mother answer found study still learn should America world tokenizer cache "
    "prefix model training data adapter"
).split()

CHAT_TARGET = 5.0
OVERHEAD_TARGET = 0.10
MiB = 2**20


def sentences(rng: random.Random, n: int) -> str:
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 18))]
        words[0] = words[0].capitalize()
        out.append(" ".join(words) + rng.choice([".", ".", ".", "?", "!"]))
        if rng.random() < 0.15:
            out.append("\n\n")
    return " ".join(out)


def prompt_of_tokens(tokenizer: Any, rng: random.Random, tokens: int) -> str:
    text = ""
    while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < tokens:
        text += sentences(rng, 20)
    return text


def uncached(tokenizer: Any) -> Callable[[str], list[int]]:
    return lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]


def timed_pair(
    texts: Sequence[str], baseline: Callable[[str], list[int]], make_cached: Callable[[], Any], repeat: int
) -> tuple[float, float, Any]:
    """Median seconds to encode ``texts`` uncached and cached (new cache per run), and the last cache.

    The two are timed text by text, alternately, so that load from other
    processes on a shared machine falls on both alike.
    """
    expected = [baseline(t) for t in texts]  # warm-up, and the reference outputs
    base_times, cached_times = [], []
    cache = None
    clock = time.perf_counter
    for _ in range(repeat):
        cache = make_cached()
        gc.collect()
        base_s = cached_s = 0.0
        got = []
        for text in texts:
            start = clock()
            baseline(text)
            middle = clock()
            got.append(cache.encode(text, add_special_tokens=False))
            end = clock()
            base_s += middle - start
            cached_s += end - middle
        base_times.append(base_s)
        cached_times.append(cached_s)
        if got != expected:
            raise SystemExit("error: the cache returned different ids from the uncached tokenizer")
    return statistics.median(base_times), statistics.median(cached_times), cache


def chat_texts(tokenizer: Any, system: str, conversations: int, turns: int, rng: random.Random) -> list[str]:
    texts = []
    for _ in range(conversations):
        messages = [{"role": "system", "content": system}]
        for _ in range(turns):
            messages.append({"role": "user", "content": sentences(rng, rng.randint(1, 4))})
            texts.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
            messages.append({"role": "assistant", "content": sentences(rng, rng.randint(2, 8))})
    return texts


def distinct_chats(tokenizer: Any, n: int, rng: random.Random) -> list[str]:
    texts = []
    for _ in range(n):
        messages = [{"role": "system", "content": sentences(rng, 30)}]
        for k in range(6):
            messages.append(
                {"role": ("user", "assistant")[k % 2], "content": sentences(rng, rng.randint(2, 10))}
            )
        texts.append(tokenizer.apply_chat_template(messages, tokenize=False))
    return texts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--distinct", type=int, default=150, help="texts in each no-reuse workload")
    parser.add_argument("--memory-cap-mib", type=float, default=4.0)
    parser.add_argument("--parallel", action="store_true", help="leave TOKENIZERS_PARALLELISM alone")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)
    if not args.parallel:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from dlmstore.bases import load_tokenizer, resolve_base
    from dlmstore.fingerprint import fingerprint_tokenizer
    from dlmstore.prefix import PrefixCachedTokenizer

    tokenizer = load_tokenizer(resolve_base("smollm2-135m"))
    fingerprint = fingerprint_tokenizer(tokenizer)
    start = time.perf_counter()
    PrefixCachedTokenizer(tokenizer)
    construct_s = time.perf_counter() - start
    rng = random.Random(2024)
    baseline = uncached(tokenizer)
    rows: list[tuple[str, float, float, str, str, bool]] = []

    def make(**kwargs: Any) -> Callable[[], Any]:
        return lambda: PrefixCachedTokenizer(tokenizer, fingerprint=fingerprint, **kwargs)

    # 1. multi-turn chat sharing a long system prompt
    system = prompt_of_tokens(tokenizer, rng, 8000)
    system_tokens = len(baseline(system))
    texts = chat_texts(tokenizer, system, args.conversations, args.turns, rng)
    total_tokens = sum(len(baseline(t)) for t in texts)
    base_s, cached_s, cache = timed_pair(texts, baseline, make(), args.repeat)
    speedup = base_s / cached_s
    chat = cache.stats()
    rows.append(
        (
            f"chat: {args.conversations} conversations x {args.turns} turns",
            base_s,
            cached_s,
            f"{speedup:.1f}x faster",
            f">= {CHAT_TARGET:.0f}x",
            speedup >= CHAT_TARGET,
        )
    )

    # 2. no reuse
    distinct = distinct_chats(tokenizer, args.distinct, rng)
    distinct_tokens = sum(len(baseline(t)) for t in distinct)
    prose = [sentences(rng, 60) for _ in range(args.distinct)]
    no_reuse = [
        ("no reuse: distinct chats, default cap", distinct, make()),
        ("no reuse: distinct chats, 256 KiB cap", distinct, make(max_bytes=256 * 1024)),
        ("no reuse: plain prose (L0 only)", prose, make()),
    ]
    evicting = None
    for label, workload, factory in no_reuse:
        base_s, cached_s, cache = timed_pair(workload, baseline, factory, args.repeat)
        overhead = cached_s / base_s - 1
        rows.append(
            (
                label,
                base_s,
                cached_s,
                f"{overhead:+.1%} overhead",
                f"<= {OVERHEAD_TARGET:.0%}",
                overhead <= OVERHEAD_TARGET,
            )
        )
        if "KiB" in label:
            evicting = cache.stats()
    # For information: against the bare `tokenizers` backend, which the cache itself calls,
    # so that the per-call work transformers adds around it cannot hide the cache's own cost.
    from tokenizers import Tokenizer

    bare = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    base_s, cached_s, _ = timed_pair(
        distinct, lambda text: bare.encode_batch([text], add_special_tokens=False)[0].ids, make(), args.repeat
    )
    info = (
        f"{'  (info) same, vs bare tokenizers backend':<42} {base_s:>8.3f} s {cached_s:>8.3f} s  "
        f"{cached_s / base_s - 1:+.1%} overhead"
    )

    # 3. memory under the cap while inserting 10x the cap's worth of prefixes
    cap = int(args.memory_cap_mib * MiB)
    capped = PrefixCachedTokenizer(tokenizer, max_bytes=cap, fingerprint=fingerprint)
    twin = PrefixCachedTokenizer(tokenizer, max_bytes=2**62, fingerprint=fingerprint)
    shared = prompt_of_tokens(tokenizer, rng, 2000)
    peak = encoded = checked = 0
    start = time.perf_counter()
    while twin.stats().memory_bytes < 10 * cap:
        messages = [{"role": "system", "content": shared}, {"role": "user", "content": sentences(rng, 2)}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = capped.encode(text, add_special_tokens=False)
        twin.encode(text, add_special_tokens=False)
        if encoded % 10 == 0:
            if ids != baseline(text):
                raise SystemExit("error: the capped cache returned different ids from the uncached tokenizer")
            checked += 1
        encoded += 1
        peak = max(peak, capped.stats().memory_bytes)
    memory_s = time.perf_counter() - start
    inserted = twin.stats().memory_bytes
    final = capped.stats()

    print(
        f"prefix cache benchmark: SmolLM2-135M-Instruct tokenizer, median of {args.repeat} runs, "
        f"TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM', '(unset)')}"
    )
    print(f"wrapper construction (fingerprint, backend copy, probes): {construct_s * 1000:.0f} ms")
    print()
    print(f"{'workload':<42} {'uncached':>10} {'cached':>10}  {'result':<18} {'target':<8} met")
    for label, base_s, cached_s, result, target, met in rows:
        print(
            f"{label:<42} {base_s:>8.3f} s {cached_s:>8.3f} s  {result:<18} {target:<8} {'yes' if met else 'NO'}"
        )
    print(info)
    memory_met = peak <= cap
    print(
        f"{'memory: ' + format(inserted / cap, '.1f') + 'x the cap inserted':<42} "
        f"{'':>10} {'':>10}  {'peak ' + format(peak / cap, '.2%') + ' of cap':<18} {'<= cap':<8} "
        f"{'yes' if memory_met else 'NO'}"
    )
    print()
    print(
        f"chat: system prompt {system_tokens} tokens; {len(texts)} encodes, {total_tokens} tokens in all; "
        f"hit rate {chat.hit_rate:.0%} ({chat.l1_hits} L1, {chat.l0_hits} L0), "
        f"{chat.tokens_reused / total_tokens:.1%} of tokens reused; {chat.memory_bytes / MiB:.1f} MiB held"
    )
    print(
        f"no reuse: {len(distinct)} chats, {distinct_tokens} tokens; with the 256 KiB cap "
        f"{evicting.evictions if evicting else 0} evictions, "
        f"{(evicting.tokens_reused if evicting else 0) / distinct_tokens:.2%} of tokens reused"
    )
    print(
        f"memory: cap {cap / MiB:.1f} MiB; {encoded} texts sharing a 2K-token system prompt inserted "
        f"{inserted / MiB:.1f} MiB of entries (uncapped twin); peak memory_bytes {peak / MiB:.3f} MiB, "
        f"final {final.entries} entries, {final.evictions} evictions, hit rate {final.hit_rate:.0%}; "
        f"{checked} outputs checked against the tokenizer; {memory_s:.1f} s"
    )
    print("outputs: identical to the uncached tokenizer in every workload")
    all_met = all(row[-1] for row in rows) and memory_met
    return 1 if args.check and not all_met else 0


if __name__ == "__main__":
    sys.exit(main())

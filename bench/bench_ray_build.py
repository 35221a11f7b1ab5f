"""Benchmark: `--engine ray` (a local Ray, N workers) against the local engine, side by side.

Builds the same synthetic pretrain corpus with both engines in one run,
with the SmolLM2 tokenizer: one Ray build that starts its workers (cold),
then ``--repeat`` pairs of a local build and a Ray build, alternated so a
drift of the machine's speed hits both engines alike (on a noisy 2-core
machine the same build varies by +-20%). It prints each engine's median
tokens per second and the median of the pairs' ratios (target: Ray >= 85%
of local with 2 workers on a 2-core machine, i.e. Ray's overhead is
bounded), the cold build's ratio with and without ``ray.init``, and the
driver's sequential phase, which docs/datasets.md scales to a cluster.
Every output is compared file by file with the first (they must be
byte-identical).

    python bench/bench_ray_build.py [--tokens 50M] [--workers 2] [--block-docs 1024] [--repeat 3] [--check]

``--tokens`` sets the corpus size (default 50M, the size the target is
stated for; 2M proves the script in a minute). ``--check`` exits 1 when
the median ratio misses the target.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

from benchlib import stdlib_lines

TARGET = 0.85
CHARS_PER_TOKEN = 3.6  # SmolLM2 on English prose and code, measured on this corpus


def parse_size(text: str) -> int:
    units = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def write_corpus(path: Path, tokens: int) -> int:
    """A JSONL corpus of about ``tokens`` tokens: documents of 20-200 stdlib source lines."""
    lines = stdlib_lines(400_001)
    want = int(tokens * CHARS_PER_TOKEN)
    written = docs = 0
    start = 0
    with open(path, "w", encoding="utf-8") as out:
        while written < want:
            size = 20 + (docs * 37) % 180
            text = "\n".join(lines[start : start + size])
            start = (start + size) % (len(lines) - 200)
            out.write(json.dumps({"text": text}) + "\n")
            written += len(text)
            docs += 1
    return docs


def build(corpus: Path, out: Path, engine: Any, encoder: Any) -> tuple[float, Any]:
    from dlmstore.datasets.build.local import iter_local_texts
    from dlmstore.datasets.build.pretrain import build_pretrain_cache

    start = time.perf_counter()
    result = build_pretrain_cache(
        iter_local_texts(corpus), out, tokenizer=encoder, val_frac=0.01, name="bench", engine=engine
    )
    return time.perf_counter() - start, result


def driver_read(corpus: Path, block_docs: int) -> float:
    """Seconds the Ray driver's sequential part takes alone: read the input, cut and hash blocks."""
    from dlmstore.datasets.build.blocks import block_key
    from dlmstore.datasets.build.local import iter_local_texts
    from dlmstore.datasets.build.output import batched

    start = time.perf_counter()
    for block in batched(iter_local_texts(corpus), block_docs):
        block_key({"kind": "pretrain"}, block)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=parse_size, default=parse_size("50M"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--block-docs", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3, help="local/Ray pairs, alternated")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()

    from dlmstore.datasets.build.ray_build import RayEngine, ray_session
    from dlmstore.datasets.build.recipes import encoder_for_base
    from dlmstore.datasets.meta import sha256_file

    encoder = encoder_for_base("smollm2-135m")
    with tempfile.TemporaryDirectory(prefix="dlm-bench-ray-") as tmp:
        root = Path(tmp)
        corpus = root / "corpus.jsonl"
        docs = write_corpus(corpus, args.tokens)
        read_s = driver_read(corpus, args.block_docs)
        text_mb = corpus.stat().st_size / 1e6

        def hashes(name: str) -> dict[str, str]:
            d = root / name
            return {str(p.relative_to(d)): sha256_file(p) for p in sorted(d.rglob("*")) if p.is_file()}

        # Ray started as `dlm data build --engine ray --workers N` starts it (N CPUs, one
        # tokenizer thread per task). The first Ray build starts its workers; then local
        # and Ray builds alternate, so a drift of the machine's speed hits both alike.
        engine = RayEngine(workers=args.workers, block_docs=args.block_docs)
        local_times: list[float] = []
        ray_times: list[float] = []
        start = time.perf_counter()
        with ray_session(engine):
            init_s = time.perf_counter() - start
            cold_s, _ = build(corpus, root / "ray", engine, encoder)
            expected = hashes("ray")
            same = True
            for _ in range(args.repeat):
                seconds, local = build(corpus, root / "local", None, encoder)
                local_times.append(seconds)
                same = same and hashes("local") == expected
                shutil.rmtree(root / "local")
                seconds, _ = build(corpus, root / "warm", engine, encoder)
                ray_times.append(seconds)
                same = same and hashes("warm") == expected
                shutil.rmtree(root / "warm")

    tokens = sum(s.tokens for s in local.splits.values())
    local_s, warm_s = statistics.median(local_times), statistics.median(ray_times)
    ratios = [lo / ra for lo, ra in zip(local_times, ray_times, strict=True)]
    local_rate, cold_rate, warm_rate = tokens / local_s, tokens / cold_s, tokens / warm_s
    print(
        f"corpus: {tokens:,} tokens in {docs:,} documents; {args.workers} Ray workers, blocks of {args.block_docs}"
    )
    print(f"local engine:          {local_s:8.2f} s  {local_rate:12,.0f} tokens/s  (median of {args.repeat})")
    print(
        f"ray engine (warm):     {warm_s:8.2f} s  {warm_rate:12,.0f} tokens/s  (median of {args.repeat}, workers up)"
    )
    print(
        f"ray engine (cold):     {cold_s:8.2f} s  {cold_rate:12,.0f} tokens/s  (first build: workers start inside)"
    )
    print(f"ray.init (not counted): {init_s:7.2f} s")
    print(
        f"ratio ray/local: warm {statistics.median(ratios):.2f} (median of the {args.repeat} side-by-side pairs: "
        f"{', '.join(f'{r:.2f}' for r in ratios)}), cold {cold_rate / local_rate:.2f}, "
        f"cold with ray.init {tokens / (cold_s + init_s) / local_rate:.2f} (target >= {TARGET})"
    )
    print(f"per worker (warm): {warm_rate / args.workers:,.0f} tokens/s; outputs byte-identical: {same}")
    print(
        f"driver read + block hashing alone: {read_s:.2f} s = {tokens / read_s:,.0f} tokens/s "
        f"({text_mb / read_s:,.0f} MB/s of JSONL; the one sequential phase)"
    )
    if not same:
        return 1
    if args.check and statistics.median(ratios) < TARGET:
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: `--engine ray` (a local Ray of 1, 2 and 4 workers) beside the local engine.

Builds one synthetic JSONL pretrain corpus the way ``dlm data build
pretrain --from FILE`` does (a :class:`LocatedInput`: the Ray workers read
their own byte ranges of the file, the driver plans and commits), with the
SmolLM2 tokenizer. For each worker count it starts a local Ray with that
many CPUs, makes one build that starts the workers (cold), then
``--repeat`` pairs of a local build and a Ray build, alternated so a drift
of the machine's speed hits both engines alike. It prints each one's
tokens per second, the ratio to the local engine, and the bytes that
passed through the driver as a share of the input (goal: <= 1%), with the
tokenizer, sent once per build, shown apart. One more Ray build reads the
input on the driver (an iterator of texts, the path a stream or a shuffle
buffer takes) for comparison. Every output is compared file by file with
the local engine's (they must be byte-identical).

    python bench/bench_ray_build.py [--tokens 20M] [--workers 1,2,4] [--repeat 1] [--range-bytes 1M]

On a 2-core machine 4 workers are 4 tokenizing processes on 2 cores: the
figure shows what oversubscribing costs, not what 4 nodes would give.
Exits 1 when an output differs or the driver's share misses 1% (the
tokenizer alone is 1.56 MB: 1% of a 156 MB input).
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

GOAL = 0.01
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


def build(source: Any, out: Path, engine: Any, encoder: Any) -> tuple[float, Any]:
    from dlmstore.datasets.build.pretrain import build_pretrain_cache

    if out.exists():
        shutil.rmtree(out)
    start = time.perf_counter()
    result = build_pretrain_cache(source, out, tokenizer=encoder, val_frac=0.01, name="bench", engine=engine)
    return time.perf_counter() - start, result


def hashes(directory: Path) -> dict[str, str]:
    from dlmstore.datasets.meta import sha256_file

    return {
        str(p.relative_to(directory)): sha256_file(p) for p in sorted(directory.rglob("*")) if p.is_file()
    }


def same(directory: Path, expected: dict[str, str], what: str) -> bool:
    """Whether ``directory`` holds the expected files; names what differs when it does not."""
    found = hashes(directory)
    if found != expected:
        differing = sorted(k for k in {*found, *expected} if found.get(k) != expected.get(k))
        print(f"{what}: differs from the local engine in {', '.join(differing)}")
    return found == expected


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=parse_size, default=parse_size("20M"))
    parser.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=1, help="local/Ray pairs per worker count, alternated")
    parser.add_argument("--range-bytes", type=parse_size, default=1 << 20)
    args = parser.parse_args()

    from dlmstore.datasets.build.local import LocatedInput, iter_local_texts
    from dlmstore.datasets.build.ray_build import RayEngine
    from dlmstore.datasets.build.recipes import encoder_for_base

    encoder = encoder_for_base("smollm2-135m")
    ok = met = True
    with tempfile.TemporaryDirectory(prefix="dlm-bench-ray-") as tmp:
        root = Path(tmp)
        corpus = root / "corpus.jsonl"
        docs = write_corpus(corpus, args.tokens)
        located = LocatedInput(str(corpus))
        local_s, local = build(located, root / "local", None, encoder)
        expected = hashes(root / "local")
        tokens = sum(s.tokens for s in local.splits.values())
        size = corpus.stat().st_size
        print(
            f"corpus: {tokens:,} tokens in {docs:,} documents, {size / 1e6:,.1f} MB of JSONL; {os.cpu_count()} CPUs"
        )
        print(f"{'engine':<28}{'seconds':>9}{'tokens/s':>13}{'vs local':>10}   driver bytes (share of input)")
        print(f"{'local (first)':<28}{local_s:9.2f}{tokens / local_s:13,.0f}{1:10.2f}   -")
        for workers in [int(w) for w in args.workers.split(",")]:
            engine = RayEngine(workers=workers, range_bytes=args.range_bytes)
            with engine.session():
                cold_s, result = build(located, root / "ray", engine, encoder)
                ok &= same(root / "ray", expected, f"ray, {workers} workers (cold)")
                pairs = []
                for _ in range(args.repeat):
                    lo_s, _ = build(located, root / "local", None, encoder)
                    ok &= same(root / "local", expected, "local")
                    ra_s, result = build(located, root / "ray", engine, encoder)
                    ok &= same(root / "ray", expected, f"ray, {workers} workers")
                    pairs.append((lo_s, ra_s))
                if workers == 2:
                    driver_s, by_driver = build(iter_local_texts(corpus), root / "driver", engine, encoder)
                    ok &= same(root / "driver", expected, "ray, the driver reading")
            moved = result.driver_bytes
            rest = moved.read + moved.sent + moved.received - moved.tokenizer
            share = (rest + moved.tokenizer) / moved.input
            met &= share <= GOAL
            if share > GOAL:
                print(
                    f"ray, {workers} workers: {share:.3%} of the input through the driver, above {GOAL:.0%}"
                )
            print(
                f"{f'ray, {workers} workers (cold)':<28}{cold_s:9.2f}{tokens / cold_s:13,.0f}{local_s / cold_s:10.2f}"
            )
            warm = statistics.median(ra for _, ra in pairs)
            ratio = statistics.median(lo / ra for lo, ra in pairs)
            print(
                f"{f'ray, {workers} workers (warm)':<28}{warm:9.2f}{tokens / warm:13,.0f}{ratio:10.2f}   "
                f"{moved.read + moved.sent + moved.received:,} ({share:.3%}): tokenizer {moved.tokenizer:,} once, "
                f"then {rest:,} ({rest / moved.input:.3%}): sent {moved.sent - moved.tokenizer:,}, "
                f"received {moved.received:,}, read {moved.read:,}"
            )
            if workers == 2:
                d = by_driver.driver_bytes
                print(
                    f"{'ray, 2, driver reads input':<28}{driver_s:9.2f}{tokens / driver_s:13,.0f}"
                    f"{local_s / driver_s:10.2f}   {d.read + d.sent + d.received:,} "
                    f"({(d.read + d.sent + d.received) / d.input:.1%}): read {d.read:,}, sent {d.sent:,}, "
                    f"received {d.received:,}"
                )
    print(f"outputs byte-identical: {ok}; driver bytes within {GOAL:.0%} of the input: {met}")
    return 0 if ok and met else 1


if __name__ == "__main__":
    raise SystemExit(main())

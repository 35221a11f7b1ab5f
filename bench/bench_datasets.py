"""Benchmark: token datasets against their bare-minimum baselines, measured in the same run.

Four figures, each a ratio to a baseline timed in the same process on the
same data (wall time on a shared machine is noisy; ratios of interleaved
medians much less so):

* build  -- ``build_pretrain_cache`` vs pure batch tokenization of the same
  documents in the same batches (the builder's overhead; target <= 10%);
* read   -- ``PretrainTokenStreamDataset.get_batch`` (B=64, T=2048) from a
  multi-shard dataset vs raw ``np.memmap`` slicing of the same windows into
  a preallocated array (target >= 80% of its throughput);
* pack   -- packing 1M tokens (doc ids + cross-document -100 labels) with
  ``MemoryMappedDataset(pack_sequences=True)`` and with the packing
  functions alone vs a per-token Python loop (target >= 50x). The loop
  reads numpy scalars, the fastest of the three loops tried: one over
  ``tolist()`` pays more converting its lists back to tensors, one over a
  tensor's elements is slower still;
* rss    -- iterating every window of a > 2 GiB dataset keeps the process
  RSS under 500 MiB (and, for contrast, the same pass without page release).

Synthetic shards are written to a temporary directory and deleted after.

    python bench/bench_datasets.py [--only build,read,pack,rss] [--rss-gib 2.1] [--check]

``--check`` exits 1 when a target is missed (off by default).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np
import torch
from benchlib import median_seconds

from dlmstore.datasets.build.writers import StreamingFile, write_npy
from dlmstore.datasets.formats import MIB, doc_index_name, shard_name
from dlmstore.datasets.meta import FORMAT, FileEntry, write_meta

TARGETS = {"build": 0.10, "read": 0.80, "pack": 50.0, "rss_mib": 500.0}


def synthetic_dataset(root: Path, shards: int, shard_tokens: int, vocab: int = 49152, eos: int = 2) -> Path:
    """A pretrain dataset of random tokens (documents of 500 tokens), with indexes and a real meta.json."""
    train = root / "train"
    train.mkdir(parents=True)
    generator = np.random.default_rng(0)  # bench data only; builders draw from torch
    entries = []
    for index in range(shards):
        tokens = generator.integers(3, vocab, size=shard_tokens, dtype=np.uint16)
        ends = np.arange(499, shard_tokens, 500)
        tokens[ends] = eos
        starts = np.concatenate([[0], ends[ends + 1 < shard_tokens] + 1]).astype(np.int64)
        handle = StreamingFile(train / shard_name(index))
        handle.write(tokens)
        sha = handle.commit()
        entries.append(
            FileEntry(
                "train",
                "tokens",
                f"train/{shard_name(index)}",
                index,
                index * shard_tokens,
                shard_tokens,
                len(starts),
                handle.bytes,
                sha,
            )
        )
        size, index_sha = write_npy(train / doc_index_name(index), starts)
        entries.append(
            FileEntry(
                "train",
                "doc_index",
                f"train/{doc_index_name(index)}",
                index,
                index * shard_tokens,
                0,
                len(starts),
                size,
                index_sha,
            )
        )
    meta = {
        "format": FORMAT,
        "kind": "pretrain",
        "built": True,
        "dataset_name": "synthetic",
        "dataset_config": None,
        "split_rule": "synthetic",
        "seed": 0,
        "token_dtype": "uint16",
        "byte_order": "little",
        "tokenizer_name": "none",
        "tokenizer_sha256": "sha256:" + "0" * 64,
        "vocab_size": vocab,
        "special_token_ids": {"eos": eos},
        "eos_token_id": eos,
        "totals": {},
        "streaming": False,
        "shard_bytes": shard_tokens * 2,
        "shard_tokens": shard_tokens,
        "budgets": {},
        "files": [dataclasses.asdict(e) for e in entries],
    }
    write_meta(root, meta)
    return root


def bench_build(repeat: int, max_docs: int) -> float:
    from dlmstore.bases import load_tokenizer, resolve_base
    from dlmstore.datasets.build.encoding import TextEncoder
    from dlmstore.datasets.build.pretrain import build_pretrain_cache

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(stdlib.rglob("*.py"))[:max_docs]]
    encoder = TextEncoder(load_tokenizer(resolve_base("smollm2-135m")))
    _ = encoder.tokenizer_sha256
    batch = 512
    tokens = sum(len(ids) for ids in encoder.encode_texts(texts))

    def baseline() -> None:
        for i in range(0, len(texts), batch):
            encoder.encode_texts(texts[i : i + batch])

    with tempfile.TemporaryDirectory() as tmp:

        def ours() -> None:
            build_pretrain_cache(
                texts,
                Path(tmp) / "ds",
                tokenizer=encoder,
                val_frac=0.01,
                shard_bytes=4 * MIB,
                batch_docs=batch,
                seed=0,
            )

        ours()  # warm-up
        baseline()
        base_times, our_times = [], []
        for _ in range(repeat):  # interleaved, so drift on a shared machine hits both
            base_times.append(median_seconds(baseline, 1))
            our_times.append(median_seconds(ours, 1))
    base, mine = statistics.median(base_times), statistics.median(our_times)
    overhead = mine / base - 1
    print(f"build: {len(texts)} docs, {tokens:,} tokens, batches of {batch}, median of {repeat}")
    print(f"  batch tokenization (baseline): {base:.3f} s  {tokens / base / 1e6:.2f} M tok/s")
    print(f"  build_pretrain_cache:          {mine:.3f} s  {tokens / mine / 1e6:.2f} M tok/s")
    print(
        f"  overhead: {overhead:+.1%}  (target <= {TARGETS['build']:.0%}: "
        f"{'met' if overhead <= TARGETS['build'] else 'NOT met'})"
    )
    return overhead


def bench_read(tmp: Path, repeat: int, batches: int) -> float:
    from dlmstore.datasets.read.pretrain_dataset import PretrainTokenStreamDataset

    B, T = 64, 2048
    root = synthetic_dataset(tmp / "read", shards=8, shard_tokens=16 * MIB)  # 8 x 32 MiB
    dataset = PretrainTokenStreamDataset(root / "train", T=T)
    maps = [np.memmap(root / "train" / shard_name(i), dtype="<u2", mode="r") for i in range(8)]
    for m in maps:
        int(m[::2048].sum())  # warm the page cache for both
    generator = torch.Generator().manual_seed(0)
    windows = []
    for _ in range(batches):  # the same kind of windows, drawn outside the timed loop
        positions = torch.randint(0, dataset.windows, (B,), generator=generator).numpy()
        shards = np.searchsorted(dataset._cumulative, positions, side="right")
        windows.append(list(zip(shards.tolist(), (positions - dataset._first[shards]).tolist(), strict=True)))
    out = np.empty((B, T + 1), dtype=np.int64)

    def baseline() -> None:
        for batch in windows:
            for row, (shard, offset) in enumerate(batch):
                out[row] = maps[shard][offset : offset + T + 1]

    views = [np.asarray(m).view(np.ndarray) for m in maps]

    def plain() -> None:  # stricter: plain ndarray views, no np.memmap __getitem__ overhead
        for batch in windows:
            for row, (shard, offset) in enumerate(batch):
                out[row] = views[shard][offset : offset + T + 1]

    def ours() -> None:
        g = torch.Generator().manual_seed(0)
        for _ in range(batches):
            dataset.get_batch(B=B, generator=g)

    ours()
    baseline()
    rounds = [
        (median_seconds(baseline, 1), median_seconds(plain, 1), median_seconds(ours, 1))
        for _ in range(repeat)
    ]
    base, strict, mine = (statistics.median(r[k] for r in rounds) for k in range(3))
    ratio = base / mine
    print(f"read: B={B} T={T}, 8 shards x 32 MiB, {batches} batches, median of {repeat}, warm cache")
    print(f"  np.memmap slicing into a preallocated array (baseline): {batches / base:8.1f} batches/s")
    print(f"  plain ndarray slicing, same windows (stricter):         {batches / strict:8.1f} batches/s")
    print(
        f"  PretrainTokenStreamDataset.get_batch:                    {batches / mine:8.1f} batches/s"
        f"  ({strict / mine:.0%} of the stricter one)"
    )
    print(
        f"  throughput: {ratio:.0%} of the baseline  (target >= {TARGETS['read']:.0%}: "
        f"{'met' if ratio >= TARGETS['read'] else 'NOT met'})"
    )
    return ratio


def packed_by_loop(tokens: Any, eos: int) -> dict[str, torch.Tensor]:
    """The per-token Python loop producing the same item: running doc id, -100 across documents."""
    labels, doc_ids, doc = [], [], 0
    for i in range(len(tokens) - 1):
        doc_ids.append(doc)
        following = doc + 1 if int(tokens[i]) == eos else doc
        labels.append(int(tokens[i + 1]) if following == doc else -100)
        doc = following
    return {
        "input_ids": torch.from_numpy(tokens[:-1].astype(np.int64)),
        "labels": torch.from_numpy(np.array(labels, dtype=np.int64)),
        "doc_ids": torch.from_numpy(np.array(doc_ids, dtype=np.int64)),
    }


def bench_pack(tmp: Path, repeat: int) -> float:
    from dlmstore.datasets.read.mmap_dataset import MemoryMappedDataset
    from dlmstore.datasets.read.packing import boundaries_from_eos, pack_window

    n, seq = 1 << 20, 2049
    root = synthetic_dataset(tmp / "pack", shards=1, shard_tokens=n)
    tokens = np.fromfile(root / "train" / shard_name(0), dtype="<u2")
    dataset = MemoryMappedDataset(root / "train", seq, "shard_*.bin", pack_sequences=True)
    searched = MemoryMappedDataset(root / "train", seq, "shard_*.bin", pack_sequences=True, starts_bytes=0)
    assert dataset.doc_indexes is not None
    windows = len(dataset)

    def loop() -> None:
        for i in range(windows):
            packed_by_loop(tokens[i * seq : (i + 1) * seq], 2)

    def functions() -> None:
        whole = tokens[: windows * seq].astype(np.int64)
        pack_window(whole, boundaries_from_eos(whole, 2))

    def items() -> None:
        for i in range(windows):
            dataset[i]

    def searched_items() -> None:
        for i in range(windows):
            searched[i]

    functions()  # warm-up
    items()
    searched_items()
    rounds: list[tuple[float, ...]] = []
    for _ in range(repeat):  # interleaved rounds: machine load hits all alike
        rounds.append(
            (
                median_seconds(loop, 1),
                median_seconds(functions, 1),
                median_seconds(items, 1),
                median_seconds(searched_items, 1),
            )
        )
    loop_s, functions_s, items_s, searched_s = (statistics.median(r[k] for r in rounds) for k in range(4))
    print(f"pack: {windows * seq:,} tokens ({windows} windows of {seq}), median of {repeat}")
    print(f"  per-token Python loop (baseline):            {loop_s * 1e3:9.1f} ms")
    print(
        f"  packing functions, EOS scan, whole array:    {functions_s * 1e3:9.1f} ms  {loop_s / functions_s:6.0f}x"
    )
    print(
        f"  items, index searched per item (huge data):  {searched_s * 1e3:9.1f} ms  {loop_s / searched_s:6.0f}x"
    )
    ratio = loop_s / items_s
    print(
        f"  MemoryMappedDataset items (document index):  {items_s * 1e3:9.1f} ms  {ratio:6.0f}x  "
        f"(target >= {TARGETS['pack']:.0f}x: {'met' if ratio >= TARGETS['pack'] else 'NOT met'})"
    )
    return ratio


def rss_mib() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss) / MIB


def rss_child(path: str, release: str) -> None:
    """Iterate every window of the dataset at ``path``; print peak and starting RSS (MiB)."""
    from dlmstore.datasets.read.mmap_dataset import MemoryMappedDataset

    dataset = MemoryMappedDataset(
        path,
        2049,
        "shard_*.bin",
        pack_sequences=True,
        release_bytes=None if release == "none" else int(release),
    )
    before = peak = rss_mib()
    start = time.perf_counter()
    for i in range(len(dataset)):
        dataset[i]
        if i % 2048 == 0:
            peak = max(peak, rss_mib())
    peak = max(peak, rss_mib())
    print(f"{len(dataset)} {time.perf_counter() - start:.2f} {before:.1f} {peak:.1f}")


def bench_rss(tmp: Path, gib: float) -> float:
    import subprocess

    from dlmstore.datasets.formats import RELEASE_BYTES

    shard_tokens = 64 * MIB  # 128 MiB shards, as build_pretrain_cache writes by default
    shards = max(1, int(np.ceil(gib * 1024 / 128)))
    start = time.perf_counter()
    root = synthetic_dataset(tmp / "rss", shards=shards, shard_tokens=shard_tokens)
    size = sum(p.stat().st_size for p in (root / "train").glob("*.bin"))
    print(
        f"rss: {shards} shards, {size / (1 << 30):.2f} GiB written in {time.perf_counter() - start:.1f} s; "
        "each pass in a fresh process (torch imported)"
    )
    results = {}
    runs = (
        (f"page release every {RELEASE_BYTES // MIB} MiB", str(RELEASE_BYTES)),
        ("plain mmap, no release", "none"),
    )
    for label, release in runs:
        out = subprocess.run(
            [sys.executable, __file__, "--rss-child", str(root / "train"), release],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        windows, seconds, before, peak = int(out[0]), float(out[1]), float(out[2]), float(out[3])
        results[label] = peak
        print(
            f"  {label:<28} {windows:,} packed windows in {seconds:5.1f} s, "
            f"peak RSS {peak:7.1f} MiB (after imports {before:.1f} MiB)"
        )
    peak = results[runs[0][0]]
    print(f"  target RSS < {TARGETS['rss_mib']:.0f} MiB: {'met' if peak < TARGETS['rss_mib'] else 'NOT met'}")
    return peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", default="build,read,pack,rss")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--build-docs", type=int, default=1500, help="stdlib modules tokenized by the build bench"
    )
    parser.add_argument("--read-batches", type=int, default=200)
    parser.add_argument("--rss-gib", type=float, default=2.1)
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    parser.add_argument("--rss-child", nargs=2, metavar=("DIR", "RELEASE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        rss_child(*args.rss_child)
        return 0
    chosen = set(args.only.split(","))
    missed = []
    home = tempfile.mkdtemp(prefix="bench-datasets-")
    try:
        tmp = Path(home)
        if "build" in chosen and bench_build(args.repeat, args.build_docs) > TARGETS["build"]:
            missed.append("build")
        if "read" in chosen and bench_read(tmp, args.repeat, args.read_batches) < TARGETS["read"]:
            missed.append("read")
        if "pack" in chosen and bench_pack(tmp, args.repeat) < TARGETS["pack"]:
            missed.append("pack")
        if "rss" in chosen and bench_rss(tmp, args.rss_gib) >= TARGETS["rss_mib"]:
            missed.append("rss")
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if missed:
        print(f"targets missed: {', '.join(missed)}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())

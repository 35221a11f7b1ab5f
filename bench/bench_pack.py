"""`dlm pack` and `dlm unpack` of a store holding the 13K-file tree's cache, beside `tar --zstd` (issue 39).

The store: a document whose ``training.sources`` is the stdlib's ``**/*.py``
(~13K files, the tree the other benches use), trained one step on the
tests' tiny random SmolLM2-shaped model (its tokenizer is SmolLM2's), so it
holds the whole tree's token cache and an adapter for a pack to carry.
It is made once under ``--work`` and reused.

Printed, side by side from one run (medians of ``--repeat``, whole
processes, each timed with ``wait4``):

* ``dlm pack --include-cache`` against ``tar --zstd -cf`` of the same store
  folder (zstd's default level 3, one thread), with both archives' sizes:
  the target is 1.3x;
* ``dlm unpack`` of that pack into a fresh home against ``tar --zstd -xf``
  into a fresh folder: the target is 1.3x;
* the limits on this machine: reading and hashing (sha256) the store's
  files on one core, and zstd alone at the pack's level over the same
  bytes (the threads the pack uses), in this process;
* peak RSS of `dlm pack` and `dlm unpack` of the whole store and of the
  same store packed without its cache (its token segments, 182 MB, left
  out): flat in the pack's size means the two are close. (Measured before
  the limits: a child's peak RSS on Linux starts from its parent's at the
  fork, so this process stays small until then.)

    python bench/bench_pack.py [--work /tmp/dlm-bench-pack] [--repeat 3]

On this 2-core machine (``--repeat 5``)::

    store: 112 files, 320.2 MB (/tmp/dlm-bench-pack/home/store/01MA4B7T2K9XQ3W6V8N5RJ0PEH)
    pack:   dlm pack --include-cache   1.56 s  (145.5 MB, zstd 3)
            tar --zstd -cf             1.19 s  (146.5 MB, zstd 3)
            ratio 1.32x (target <= 1.3x); 205 MB/s
    unpack: dlm unpack                 0.83 s
            tar --zstd -xf             0.44 s
            ratio 1.90x (target <= 1.3x); 386 MB/s
    memory: pack peak RSS 105 MiB for 145.5 MB, 100 MiB for 86.14 MB (no cache)
            unpack peak RSS 45 MiB and 43 MiB
    limits: read + sha256 on one core 0.26 s (1,249 MB/s); zstd 3 alone 0.77 s (414 MB/s)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import DLM, STDLIB, compile_bytecode, make_tiny_base, timed_process

DLM_ID = "01MA4B7T2K9XQ3W6V8N5RJ0PEH"
TARGET = 1.3


def env(home: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "DLM_HOME": str(home)}


def make_store(work: Path) -> Path:
    """The trained document (made once): its store holds the tree's cache and one adapter."""
    doc = work / "doc" / "stdlib.dlm"
    home = work / "home"
    if (home / "store" / DLM_ID / "adapter" / "versions" / "v0001").is_dir():
        return doc
    base = make_tiny_base(work / "tiny")
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(
        f"---\ndlm_id: {DLM_ID}\nbase_model: {base}\ntraining:\n  sequence_len: 256\n  max_steps: 1\n"
        f'  micro_batch_size: 1\n  sources:\n    - path: {STDLIB}\n      include: ["**/*.py"]\n---\nA corpus.\n',
        encoding="utf-8",
    )
    print("making the store (tokenizes ~13K files, trains one step; once)...", flush=True)
    seconds, _, _ = timed_process([DLM, "train", str(doc)], env(home))
    print(f"  done in {seconds:.0f} s", flush=True)
    return doc


def folder_bytes(folder: Path) -> tuple[int, int]:
    files = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]
    return len(files), sum(p.stat().st_size for p in files)


def median_run(
    argv: list[str], environ: dict[str, str], repeat: int, before: list[Path]
) -> tuple[float, int]:
    """Median wall seconds and the largest peak RSS of ``repeat`` runs, each after removing ``before``."""
    times, peaks = [], []
    for _ in range(repeat):
        for path in before:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        seconds, rss, _ = timed_process(argv, environ)
        times.append(seconds)
        peaks.append(rss)
    return statistics.median(times), max(peaks)


def hash_limit(folder: Path) -> float:
    """Seconds to read and sha256 every file of ``folder`` on one core (page cache warm)."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    start = time.perf_counter()
    for path in files:
        with open(path, "rb") as f:
            hashlib.file_digest(f, "sha256")
    return time.perf_counter() - start


def zstd_limit(folder: Path) -> float:
    """Seconds for zstd alone, at the pack's level and threads, over every byte of ``folder``."""
    import zstandard

    from dlmstore.pack.layout import ZSTD_LEVEL

    params = zstandard.ZstdCompressionParameters.from_level(
        ZSTD_LEVEL, threads=max(1, min(os.cpu_count() or 1, 8)), write_checksum=True
    )
    files = [p for p in folder.rglob("*") if p.is_file()]
    start = time.perf_counter()
    with (
        open(os.devnull, "wb") as sink,
        zstandard.ZstdCompressor(compression_params=params).stream_writer(sink) as stream,
    ):
        for path in files:
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    stream.write(chunk)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/dlm-bench-pack"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    compile_bytecode()
    work: Path = args.work
    doc = make_store(work)
    home = work / "home"
    store = home / "store" / DLM_ID
    count, size = folder_bytes(store)
    print(f"store: {count:,} files, {size / 1e6:,.1f} MB ({store})")
    from dlmstore.pack.layout import ZSTD_LEVEL

    pack, tar = work / "stdlib.dlm.pack", work / "store.tar.zst"
    ours, ours_rss = median_run(
        [DLM, "pack", str(doc), "--include-cache", "-o", str(pack)], env(home), args.repeat, [pack]
    )
    theirs, _ = median_run(
        ["tar", "--zstd", "-cf", str(tar), "-C", str(store.parent), DLM_ID], env(home), args.repeat, [tar]
    )
    print(
        f"pack:   dlm pack --include-cache {ours:6.2f} s  ({pack.stat().st_size / 1e6:,.1f} MB, zstd {ZSTD_LEVEL})"
    )
    print(f"        tar --zstd -cf           {theirs:6.2f} s  ({tar.stat().st_size / 1e6:,.1f} MB, zstd 3)")
    print(f"        ratio {ours / theirs:.2f}x (target <= {TARGET}x); {size / 1e6 / ours:,.0f} MB/s")
    h2, to, out = work / "home2", work / "to", work / "untarred"
    unpacked, unpack_rss = median_run(
        [DLM, "unpack", str(pack), "--home", str(h2), "--to", str(to)], env(home), args.repeat, [h2, to]
    )
    out_cmd = ["bash", "-c", f"mkdir -p {out} && tar --zstd -xf {tar} -C {out}"]
    untarred, _ = median_run(out_cmd, env(home), args.repeat, [out])
    print(f"unpack: dlm unpack               {unpacked:6.2f} s")
    print(f"        tar --zstd -xf           {untarred:6.2f} s")
    print(
        f"        ratio {unpacked / untarred:.2f}x (target <= {TARGET}x); {size / 1e6 / unpacked:,.0f} MB/s"
    )
    small = work / "small.dlm.pack"
    _, small_rss = median_run([DLM, "pack", str(doc), "-o", str(small)], env(home), 1, [small])
    h3, to3 = work / "home3", work / "to3"
    _, small_unpack_rss = median_run(
        [DLM, "unpack", str(small), "--home", str(h3), "--to", str(to3)], env(home), 1, [h3, to3]
    )
    print(f"memory: pack peak RSS {ours_rss / 2**20:,.0f} MiB for {pack.stat().st_size / 1e6:,.1f} MB, "
          f"{small_rss / 2**20:,.0f} MiB for {small.stat().st_size / 1e6:,.2f} MB (no cache)")  # fmt: skip
    print(f"        unpack peak RSS {unpack_rss / 2**20:,.0f} MiB and {small_unpack_rss / 2**20:,.0f} MiB")
    hashed, squeezed = hash_limit(store), zstd_limit(store)
    print(f"limits: read + sha256 on one core {hashed:.2f} s ({size / 1e6 / hashed:,.0f} MB/s); "
          f"zstd {ZSTD_LEVEL} alone {squeezed:.2f} s ({size / 1e6 / squeezed:,.0f} MB/s)")  # fmt: skip


if __name__ == "__main__":
    main()

"""Tokens shared across the stores of a home, and what finding duplicate rows costs (issue 33).

Prints, side by side from one run on this machine, each figure beside the
baseline it is measured against in the same run:

* **shared cold**: a second document (a new store) over the same tree as a
  document already tokenized, its first `dlm tokenize`: with sharing (the
  first store's segments hard-linked) against without (``--no-share``: the
  tokenizer again), as a speedup (goal >= 20x); per 100,000 files against
  the warm `dlm tokenize` of ``--tiny`` generated files (goal: no slower);
* **extra disk** of the shared store: bytes of its token files that are not
  hard links of another store's (goal ~0) against the same store's token
  files without sharing;
* **dedup, cold**: what the cold pass of the first document spent finding
  duplicates after its tokenizing (``dedup_runs.seconds``: clustering and
  keeping the signatures; the rows it encodes are signed on its encoding
  threads, inside its tokenizing) against that tokenizing; and in this
  process over the same texts, the content hashes alone (exact duplicates)
  and the whole signature (exact and near), against the cold tokenize
  (goal: near <= 25%, exact ~free);
* **dedup, warm**: the seconds `dlm show --json` reports for its duplicate
  report against the whole warm `dlm show` (goal <= 5%);
* what the tree holds: clusters, exact and near, and duplicate rows.

Whole processes, dlmstore's bytecode compiled first (as an installed
package has it); medians of ``--repeat`` for warm figures. ``--quick``
takes the first 1,500 files of the tree and 5,000 tiny files, for a check
that the script runs, not for figures. ``--tiny-only`` measures only the
tiny files: the second document's shared cold pass against that tree's
warm pass, ``--repeat`` times each (medians), and what the pass spends
registering the entries and stat records it takes (``--profile``: one
shared pass in this process, its steps timed on the CPU clock).

    python bench/bench_share_dedup.py [--root PATH] [--repeat 5] [--tiny 100000] [--quick]
    python bench/bench_share_dedup.py --tiny-only --tiny 20000 [--repeat 3] [--profile]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import DLM, REPO, STDLIB, compile_bytecode, make_tiny_tree, timed_process

FIRST = "01M7YJ087N2NEP493AF56E3CF0"
SECOND = "01M7YJ087N2NEP493AF56E3CF1"
TINY = "01M7YJ087N2NEP493AF56E3CF2"
TINY_SECOND = "01M7YJ087N2NEP493AF56E3CF3"

GOALS = {"shared_speedup": 20.0, "near_share": 0.25, "warm_share": 0.05}


def write_doc(path: Path, dlm_id: str, root: Path, max_files: int | None) -> Path:
    limit = f"      max_files: {max_files}\n" if max_files else ""
    path.write_text(
        f"---\ndlm_id: {dlm_id}\ntraining:\n  sources:\n    - path: {root}\n"
        f'      include: ["**/*.py"]\n{limit}---\nA corpus.\n',
        encoding="utf-8",
    )
    return path


def tokenize(doc: Path, env: dict[str, str], *flags: str) -> tuple[float, dict[str, Any]]:
    seconds, _, stdout = timed_process([DLM, "tokenize", str(doc), "--json", *flags], env)
    return seconds, json.loads(stdout)


def fresh(home: Path, dlm_id: str) -> None:
    shutil.rmtree(home / "store" / dlm_id, ignore_errors=True)


def disk(home: Path, dlm_id: str) -> tuple[int, int]:
    """Bytes on disk of a store's token files: all of them, and those that are no other file's link."""
    total = own = 0
    for segment in (home / "store" / dlm_id / "tokens").glob("segment-*.bin"):
        st = segment.stat()
        total += st.st_blocks * 512
        own += st.st_blocks * 512 if st.st_nlink == 1 else 0
    return total, own


def dedup_record(home: Path, dlm_id: str, run_id: int) -> tuple[float, int]:
    conn = sqlite3.connect(home / "store" / dlm_id / "store.db")
    try:
        seconds, signed = conn.execute(
            "SELECT seconds, signatures_computed FROM dedup_runs WHERE run_id = ?", (run_id,)
        ).fetchone()
    finally:
        conn.close()
    return float(seconds), int(signed)


def walked(doc: Path, home: Path, env: dict[str, str]) -> float:
    """A warm ``dlm tokenize`` of ``doc`` with its pass snapshot dropped first: the walk and lookup."""
    for store in (home / "store").iterdir():
        conn = sqlite3.connect(store / "store.db")
        with conn:
            conn.execute("DELETE FROM pass_snapshots")
        conn.close()
    return tokenize(doc, env)[0]


def in_process_costs(doc: Path) -> tuple[float, float, int, float]:
    """This process, over the same rows: the content hashes alone, and the whole signatures."""
    from dlmstore.collector import paused
    from dlmstore.corpus import signatures
    from dlmstore.corpus.assemble import load_corpus
    from dlmstore.corpus.dedup import text_rows
    from dlmstore.document.parser import parse_document

    with paused():
        items = text_rows(load_corpus(parse_document(doc)))
        texts = [signatures.row_text(item.row.data["text"], item.source) for item in items]
        start = time.perf_counter()
        for text in texts:
            hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        exact = time.perf_counter() - start
        signatures.sign("warm the numpy tables up")
        start = time.perf_counter()
        shingles = sum(signatures.sign(text).shingles for text in texts)
        near = time.perf_counter() - start
    return exact, near, shingles, sum(len(t) for t in texts) / 2**20


def tiny_shared_pass(tiny: Path, env: dict[str, str], dlm_id: str) -> tuple[float, dict[str, Any]]:
    """The first ``dlm tokenize`` of a second document over the tiny tree (a new store each time)."""
    second = tiny.with_name(f"{dlm_id}.dlm")
    second.write_text(tiny.read_text().replace(TINY, dlm_id), encoding="utf-8")
    fresh(Path(env["DLM_HOME"]), dlm_id)
    seconds, summary = tokenize(second, env)
    assert summary["tokenization"]["cache_misses"] == 0, summary["tokenization"]
    return seconds, summary


def profile_shared(tiny: Path, env: dict[str, str]) -> list[tuple[str, float]]:
    """One shared pass in this process: its CPU seconds, and those of the steps that take and
    register what it takes (each step's function wrapped in a CPU-clock timer: cProfile's own cost
    per call would inflate the steps that make many small calls several times over)."""
    os.environ.update(DLM_HOME=env["DLM_HOME"], HF_HUB_OFFLINE="1")
    sys.path.insert(0, str(REPO))  # this checkout's dlmstore, as the processes above run it
    from dlmstore.cache import share
    from dlmstore.corpus import assemble, dedup, tokenize

    steps: list[tuple[str, Any, str]] = [
        ("taking the entries (lookup, links, CRC-32s, registering)", tokenize, "take_shared"),
        ("  of which looking them up in the other store", share, "_entries_of"),
        ("  of which registering them", share._Taker, "register"),
        ("saving the borrowed stat records", share.BorrowedStatCache, "save"),
        ("walking the tree (a stat per file)", assemble, "load_corpus"),
        ("finding the duplicates", dedup, "analyse"),
    ]
    spent = dict.fromkeys((label for label, _, _ in steps), 0.0)

    def timed(label: str, function: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                spent[label] += time.process_time() - start

        return run

    second = tiny.with_name(f"{TINY_SECOND}.dlm")
    second.write_text(tiny.read_text().replace(TINY, TINY_SECOND), encoding="utf-8")
    fresh(Path(env["DLM_HOME"]), TINY_SECOND)
    tokenize.tokenize_document(str(second), materialize=False)  # the lazy imports, out of the figures
    fresh(Path(env["DLM_HOME"]), TINY_SECOND)
    for label, owner, name in steps:
        setattr(owner, name, timed(label, getattr(owner, name)))
    start = time.process_time()
    tokenize.tokenize_document(str(second), materialize=False)
    return [("the pass, CPU seconds", time.process_time() - start), *spent.items()]


def tiny_only(args: argparse.Namespace) -> None:
    """The shared cold pass of a second document over ``--tiny`` files against that tree's warm pass."""
    compile_bytecode()
    load = os.getloadavg()[0]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="dlm-bench-share-"))
    work.mkdir(parents=True, exist_ok=True)
    home = work / "home"
    env = {**os.environ, "DLM_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONPATH": str(REPO)}  # fmt: skip
    try:
        tree = make_tiny_tree(work / "tiny" / "src", args.tiny)
        tiny = work / "tiny.dlm"
        tiny.write_text(f"---\ndlm_id: {TINY}\ntraining:\n  sources:\n    - path: {tree}\n---\nTiny.\n")
        for _ in range(3):  # cold, then a racy-clean pass, then one that keeps the snapshot
            tokenize(tiny, env)
        print(f"load average {load:.2f} at start; {args.tiny:,} tiny files", flush=True)
        warm, shared = [], []
        for _ in range(args.repeat):  # alternated: both see the same load
            warm.append(tokenize(tiny, env)[0])
            shared.append(tiny_shared_pass(tiny, env, TINY_SECOND)[0])
        warm_s, shared_s = statistics.median(warm), statistics.median(shared)
        print(
            f"\n{args.tiny:,} tiny files, warm dlm tokenize (snapshot): {warm_s:.2f} s (median of {args.repeat})"
        )
        print(f"{args.tiny:,} tiny files, second document, cold, shared: {shared_s:.2f} s "
              f"(median of {args.repeat}): {shared_s / warm_s:.2f}x the warm pass")  # fmt: skip
        print(
            f"  per 100K files: shared {shared_s * 100_000 / args.tiny:.2f} s, warm {warm_s * 100_000 / args.tiny:.2f} s"
        )
        if args.profile:
            print("\none shared pass in this process (CPU clock):")
            parts = profile_shared(tiny, env)
            total = parts[0][1]
            for label, seconds in parts:
                print(f"  {label:<58} {seconds:6.2f} s  {seconds / total:6.1%}")
        print(f"load average {os.getloadavg()[0]:.2f} at the end ({load:.2f} at the start)")
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=STDLIB, help="the tree of .py files (the stdlib)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tiny", type=int, default=100_000, help="files of the generated tree")
    parser.add_argument("--quick", action="store_true", help="1,500 files and 5,000 tiny ones: a smoke run")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the generated tree here")
    parser.add_argument("--tiny-only", action="store_true", help="only the tiny files' shared pass vs warm")
    parser.add_argument("--profile", action="store_true", help="with --tiny-only: profile one shared pass")
    args = parser.parse_args()
    if args.tiny_only:
        tiny_only(args)
        return
    max_files = 1500 if args.quick else None
    tiny_count = 5000 if args.quick else args.tiny
    compile_bytecode()
    load = os.getloadavg()[0]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="dlm-bench-share-"))
    work.mkdir(parents=True, exist_ok=True)
    home = work / "home"
    env = {**os.environ, "DLM_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONPATH": str(REPO)}  # fmt: skip
    env.pop("RAYON_NUM_THREADS", None)
    env.pop("TOKENIZERS_PARALLELISM", None)
    rows: list[tuple[str, str, str]] = []
    try:
        first = write_doc(work / "first.dlm", FIRST, args.root, max_files)
        second = write_doc(work / "second.dlm", SECOND, args.root, max_files)
        # Convert the base once and keep its tokenizer, so no timing below includes that one-off.
        once = work / "once.dlm"
        once.write_text(f"---\ndlm_id: {TINY}\n---\nWarm the base up.\n", encoding="utf-8")
        timed_process([DLM, "tokenize", str(once)], env)
        fresh(home, TINY)
        print(f"load average {load:.2f} at start; tree {args.root}", flush=True)

        cold_s, cold = tokenize(first, env)
        files = cold["tokenization"]["total_rows"] - 1
        pass_s = cold["tokenization"]["total_tokenize_seconds"]
        dedup_s, signed = dedup_record(home, FIRST, cold["run_id"])
        rows.append(("first document, cold dlm tokenize", f"{cold_s:.2f} s",
                     f"{files:,} files, {cold['tokens']:,} tokens; its pass {pass_s:.2f} s"))  # fmt: skip

        alone_s, alone = tokenize(second, env, "--no-share")
        alone_disk, _ = disk(home, SECOND)
        assert alone["tokenization"]["cache_shared"] == 0
        rows.append(("second document, cold, --no-share", f"{alone_s:.2f} s",
                     f"{alone['tokenization']['cache_misses']:,} misses; tokens {alone_disk / 2**20:.1f} MiB"))  # fmt: skip
        fresh(home, SECOND)
        shared_s, shared = tokenize(second, env)
        shared_disk, shared_own = disk(home, SECOND)
        event = shared["tokenization"]
        assert event["cache_misses"] == 0, event
        rows.append(("second document, cold, shared", f"{shared_s:.2f} s",
                     f"{event['cache_shared']:,} rows taken, 0 misses; {alone_s / shared_s:.1f}x faster"))  # fmt: skip
        rows.append(("  its token files", f"{shared_disk / 2**20:.1f} MiB",
                     f"of which not a link of the first store's: {shared_own:,} bytes"))  # fmt: skip

        tree = make_tiny_tree(work / "tiny" / "src", tiny_count)
        tiny = work / "tiny.dlm"
        tiny.write_text(f"---\ndlm_id: {TINY}\ntraining:\n  sources:\n    - path: {tree}\n---\nTiny.\n")
        tokenize(tiny, env)
        tokenize(tiny, env)  # the tree was just written: a racy-clean pass takes no snapshot
        tokenize(tiny, env)
        tiny_warm = statistics.median(tokenize(tiny, env)[0] for _ in range(args.repeat))
        tiny_walked = statistics.median(walked(tiny, home, env) for _ in range(3))
        tiny_second = work / "tiny-second.dlm"
        tiny_second.write_text(tiny.read_text().replace(TINY, TINY_SECOND), encoding="utf-8")
        tiny_shared, summary = tokenize(tiny_second, env)
        assert summary["tokenization"]["cache_misses"] == 0, summary["tokenization"]
        per_100k_shared = shared_s * 100_000 / files
        per_100k_warm = tiny_warm * 100_000 / tiny_count
        tiny_shared_100k = tiny_shared * 100_000 / tiny_count
        rows.append((f"{tiny_count:,} tiny files, warm dlm tokenize", f"{tiny_warm:.2f} s",
                     f"median of {args.repeat}, from the snapshot; walked {tiny_walked:.2f} s (median of 3)"))  # fmt: skip
        rows.append((f"{tiny_count:,} tiny files, second document, shared", f"{tiny_shared:.2f} s",
                     f"cold, {summary['tokenization']['cache_shared']:,} rows taken, 0 misses"))  # fmt: skip

        exact_s, near_s, shingles, mib = in_process_costs(first)
        rows.append(("dedup after the cold pass's tokenizing (dedup_runs)", f"{dedup_s:.2f} s",
                     f"{signed:,} rows clustered (signed while encoded); {dedup_s / pass_s:.1%} of its tokenizing"))  # fmt: skip
        rows.append(("exact: content sha256 of every row", f"{exact_s:.2f} s",
                     f"{mib:.0f} MiB of text; {exact_s / pass_s:.1%} of the cold pass"))  # fmt: skip
        rows.append(("near: whole signature of every row", f"{near_s:.2f} s",
                     f"{shingles:,} shingles; {near_s / pass_s:.1%} of the cold pass"))  # fmt: skip

        # All hits: takes the pass snapshot if the cold pass could not (a tree written a moment ago).
        timed_process([DLM, "tokenize", str(first)], env)
        shows = [timed_process([DLM, "show", str(first), "--json"], env) for _ in range(args.repeat)]
        show_s = statistics.median(s for s, _, _ in shows)
        report = json.loads(shows[-1][2])["dedup"]
        warm_dedup = statistics.median(json.loads(out)["dedup"]["seconds"] for _, _, out in shows)
        rows.append(("warm dlm show", f"{show_s:.2f} s",
                     f"median of {args.repeat}; its duplicate report {warm_dedup * 1000:.1f} ms "
                     f"({warm_dedup / show_s:.1%}), from run {report['from_run']}"))  # fmt: skip
        exact_clusters = sum(c["kind"] == "exact" for c in report["clusters"])
        rows.append(("the tree's duplicates", f"{len(report['clusters']):,}",
                     f"clusters ({exact_clusters:,} exact, {len(report['clusters']) - exact_clusters:,} near), "
                     f"{report['duplicate_rows']:,} duplicate rows of {report['rows']:,}"))  # fmt: skip
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\n{'case':<42} {'measured':>10}  against")
    for case, value, note in rows:
        print(f"{case:<42} {value:>10}  {note}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end ({load:.2f} at the start)")

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    speedup = alone_s / shared_s
    print("\nagainst the issue's goals")
    print(f"  shared cold vs without sharing >= {GOALS['shared_speedup']:.0f}x: {speedup:.1f}x  "
          f"{verdict(speedup >= GOALS['shared_speedup'])}")  # fmt: skip
    print(f"  shared cold per 100K files <= warm per 100K files: on {tiny_count:,} tiny files {tiny_shared_100k:.2f} s "
          f"vs warm {per_100k_warm:.2f} s (walked {tiny_walked * 100_000 / tiny_count:.2f} s)  "
          f"{verdict(tiny_shared_100k <= per_100k_warm)}; the stdlib's {per_100k_shared:.2f} s per 100K files "
          "is its larger files (100 MB of tokens)")  # fmt: skip
    print(f"  extra disk of shared segments ~0: {shared_own:,} bytes (without sharing {alone_disk:,})  "
          f"{verdict(shared_own <= alone_disk * 0.01)}")  # fmt: skip
    print(f"  near-dup signatures cold <= {GOALS['near_share']:.0%} of the cold tokenize: "
          f"{near_s / pass_s:.1%} in this process, {dedup_s / pass_s:.1%} in the pass  "
          f"{verdict(max(near_s, dedup_s) / pass_s <= GOALS['near_share'])}")  # fmt: skip
    print(f"  exact ~free: {exact_s / pass_s:.1%} of the cold tokenize")
    print(f"  warm dedup <= {GOALS['warm_share']:.0%} of a warm dlm show: {warm_dedup / show_s:.1%}  "
          f"{verdict(warm_dedup / show_s <= GOALS['warm_share'])}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

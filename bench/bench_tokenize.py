"""Whole-process `dlm tokenize` against the tokenizer's limit, cold and warm, with peak RSS.

Prints, side by side from one run on this machine (issues 17 and 31):

* **the limit**: the least work that gives the ids. One process reads the
  files `dlm tokenize` reads and encodes them with the Rust tokenizer's
  ``encode_batch_fast`` (no character offsets) in batches of 256 on *one*
  thread (``RAYON_NUM_THREADS=1``), timed after the tokenizer is loaded;
  that time divided by the cores is the limit a pass on every core could
  reach if it did nothing else. (``encode_batch`` on the tokenizer's pool,
  the floor before, builds offsets and scales below the core count.)
  Measured for the first ``--first`` files of the tree (1,000 by default)
  and for the whole tree (the stdlib's ``**/*.py``, ~13K files);
* **the encoding alone** on every core, the pass's way (the same reads,
  then chunks of ``CHUNK_ROWS`` rows, one thread per core, the tokenizer's
  pool off), for the first files: what encoding costs with nothing else
  in the process, against the limit, and its CPU seconds against one
  thread's (two threads encode at less than twice one's rate);
* **cold** `dlm tokenize` (no store: its database is made, every row
  tokenized) of those ``--first`` files, median of ``--cold-repeat``, and
  of the whole tree, each as a ratio of its limit; then the whole tree with
  ``RAYON_NUM_THREADS=1`` (one tokenizer thread), as the speedup all
  cores give;
* **warm** `dlm tokenize` (all hits) and `dlm show`, median of
  ``--repeat``, at ``--first`` files and on the whole tree, answered from
  the pass snapshot (a stat per folder and file,
  ``dlmstore.corpus.snapshot``); beside the whole tree's, the same pass
  with the snapshot dropped first, so it walks the tree and looks every
  row up (what the first pass after a change elsewhere in the store costs);
* a generated tree of ``--tiny`` tiny files (100,000 by default): cold,
  warm (median, and walked) and `dlm show` (median, and walked);
* the peak RSS of every process (``wait4``), and the issue's "now" figures
  (measured before this work, same machine) as ratios.

dlmstore's bytecode is compiled first, as an installed package has it.

    python bench/bench_tokenize.py [--root PATH] [--first 1000] [--repeat 5] [--tiny 100000] [--skip-one-thread]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

from benchlib import DLM, REPO, STDLIB, compile_bytecode, make_tiny_tree, timed_process

ID_STDLIB = "01M7YJ087N2NEP493AF56E3CE0"
ID_FIRST = "01M7YJ087N2NEP493AF56E3CE1"
ID_TINY = "01M7YJ087N2NEP493AF56E3CE2"

#: The issues' "now" (before each piece of work; quiet 2-core machine, whole process):
#: issue 17 for the whole tree and the tiny tree, issue 31 for the first 1,000 files.
BEFORE = {"cold": 76.5, "warm": 0.93, "tiny_warm": 3.7, "tiny_cold": 34.7, "tiny_show": 4.6,
          "first_cold/limit": 4.56 / 3.0, "first_warm": 0.38}  # fmt: skip
#: Issue 31's last figures before its fixed-cost work (`--tiny 0 --skip-one-thread`, load ~1):
#: what the imports, the frontmatter's validation and the store open cost a warm pass and `dlm show`.
LAST = {"first_cold/limit": 1.57, "first_warm": 0.23, "first_show": 0.29, "warm": 0.41, "show": 0.53}
GOALS = {
    "first_cold/limit": 1.15,
    "cold_rss": 1 << 30,
    "warm": 0.25,
    "show": 0.25,
    "tiny_warm": 1.5,
    "tiny_show": 1.5,
    "threads": 1.8,
}

#: The limit: load the tokenizer, then (timed) read the listed files and encode them with the
#: backend's encode_batch_fast in batches of 256; run with RAYON_NUM_THREADS=1, divided by the cores.
FLOOR = """
import sys, time
from dlmstore.bases import load_tokenizer, resolve_base
backend = load_tokenizer(resolve_base("smollm2-135m"))._tokenizer
paths = open(sys.argv[1], encoding="utf-8").read().splitlines()
start, tokens = time.perf_counter(), 0
for begin in range(0, len(paths), 256):
    texts = []
    for path in paths[begin : begin + 256]:
        with open(path, "rb") as f:
            data = f.read()
        try:  # dlm skips a file that is not UTF-8 too
            texts.append(data.decode("utf-8") + "<|endoftext|>")
        except UnicodeDecodeError:
            pass
    tokens += sum(len(e.ids) for e in backend.encode_batch_fast(texts, add_special_tokens=True))
print(tokens, time.perf_counter() - start)
"""


#: The encoding alone, the pass's way: the same reads, then (timed with them) the texts encoded in
#: chunks of the pass's CHUNK_ROWS rows by one thread per core, each with the tokenizer's pool off.
#: What encoding on every core costs with nothing else in the process (no store, no signing).
ENCODE_ALL = """
import os, resource, sys, threading, time
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from dlmstore.bases import load_tokenizer, resolve_base
from dlmstore.corpus.tokenize import CHUNK_ROWS
backend = load_tokenizer(resolve_base("smollm2-135m"))._tokenizer
paths = open(sys.argv[1], encoding="utf-8").read().splitlines()
threads = int(sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF)
start, texts = time.perf_counter(), []
for path in paths:
    with open(path, "rb") as f:
        data = f.read()
    try:
        texts.append(data.decode("utf-8") + "<|endoftext|>")
    except UnicodeDecodeError:
        pass
chunks = iter([texts[i : i + CHUNK_ROWS] for i in range(0, len(texts), CHUNK_ROWS)])
lock, tokens = threading.Lock(), []
def work():
    while True:
        with lock:
            chunk = next(chunks, None)
        if chunk is None:
            return
        tokens.append(sum(len(e.ids) for e in backend.encode_batch_fast(chunk, add_special_tokens=True)))
workers = [threading.Thread(target=work) for _ in range(threads)]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
after = resource.getrusage(resource.RUSAGE_SELF)
cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
print(sum(tokens), time.perf_counter() - start, cpu)
"""


def write_doc(path: Path, dlm_id: str, root: Path, include: str | None) -> Path:
    globs = f'      include: ["{include}"]\n' if include else ""
    path.write_text(
        f"---\ndlm_id: {dlm_id}\ntraining:\n  sources:\n    - path: {root}\n{globs}---\nA corpus.\n",
        encoding="utf-8",
    )
    return path


def chosen_files(doc: Path) -> list[str]:
    """The files `dlm tokenize` reads for ``doc`` (its walk), as paths to open."""
    from dlmstore.document.parser import parse_document
    from dlmstore.sources.walk import walk_directive

    document = parse_document(doc)
    directive = document.frontmatter.training.sources[0]
    walked = walk_directive(directive, label="bench", doc_dir=document.directory,
                            doc_root=os.path.realpath(document.directory), policy="permissive")  # fmt: skip
    return [path for _, path in walked.files]


def tokenize(doc: Path, env: dict[str, str]) -> tuple[float, int, dict[str, object]]:
    seconds, peak, stdout = timed_process([DLM, "tokenize", str(doc), "--json"], env)
    return seconds, peak, json.loads(stdout)


def cold(
    doc: Path, dlm_id: str, env: dict[str, str], home: Path, cpu: list[float] | None = None
) -> tuple[float, int, dict[str, object]]:
    """A pass with no store: its database is made and every row tokenized (none taken from another
    store); its CPU seconds are appended to ``cpu``."""
    shutil.rmtree(home / "store" / dlm_id, ignore_errors=True)
    seconds, peak, stdout = timed_process([DLM, "tokenize", str(doc), "--json", "--no-share"], env, cpu=cpu)
    summary = json.loads(stdout)
    event = summary["tokenization"]
    assert event["cache_hits"] == 0, event  # type: ignore[index]
    return seconds, peak, summary


def walked(
    doc: Path, dlm_id: str, env: dict[str, str], home: Path, argv: list[str]
) -> tuple[float, int, bytes]:
    """``argv`` on ``doc`` with its pass snapshot dropped first: the full walk and lookup."""
    with sqlite3.connect(home / "store" / dlm_id / "store.db") as conn:
        conn.execute("DELETE FROM pass_snapshots")
    conn.close()
    return timed_process([*argv, str(doc)], env)


def has_snapshot(home: Path, dlm_id: str) -> bool:
    with sqlite3.connect(home / "store" / dlm_id / "store.db") as conn:
        found = conn.execute("SELECT COUNT(*) FROM pass_snapshots").fetchone()[0] > 0
    conn.close()
    return bool(found)


def median_of(argv_runs: list[tuple[float, int, object]]) -> tuple[float, int]:
    return statistics.median(r[0] for r in argv_runs), max(r[1] for r in argv_runs)


def gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:5.2f} GiB"


def copy_first(files: list[str], root: Path, count: int, dest: Path) -> Path:
    """The first ``count`` of ``files`` (under ``root``) copied to ``dest``, keeping their relative paths."""
    shutil.rmtree(dest, ignore_errors=True)
    for path in files[:count]:
        target = dest / Path(path).relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return dest


def limit(files: list[str], listing: Path, env: dict[str, str]) -> tuple[int, float, int, float]:
    """Tokens, one-thread ``encode_batch_fast`` seconds, its peak RSS, and the limit (seconds / cores)."""
    listing.write_text("\n".join(files), encoding="utf-8")
    _, rss, out = timed_process(
        [sys.executable, "-c", FLOOR, str(listing)], {**env, "RAYON_NUM_THREADS": "1"}
    )
    tokens, seconds = int(out.split()[0]), float(out.split()[1])
    return tokens, seconds, rss, seconds / CORES


def encoding_alone(listing: Path, env: dict[str, str]) -> tuple[int, float, float]:
    """Tokens, wall and CPU seconds of :data:`ENCODE_ALL` over the files of ``listing`` on every core."""
    _, _, out = timed_process([sys.executable, "-c", ENCODE_ALL, str(listing), str(CORES)], env)
    tokens, seconds, cpu = out.split()
    return int(tokens), float(seconds), float(cpu)


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


CORES = cpu_count()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=STDLIB, help="the tree of .py files (the stdlib)")
    parser.add_argument(
        "--first", type=int, default=1000, help="the small corpus: the tree's first files (0: skip)"
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cold-repeat", type=int, default=3, help="cold runs of the small corpus (median)")
    parser.add_argument("--tiny", type=int, default=100_000, help="files of the generated tree (0: skip)")
    parser.add_argument("--skip-one-thread", action="store_true", help="leave out the 1-thread cold run")
    parser.add_argument(
        "--skip-whole", action="store_true", help="leave out the whole tree (its limit, cold and warm runs)"
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=1,
        help="alternated cold runs on all cores and on 1 thread (median ratio)",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="keep the generated tree here")
    args = parser.parse_args()
    compile_bytecode()  # as an installed package has it (see benchlib.compile_bytecode)
    load = os.getloadavg()[0]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="dlm-bench-tokenize-"))
    work.mkdir(parents=True, exist_ok=True)
    home = work / "home"
    env = {**os.environ, "DLM_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONPATH": str(REPO)}  # fmt: skip
    env.pop("RAYON_NUM_THREADS", None)
    env.pop("TOKENIZERS_PARALLELISM", None)
    rows: list[tuple[str, float, int, str]] = []  # case, seconds, peak RSS, note
    figures: dict[str, float] = {}
    tokenize_argv = [DLM, "tokenize", "--json"]
    try:
        stdlib = write_doc(work / "stdlib.dlm", ID_STDLIB, args.root, "**/*.py")
        # Convert the base, and make the home's first store (the one Alembic migrates), once:
        # no timing below includes the one-off conversion or the first migration.
        timed_process([DLM, "tokenize", "--no-cache", str(write_doc(work / "one.dlm", ID_TINY, REPO / "bench",
                                                                    "benchlib.py"))], env)  # fmt: skip
        files = chosen_files(stdlib)
        print(
            f"load average {load:.2f} at start; {len(files):,} files under {args.root}; {CORES} cores",
            flush=True,
        )

        if args.first:
            first_tree = copy_first(files, args.root, args.first, work / "first" / args.root.name)
            first = write_doc(work / "first.dlm", ID_FIRST, first_tree, "**/*.py")
            # The limit, the encoding alone and the cold pass in turn, each round, so that the
            # machine's drift (a quarter within the hour) reaches all three alike; medians.
            listing, limits, alone, colds, cpus = chosen_files(first), [], [], [], []
            for _ in range(args.cold_repeat):
                limits.append(limit(listing, work / "first.txt", env))
                alone.append(encoding_alone(work / "first.txt", env))
                colds.append(cold(first, ID_FIRST, env, home, cpus))
            tokens, rss = limits[0][0], max(x[2] for x in limits)
            one = statistics.median(x[1] for x in limits)
            first_limit = one / CORES
            rows.append((f"first {args.first:,} files: limit", first_limit, rss,
                         f"{tokens:,} tokens; encode_batch_fast on 1 thread {one:.2f} s / {CORES} cores "
                         f"(median of {args.cold_repeat}: {', '.join(f'{x[1]:.2f}' for x in limits)})"))  # fmt: skip
            alone_s, alone_cpu = (
                statistics.median(a[1] for a in alone),
                statistics.median(a[2] for a in alone),
            )
            rows.append((f"first {args.first:,} files: encoding alone", alone_s, 0,
                         f"on {CORES} threads as the pass encodes, median of {args.cold_repeat}: "
                         f"{alone_s / first_limit:.2f}x the limit; {alone_cpu:.2f} s of CPU, "
                         f"{alone_cpu / one:.2f}x one thread's"))  # fmt: skip
            first_cold, first_cold_rss = median_of(colds)  # type: ignore[arg-type]
            figures["first_cold/limit"] = first_cold / first_limit
            cold_cpu = statistics.median(cpus)
            rows.append((f"first {args.first:,} files: cold dlm tokenize", first_cold, first_cold_rss,
                         f"median of {args.cold_repeat} ({', '.join(f'{c[0]:.2f}' for c in colds)}): "
                         f"{first_cold / first_limit:.2f}x the limit; {cold_cpu:.2f} s of CPU, "
                         f"{cold_cpu / one:.2f}x one thread's encoding"))  # fmt: skip
            tokenize(first, env)
            tokenize(first, env)  # all hits, mtimes past: takes the snapshot if the cold pass could not
            assert has_snapshot(home, ID_FIRST), "no pass snapshot was taken of the first files"
            figures["first_warm"], rss = median_of([tokenize(first, env) for _ in range(args.repeat)])
            rows.append((f"first {args.first:,} files: warm dlm tokenize", figures["first_warm"], rss,
                         f"median of {args.repeat}, snapshot"))  # fmt: skip
            shows = [timed_process([DLM, "show", str(first)], env) for _ in range(args.repeat)]
            figures["first_show"], rss = median_of(shows)  # type: ignore[arg-type]
            rows.append((f"first {args.first:,} files: dlm show", figures["first_show"], rss,
                         f"median of {args.repeat}, snapshot"))  # fmt: skip

        cold_s = cold_rss = None
        if not args.skip_whole:
            tokens, one, rss, whole_limit = limit(files, work / "files.txt", env)
            rows.append(("whole tree: limit", whole_limit, rss,
                         f"{tokens:,} tokens; encode_batch_fast on 1 thread {one:.1f} s / {CORES} cores"))  # fmt: skip
            cold_s, cold_rss, summary = cold(stdlib, ID_STDLIB, env, home)
            figures["cold/limit"] = cold_s / whole_limit
            rows.append(("whole tree: cold dlm tokenize", cold_s, cold_rss,
                         f"{summary['tokens']:,} tokens; {cold_s / whole_limit:.2f}x the limit"))  # fmt: skip
            if not args.skip_one_thread:
                ratios = []
                for pair in range(args.pairs):
                    all_s = cold_s  # the first pair's all-cores run is the cold run above
                    if pair:
                        all_s, all_rss, _ = cold(stdlib, ID_STDLIB, env, home)
                        rows.append((f"whole tree: cold, pair {pair + 1}", all_s, all_rss, ""))
                    one_s, one_rss, _ = cold(stdlib, ID_STDLIB, {**env, "RAYON_NUM_THREADS": "1"}, home)
                    ratios.append(one_s / all_s)
                    rows.append((f"whole tree: cold, RAYON_NUM_THREADS=1{f', pair {pair + 1}' if args.pairs > 1 else ''}",
                                 one_s, one_rss, f"all {CORES} cores {one_s / all_s:.2f}x faster"))  # fmt: skip
                figures["threads"] = statistics.median(ratios)
        if not args.skip_whole:
            tokenize(stdlib, env)  # all hits (or the first pass), walked: takes the snapshot
            tokenize(stdlib, env)
            assert has_snapshot(home, ID_STDLIB), "no pass snapshot was taken of the stdlib"
            figures["warm"], warm_rss = median_of([tokenize(stdlib, env) for _ in range(args.repeat)])
            rows.append(
                (
                    "whole tree: warm dlm tokenize",
                    figures["warm"],
                    warm_rss,
                    f"median of {args.repeat}, snapshot",
                )
            )
            shows = [timed_process([DLM, "show", str(stdlib)], env) for _ in range(args.repeat)]
            figures["show"], rss = median_of(shows)  # type: ignore[arg-type]
            rows.append(("whole tree: dlm show", figures["show"], rss, f"median of {args.repeat}, snapshot"))
            walk_s, walk_rss = median_of(
                [walked(stdlib, ID_STDLIB, env, home, tokenize_argv) for _ in range(3)]
            )
            figures["warm_walked"] = walk_s
            rows.append(
                ("whole tree: warm, snapshot dropped", walk_s, walk_rss, "median of 3, walks the tree")
            )
        if args.tiny:
            tree = make_tiny_tree(work / "tiny" / "src", args.tiny)
            tiny = write_doc(work / "tiny.dlm", ID_TINY, tree, None)
            tiny_cold, tiny_cold_rss, _ = cold(tiny, ID_TINY, env, home)
            figures["tiny_cold"] = tiny_cold
            rows.append((f"{args.tiny:,} tiny files cold", tiny_cold, tiny_cold_rss, ""))
            tokenize(tiny, env)  # the tree was just written: a racy-clean pass takes no snapshot
            tokenize(tiny, env)  # all hits, walked, mtimes now past: takes the snapshot
            assert has_snapshot(home, ID_TINY), "no pass snapshot was taken of the tiny tree"
            figures["tiny_warm"], rss = median_of([tokenize(tiny, env) for _ in range(args.repeat)])
            rows.append(
                (
                    f"{args.tiny:,} tiny files warm",
                    figures["tiny_warm"],
                    rss,
                    f"median of {args.repeat}, snapshot",
                )
            )
            shows = [timed_process([DLM, "show", str(tiny)], env) for _ in range(args.repeat)]
            figures["tiny_show"], rss = median_of(shows)  # type: ignore[arg-type]
            rows.append(
                (
                    f"{args.tiny:,} tiny files dlm show",
                    figures["tiny_show"],
                    rss,
                    f"median of {args.repeat}, snapshot",
                )
            )
            runs = [walked(tiny, ID_TINY, env, home, tokenize_argv) for _ in range(3)]
            figures["tiny_warm_walked"], rss = median_of(runs)  # type: ignore[arg-type]
            rows.append(
                (
                    f"{args.tiny:,} tiny warm, snapshot dropped",
                    figures["tiny_warm_walked"],
                    rss,
                    "median of 3",
                )
            )
            runs = [walked(tiny, ID_TINY, env, home, [DLM, "show"]) for _ in range(3)]
            figures["tiny_show_walked"], rss = median_of(runs)  # type: ignore[arg-type]
            rows.append(
                (
                    f"{args.tiny:,} tiny show, snapshot dropped",
                    figures["tiny_show_walked"],
                    rss,
                    "median of 3",
                )
            )
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\n{'case':<44} {'wall':>8} {'peak RSS':>10}  note")
    for case, seconds, peak, note in rows:
        print(f"{case:<44} {seconds:>6.2f} s {gib(peak)}  {note}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end ({load:.2f} at the start)")

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    print("\nagainst the issues' goals and their 'now' (before the work)")
    if "first_cold/limit" in figures:
        ratio = figures["first_cold/limit"]
        print(f"  first {args.first:,} files cold / limit <= {GOALS['first_cold/limit']:.2f}: {ratio:.2f}  "
              f"{verdict(ratio <= GOALS['first_cold/limit'])}   (issue 31's now: {BEFORE['first_cold/limit']:.2f}, "
              f"last: {LAST['first_cold/limit']:.2f})")  # fmt: skip
        for key, label, goal in (("first_warm", "warm", "warm"), ("first_show", "dlm show", "show")):
            value = figures[key]
            print(f"  first {args.first:,} files {label} <= {GOALS[goal]} s: {value:.2f} s  {verdict(value <= GOALS[goal])}"
                  + (f"   (issue 31's now: {BEFORE['first_warm']} s" if key == "first_warm" else "   (")
                  + f"{', ' if key == 'first_warm' else ''}last: {LAST[key]} s)")  # fmt: skip
    if "cold/limit" in figures and cold_s is not None and cold_rss is not None:
        print(f"  whole tree cold / limit: {figures['cold/limit']:.2f}   (the issue's {BEFORE['cold']:.1f} s: "
              f"{BEFORE['cold'] / cold_s:.2f}x faster)")  # fmt: skip
        print(f"  cold peak RSS <= 1 GiB: {gib(cold_rss)}  {verdict(cold_rss <= GOALS['cold_rss'])}")
    if "threads" in figures:
        pairs = f" (median of {args.pairs} alternated pairs)" if args.pairs > 1 else ""
        print(f"  all cores vs 1 thread >= {GOALS['threads']}x: {figures['threads']:.2f}x{pairs}  "
              f"{verdict(figures['threads'] >= GOALS['threads'])}")  # fmt: skip
    for key, label in (("warm", "whole tree warm"), ("show", "whole tree dlm show")):
        if key not in figures:
            continue
        value = figures[key]
        print(f"  {label} <= {GOALS[key]} s: {value:.2f} s  {verdict(value <= GOALS[key])}"
              + (f"   ({BEFORE['warm'] / value:.2f}x faster than issue 17's {BEFORE['warm']} s; walked: "
                 f"{figures['warm_walked']:.2f} s; " if key == "warm" else "   (")
              + f"issue 31's last: {LAST[key]} s)")  # fmt: skip
    for key, label in (("tiny_warm", "tiny warm"), ("tiny_show", "tiny show")):
        if key in figures:
            value = figures[key]
            walk = figures[f"{key}_walked"]
            print(f"  {label} <= {GOALS[key]} s: {value:.2f} s  {verdict(value <= GOALS[key])}"
                  f"   ({BEFORE[key] / value:.2f}x faster than {BEFORE[key]} s;"
                  f" walked: {walk:.2f} s, {BEFORE[key] / walk:.2f}x)")  # fmt: skip
    if "tiny_cold" in figures:
        print(f"  tiny cold: {figures['tiny_cold']:.1f} s   "
              f"({BEFORE['tiny_cold'] / figures['tiny_cold']:.2f}x faster than {BEFORE['tiny_cold']} s)")  # fmt: skip


if __name__ == "__main__":
    main()

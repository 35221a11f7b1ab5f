"""Whole-process `dlm tokenize` against the tokenizer's floor, cold and warm, with peak RSS.

Prints, side by side from one run on this machine (issue 17, "Tokenize at
the tokenizer's floor"):

* **floor**: one process that reads the files `dlm tokenize` reads (the
  stdlib's ``**/*.py``, ~13K files) and encodes them with the Rust
  tokenizer's ``encode_batch`` in batches of 256 on every core; its time is
  taken from after the tokenizer is loaded, so the floor leaves out what
  any process must pay first;
* **floor on one thread**: the same with ``RAYON_NUM_THREADS=1``, so the
  tokenizer's own scaling on this machine is printed beside dlm's;
* **cold** `dlm tokenize` on the same tree (no cache entries), as a ratio
  of the floor; then the same with ``RAYON_NUM_THREADS=1`` (one tokenizer
  thread), as the speedup all cores give;
* **warm** `dlm tokenize` on the stdlib (all hits), median of ``--repeat``,
  answered from the pass snapshot (a stat per folder and file,
  ``dlmstore.corpus.snapshot``); beside it the same pass with the snapshot
  dropped first, so it walks the tree and looks every row up (what the
  first pass after a change elsewhere in the store costs);
* a generated tree of ``--tiny`` tiny files (100,000 by default): cold,
  warm (median, and walked) and `dlm show` (median, and walked);
* the peak RSS of every process (``wait4``), and the issue's "now" figures
  (measured before this work, same machine) as ratios.

dlmstore's bytecode is compiled first, as an installed package has it.

    python bench/bench_tokenize.py [--root PATH] [--repeat 5] [--tiny 100000] [--skip-one-thread]
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
ID_TINY = "01M7YJ087N2NEP493AF56E3CE2"

#: The issue's "now" (before this work; quiet 2-core machine, whole process).
BEFORE = {"cold": 76.5, "warm": 0.93, "tiny_warm": 3.7, "tiny_cold": 34.7, "tiny_show": 4.6}
GOALS = {
    "cold/floor": 1.10,
    "cold_rss": 1 << 30,
    "warm": 0.5,
    "tiny_warm": 1.5,
    "tiny_show": 1.5,
    "threads": 1.8,
}

#: The floor: load the tokenizer, then (timed) read the listed files and
#: encode them with the backend's encode_batch in batches of 256.
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
    tokens += sum(len(e.ids) for e in backend.encode_batch(texts, add_special_tokens=True))
print(tokens, time.perf_counter() - start)
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


def cold(doc: Path, dlm_id: str, env: dict[str, str], home: Path) -> tuple[float, int, dict[str, object]]:
    shutil.rmtree(home / "store" / dlm_id, ignore_errors=True)
    seconds, peak, summary = tokenize(doc, env)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=STDLIB, help="the tree of .py files (the stdlib)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tiny", type=int, default=100_000, help="files of the generated tree (0: skip)")
    parser.add_argument("--skip-one-thread", action="store_true", help="leave out the 1-thread cold run")
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
    try:
        stdlib = write_doc(work / "stdlib.dlm", ID_STDLIB, args.root, "**/*.py")
        # Convert the base once, so no timing below includes the one-off conversion.
        timed_process([DLM, "tokenize", "--no-cache", str(write_doc(work / "one.dlm", ID_TINY, REPO / "bench",
                                                                    "benchlib.py"))], env)  # fmt: skip
        listing = work / "files.txt"
        files = chosen_files(stdlib)
        listing.write_text("\n".join(files), encoding="utf-8")
        print(f"load average {load:.2f} at start; {len(files):,} files under {args.root}", flush=True)

        floor_wall, floor_rss, out = timed_process([sys.executable, "-c", FLOOR, str(listing)], env)
        floor_tokens, floor_s = int(out.split()[0]), float(out.split()[1])
        rows.append(("floor: read + encode_batch, 256/batch", floor_s, floor_rss,
                     f"{floor_tokens:,} tokens; whole process {floor_wall:.1f} s"))  # fmt: skip
        floor_one_s = None
        if not args.skip_one_thread:  # the tokenizer's own scaling, for the threads figure
            _, floor_one_rss, out = timed_process([sys.executable, "-c", FLOOR, str(listing)],
                                                  {**env, "RAYON_NUM_THREADS": "1"})  # fmt: skip
            floor_one_s = float(out.split()[1])
            rows.append(("floor, RAYON_NUM_THREADS=1", floor_one_s, floor_one_rss,
                         f"the tokenizer alone: all cores {floor_one_s / floor_s:.2f}x faster"))  # fmt: skip
        cold_s, cold_rss, summary = cold(stdlib, ID_STDLIB, env, home)
        rows.append(("stdlib cold dlm tokenize", cold_s, cold_rss,
                     f"{summary['tokens']:,} tokens; {cold_s / floor_s:.3f}x the floor"))  # fmt: skip
        one_s = None
        if not args.skip_one_thread:
            ratios = []
            for pair in range(args.pairs):
                all_s = cold_s  # the first pair's all-cores run is the cold run above
                if pair:
                    all_s, all_rss, _ = cold(stdlib, ID_STDLIB, env, home)
                    rows.append((f"stdlib cold, pair {pair + 1}", all_s, all_rss, ""))
                one_s, one_rss, _ = cold(stdlib, ID_STDLIB, {**env, "RAYON_NUM_THREADS": "1"}, home)
                ratios.append(one_s / all_s)
                rows.append((f"stdlib cold, RAYON_NUM_THREADS=1{f', pair {pair + 1}' if args.pairs > 1 else ''}",
                             one_s, one_rss, f"all {os.cpu_count()} cores {one_s / all_s:.2f}x faster"))  # fmt: skip
            speedup = statistics.median(ratios)
        tokenize(stdlib, env)  # all hits, walked: takes the snapshot if the cold pass could not
        assert has_snapshot(home, ID_STDLIB), "no pass snapshot was taken of the stdlib"
        warm_s, warm_rss = median_of([tokenize(stdlib, env) for _ in range(args.repeat)])
        rows.append(("stdlib warm dlm tokenize", warm_s, warm_rss, f"median of {args.repeat}, snapshot"))
        tokenize_argv = [DLM, "tokenize", "--json"]
        walk_s, walk_rss = median_of([walked(stdlib, ID_STDLIB, env, home, tokenize_argv) for _ in range(3)])
        rows.append(("stdlib warm, snapshot dropped", walk_s, walk_rss, "median of 3, walks the tree"))
        tiny_figures: dict[str, float] = {}
        if args.tiny:
            tree = make_tiny_tree(work / "tiny" / "src", args.tiny)
            tiny = write_doc(work / "tiny.dlm", ID_TINY, tree, None)
            tiny_cold, tiny_cold_rss, _ = cold(tiny, ID_TINY, env, home)
            rows.append((f"{args.tiny:,} tiny files cold", tiny_cold, tiny_cold_rss, ""))
            tokenize(tiny, env)  # the tree was just written: a racy-clean pass takes no snapshot
            tokenize(tiny, env)  # all hits, walked, mtimes now past: takes the snapshot
            assert has_snapshot(home, ID_TINY), "no pass snapshot was taken of the tiny tree"
            tiny_warm, tiny_warm_rss = median_of([tokenize(tiny, env) for _ in range(args.repeat)])
            rows.append(
                (
                    f"{args.tiny:,} tiny files warm",
                    tiny_warm,
                    tiny_warm_rss,
                    f"median of {args.repeat}, snapshot",
                )
            )
            shows = [timed_process([DLM, "show", str(tiny)], env) for _ in range(args.repeat)]
            show_s, show_rss = median_of(shows)  # type: ignore[arg-type]
            rows.append(
                (f"{args.tiny:,} tiny files dlm show", show_s, show_rss, f"median of {args.repeat}, snapshot")
            )
            runs = [walked(tiny, ID_TINY, env, home, tokenize_argv) for _ in range(3)]
            tiny_walk, tiny_walk_rss = median_of(runs)  # type: ignore[arg-type]
            rows.append(
                (f"{args.tiny:,} tiny warm, snapshot dropped", tiny_walk, tiny_walk_rss, "median of 3")
            )
            runs = [walked(tiny, ID_TINY, env, home, [DLM, "show"]) for _ in range(3)]
            show_walk, show_walk_rss = median_of(runs)  # type: ignore[arg-type]
            rows.append(
                (f"{args.tiny:,} tiny show, snapshot dropped", show_walk, show_walk_rss, "median of 3")
            )
            tiny_figures = {"tiny_cold": tiny_cold, "tiny_warm": tiny_warm, "tiny_show": show_s,
                            "tiny_warm_walked": tiny_walk, "tiny_show_walked": show_walk}  # fmt: skip
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\n{'case':<42} {'wall':>8} {'peak RSS':>10}  note")
    for case, seconds, peak, note in rows:
        print(f"{case:<42} {seconds:>6.2f} s {gib(peak)}  {note}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end ({load:.2f} at the start)")

    print("\nagainst the issue's goals and its 'now' (before this work)")
    ratio = cold_s / floor_s

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    print(f"  cold / floor <= {GOALS['cold/floor']:.2f}: {ratio:.3f}  {verdict(ratio <= GOALS['cold/floor'])}"
          f"   (now {BEFORE['cold'] / cold_s:.2f}x faster than the issue's {BEFORE['cold']:.1f} s)")  # fmt: skip
    print(f"  cold peak RSS <= 1 GiB: {gib(cold_rss)}  {verdict(cold_rss <= GOALS['cold_rss'])}")
    if one_s is not None:
        pairs = f" (median of {args.pairs} alternated pairs)" if args.pairs > 1 else ""
        print(
            f"  all cores vs 1 thread >= {GOALS['threads']}x: {speedup:.2f}x{pairs}  "
            f"{verdict(speedup >= GOALS['threads'])}"
            + (f"   (the tokenizer alone, one pair: {floor_one_s / floor_s:.2f}x)" if floor_one_s else "")
        )
    print(f"  warm <= {GOALS['warm']} s: {warm_s:.2f} s  {verdict(warm_s <= GOALS['warm'])}"
          f"   ({BEFORE['warm'] / warm_s:.2f}x faster than {BEFORE['warm']} s;"
          f" walked: {walk_s:.2f} s, {BEFORE['warm'] / walk_s:.2f}x)")  # fmt: skip
    for key, label in (("tiny_warm", "tiny warm"), ("tiny_show", "tiny show")):
        if key in tiny_figures:
            value = tiny_figures[key]
            walk = tiny_figures[f"{key}_walked"]
            print(f"  {label} <= {GOALS[key]} s: {value:.2f} s  {verdict(value <= GOALS[key])}"
                  f"   ({BEFORE[key] / value:.2f}x faster than {BEFORE[key]} s;"
                  f" walked: {walk:.2f} s, {BEFORE[key] / walk:.2f}x)")  # fmt: skip
    if "tiny_cold" in tiny_figures:
        print(
            f"  tiny cold: {tiny_figures['tiny_cold']:.1f} s   "
            f"({BEFORE['tiny_cold'] / tiny_figures['tiny_cold']:.2f}x faster than {BEFORE['tiny_cold']} s)"
        )


if __name__ == "__main__":
    main()

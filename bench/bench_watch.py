"""``dlm train --watch``: from a save to the start of its run's training, against a fresh ``dlm train``.

    python bench/bench_watch.py                  # a 13,000-file document, 5 saves of each kind
    python bench/bench_watch.py --files 500 --repeat 3

The document trains the tiny SmolLM2-shaped base (benchlib.make_tiny_base)
on its body and on ``training.sources``: a tree of ``--files`` small files
(benchlib.make_tiny_tree). One ``dlm train --watch`` session (the real
command, in a child process; the default 400 ms debounce) trains it once;
then, ``--repeat`` times each, the bench appends one line to the document,
or to one file of the tree, and measures the seconds from the write to the
moment the cycle's SFT training starts (the first progress update of its
``training sft`` task). The baseline, in the same run: a fresh ``dlm train
--max-steps 1`` process over the same document after the same one-line
edit, from its start to the same point. Medians are printed side by side.
Goal: the watch cycle starts training within 1 s of the save.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import REPO, compile_bytecode, make_tiny_base, make_tiny_tree

WORK = Path(tempfile.gettempdir()) / "dlm-bench-watch"
DLM_ID = "01M7YJ087N2NEP493AF56E3CW0"

#: ``dlm ARGS...`` in a child that appends the time (``time.time()``) at which each SFT training
#: starts to the file ``$BENCH_MARKS``: the CLI's own progress drawing, wrapped.
_MARKED = """
import os, sys, time
from dlmstore.cli import progress
draw = progress.ProgressRenderer.__call__
training = []
def marked(self, update):
    if update.task == "training sft" and not training:
        with open(os.environ["BENCH_MARKS"], "a") as marks:
            marks.write(f"{time.time()}\\n")
        training.append(update)
    if update.finished:
        training.clear()
    draw(self, update)
progress.ProgressRenderer.__call__ = marked
from dlmstore.cli.main import cli
cli(sys.argv[1:], prog_name="dlm")
"""

#: Waits longer than this are a stuck session, not a measurement.
PATIENCE_S = 1800


def env(marks: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "DLM_HOME": str(WORK / "home"),
        "BENCH_MARKS": str(marks),
    }


def write_doc(base: Path, tree: Path) -> Path:
    doc = WORK / "watched.dlm"
    doc.write_text(
        f"---\ndlm_id: {DLM_ID}\nbase_model: {base}\ntraining:\n  sequence_len: 64\n  max_steps: 1\n"
        f"  sources:\n    - path: {tree}\n      include: ['**/*.txt']\n---\nProse about the watched tree.\n",
        encoding="utf-8",
    )
    return doc


def marks_in(marks: Path) -> list[float]:
    return [float(line) for line in marks.read_text().split()] if marks.exists() else []


def wait_for(what: str, done: object, process: subprocess.Popen[bytes], log: Path) -> None:
    """Poll ``done()`` until it holds; the process ending first, or a stuck one, ends the bench."""
    deadline = time.monotonic() + PATIENCE_S
    while not done():  # type: ignore[operator]
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"no {what}:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.005)


def edited(path: Path, number: int) -> None:
    with path.open("a", encoding="utf-8") as file:
        file.write(f"One more line, the edit number {number}.\n")


def watched_latencies(doc: Path, tree: Path, repeat: int) -> tuple[list[float], list[float]]:
    """Seconds from each save to its cycle's training start: edits of the document, then of a source file."""
    marks, log = WORK / "watch.marks", WORK / "watch.log"
    marks.unlink(missing_ok=True)
    with log.open("wb") as out:
        session = subprocess.Popen(
            [sys.executable, "-c", _MARKED, "train", str(doc), "--watch", "--watch-max-steps", "1"],
            env=env(marks), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for("first run", lambda: "watching " in log.read_text(errors="replace"), session, log)
        latencies: dict[str, list[float]] = {"document": [], "source": []}
        cycle = 0
        for kind, path in (("document", doc), ("source", tree / "f000123.txt")):
            for _ in range(repeat):
                cycle += 1
                before = len(marks_in(marks))
                saved = time.time()
                edited(path, cycle)
                wait_for(f"cycle {cycle} training", lambda b=before: len(marks_in(marks)) > b, session, log)
                latencies[kind].append(marks_in(marks)[before] - saved)
                ended = f"cycle {cycle}: "  # its result line (with the adapter version) ends the cycle
                wait_for(f"cycle {cycle} end", lambda e=ended: _ended(log, e), session, log)
        return latencies["document"], latencies["source"]
    finally:
        session.send_signal(signal.SIGINT)
        session.wait(timeout=PATIENCE_S)


def _ended(log: Path, head: str) -> bool:
    return any(
        line.startswith(head) and " -> v" in line for line in log.read_text(errors="replace").splitlines()
    )


def fresh_latencies(doc: Path, repeat: int) -> list[float]:
    """Seconds from a fresh ``dlm train`` process's start to its training start, after a one-line edit."""
    marks, log = WORK / "fresh.marks", WORK / "fresh.log"
    seconds = []
    for number in range(repeat):
        marks.unlink(missing_ok=True)
        edited(doc, 1000 + number)
        with log.open("wb") as out:
            started = time.time()
            process = subprocess.Popen(
                [sys.executable, "-c", _MARKED, "train", str(doc), "--max-steps", "1"],
                env=env(marks), stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
            if process.wait(timeout=PATIENCE_S) != 0:
                raise SystemExit(f"dlm train failed:\n{log.read_text(errors='replace')[-3000:]}")
        seconds.append(marks_in(marks)[0] - started)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=13_000, help="files in the document's source tree")
    parser.add_argument("--repeat", type=int, default=5, help="saves of each kind (and fresh runs) measured")
    args = parser.parse_args()
    compile_bytecode()
    WORK.mkdir(parents=True, exist_ok=True)
    os.chdir(REPO)
    base = make_tiny_base(WORK / "tiny")
    tree = make_tiny_tree(WORK / f"tree-{args.files}", args.files)
    doc = write_doc(base, tree)
    document, source = watched_latencies(doc, tree, args.repeat)
    fresh = fresh_latencies(doc, args.repeat)
    print(f"document: {args.files:,} source files + its body, tiny base, default debounce (400 ms)")
    print(f"save -> training start, watch cycle (document edited): {statistics.median(document):.2f} s median "
          f"of {len(document)}")  # fmt: skip
    print(f"save -> training start, watch cycle (a source edited): {statistics.median(source):.2f} s median "
          f"of {len(source)}")  # fmt: skip
    print(f"start -> training start, fresh dlm train (baseline):   {statistics.median(fresh):.2f} s median "
          f"of {len(fresh)}")  # fmt: skip
    print("goal: the watch cycle within 1 s of the save")


if __name__ == "__main__":
    main()

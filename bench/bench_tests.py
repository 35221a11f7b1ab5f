"""How long the test loop takes: `make test-fast`'s share and the slow tests', against the targets.

The suite is split by the ``slow`` marker (real-model training, the
determinism golden, process races, mypy). This runs each part as its own
pytest process, whole process, and prints its wall time, its test count and
its share of the whole, beside the targets of the house issue: the whole
suite within 10 minutes and the fast part within 2 minutes on an idle
2-core machine. ``--durations N`` also prints the slowest tests of each part,
which is where to look when a target is missed.

    python bench/bench_tests.py [--durations 10]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS_S = {"fast": 120.0, "whole": 600.0}
PARTS = {"fast": "not slow", "slow": "slow"}


def run_part(marker: str, durations: int) -> tuple[float, int, str]:
    """Wall seconds, tests passed and the durations report of one pytest run."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker]
    if durations:
        argv.append(f"--durations={durations}")
    start = time.perf_counter()
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"pytest -m {marker!r} failed:\n{out.stdout[-4000:]}")
    passed = re.search(r"(\d+) passed", out.stdout)
    report = out.stdout.split("slowest", 1)[1].split("\n", 1)[1] if "slowest" in out.stdout else ""
    return wall, int(passed.group(1)) if passed else 0, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--durations", type=int, default=0)
    args = parser.parse_args()

    results = {name: run_part(marker, args.durations) for name, marker in PARTS.items()}
    whole = sum(wall for wall, _, _ in results.values())
    tests = sum(count for _, count, _ in results.values())
    print("whole process, each part its own pytest run")
    for name, (wall, count, _) in results.items():
        print(f"  {name:6s} {count:4d} tests  {wall:7.1f} s  {wall / whole:6.1%} of the suite")
    print(f"  whole  {tests:4d} tests  {whole:7.1f} s")
    for name, seconds in (("fast", results["fast"][0]), ("whole", whole)):
        verdict = "meets" if seconds <= TARGETS_S[name] else "MISSES"
        print(
            f"{name}: {seconds:.1f} s, {verdict} the {TARGETS_S[name]:.0f} s target ({seconds / TARGETS_S[name]:.2f} of it)"
        )
    if args.durations:
        for name, (_, _, report) in results.items():
            print(f"\nslowest of {name}:\n{report.rstrip()}")


if __name__ == "__main__":
    main()

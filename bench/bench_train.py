"""Where the time before the first training step goes: `dlm train` on the tour document.

Training itself is bounded by the model; the time before the first step is
ours. With a warm cache it must be dominated by loading the model, not by
tokenization or dataset building. Runs `dlm train --json` (whole process)
cold and then warm, --repeat times, and prints the median split:

    python bench/bench_train.py [--doc examples/tour.dlm] [--repeat 3] [--max-steps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DLM = str(Path(sys.executable).with_name("dlm"))
PHASES = ("startup", "framework_import", "tokenize", "dataset", "model_load", "trainer_setup", "first_step")
OURS = ("startup", "tokenize", "dataset")
MODEL = ("framework_import", "model_load", "trainer_setup", "first_step")


def run(doc: Path, env: dict[str, str], max_steps: int) -> tuple[float, dict[str, object]]:
    start = time.perf_counter()
    out = subprocess.run(
        [DLM, "train", str(doc), "--json", "--max-steps", str(max_steps), "--update-lock"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    return wall, json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--doc", type=Path, default=Path(__file__).resolve().parent.parent / "examples" / "tour.dlm"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=2)
    args = parser.parse_args()

    from dlmstore.home import bases_dir

    bases = bases_dir()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        bases.mkdir(parents=True, exist_ok=True)
        (home / "bases").symlink_to(
            bases, target_is_directory=True
        )  # no one-off GGUF conversion in the timings
        env = {**os.environ, "DLM_HOME": str(home), "HF_HUB_OFFLINE": "1"}
        cold_wall, cold = run(args.doc, env, args.max_steps)
        warm = [run(args.doc, env, args.max_steps) for _ in range(args.repeat)]

    def split(summary: dict[str, object]) -> dict[str, float]:
        return dict(summary["timings"])  # type: ignore[call-overload]

    print(f"{args.doc.name}: {cold['rows_trained']} rows, {cold['tokens']:,} tokens, {args.max_steps} steps")
    print(f"{'phase':16s} {'cold':>8s} {'warm (median)':>14s}")
    medians = {}
    for phase in (*PHASES, "train", "save"):
        medians[phase] = statistics.median(split(w[1])[phase] for w in warm)
        print(f"{phase:16s} {split(cold)[phase]:8.2f} {medians[phase]:14.2f}")
    warm_wall = statistics.median(w[0] for w in warm)
    cold_other = (
        cold_wall - sum(split(cold).values()) + split(cold)["first_step"]
    )  # first_step is inside train
    warm_other = warm_wall - sum(medians.values()) + medians["first_step"]
    print(f"{'process+exit':16s} {cold_other:8.2f} {warm_other:14.2f}")
    print(f"{'whole':16s} {cold_wall:8.2f} {warm_wall:14.2f}")
    ours = sum(medians[p] for p in OURS)
    model = sum(medians[p] for p in MODEL)
    before = ours + model
    print(
        f"\nwarm, start to first step: {before:.2f} s; loading and stepping the model {model:.2f} s "
        f"({model / before:.0%}: import {medians['framework_import']:.2f}, from_pretrained "
        f"{medians['model_load']:.2f}, trainer setup {medians['trainer_setup']:.2f}, first step "
        f"{medians['first_step']:.2f}); ours {ours:.2f} s ({ours / before:.0%}: startup "
        f"{medians['startup']:.2f}, tokenize {medians['tokenize']:.2f}, dataset {medians['dataset']:.2f})"
    )
    print(
        f"target (the model dominates, not tokenization or dataset building): {'met' if model > ours else 'MISSED'}"
    )
    hit = warm[-1][1]["tokenization"]
    print(f"warm cache: {hit['cache_hits']} hits, {hit['cache_misses']} misses")  # type: ignore[index]


if __name__ == "__main__":
    main()

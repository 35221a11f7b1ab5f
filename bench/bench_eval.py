"""What evaluating costs: the val loss and the probes beside the training they belong to.

For each document (the tour and the demo by default), one `dlm train --json`
in a fresh home (the base's converted folder shared, so no one-off GGUF
conversion is timed) reports, from the same run:

* train: the optimizer steps (the val evaluations between them taken out);
* val during training: the val split evaluated every `max_steps // 4` steps;
* after the phases: the base and each phase's adapter on the val split and
  the probes (greedy answers, reference NLLs);

and the eval cost ratio (val during training + after the phases) / train,
whose goal is 15% or less with the documents' own settings. Then a
`dlm eval --json` of the same store (the whole process) beside it, and how
long the probes take one at a time against batched, and batched with the
decoding steps' linear layers as ``F.linear`` computes them against
weight-first (``dlmstore.eval.linears``), on the real model (in this
process, its threads set as `dlm eval` sets them). The machine may be
shared: each document's line ends with the 1-minute load average before
its training and after its `dlm eval`, and the last line gives the load at
the end:

    python bench/bench_eval.py [--doc examples/tour.dlm --doc examples/demo.dlm]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DLM = str(Path(sys.executable).with_name("dlm"))
REPO = Path(__file__).resolve().parent.parent
GOAL = 0.15


def dlm(*args: str, env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    out = subprocess.run([DLM, *args, "--json"], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    return wall, json.loads(out.stdout)


def after_phases(summary: dict[str, Any]) -> float:
    """Seconds the base and the adapters took after their phases (the base once per run)."""
    seconds = 0.0
    for index, phase in enumerate(summary["phases"]):
        evaluation = phase["evaluation"]
        seconds += evaluation["adapter"]["seconds"] + (evaluation["base"]["seconds"] if index == 0 else 0.0)
    return seconds


def probes_one_at_a_time_and_batched(doc: Path) -> tuple[float, float, float, int]:
    """The base answering the document's probes one by one, then all at once, then all at once with
    every linear layer computed by ``F.linear`` as before (``dlmstore.eval.linears``); median of 3 each."""
    import statistics

    import torch

    from dlmstore.bases import load_model, load_tokenizer, resolve_base
    from dlmstore.document.parser import parse_document
    from dlmstore.eval import linears
    from dlmstore.eval.inference import ask, evaluating
    from dlmstore.eval.probes import extract_probes

    document = parse_document(doc)
    ref = resolve_base(document.base_model, relative_to=document.directory)
    tokenizer, model = load_tokenizer(ref), load_model(ref)
    probes = extract_probes(document.sections, seed=document.frontmatter.training.seed)
    system = document.frontmatter.system_prompt
    single, batched, plain = [], [], []
    weight_first = linears.FEW_ROWS
    with evaluating(model), torch.no_grad():
        for _ in range(3):
            single.append(sum(ask(model, tokenizer, [probe], system)[1] for probe in probes))
            batched.append(ask(model, tokenizer, probes, system)[1])
            linears.FEW_ROWS = range(0)
            try:
                plain.append(ask(model, tokenizer, probes, system)[1])
            finally:
                linears.FEW_ROWS = weight_first
    return statistics.median(single), statistics.median(batched), statistics.median(plain), len(probes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doc", type=Path, action="append")
    args = parser.parse_args()
    docs = args.doc or [REPO / "examples" / "tour.dlm", REPO / "examples" / "demo.dlm"]

    from dlmstore.home import bases_dir

    bases = bases_dir()
    bases.mkdir(parents=True, exist_ok=True)
    start_load = os.getloadavg()[0]
    print(f"load average {start_load:.2f} at the start; {len(os.sched_getaffinity(0))} CPUs usable")
    print(
        f"{'document':12s} {'train':>8s} {'val (in)':>9s} {'after':>8s} {'eval':>8s} {'ratio':>7s}  "
        "dlm eval (whole); load average"
    )
    for doc in docs:
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp) / "home"
            home.mkdir()
            (home / "bases").symlink_to(bases, target_is_directory=True)
            env = {**os.environ, "DLM_HOME": str(home), "HF_HUB_OFFLINE": "1"}
            _, summary = dlm("train", str(doc), env=env)
            wall, report = dlm("eval", str(doc), env=env)
        timings = summary["timings"]
        after = after_phases(summary)
        during = timings["evaluate"] - after
        ratio = timings["evaluate"] / timings["train"]
        print(
            f"{doc.name:12s} {timings['train']:7.1f}s {during:8.1f}s {after:7.1f}s {timings['evaluate']:7.1f}s "
            f"{ratio:6.1%}  {wall:.1f}s ({report['models'][0]['seconds'] + report['models'][-1]['seconds']:.1f}s "
            f"evaluating, {report['cache_misses']} rows tokenized); load {load:.2f} -> {os.getloadavg()[0]:.2f}"
        )
        models = ", ".join(
            f"{phase['phase']} {name} {phase['evaluation'][name]['seconds']:.1f}s"
            for index, phase in enumerate(summary["phases"])
            for name in (("base", "adapter") if index == 0 else ("adapter",))
        )
        print(f"{'':12s} after the phases: {models}")
        print(
            f"{'':12s} goal: eval <= {GOAL:.0%} of train: {'met' if ratio <= GOAL else 'MISSED'}", flush=True
        )
    from dlmstore.train.threads import configure

    configure()  # before torch is imported here, as `dlm eval` does
    for doc in docs:
        single, batched, plain, count = probes_one_at_a_time_and_batched(doc)
        print(
            f"{doc.name}: {count} probes, the base answering one at a time {single:.2f}s, batched {batched:.2f}s; "
            f"batched with F.linear for few rows {plain:.2f}s ({plain / batched:.2f}x the weight-first time)"
        )
    print(f"load average {os.getloadavg()[0]:.2f} at the end ({start_load:.2f} at the start)")


if __name__ == "__main__":
    main()

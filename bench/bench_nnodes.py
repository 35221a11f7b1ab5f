"""What training across machines costs: a step on two localhost "nodes" beside the same step on one.

    python bench/bench_nnodes.py                 # 20 steps, each layout twice
    python bench/bench_nnodes.py --steps 40 --repeat 3

The same document (the built-in SmolLM2-135M, a token dataset of stdlib
lines, micro-batch 2, sequence_len 128) is trained in three layouts, the
repeats interleaved so a busy machine weighs on each alike:

* ``--nproc 1`` - the baseline, one process;
* ``--nproc 2`` - one node of two ranks (gloo over loopback);
* ``--nnodes 2`` - two ``dlm train --nnodes 2 --node-rank 0|1`` launchers on
  127.0.0.1, one rank each, node 1 with a home of its own (as another machine
  would be: it converts the base for itself, and never opens the store).

Printed per layout: the median milliseconds per optimizer step (the summary's
``timings.train`` over its steps), the median wall time of the command, and
the adapter sha256, which is the same for both two-rank layouts. Every rank
runs one torch thread (``OMP_NUM_THREADS=1``), gloo on ``lo``.

Work folder: ``$TMPDIR/dlm-bench-nnodes`` (its homes convert the built-in
base once each).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import make_tiny_tree

WORK = Path(tempfile.gettempdir()) / "dlm-bench-nnodes"
DLM_ID = "01KPQ1FFEDGPPSMWRAS18SAZSN"
ENV = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "DLM_QUIET": "1"}
LAYOUTS = ("nproc1", "nproc2", "nnodes2")


def prepare(steps: int) -> Path:
    """The dataset (built once) and the document."""
    dataset = WORK / "dataset"
    if not (dataset / "meta.json").is_file():
        corpus = make_tiny_tree(WORK / "corpus", 400)
        env = {**os.environ, **ENV, "DLM_HOME": str(WORK / "home-build")}
        command = [sys.executable, "-m", "dlmstore.cli.main", "data", "build", "pretrain", "--from", str(corpus),
                   "--out", str(dataset), "--base", "smollm2-135m", "--val-frac", "0", "--force"]  # fmt: skip
        subprocess.run(command, env=env, check=True)
    doc = WORK / "doc.dlm"
    doc.write_text(
        f"---\ndlm_id: {DLM_ID}\nbase_model: smollm2-135m\ntraining:\n  sequence_len: 128\n"
        f"  max_steps: {steps}\n  micro_batch_size: 2\n  grad_accum: 1\n  seed: 7\n"
        f"  datasets:\n    - path: {dataset}\n---\nA line of prose.\n"
    )
    return doc


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(layout: str, doc: Path, rep: int) -> tuple[float, float, str]:
    """One run of ``layout`` in fresh stores: (ms per step, wall seconds, adapter sha256)."""
    homes = [WORK / f"home-{layout}-{node}" for node in (0, 1)]
    for home in homes:  # a fresh store each time; the converted bases are kept
        shutil.rmtree(home / "store", ignore_errors=True)
    train = [sys.executable, "-m", "dlmstore.cli.main", "train", str(doc), "--json"]
    t0 = time.perf_counter()
    if layout == "nnodes2":
        port = free_port()
        nodes = [
            subprocess.Popen(
                [
                    *train,
                    "--nnodes",
                    "2",
                    "--node-rank",
                    str(node),
                    "--master-addr",
                    "127.0.0.1",
                    "--master-port",
                    str(port),
                ],
                env={**os.environ, **ENV, "DLM_HOME": str(homes[node])},
                stdout=subprocess.PIPE,
            )  # fmt: skip
            for node in (0, 1)
        ]
        out = [node.communicate()[0] for node in nodes][0]
        if any(node.returncode for node in nodes):
            raise SystemExit(f"{layout} failed")
    else:
        extra = ["--nproc", "2"] if layout == "nproc2" else []
        done = subprocess.run([*train, *extra], env={**os.environ, **ENV, "DLM_HOME": str(homes[0])},
                              stdout=subprocess.PIPE, check=True)  # fmt: skip
        out = done.stdout
    wall = time.perf_counter() - t0
    summary = json.loads(out)
    ms = 1000 * summary["timings"]["train"] / summary["steps"]
    print(f"  {layout:8} run {rep}: {ms:7.0f} ms/step, {wall:6.1f} s wall", flush=True)
    return ms, wall, str(summary["adapter_sha256"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    doc = prepare(args.steps)
    results: dict[str, list[tuple[float, float, str]]] = {layout: [] for layout in LAYOUTS}
    for layout in LAYOUTS:  # a first run each converts the base into that layout's homes, untimed
        run(layout, doc, 0)
    for rep in range(1, args.repeat + 1):
        for layout in LAYOUTS:
            results[layout].append(run(layout, doc, rep))
    print(f"{args.steps} steps, micro-batch 2 a rank, sequence_len 128, SmolLM2-135M, one thread a rank:")
    for layout, runs in results.items():
        ms = statistics.median(item[0] for item in runs)
        wall = statistics.median(item[1] for item in runs)
        print(f"  {layout:8} {ms:7.0f} ms/step  {wall:6.1f} s wall  adapter {runs[0][2][:23]}...")
    same = {results["nproc2"][0][2]} == {item[2] for item in results["nnodes2"] + results["nproc2"]}
    print(f"  --nnodes 2 and --nproc 2 train the same adapter bytes: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()

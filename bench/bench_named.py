"""A two-adapter document against its two row sets trained as two one-adapter documents.

    python bench/bench_named.py                 # SmolLM2-135M, 10 steps per adapter, 3 repeats
    python bench/bench_named.py --max-steps 5 --repeat 1

The named document declares ``knowledge`` and ``tone`` (DLM's multi-adapter
cookbook shape: shared prose, each adapter's own instruction pairs). The
baseline is the same rows as two one-adapter documents: ``knowledge.dlm``
holds what the routing table gives ``knowledge`` (the shared prose, the
untagged and its own pairs), ``tone.dlm`` what it gives ``tone``, each with
that adapter's LoRA settings. Each is trained by a fresh ``dlm train --json``
process in a fresh home (cold cache, the converted base shared), the three
side by side in each repeat. Printed, as medians:

* the named document's wall time against the two documents' wall times
  less one base load (the larger of their ``model_load`` timings): the
  issue's target is at most 1.15x;
* the same in-process (each run's timings less the framework import, which
  every process pays): what the invocation does, without Python's start.
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
WORK = Path(tempfile.gettempdir()) / "dlm-bench-named"

SHARED = "".join(
    f"The harbour log, entry {i}: the tide turned at {i % 12 + 1} o'clock and the north wall held.\n\n"
    for i in range(40)
)
KNOWLEDGE = [
    (f"How deep is berth {i}?", f"Berth {i} is {8 + i % 5} metres deep at low tide.") for i in range(24)
]
TONE = [(f"Greet visitor {i}.", f"Ahoy, visitor {i}! Fair winds to ye.") for i in range(24)]


def _pairs(pairs: list[tuple[str, str]], fence: str) -> str:
    return "".join(f"\n{fence}\n### Q\n{q}\n### A\n{a}\n" for q, a in pairs)


def _front(dlm_id: str, steps: int, block: str) -> str:
    return (
        f"---\ndlm_id: {dlm_id}\nbase_model: smollm2-135m\ntraining:\n  sequence_len: 256\n"
        f"  max_steps: {steps}\n  micro_batch_size: 4\n  seed: 42\n{block}---\n"
    )


def write_docs(folder: Path, steps: int) -> dict[str, Path]:
    """The named document and the two documents of its row sets."""
    folder.mkdir(parents=True, exist_ok=True)
    named = folder / "named.dlm"
    named.write_text(
        _front(
            "01M8B2RZQ3G7V3J0CQ9T5W6XKA", steps,
            "  adapters:\n    knowledge: {lora_r: 8}\n    tone: {lora_r: 4, learning_rate: 1e-4}\n",
        )
        + SHARED + _pairs(KNOWLEDGE, "::instruction#knowledge::") + _pairs(TONE, "::instruction#tone::"),
        encoding="utf-8",
    )  # fmt: skip
    knowledge = folder / "knowledge.dlm"
    knowledge.write_text(
        _front("01M8B2RZQ3G7V3J0CQ9T5W6XKB", steps, "  lora_r: 8\n")
        + SHARED
        + _pairs(KNOWLEDGE, "::instruction::"),
        encoding="utf-8",
    )
    tone = folder / "tone.dlm"
    tone.write_text(
        _front("01M8B2RZQ3G7V3J0CQ9T5W6XKC", steps, "  lora_r: 4\n  learning_rate: 1e-4\n")
        + SHARED
        + _pairs(TONE, "::instruction::"),
        encoding="utf-8",
    )
    return {"named": named, "knowledge": knowledge, "tone": tone}


def train(doc: Path, home: Path) -> tuple[float, dict[str, object]]:
    """``dlm train --json`` of ``doc`` in the fresh home ``home``: its wall time and its summary."""
    from dlmstore.home import bases_dir

    home.mkdir(parents=True)
    (home / "bases").symlink_to(bases_dir(), target_is_directory=True)
    env = {**os.environ, "DLM_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    start = time.perf_counter()
    out = subprocess.run([DLM, "train", str(doc), "--json"], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    summary: dict[str, object] = json.loads(out.stdout)
    return wall, summary


def _inside(summary: dict[str, object]) -> float:
    """A run's seconds in the process, less the framework import every process pays."""
    timings: dict[str, float] = summary["timings"]  # type: ignore[assignment]
    return sum(value for key, value in timings.items() if key != "framework_import")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=10)
    args = parser.parse_args()
    docs = write_docs(WORK / "docs", args.max_steps)
    walls: dict[str, list[float]] = {"named": [], "baseline": []}
    inside: dict[str, list[float]] = {"named": [], "baseline": []}
    loads: list[float] = []
    for repeat in range(args.repeat):
        homes = WORK / f"homes-{repeat}"
        subprocess.run(["rm", "-rf", str(homes)], check=True)
        named_wall, named = train(docs["named"], homes / "named")
        k_wall, k = train(docs["knowledge"], homes / "knowledge")
        t_wall, t = train(docs["tone"], homes / "tone")
        load = max(k["timings"]["model_load"], t["timings"]["model_load"])  # type: ignore[index]
        loads.append(load)
        walls["named"].append(named_wall)
        walls["baseline"].append(k_wall + t_wall - load)
        runs: list[dict[str, object]] = named["adapters"]  # type: ignore[assignment]
        inside["named"].append(sum(_inside(run) for run in runs))
        inside["baseline"].append(_inside(k) + _inside(t) - load)
        assert named["base_loads"] == 1, named["base_loads"]
        print(
            f"repeat {repeat + 1}: named {named_wall:.1f} s; knowledge {k_wall:.1f} s + tone {t_wall:.1f} s "
            f"- one base load {load:.2f} s = {k_wall + t_wall - load:.1f} s",
            flush=True,
        )
    wall_named, wall_base = statistics.median(walls["named"]), statistics.median(walls["baseline"])
    in_named, in_base = statistics.median(inside["named"]), statistics.median(inside["baseline"])
    print(
        f"\nmedians of {args.repeat} ({args.max_steps} steps per adapter, SmolLM2-135M, base load {statistics.median(loads):.2f} s):"
    )
    print(f"  processes:  named {wall_named:.1f} s vs two documents less one base load {wall_base:.1f} s: "
          f"{wall_named / wall_base:.2f}x (target <= 1.15x)")  # fmt: skip
    print(f"  in process: named {in_named:.1f} s vs two documents less one base load {in_base:.1f} s: "
          f"{in_named / in_base:.2f}x (target <= 1.15x)")  # fmt: skip


if __name__ == "__main__":
    main()

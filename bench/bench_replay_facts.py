"""Retraining an edited document with and without replay: six facts on SmolLM2-135M.

Issue 38's bench. A document teaches three invented facts as ``### Q
!probe`` pairs (v1); the user then replaces the three pairs with three
other facts (v2) and trains again. With replay, the v2 run draws v1's pairs
from the store's replay history and trains them beside the new ones; with
``--no-replay`` it trains on v2's text alone. After v2, ``dlm train`` asks
v2's probes (``probe_exact``) and the probes v1 held that v2 no longer
holds (``retained_exact``), so one run of each gives the six answers.

Steps, each a ``dlm train --json`` process with its own ``DLM_HOME`` (the
base's converted folder shared, as the other benches do):

1. v1 in home A;
2. home A copied to home B, so both start from the same v1 store;
3. v2 in home A (replay on, the default) and v2 in home B with ``--no-replay``.

The figures are read from each run's ``--json`` summary, checked against
the ``evaluations`` rows of ``store.db`` and against a ``dlm eval --json``
of each v2 adapter (the same answers); the table is

    version | replay | v1 facts exact | v2 facts exact | total of 6

with the verdict against the issue's target: with replay v2 answers at
least 5 of the 6, without it the old three are lost (0 of 3). The
retention slice (about 5% of history, at least one row, never replayed)
is one of v1's rows here (the prose is held out for val, so v1's history is
its three pairs): that fact is measured, not replayed, which is why the
target is 5 of 6 and not 6. The bench names it, and prints its loss, the
v1 adapter's loss on it and the delta. Per-fact answers follow the table.
About 6 minutes on a 2-core machine:

    python bench/bench_replay_facts.py [--steps 48] [--learning-rate 3e-3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import DLM

DLM_ID = "01M8HHSDSRXJ33QF518TVHA9KD"
TARGET_WITH_REPLAY = 5  # of the six facts

# examples/demo.dlm's settings (docs/training.md says why: a few dozen steps
# on a CPU must carry three facts) but for three: 48 steps, a multiple of 4,
# so that early stopping on the prose's val loss never ends a run early;
# learning rate 3e-3 (at 2e-3, 32 or 48 steps taught v1 two of its three
# facts: "Who founded the Zarnian Academy?" got "The Zarnian Academy." and
# "The Zarnian system."); four rows a step (v2 with replay trains five).
FRONTMATTER = """\
---
dlm_id: {dlm_id}
dlm_version: 15
base_model: smollm2-135m
system_prompt: You answer questions about Zarnia briefly.
training:
  sequence_len: 128
  micro_batch_size: 4
  grad_accum: 1
  learning_rate: {learning_rate}
  lora_r: 16
  lora_alpha: 32
  max_steps: {steps}
  seed: 42
---
Zarnia is an island that exists only in these notes. Each version of the
notes records a few facts about it as questions and answers.
"""

V1_FACTS = (
    ("What is the capital of Zarnia?", "Quillport."),
    ("Who founded the Zarnian Academy?", "Ilsa Morrow."),
    ("What is the currency of Zarnia?", "The brass tallin."),
)
V2_FACTS = (
    ("Which river flows through Quillport?", "The Vessa."),
    ("What colour is the flag of Zarnia?", "Teal and amber."),
    ("Who keeps the Zarnian lighthouse?", "The Okafor twins."),
)


def document(facts: tuple[tuple[str, str], ...], *, steps: int, learning_rate: str) -> str:
    """The document at one version: the frontmatter, the prose, and ``facts`` as ``!probe`` pairs."""
    pairs = "\n".join(f"### Q !probe\n{question}\n### A\n{answer}\n" for question, answer in facts)
    head = FRONTMATTER.format(dlm_id=DLM_ID, steps=steps, learning_rate=learning_rate)
    return f"{head}\n::instruction::\n{pairs}"


def dlm(command: str, doc: Path, home: Path, *extra: str) -> tuple[float, dict[str, Any]]:
    """One ``dlm COMMAND DOC --json`` in ``home``: wall seconds and what it printed."""
    env = {**os.environ, "DLM_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    start = time.perf_counter()
    out = subprocess.run([DLM, command, str(doc), "--json", *extra], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"dlm {command} {' '.join(extra)} in {home} failed:\n{out.stderr[-3000:]}")
    return wall, json.loads(out.stdout)


def adapter_eval(summary: dict[str, Any]) -> dict[str, Any]:
    """The SFT phase's adapter evaluation (ModelEval) of a train summary."""
    evaluation = summary["phases"][0]["evaluation"]
    if evaluation is None:
        raise SystemExit(f"run {summary['run_id']} recorded no evaluation after SFT")
    return dict(evaluation["adapter"])


def exact_by_question(scores: list[dict[str, Any]], facts: tuple[tuple[str, str], ...]) -> list[bool | None]:
    """For each fact, whether its probe was answered exactly; None when it was not asked."""
    asked = {score["question"]: bool(score["exact"]) for score in scores}
    return [asked.get(question) for question, _ in facts]


def store_db(home: Path) -> sqlite3.Connection:
    db = home / "store" / DLM_ID / "store.db"
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True)


def retention_slice(home: Path) -> set[str]:
    """The keys of the history rows in the retention slice (never drawn for replay)."""
    conn = store_db(home)
    try:
        return {row[0] for row in conn.execute("SELECT row_key FROM history WHERE retention = 1")}
    finally:
        conn.close()


def check_store(home: Path, summary: dict[str, Any], model: dict[str, Any]) -> None:
    """The ``evaluations`` row of the run's adapter says what the summary says."""
    db = home / "store" / DLM_ID / "store.db"
    conn = store_db(home)
    try:
        conn.row_factory = sqlite3.Row
        row = conn.execute(
            "SELECT probe_exact, retained_probes, retained_exact, retention_loss, retention_delta "
            "FROM evaluations WHERE run_id = ? AND phase = 'sft' AND adapter_version = ?",
            (summary["run_id"], summary["adapter_version"]),
        ).fetchone()
    finally:
        conn.close()
    if row is None:
        raise SystemExit(f"{db}: no evaluations row for run {summary['run_id']}'s adapter")
    expected = (
        model["probe_exact"],
        len(model["retained"]),
        model["retained_exact"],
        model["retention_loss"],
        model["retention_delta"],
    )
    if tuple(row) != expected:
        raise SystemExit(f"{db}: evaluations row {tuple(row)} differs from the summary's {expected}")


def check_eval(home: Path, doc: Path, model: dict[str, Any]) -> float:
    """``dlm eval`` of the newest adapter gives the train run's answers (current and earlier probes).

    Returns its wall seconds.
    """
    wall, report = dlm("eval", doc, home)
    again = report["models"][0]
    for field in ("probes", "retained"):
        seen = [(p["question"], p["answer"], p["exact"]) for p in again[field]]
        trained = [(p["question"], p["answer"], p["exact"]) for p in model[field]]
        if seen != trained:
            raise SystemExit(f"dlm eval in {home}: {field} {seen} differ from dlm train's {trained}")
    return wall


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def count(flags: list[bool | None]) -> str:
    asked = [flag for flag in flags if flag is not None]
    if not asked:
        return "not asked"
    return f"{sum(asked)}/{len(flags)}" + ("" if len(asked) == len(flags) else f" ({len(asked)} asked)")


def describe(label: str, wall: float, summary: dict[str, Any]) -> None:
    replay = summary["replay"]
    drawn = (
        "replay: none recorded"
        if replay is None
        else f"replay: {replay['skipped']}"
        if replay["skipped"]
        else f"replay: drew {replay['rows_drawn']} of {replay['sft_candidates']} candidates"
    )
    print(
        f"{label}: {wall:.0f} s, {summary['rows_trained']} rows trained ({summary['val_rows']} val), "
        f"{summary['steps']} steps, final loss {fmt(summary['final_loss'])}, adapter "
        f"v{summary['adapter_version']:04d} {summary['adapter_sha256'].removeprefix('sha256:')[:12]}; {drawn}",
        flush=True,
    )


def answers(label: str, scores: list[dict[str, Any]]) -> None:
    for score in scores:
        mark = "exact" if score["exact"] else f"F1 {score['f1']:.2f}"
        print(
            f"  {label:22s} {score['question']:38s} -> {score['answer']!r} ({mark}, NLL {fmt(score['nll'])})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--learning-rate", default="3e-3")
    parser.add_argument("--keep", type=Path, help="keep the document and both homes in this folder")
    args = parser.parse_args()

    from dlmstore.home import bases_dir

    bases = bases_dir()
    bases.mkdir(parents=True, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the start; {len(os.sched_getaffinity(0))} CPUs usable")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        doc = root / "zarnia.dlm"
        replay_home, plain_home = root / "home-replay", root / "home-no-replay"
        for home in (replay_home, plain_home):
            shutil.rmtree(home, ignore_errors=True)
        replay_home.mkdir()
        (replay_home / "bases").symlink_to(bases, target_is_directory=True)

        doc.write_text(
            document(V1_FACTS, steps=args.steps, learning_rate=args.learning_rate), encoding="utf-8"
        )
        wall, v1 = dlm("train", doc, replay_home)
        describe("v1", wall, v1)
        shutil.copytree(replay_home, plain_home, symlinks=True)  # both v2 runs start from v1's store

        doc.write_text(
            document(V2_FACTS, steps=args.steps, learning_rate=args.learning_rate), encoding="utf-8"
        )
        wall, with_replay = dlm("train", doc, replay_home)
        describe("v2 with replay", wall, with_replay)
        wall, without = dlm("train", doc, plain_home, "--no-replay")
        describe("v2 --no-replay", wall, without)

        v1_model = adapter_eval(v1)
        check_store(replay_home, v1, v1_model)
        v1_base = v1["phases"][0]["evaluation"]["base"]
        held = retention_slice(replay_home)
        if held != retention_slice(plain_home):
            raise SystemExit("the two homes hold different retention slices")
        held_facts = [p["question"] for p in v1_model["probes"] if p["row_key"] in held]
        rows = [("v0001", "-", exact_by_question(v1_model["probes"], V1_FACTS), None)]
        models = {}
        for label, home, summary in (("on", replay_home, with_replay), ("off", plain_home, without)):
            model = adapter_eval(summary)
            check_store(home, summary, model)
            models[label] = model
            seconds = check_eval(home, doc, model)
            print(f"dlm eval in the replay-{label} home: the same answers ({seconds:.0f} s)", flush=True)
            rows.append(
                (
                    f"v{summary['adapter_version']:04d}",
                    label,
                    exact_by_question(model["retained"], V1_FACTS),
                    exact_by_question(model["probes"], V2_FACTS),
                )
            )

    print()
    print(f"{'version':8s}| {'replay':7s}| {'v1 facts exact':15s}| {'v2 facts exact':15s}| total of 6")
    for version, replay, old, new in rows:
        total = "-" if new is None else f"{sum(bool(f) for f in old) + sum(bool(f) for f in new)}/6"
        print(
            f"{version:8s}| {replay:7s}| {count(old):15s}| {'-' if new is None else count(new):15s}| {total}"
        )
    print()
    print(f"base model: v1 facts {v1_base['probe_exact']}/3 exact (probe NLL {fmt(v1_base['probe_nll'])})")
    for label, model in models.items():
        print(
            f"v2 replay {label}: v1 facts NLL {fmt(model['retained_nll'])}, F1 {fmt(model['retained_f1'], '.2f')}; "
            f"v2 facts NLL {fmt(model['probe_nll'])}, F1 {fmt(model['probe_f1'], '.2f')}; retention slice: "
            + (
                f"{model['retention_rows']} row(s), loss {fmt(model['retention_loss'])} against v0001's "
                f"{fmt(model['retention_previous_loss'])} (delta {fmt(model['retention_delta'], '+.3f')})"
                if model["retention_loss"] is not None
                else "no row v2 no longer holds"
            )
        )
    print()
    answers("v0001", v1_model["probes"])
    for label, model in models.items():
        answers(f"v0002 replay {label}", [*model["retained"], *model["probes"]])

    print()
    print(
        f"retention slice (history rows never replayed): {len(held)} row(s); of v1's facts: "
        + (", ".join(repr(question) for question in held_facts) or "none")
        + f", so replay can bring back at most {3 - len(held_facts)} of v1's three"
    )
    kept = sum(bool(flag) for flag in rows[1][2]) + sum(bool(flag) for flag in rows[1][3] or [])
    lost = sum(bool(flag) for flag in rows[2][2])
    print()
    print(
        f"target: with replay v2 answers >= {TARGET_WITH_REPLAY} of 6: {kept}/6, "
        f"{'met' if kept >= TARGET_WITH_REPLAY else 'MISSED'}; with --no-replay the old three are lost: "
        f"{lost}/3 kept, {'met' if lost == 0 else 'MISSED'}"
    )
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()

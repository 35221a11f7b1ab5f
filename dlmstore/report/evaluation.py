"""What the report shows of evaluation: the val loss beside the train loss, and a probe table.

* :func:`val_points` - each train run's val loss by phase and step
  (``val_steps``), drawn in the same chart as the phase's train loss;
* :func:`newest_probes` - the probes of the newest run that evaluated
  anything (``evaluations`` and ``probe_results``): after a train run's last
  phase the base and the adapter, after ``dlm eval`` the models it compared,
  one column per model with each answer and its scores.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class ValPoint:
    """The val loss after one step.

    Attributes:
        step: The optimizer step.
        loss: The val loss; null when it was not finite.
    """

    step: int
    loss: float | None


@dataclass(frozen=True)
class ProbeCell:
    """One model's answer to one probe, and its scores.

    Attributes:
        answer: The greedy answer.
        exact: Whether it is the reference, once both are normalised.
        f1: Its token-F1 against the reference.
        nll: The reference's mean token NLL under the model.
    """

    answer: str
    exact: bool
    f1: float
    nll: float | None


@dataclass(frozen=True)
class ProbeRow:
    """One probe: the question, the document's answer and each model's.

    Attributes:
        question: The question asked.
        reference: The document's answer.
        answers: Each model's answer, in the order of ``ProbeTable.models``.
    """

    question: str
    reference: str
    answers: list[ProbeCell]


@dataclass(frozen=True)
class ProbeTable:
    """The probes of one evaluation, the models side by side.

    Attributes:
        run_id: The run that asked them.
        phase: ``sft`` or ``preference`` (after that phase of a train run), or ``eval`` (``dlm eval``).
        models: The models compared (``base``, ``v0003``): the base first, then the adapter, after a
            train run; the one asked for first after ``dlm eval``.
        rows: One per probe, in the run's order.
    """

    run_id: int
    phase: str
    models: list[str]
    rows: list[ProbeRow]


def val_points(conn: sqlite3.Connection, run_ids: list[int]) -> dict[tuple[int, str], list[ValPoint]]:
    """The val loss of each of ``run_ids`` by (run, phase), in step order (one query)."""
    points: dict[tuple[int, str], list[ValPoint]] = defaultdict(list)
    if not run_ids:
        return points
    marks = ", ".join("?" for _ in run_ids)
    for row in conn.execute(
        f"SELECT run_id, phase, step, loss FROM val_steps WHERE run_id IN ({marks}) ORDER BY run_id, phase, step",
        run_ids,
    ):
        points[(row["run_id"], row["phase"])].append(ValPoint(row["step"], row["loss"]))
    return points


def newest_probes(conn: sqlite3.Connection) -> ProbeTable | None:
    """The probe table of the newest evaluation that asked any (two queries); None before any."""
    newest = conn.execute(
        "SELECT run_id, phase FROM evaluations WHERE probes > 0 ORDER BY id DESC LIMIT 1"
    ).fetchone()
    if newest is None:
        return None
    run_id, phase = newest["run_id"], newest["phase"]
    models: list[str] = []
    rows: dict[str, ProbeRow] = {}
    for row in conn.execute(
        "SELECT e.model, p.row_key, p.question, p.reference, p.answer, p.exact, p.f1, p.nll "
        "FROM evaluations AS e JOIN probe_results AS p ON p.evaluation_id = e.id "
        "WHERE e.run_id = ? AND e.phase = ? ORDER BY e.id, p.position",
        (run_id, phase),
    ):
        if row["model"] not in models:
            models.append(row["model"])
        probe = rows.setdefault(row["row_key"], ProbeRow(row["question"], row["reference"], []))
        probe.answers.append(ProbeCell(row["answer"], bool(row["exact"]), row["f1"], row["nll"]))
    return ProbeTable(run_id=run_id, phase=phase, models=models, rows=list(rows.values()))

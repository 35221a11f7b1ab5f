"""What the report shows of evaluation: the val loss beside the train loss, and a probe table.

* :func:`val_points` - each train run's val loss by phase and step
  (``val_steps``), drawn in the same chart as the phase's train loss;
* :func:`newest_probes` - the probes of the newest run that evaluated
  anything (``evaluations`` and ``probe_results``): after a train run's last
  phase the base and the adapter, after ``dlm eval`` the models it compared,
  one column per model with each answer and its scores; the probes of
  earlier versions of the document (the replay history's) marked, and each
  model's retention figures beside them;
* :func:`retention_figures` - each evaluation's retention figures (the
  probes of earlier versions, the retention slice's loss and its delta
  against the previous adapter), by run, for those that measured any;
* :func:`replay_draws` - what each train run drew from the replay history
  (``replay_runs``).
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field


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
        retained: An earlier version of the document held it and this one does not (asked to
            measure what the adapter kept).
    """

    question: str
    reference: str
    answers: list[ProbeCell]
    retained: bool = False


@dataclass(frozen=True)
class RetentionFigures:
    """What one evaluation measured of the replay history's retention.

    Attributes:
        phase: ``sft`` or ``preference`` (after that phase of a train run), or ``eval`` (``dlm eval``).
        model: ``base``, or the adapter version as ``v0003``.
        retained_probes: Probes of earlier versions the document no longer holds, asked.
        retained_exact: Of those, answered exactly.
        retained_nll: Their mean reference NLL; null without them.
        retention_loss: The loss on the retention slice's rows the document no longer holds; null
            without them.
        retention_rows: Rows of the retention slice evaluated.
        retention_delta: retention_loss less that of the adapter it is compared with on the same
            rows (the previous adapter after a train phase, ``--against``'s after ``dlm eval``;
            above 0: it forgot some); null when none was compared.
    """

    phase: str
    model: str
    retained_probes: int
    retained_exact: int
    retained_nll: float | None
    retention_loss: float | None
    retention_rows: int
    retention_delta: float | None


@dataclass(frozen=True)
class ReplayDraw:
    """What a train run drew from the replay history (a row of ``replay_runs``).

    Attributes:
        generation: The generation it trained (a new one each time the document's rows changed).
        candidates: History rows and preference triples it could replay (the document no longer
            holds them, none superseded).
        drawn: Rows and triples it replayed.
        skipped: Why it did not replay (``--no-replay``); null when it drew.
    """

    generation: int
    candidates: int
    drawn: int
    skipped: str | None


@dataclass(frozen=True)
class ProbeTable:
    """The probes of one evaluation, the models side by side.

    Attributes:
        run_id: The run that asked them.
        phase: ``sft`` or ``preference`` (after that phase of a train run), or ``eval`` (``dlm eval``).
        models: The models compared (``base``, ``v0003``): the base first, then the adapter, after a
            train run; the one asked for first after ``dlm eval``.
        rows: One per probe, in the run's order; the probes of earlier versions last.
        retention: Each model's retention figures, in the order of ``models``; empty when it
            measured none.
    """

    run_id: int
    phase: str
    models: list[str]
    rows: list[ProbeRow]
    retention: list[RetentionFigures] = field(default_factory=list)


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
    """The probe table of the newest evaluation that asked any (three queries); None before any."""
    newest = conn.execute(
        "SELECT run_id, phase FROM evaluations WHERE probes > 0 OR retained_probes > 0 ORDER BY id DESC LIMIT 1"
    ).fetchone()
    if newest is None:
        return None
    run_id, phase = newest["run_id"], newest["phase"]
    models: list[str] = []
    rows: dict[str, ProbeRow] = {}
    for row in conn.execute(
        "SELECT e.model, p.row_key, p.question, p.reference, p.answer, p.exact, p.f1, p.nll, p.retained "
        "FROM evaluations AS e JOIN probe_results AS p ON p.evaluation_id = e.id "
        "WHERE e.run_id = ? AND e.phase = ? ORDER BY e.id, p.position",
        (run_id, phase),
    ):
        if row["model"] not in models:
            models.append(row["model"])
        probe = rows.setdefault(
            row["row_key"], ProbeRow(row["question"], row["reference"], [], bool(row["retained"]))
        )
        probe.answers.append(ProbeCell(row["answer"], bool(row["exact"]), row["f1"], row["nll"]))
    figures = retention_figures(conn, [run_id]).get(run_id, [])
    return ProbeTable(
        run_id=run_id, phase=phase, models=models, rows=list(rows.values()),
        retention=[item for item in figures if item.phase == phase],
    )  # fmt: skip


def retention_figures(conn: sqlite3.Connection, run_ids: list[int]) -> dict[int, list[RetentionFigures]]:
    """The retention figures of each of ``run_ids``' evaluations that measured any, in the order they
    were recorded (one query)."""
    found: dict[int, list[RetentionFigures]] = defaultdict(list)
    if not run_ids:
        return found
    marks = ", ".join("?" for _ in run_ids)
    for row in conn.execute(
        "SELECT run_id, phase, model, retained_probes, retained_exact, retained_nll, retention_loss, "
        f"retention_rows, retention_delta FROM evaluations WHERE run_id IN ({marks}) "
        "AND (retained_probes > 0 OR retention_loss IS NOT NULL) ORDER BY id",
        run_ids,
    ):
        fields = dict(row)
        found[fields.pop("run_id")].append(RetentionFigures(**fields))
    return found


def replay_draws(conn: sqlite3.Connection, run_ids: list[int]) -> dict[int, ReplayDraw]:
    """What each of ``run_ids`` drew from the replay history (one query); a run that recorded no
    draw (it ran before replay, or with ``training.replay.enabled: false``) is absent."""
    if not run_ids:
        return {}
    marks = ", ".join("?" for _ in run_ids)
    return {
        row["run_id"]: ReplayDraw(row["generation"], row["candidates"], row["drawn"], row["skipped"])
        for row in conn.execute(
            "SELECT run_id, generation, sft_candidates + preference_candidates AS candidates, "
            f"sft_drawn + preference_drawn AS drawn, skipped FROM replay_runs WHERE run_id IN ({marks})",
            run_ids,
        )
    }

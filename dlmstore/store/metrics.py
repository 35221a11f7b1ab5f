"""Run metrics: tokenization events per run, and the ``dlm metrics`` listing.

Each ``dlm tokenize`` and ``dlm train`` run records one row in
``tokenization_events`` (``dlmstore.store.events``); :func:`run_metrics`
joins runs with their events in
one query, newest first, so ``dlm metrics doc.dlm --json | jq
'.runs[0].tokenization'`` shows the last pass's hits and misses. The same
join is the ``run_hit_rates`` view for people using ``sqlite3``.

A train run also lists the adapters it registered (an sft one, and a
preference one when it ran that phase) and, asked for one run, every logged
step of each phase with the numbers TRL logged beside the loss
(``train_step_metrics``). Every train run carries its losses by phase, for
the sparkline ``dlm metrics`` draws beside the hit rate. Every export of
the document's adapters (``exports``, written by ``dlm export``) is listed
after the runs (:func:`list_exports`, which ``dlm report`` shows too).

A train run carries its validation split too (``val_splits``): the rows
it held out and each one that duplicates a training row
(``dlmstore.store.contamination``).

Every run also carries what it evaluated (``evaluations``: the base and
each phase's adapter after a train run's phases, the models ``dlm eval``
compared) and the val loss at each evaluation step of its training
(``val_steps``), as ``dlmstore.eval`` recorded them; with the replay
history's retention figures: the probes of earlier versions asked and the
retention slice's loss, with its delta against the previous adapter.

What a person comparing runs asks first is carried by every run: how long
it took (``duration_seconds``, from ``started_at`` to ``finished_at``; the
tokenize pass's own time is ``tokenization.total_tokenize_seconds``), each
phase's steps with its final and best loss (:class:`PhaseMetrics`, from the
logged steps), why it failed (``error``), and whether its pass bypassed the
cache (``tokenization.cache_mode``).
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from dlmstore.clock import iso_before
from dlmstore.errors import DurationError
from dlmstore.store import contamination as contaminations
from dlmstore.store.contamination import Contamination
from dlmstore.store.database import Store
from dlmstore.store.events import DedupEvent, TokenizationEvent
from dlmstore.store.runs import shown_status

_DURATION = re.compile(r"^\s*(\d+)\s*([dhms])\s*$")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> timedelta:
    """``30d`` / ``12h`` / ``45m`` / ``10s`` -> a timedelta.

    Raises:
        DurationError: anything else, with an example of a valid value.
    """
    match = _DURATION.match(text)
    if not match:
        raise DurationError(
            f"invalid duration {text!r}: use a number and a unit d, h, m or s, e.g. 30d, 12h, 45m or 10s"
        )
    return timedelta(seconds=int(match.group(1)) * _UNIT_SECONDS[match.group(2)])


@dataclass(frozen=True)
class TrainStep:
    """One logged training step of a phase.

    ``metrics`` holds every other number the trainer logged at that step,
    under TRL's names (``rewards/chosen``, ``rewards/margins``,
    ``grad_norm``, ...); a NaN was stored as NULL and reads as ``None``.

    Attributes:
        phase: ``sft`` or ``preference``.
        step: The optimizer step, from 1.
        epoch: Epoch at that step (fractional); null when not logged.
        loss: Training loss; null when not logged (or NaN).
        learning_rate: Learning rate at that step.
        tokens_per_second: Training throughput over the logging interval.
        metrics: Every other number logged at that step, under TRL's names.
    """

    phase: str
    step: int
    epoch: float | None
    loss: float | None
    learning_rate: float | None
    tokens_per_second: float | None
    metrics: dict[str, float | None]


@dataclass(frozen=True)
class RunAdapter:
    """An adapter version registered by a train run.

    Attributes:
        version: The adapter version (``adapter/versions/vNNNN``).
        phase: ``sft`` or ``preference``.
        method: ``dpo`` or ``orpo`` for a preference adapter; null for SFT.
        parent_version: The adapter a preference phase started from; null for SFT.
        sha256: sha256 of ``adapter_model.safetensors``.
        steps: Optimizer steps that produced it.
        final_loss: Loss at the last logged step; null when none was logged.
    """

    version: int
    phase: str
    method: str | None
    parent_version: int | None
    sha256: str
    steps: int
    final_loss: float | None


@dataclass(frozen=True)
class PhaseMetrics:
    """One training phase of a run, summarised from its logged steps.

    Attributes:
        phase: ``sft`` or ``preference``.
        steps: The last step it logged (its steps in this run; a resumed run
            counts from the checkpoint's step, so this is the run's total).
        final_loss: Loss at the last logged step; null when none was logged (or NaN).
        best_loss: The lowest loss logged; null when none was.
        best_step: The step of ``best_loss`` (the first, on a tie); null when none was logged.
    """

    phase: str
    steps: int
    final_loss: float | None
    best_loss: float | None
    best_step: int | None

    @classmethod
    def of(cls, phase: str, points: list[tuple[int, float | None]]) -> PhaseMetrics:
        """From ``(step, loss)`` pairs in step order."""
        losses = [(loss, step) for step, loss in points if loss is not None]
        best = min(losses) if losses else None
        return cls(
            phase=phase,
            steps=points[-1][0],
            final_loss=points[-1][1],
            best_loss=None if best is None else best[0],
            best_step=None if best is None else best[1],
        )


@dataclass(frozen=True)
class TrainingInfo:
    """What a train run produced: its adapters, oldest first (sft before preference).

    ``losses`` is the loss of every logged step by phase (sft first, in
    step order; ``None`` where it was NaN), what ``dlm metrics`` draws as a
    sparkline. ``steps`` (every phase, sft first, then by step) is filled
    only for ``--run-id``.

    Attributes:
        adapters: The adapters the run registered, oldest first.
        steps: Every logged step, SFT first; null unless ``--run-id`` asked for it.
        losses: Each phase's loss at every logged step, in step order (null where it was NaN).
    """

    adapters: list[RunAdapter]
    steps: list[TrainStep] | None = None
    losses: dict[str, list[float | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class ValStep:
    """The val loss after one step of a training phase (a row of ``val_steps``).

    Attributes:
        phase: ``sft``.
        step: The optimizer step the val split was evaluated after.
        loss: Mean negative log-likelihood per target token; null when it was not finite.
        perplexity: ``exp(loss)``.
    """

    phase: str
    step: int
    loss: float | None
    perplexity: float | None


@dataclass(frozen=True)
class RunEvaluation:
    """One model a run evaluated: the base or an adapter (a row of ``evaluations``).

    Attributes:
        phase: ``sft`` or ``preference`` (after that phase of a train run), or ``eval`` (``dlm eval``).
        model: ``base``, or the adapter version as ``v0003``.
        adapter_version: The adapter version; null for the base.
        val_loss: Its val loss; null without val rows.
        val_perplexity: ``exp(val_loss)``.
        val_rows: Val items evaluated.
        probes: Probes asked.
        probe_nll: Mean of the probes' reference NLLs; null without probes.
        probe_exact: Probes answered exactly.
        probe_f1: Mean token-F1 of the answers; null without probes.
        best_step: The step of the phase's best val loss (a train run's adapter); null otherwise.
        best_val_loss: That loss.
        stopped_early: Whether early stopping ended the phase (a train run's adapter); null otherwise.
        stop_reason: Why the phase ended where it did (a train run's adapter); null otherwise.
        retained_probes: Probes of earlier versions of the document (the replay history's) it was
            asked, which the document no longer holds.
        retained_exact: Of those, answered exactly.
        retained_nll: Their mean reference NLL; null without them.
        retained_f1: Their mean token-F1; null without them.
        retention_loss: Its loss on the retention slice's rows the document no longer holds; null
            without them.
        retention_rows: Rows of the retention slice evaluated.
        retention_previous_loss: The previous adapter's loss on the same rows (a train run's
            adapter; ``dlm eval``'s first adapter with ``--against``); null otherwise.
        retention_delta: retention_loss less retention_previous_loss (above 0: it forgot some).
    """

    phase: str
    model: str
    adapter_version: int | None
    val_loss: float | None
    val_perplexity: float | None
    val_rows: int
    probes: int
    probe_nll: float | None
    probe_exact: int
    probe_f1: float | None
    best_step: int | None = None
    best_val_loss: float | None = None
    stopped_early: bool | None = None
    stop_reason: str | None = None
    retained_probes: int = 0
    retained_exact: int = 0
    retained_nll: float | None = None
    retained_f1: float | None = None
    retention_loss: float | None = None
    retention_rows: int = 0
    retention_previous_loss: float | None = None
    retention_delta: float | None = None


@dataclass(frozen=True)
class RunMetrics:
    """One run as ``dlm metrics`` shows it.

    Attributes:
        run_id: The run's id (``runs.id``).
        command: ``tokenize`` or ``train``.
        status: ``running``, ``completed`` or ``failed``; ``dead`` for a run
            still marked running whose process is gone (``dlm metrics``
            writes nothing: the next command that writes to the store
            records it as failed, with the same reason).
        started_at: When it started (ISO-8601 UTC).
        finished_at: When it ended; null while running.
        error: One-line reason when it failed or is dead; null otherwise.
        tokenization: Its tokenize pass's numbers; null when it did not get that far.
        training: What a train run produced; null for tokenize runs.
        dedup: The duplicate clusters its text rows held, and what it left out of training; null
            when it did not get that far (or ran before duplicates were looked for).
        contamination: A train run's validation split: the rows it held out, and those that
            duplicate training rows (each listed, held out or kept out by ``training.dedup``); null
            for other runs and runs that did not get that far.
        duration_seconds: How long the run took, ``finished_at`` minus ``started_at`` (the whole
            command, not only its tokenize pass); null while it runs.
        phases: Each training phase it logged steps for, SFT first, with its final and best
            loss; empty for tokenize runs and runs that logged no step.
        evaluations: The models it evaluated (a train run: the base and the adapter after each
            phase; ``dlm eval``: what it was asked to), in the order it recorded them.
        val_steps: The val loss at each evaluation step of its training phases, in step order.
        adapter: The named adapter (``training.adapters``) a train or eval run was of; null for a
            document's one adapter and other runs.
    """

    run_id: int
    command: str
    status: str
    started_at: str
    finished_at: str | None
    error: str | None
    tokenization: TokenizationEvent | None
    training: TrainingInfo | None = None
    dedup: DedupEvent | None = None
    contamination: Contamination | None = None
    duration_seconds: float | None = None
    phases: list[PhaseMetrics] = field(default_factory=list)
    evaluations: list[RunEvaluation] = field(default_factory=list)
    val_steps: list[ValStep] = field(default_factory=list)
    adapter: str | None = None


@dataclass(frozen=True)
class ExportSummary:
    """One ``dlm export`` of an adapter (a row of ``exports``).

    Attributes:
        export_id: The export's id.
        adapter_version: The adapter version exported.
        target: ``ollama``, ``llama-server`` or ``hf``.
        quant: The GGUF files' quantisation; null for ``hf``.
        path: The export folder.
        files: How many files it wrote.
        bytes: Their total size.
        llama_cpp: The llama-cpp-python that wrote its GGUF files; null for ``hf``.
        seconds: How long it took.
        created_at: When it was recorded (ISO-8601 UTC).
    """

    export_id: int
    adapter_version: int
    target: str
    quant: str | None
    path: str
    files: int
    bytes: int
    llama_cpp: str | None
    seconds: float
    created_at: str


@dataclass(frozen=True)
class MetricsReport:
    """The JSON shape of ``dlm metrics --json``.

    Attributes:
        dlm_id: The document id.
        store_path: The store folder.
        runs: The runs asked for, newest first.
        exports: Every export of the document's adapters (``dlm export``), newest first.
    """

    dlm_id: str
    store_path: str
    runs: list[RunMetrics]
    exports: list[ExportSummary] = field(default_factory=list)


def list_exports(conn: sqlite3.Connection) -> list[ExportSummary]:
    """Every row of ``exports``, newest first, summarised."""
    rows = conn.execute(
        "SELECT id, adapter_version, target, quant, path, "
        "(SELECT count(*) FROM json_each(files)) AS files, "
        "(SELECT coalesce(sum(json_extract(value, '$.bytes')), 0) FROM json_each(files)) AS bytes, "
        "json_extract(tool_versions, '$.llama_cpp') AS llama_cpp, seconds, created_at "
        "FROM exports ORDER BY id DESC"
    ).fetchall()
    return [ExportSummary(*row) for row in rows]


def run_metrics(
    store: Store, *, run_id: int | None = None, since: timedelta | None = None, limit: int = 20
) -> MetricsReport:
    """Runs newest first with their tokenization events and adapters; with
    ``run_id``, also that run's steps of every phase and their metrics.

    One query per table for the whole report, whatever the number of runs
    or steps.
    """
    where: list[str] = []
    params: list[object] = []
    if run_id is not None:
        where.append("r.id = ?")
        params.append(run_id)
    if since is not None:
        where.append("r.started_at >= ?")
        params.append(iso_before(since))
    chosen = (
        "FROM runs AS r " + (f"WHERE {' AND '.join(where)} " if where else "") + "ORDER BY r.id DESC LIMIT ?"
    )
    with store.read() as conn:
        rows = conn.execute(
            "SELECT r.id AS run_id, r.command, r.status, r.started_at, r.finished_at, r.error, r.pid, r.adapter, "
            "e.total_sections, e.total_rows, e.cache_hits, e.cache_misses, e.total_tokenize_seconds, "
            "e.cache_bytes_after, e.cache_mode, e.cache_shared, d.mode AS dedup_mode, d.rows AS dedup_rows, "
            "d.clusters AS dedup_clusters, d.duplicate_rows AS dedup_duplicates, d.dropped_rows AS dedup_dropped, "
            "d.signatures_computed AS dedup_signed, d.seconds AS dedup_seconds "
            f"FROM (SELECT r.* {chosen}) AS r LEFT JOIN tokenization_events AS e ON e.run_id = r.id "
            "LEFT JOIN dedup_runs AS d ON d.run_id = r.id ORDER BY r.id DESC",
            (*params, limit),
        ).fetchall()
        adapters: dict[int, list[RunAdapter]] = {}
        for row in conn.execute(
            "SELECT run_id, version, phase, method, parent_version, sha256, steps, final_loss FROM adapters "
            f"WHERE run_id IN (SELECT r.id {chosen}) ORDER BY version",
            (*params, limit),
        ):
            fields = dict(row)
            adapters.setdefault(fields.pop("run_id"), []).append(RunAdapter(**fields))
        points: dict[int, dict[str, list[tuple[int, float | None]]]] = {}
        steps: list[TrainStep] | None = None
        if run_id is not None:  # the run's steps hold its losses: train_steps is read once
            steps = _steps(conn, run_id)
            for step in steps:
                points.setdefault(run_id, {}).setdefault(step.phase, []).append((step.step, step.loss))
        else:
            for step_run, phase, number, loss in conn.execute(
                "SELECT run_id, phase, step, loss FROM train_steps "
                f"WHERE run_id IN (SELECT r.id {chosen}) ORDER BY run_id, phase <> 'sft', step",
                (*params, limit),
            ):
                points.setdefault(step_run, {}).setdefault(phase, []).append((number, loss))
        exports = list_exports(conn)
        evaluations: dict[int, list[RunEvaluation]] = {}
        for row in conn.execute(
            "SELECT run_id, phase, model, adapter_version, val_loss, val_perplexity, val_rows, probes, probe_nll, "
            "probe_exact, probe_f1, best_step, best_val_loss, stopped_early, stop_reason, retained_probes, "
            "retained_exact, retained_nll, retained_f1, retention_loss, retention_rows, retention_previous_loss, "
            "retention_delta FROM evaluations "
            f"WHERE run_id IN (SELECT r.id {chosen}) ORDER BY id",
            (*params, limit),
        ):
            fields = dict(row)
            stopped = fields.pop("stopped_early")
            evaluations.setdefault(fields.pop("run_id"), []).append(
                RunEvaluation(**fields, stopped_early=None if stopped is None else bool(stopped))
            )
        val_steps: dict[int, list[ValStep]] = {}
        for row in conn.execute(
            "SELECT run_id, phase, step, loss, perplexity FROM val_steps "
            f"WHERE run_id IN (SELECT r.id {chosen}) ORDER BY run_id, phase <> 'sft', step",
            (*params, limit),
        ):
            fields = dict(row)
            val_steps.setdefault(fields.pop("run_id"), []).append(ValStep(**fields))
        splits = contaminations.recorded(conn, [row["run_id"] for row in rows])
    runs = []
    for row in rows:
        event = None
        if row["total_sections"] is not None:
            event = TokenizationEvent(
                total_sections=row["total_sections"], total_rows=row["total_rows"],
                cache_hits=row["cache_hits"], cache_misses=row["cache_misses"],
                total_tokenize_seconds=row["total_tokenize_seconds"],
                cache_bytes_after=row["cache_bytes_after"], cache_mode=row["cache_mode"],
                hit_rate=TokenizationEvent.rate(row["cache_hits"], row["cache_misses"]),
                cache_shared=row["cache_shared"],
            )  # fmt: skip
        dedup = None
        if row["dedup_mode"] is not None:
            dedup = DedupEvent(
                row["dedup_mode"], row["dedup_rows"], row["dedup_clusters"], row["dedup_duplicates"],
                row["dedup_dropped"], row["dedup_signed"], row["dedup_seconds"],
            )  # fmt: skip
        phases = points.get(row["run_id"], {})
        training = None
        if row["command"] == "train":
            losses = {phase: [loss for _, loss in logged] for phase, logged in phases.items()}
            training = TrainingInfo(adapters=adapters.get(row["run_id"], []), steps=steps, losses=losses)
        status, dead = shown_status(row["status"], row["pid"])
        runs.append(
            RunMetrics(
                run_id=row["run_id"],
                command=row["command"],
                status=status,
                started_at=row["started_at"],
                finished_at=row["finished_at"],
                error=dead or row["error"],
                tokenization=event,
                training=training,
                dedup=dedup,
                contamination=splits.get(row["run_id"]),
                duration_seconds=duration_seconds(row["started_at"], row["finished_at"]),
                phases=[PhaseMetrics.of(phase, logged) for phase, logged in phases.items()],
                evaluations=evaluations.get(row["run_id"], []),
                val_steps=val_steps.get(row["run_id"], []),
                adapter=row["adapter"],
            )
        )
    return MetricsReport(store.dlm_id, str(store.path), runs, exports)


def duration_seconds(started_at: str, finished_at: str | None) -> float | None:
    """Seconds from ``started_at`` to ``finished_at`` (ISO-8601 UTC), to the millisecond; None
    while the run has not finished."""
    if finished_at is None:
        return None
    spent = datetime.fromisoformat(finished_at) - datetime.fromisoformat(started_at)
    return round(spent.total_seconds(), 3)


def _steps(conn: sqlite3.Connection, run_id: int) -> list[TrainStep]:
    """Every logged step of ``run_id``, sft first, with its metrics (two queries)."""
    metrics: dict[tuple[str, int], dict[str, float | None]] = {}
    for phase, step, name, value in conn.execute(
        "SELECT phase, step, name, value FROM train_step_metrics WHERE run_id = ? ORDER BY name", (run_id,)
    ):
        metrics.setdefault((phase, step), {})[name] = value
    return [
        TrainStep(**row, metrics=metrics.get((row["phase"], row["step"]), {}))
        for row in conn.execute(
            "SELECT phase, step, epoch, loss, learning_rate, tokens_per_second FROM train_steps "
            "WHERE run_id = ? ORDER BY phase <> 'sft', step",
            (run_id,),
        )
    ]

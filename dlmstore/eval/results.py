"""What an evaluation is, as ``--json`` prints it and store.db records it.

A run evaluates one or more *models* - the base, or an adapter version -
each on the val split (its loss and perplexity) and the probes (each
probe's greedy answer and scores). ``dlm train`` evaluates the base and
the adapter after each phase; ``dlm eval`` evaluates what it is asked to.
Rows go to ``evaluations`` and ``probe_results`` (and, during training,
``val_steps``); schema in docs/schema.md.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field

from dlmstore.clock import utc_now


@dataclass(frozen=True)
class ProbeScore:
    """One probe asked of one model.

    Attributes:
        row_key: The key of the probe's Q/A row.
        marked: True for a ``### Q !probe`` pair, false for a sampled one.
        question: The question asked.
        reference: The document's answer.
        answer: The model's greedy answer.
        answer_tokens: Tokens generated.
        nll: Mean negative log-likelihood of the reference's tokens, teacher-forced (lower is better).
        exact: Whether the answer is the reference, once both are normalised.
        f1: Token-F1 of the answer against the reference, from 0 to 1.
        retained: An earlier version of the document held the probe and this one does not.
    """

    row_key: str
    marked: bool
    question: str
    reference: str
    answer: str
    answer_tokens: int
    nll: float | None
    exact: bool
    f1: float
    retained: bool = False


@dataclass(frozen=True)
class EarlyStop:
    """How a training phase used its val split: the cadence, the best step, why it ended there.

    Attributes:
        interval: Optimizer steps between two evaluations of the val split.
        patience: Evaluations without improvement that stop training.
        best_step: The step of the best val loss; null when none was finite.
        best_val_loss: The best val loss.
        stopped_early: Whether early stopping ended the phase.
        stopped_at: The step it stopped at (the adapter's weights are that step's); null when it ran to the end.
        reason: Why the phase ended where it did, in one line.
    """

    interval: int
    patience: int
    best_step: int | None
    best_val_loss: float | None
    stopped_early: bool
    stopped_at: int | None
    reason: str


@dataclass(frozen=True)
class ModelEval:
    """One model evaluated: the base or an adapter version.

    Attributes:
        model: ``base``, or the adapter version as ``v0003``.
        adapter_version: The adapter version; null for the base.
        val_loss: Mean negative log-likelihood per target token of the val split; null without val rows.
        val_perplexity: ``exp(val_loss)``.
        val_rows: Val items evaluated (the document's val rows and the token datasets' val items).
        val_tokens: Target tokens of those items.
        probes: Each probe's answer and scores, in the run's probe order.
        probe_nll: Mean of the probes' reference NLLs; null without probes.
        probe_exact: Probes answered exactly.
        probe_f1: Mean token-F1 of the answers; null without probes.
        seconds: Time spent evaluating it.
        retained: The probes of earlier versions the document no longer holds, asked too, with scores.
        retained_exact: Of those, answered exactly.
        retained_nll: Their mean reference NLL; null without them.
        retained_f1: Their mean token-F1; null without them.
        retention_loss: Loss on the retention slice's rows the document no longer holds; null without them.
        retention_rows: Rows of the retention slice evaluated.
        retention_tokens: Target tokens of those rows.
        retention_previous_loss: A train run's adapter: the previous adapter's loss on the same rows.
        retention_delta: retention_loss less retention_previous_loss (above 0: it forgot some).
    """

    model: str
    adapter_version: int | None
    val_loss: float | None
    val_perplexity: float | None
    val_rows: int
    val_tokens: int
    probes: list[ProbeScore] = field(default_factory=list)
    probe_nll: float | None = None
    probe_exact: int = 0
    probe_f1: float | None = None
    seconds: float = 0.0
    retained: list[ProbeScore] = field(default_factory=list)
    retained_exact: int = 0
    retained_nll: float | None = None
    retained_f1: float | None = None
    retention_loss: float | None = None
    retention_rows: int = 0
    retention_tokens: int = 0
    retention_previous_loss: float | None = None
    retention_delta: float | None = None


@dataclass(frozen=True)
class PhaseEval:
    """What a train run measured after one phase: the base and the adapter, side by side.

    Attributes:
        phase: ``sft`` or ``preference``.
        base: The base model on the val split and the probes.
        adapter: The phase's adapter on the same.
        early_stop: How the phase used its val split (SFT with val rows); null otherwise.
    """

    phase: str
    base: ModelEval
    adapter: ModelEval
    early_stop: EarlyStop | None = None


def model_name(adapter_version: int | None) -> str:
    """``base``, or ``v0003`` for adapter version 3."""
    return "base" if adapter_version is None else f"v{adapter_version:04d}"


def summarise(
    model: str,
    adapter_version: int | None,
    val: tuple[float | None, int, int],
    probes: Sequence[ProbeScore],
    seconds: float,
    retained: Sequence[ProbeScore] = (),
    retention: tuple[float | None, int, int] = (None, 0, 0),
) -> ModelEval:
    """A :class:`ModelEval` from the val split's (loss, rows, tokens), the probes' scores, the retained
    probes' scores and the retention slice's (loss, rows, tokens)."""
    from dlmstore.eval.scores import perplexity

    loss, rows, tokens = val
    if loss is not None and not math.isfinite(loss):
        loss = None
    kept_loss, kept_rows, kept_tokens = retention
    if kept_loss is not None and not math.isfinite(kept_loss):
        kept_loss = None
    nlls = [p.nll for p in probes if p.nll is not None]
    kept_nlls = [p.nll for p in retained if p.nll is not None]
    return ModelEval(
        model=model,
        adapter_version=adapter_version,
        val_loss=loss,
        val_perplexity=None if loss is None else _finite(perplexity(loss)),
        val_rows=rows,
        val_tokens=tokens,
        probes=list(probes),
        probe_nll=sum(nlls) / len(nlls) if nlls else None,
        probe_exact=sum(p.exact for p in probes),
        probe_f1=sum(p.f1 for p in probes) / len(probes) if probes else None,
        seconds=round(seconds, 3),
        retained=list(retained),
        retained_exact=sum(p.exact for p in retained),
        retained_nll=sum(kept_nlls) / len(kept_nlls) if kept_nlls else None,
        retained_f1=sum(p.f1 for p in retained) / len(retained) if retained else None,
        retention_loss=kept_loss,
        retention_rows=kept_rows,
        retention_tokens=kept_tokens,
    )


def with_previous(evaluation: ModelEval, previous_loss: float | None) -> ModelEval:
    """The same evaluation with the previous adapter's retention loss on the same rows, and the delta."""
    from dataclasses import replace

    if previous_loss is None or not math.isfinite(previous_loss) or evaluation.retention_loss is None:
        return evaluation
    return replace(
        evaluation,
        retention_previous_loss=previous_loss,
        retention_delta=evaluation.retention_loss - previous_loss,
    )


def with_version(evaluation: ModelEval, adapter_version: int) -> ModelEval:
    """The same evaluation, of the adapter now registered as ``adapter_version``."""
    from dataclasses import replace

    return replace(evaluation, model=model_name(adapter_version), adapter_version=adapter_version)


def record_evaluation(
    conn: sqlite3.Connection,
    run_id: int,
    phase: str,
    evaluation: ModelEval,
    early_stop: EarlyStop | None = None,
) -> None:
    """Insert one evaluation and its probes' rows (inside the caller's transaction)."""
    stop = early_stop
    cursor = conn.execute(
        "INSERT INTO evaluations (run_id, phase, model, adapter_version, val_loss, val_perplexity, val_rows, "
        "val_tokens, probes, probe_nll, probe_exact, probe_f1, eval_interval, best_step, best_val_loss, "
        "stopped_early, stop_reason, seconds, created_at, retained_probes, retained_exact, retained_nll, "
        "retained_f1, retention_loss, retention_rows, retention_tokens, retention_previous_loss, retention_delta) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run_id, phase, evaluation.model, evaluation.adapter_version, evaluation.val_loss,
            evaluation.val_perplexity, evaluation.val_rows, evaluation.val_tokens, len(evaluation.probes),
            evaluation.probe_nll, evaluation.probe_exact, evaluation.probe_f1,
            None if stop is None else stop.interval, None if stop is None else stop.best_step,
            None if stop is None else stop.best_val_loss, None if stop is None else int(stop.stopped_early),
            None if stop is None else stop.reason, evaluation.seconds, utc_now(), len(evaluation.retained),
            evaluation.retained_exact, evaluation.retained_nll, evaluation.retained_f1,
            evaluation.retention_loss, evaluation.retention_rows, evaluation.retention_tokens,
            evaluation.retention_previous_loss, evaluation.retention_delta,
        ),
    )  # fmt: skip
    conn.executemany(
        "INSERT INTO probe_results (evaluation_id, position, row_key, marked, question, reference, answer, "
        "answer_tokens, nll, exact, f1, retained) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                cursor.lastrowid,
                position,
                p.row_key,
                int(p.marked),
                p.question,
                p.reference,
                p.answer,
                p.answer_tokens,
                p.nll,
                int(p.exact),
                p.f1,
                int(p.retained),
            )
            for position, p in enumerate([*evaluation.probes, *evaluation.retained])
        ],  # fmt: skip
    )


def record_val_step(
    conn: sqlite3.Connection, run_id: int, phase: str, step: int, loss: float | None, rows: int, tokens: int
) -> None:
    """Insert the val loss after ``step`` of a training phase (inside the caller's transaction)."""
    from dlmstore.eval.scores import perplexity

    finite = loss is not None and math.isfinite(loss)
    conn.execute(
        "INSERT OR REPLACE INTO val_steps (run_id, phase, step, loss, perplexity, rows, tokens, recorded_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (run_id, phase, step, loss if finite else None, _finite(perplexity(loss)) if finite else None,  # type: ignore[arg-type]
         rows, tokens, utc_now()),
    )  # fmt: skip


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class EvalReport:
    """The JSON shape of ``dlm eval --json``.

    Attributes:
        run_id: The eval run recorded (``dlm metrics`` lists it).
        dlm_id: The document id.
        seed: The seed the val split and the probe sample were drawn with (``training.seed``).
        val_rows: Rows of the document held out for validation.
        models: Each model evaluated: the one asked for first (``--adapter``, the newest adapter, or
            ``--base``), then the one it is compared with (``--against``, else the base).
        cache_hits: Rows whose tokens the run's tokenize pass took from the cache.
        cache_misses: Rows it tokenized.
        seconds: Time the whole evaluation took.
    """

    run_id: int
    dlm_id: str
    seed: int
    val_rows: int
    models: list[ModelEval]
    cache_hits: int
    cache_misses: int
    seconds: float

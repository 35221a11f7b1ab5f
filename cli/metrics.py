"""``dlm metrics PATH``: runs newest first, with their tokenization numbers, loss sparklines and adapters.

``--csv`` prints the same runs as CSV for a spreadsheet (with ``--run-id``,
that run's steps instead); ``--json`` prints the library's dataclasses.
"""

from __future__ import annotations

import csv
import io
from itertools import groupby
from typing import TYPE_CHECKING

import click

from .params import DURATION, RUN_ID, LocalPath
from .render import emit_json, human_bytes, json_option, note, plural

if TYPE_CHECKING:
    from dlmstore.store.metrics import MetricsReport, RunEvaluation, RunMetrics, TrainingInfo, ValStep


@click.command("metrics")
@click.argument("path", type=LocalPath(dir_okay=False))
@click.option("--run-id", type=RUN_ID, help="Only this run, with its logged steps of every phase.")
@click.option("--since", type=DURATION, help="Only runs started within this long (7d, 12h, ...).")
@click.option(
    "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="At most this many runs."
)
@json_option("dlmstore.store.metrics:MetricsReport", help="Print the runs as JSON.")
@click.option(
    "--csv",
    "as_csv",
    is_flag=True,
    help="Print the runs as CSV for a spreadsheet; with --run-id, that run's steps.",
)
def metrics_command(
    path: str, run_id: int | None, since: object, limit: int, as_json: bool, as_csv: bool
) -> None:
    """List the runs recorded for the document at PATH, newest first.

    A train run's loss is drawn as a sparkline per phase (each scaled to
    its own range), beside the run's cache hit rate. DURATION is the whole
    run's; TOKENIZE is its tokenize pass's; HIT RATE reads `bypassed` for a
    --no-cache run and `off` when training.cache.enabled is false. Below the
    table: why each failed run failed, and each train run's phases (steps,
    final and best loss) and adapters, and its validation rows that
    duplicate training rows (with --run-id, each of them).
    """
    if as_json and as_csv:
        raise click.UsageError("--json and --csv cannot be combined; pass one of them")
    from dlmstore.document.parser import parse_document
    from dlmstore.report.sparkline import sparkline
    from dlmstore.store.database import open_store
    from dlmstore.store.metrics import run_metrics

    document = parse_document(path)
    with open_store(document.dlm_id, create=False) as store:
        report = run_metrics(store, run_id=run_id, since=since, limit=limit)  # type: ignore[arg-type]
    if as_json:
        emit_json(report)
        return
    if as_csv:
        click.echo(_steps_csv(report) if run_id is not None else _runs_csv(report), nl=False)
        return
    header = f"{'run':>5}  {'command':8}  {'status':9}  {'started (UTC)':23}  {'duration':>8}  {'rows':>7}  {'hits':>7}  {'misses':>7}  {'hit rate':>8}  {'tokenize':>8}  {'cache':>9}  loss"
    click.echo(header)
    for run in report.runs:
        event = run.tokenization
        if event is None:
            numbers = f"{'':>7}  {'':>7}  {'':>7}  {'':>8}  {'':>8}  {'':>9}"
        else:
            rate = "n/a" if event.hit_rate is None else f"{event.hit_rate:.1%}"
            if event.cache_mode != "on":  # every row tokenized on purpose, not an emptied cache
                rate = event.cache_mode
            numbers = (
                f"{event.total_rows:>7,}  {event.cache_hits:>7,}  {event.cache_misses:>7,}  {rate:>8}  "
                f"{_seconds(event.total_tokenize_seconds):>8}  {human_bytes(event.cache_bytes_after):>9}"
            )
        losses = ""
        if run.training is not None:
            losses = "  ".join(
                f"{_PHASE_LABELS.get(phase, phase)} {sparkline(values)}"
                for phase, values in run.training.losses.items()
            )
        duration = "-" if run.duration_seconds is None else _seconds(run.duration_seconds)
        line = (
            f"{run.run_id:>5}  {run.command:8}  {run.status:9}  {run.started_at:23}  {duration:>8}  {numbers}"
        )
        click.echo(f"{line}  {losses}".rstrip())
    for run in report.runs:
        _outcome(run)
        _evaluations(run)
        if run.training is not None:
            _training(run.run_id, run.training, run.val_steps, run.adapter)
    for run in report.runs:
        _shared_and_duplicates(run)
        _contamination(run, listed=run_id is not None)
    for export in report.exports:
        quant = f", {export.quant}" if export.quant else ""
        click.echo(
            f"export {export.export_id}: adapter v{export.adapter_version:04d}, {export.target}{quant}, "
            f"{export.path} ({plural(export.files, 'file')}, {human_bytes(export.bytes)}, {export.created_at})"
        )
    if not report.runs:
        note("no runs yet: run `dlm tokenize` or `dlm train` first")


def _seconds(seconds: float) -> str:
    """``0.88s``, ``42.1s``, ``15m02s``, ``2h05m``: a duration that reads at a glance."""
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{rest:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _outcome(run: RunMetrics) -> None:
    """Why a run failed, and each phase's steps with its final and best loss."""
    if run.error is not None:
        click.echo(f"run {run.run_id}: {run.status}: {run.error}")
    for phase in run.phases:
        final = "n/a" if phase.final_loss is None else f"{phase.final_loss:.4f}"
        best = "" if phase.best_loss is None else f", best {phase.best_loss:.4f} at step {phase.best_step}"
        click.echo(f"run {run.run_id} {phase.phase}: {plural(phase.steps, 'step')}, final loss {final}{best}")


def _evaluations(run: RunMetrics) -> None:
    """What a run evaluated: per phase, the val loss and the probes, base -> adapter; ``dlm eval``'s models."""
    phases: dict[str, list[RunEvaluation]] = {}
    for evaluation in run.evaluations:
        phases.setdefault(evaluation.phase, []).append(evaluation)
    for phase, models in phases.items():
        if phase == "eval":
            click.echo(f"run {run.run_id} eval: " + "; ".join(f"{m.model} {_scores(m)}" for m in models))
            continue
        base = next((m for m in models if m.adapter_version is None), None)
        adapter = next((m for m in models if m.adapter_version is not None), None)
        if base is None or adapter is None:
            continue
        best = ""
        if adapter.best_val_loss is not None:
            best = f" (best {adapter.best_val_loss:.4f} at step {adapter.best_step}{', stopped early' if adapter.stopped_early else ''})"
        val = (
            "no val rows"
            if adapter.val_loss is None
            else f"val loss {_number(base.val_loss, '.4f')} -> {adapter.val_loss:.4f}{best}"
        )
        probes = ""
        if adapter.probes:
            probes = (
                f"; probes: base {base.probe_exact}/{base.probes} exact, NLL {_number(base.probe_nll, '.2f')} -> "
                f"{adapter.model} {adapter.probe_exact}/{adapter.probes} exact, NLL {_number(adapter.probe_nll, '.2f')}"
            )
        click.echo(f"run {run.run_id} {phase}: {val}{probes}")
        _retention(run.run_id, phase, base, adapter)


def _retention(run_id: int, phase: str, base: RunEvaluation, adapter: RunEvaluation) -> None:
    """A train phase's probes of earlier versions and retention slice loss, base -> adapter (no line
    without them)."""
    parts = []
    if adapter.retained_probes:
        parts.append(
            f"kept: base {base.retained_exact}/{base.retained_probes} exact, NLL {_number(base.retained_nll, '.2f')} -> "
            f"{adapter.model} {adapter.retained_exact}/{adapter.retained_probes} exact, NLL {_number(adapter.retained_nll, '.2f')}"
        )
    if adapter.retention_loss is not None:
        line = (
            f"retain: loss {_number(base.retention_loss, '.4f')} -> {adapter.retention_loss:.4f} "
            f"({plural(adapter.retention_rows, 'row')})"
        )
        if adapter.retention_delta is not None:
            line += f", {adapter.retention_delta:+.4f} against the previous adapter"
        parts.append(line)
    if parts:
        click.echo(f"run {run_id} {phase}: {'; '.join(parts)}")


def _scores(model: RunEvaluation) -> str:
    """``val loss 2.6957, 3/3 exact, NLL 0.01``, then the probes of earlier versions and the retention
    slice's loss when it measured them (``kept 1/2 exact, NLL 0.40, retain loss 3.1020, delta +0.0120``)."""
    parts = [] if model.val_loss is None else [f"val loss {model.val_loss:.4f}"]
    if model.probes:
        parts += [f"{model.probe_exact}/{model.probes} exact", f"NLL {_number(model.probe_nll, '.2f')}"]
    if model.retained_probes:
        parts += [
            f"kept {model.retained_exact}/{model.retained_probes} exact",
            f"NLL {_number(model.retained_nll, '.2f')}",
        ]
    if model.retention_loss is not None:
        parts.append(f"retain loss {model.retention_loss:.4f}")
        if model.retention_delta is not None:
            parts.append(f"delta {model.retention_delta:+.4f}")
    return ", ".join(parts) or "nothing to evaluate"


def _shared_and_duplicates(run: RunMetrics) -> None:
    """A line for a run that took tokens from other stores or found duplicate rows."""
    parts = []
    if run.tokenization is not None and run.tokenization.cache_shared:
        parts.append(f"{plural(run.tokenization.cache_shared, 'row')} taken from other stores")
    dedup = run.dedup
    if dedup is not None and dedup.clusters:
        left = f", {dedup.dropped_rows:,} left out" if run.command == "train" and dedup.dropped_rows else ""
        parts.append(
            f"{plural(dedup.clusters, 'duplicate cluster')}, {plural(dedup.duplicate_rows, 'duplicate row')} "
            f"(training.dedup: {dedup.mode}{left})"
        )
    if parts:
        click.echo(f"run {run.run_id}: {'; '.join(parts)}")


def _contamination(run: RunMetrics, *, listed: bool) -> None:
    """A train run's held-out rows that duplicate training rows; each of them when ``listed``."""
    found = run.contamination
    if found is None or not found.contaminated_rows:
        return
    kinds = ", ".join(
        f"{count} {kind}"
        for kind in ("exact", "near")
        if (count := sum(row.kind == kind for row in found.rows))
    )
    if found.kept_out_rows:
        what = f"kept out of the split, they trained (training.dedup: {found.mode})"
    else:
        what = "held out: its val loss reads low on them"
    verb = "duplicates a training row" if found.contaminated_rows == 1 else "duplicate training rows"
    click.echo(
        f"run {run.run_id}: {plural(found.contaminated_rows, 'validation row')} of seed {found.seed} {verb} "
        f"({kinds}); {what}"
    )
    if listed:
        width = max(len(row.path) for row in found.rows)
        for row in found.rows:
            state = "kept out" if row.kept_out else "held out"
            click.echo(f"  {row.path:{width}}  {row.kind:5}  {row.similarity:.2f}  {row.train_path}  {state}")


#: The preference columns: what TRL logs under ``rewards/...`` at each step.
REWARDS = (
    ("chosen", "rewards/chosen"),
    ("rejected", "rewards/rejected"),
    ("margin", "rewards/margins"),
    ("accuracy", "rewards/accuracies"),
)


def _training(run_id: int, train: TrainingInfo, val_steps: list[ValStep], name: str | None = None) -> None:
    """The adapters a run registered, then its steps (``--run-id``) grouped by phase, with the val loss."""
    val = {(item.phase, item.step): item.loss for item in val_steps}
    for adapter in train.adapters:
        origin = (
            f"{adapter.phase}, {adapter.method} from v{adapter.parent_version:04d}"
            if adapter.method
            else adapter.phase
        )
        loss = "n/a" if adapter.final_loss is None else f"{adapter.final_loss:.4f}"
        click.echo(
            f"run {run_id}: adapter {name + ' ' if name else ''}v{adapter.version:04d} ({origin}), "
            f"{plural(adapter.steps, 'step')}, "
            f"final loss {loss}, {adapter.sha256}"
        )
    for phase, steps in groupby(train.steps or [], key=lambda step: step.phase):
        preference = phase == "preference"
        click.echo(f"run {run_id}, {phase} steps:")
        validated = any(key[0] == phase for key in val)
        header = f"{'step':>6}  {'epoch':>7}  {'loss':>9}  {'learning rate':>13}  {'tokens/s':>9}"
        header += f"  {'val loss':>9}" if validated else ""
        click.echo(header + "".join(f"  {title:>9}" for title, _ in REWARDS) if preference else header)
        for step in steps:
            line = (
                f"{step.step:>6}  {_number(step.epoch, '.3f'):>7}  {_number(step.loss, '.4f'):>9}  "
                f"{_number(step.learning_rate, '.3g'):>13}  {_number(step.tokens_per_second, ',.0f'):>9}"
            )
            if validated:
                line += f"  {_number(val.get((phase, step.step)), '.4f'):>9}"
            if preference:
                line += "".join(
                    f"  {_number(step.metrics.get(name), '.1%' if title == 'accuracy' else '.4f'):>9}"
                    for title, name in REWARDS
                )
            click.echo(line)


def _number(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


#: How a phase is labelled beside its sparkline.
_PHASE_LABELS = {"sft": "sft", "preference": "pref"}

RUN_COLUMNS = (
    "run_id", "command", "status", "started_at", "finished_at", "error", "total_sections", "total_rows",
    "cache_hits", "cache_misses", "hit_rate", "total_tokenize_seconds", "cache_bytes_after", "cache_mode",
    "adapter_versions", "final_loss", "duration_seconds", "sft_steps", "sft_final_loss", "sft_best_loss",
    "preference_steps", "preference_final_loss", "preference_best_loss", "val_rows", "contaminated_rows",
    "kept_out_rows",
)  # fmt: skip

STEP_COLUMNS = ("run_id", "phase", "step", "epoch", "loss", "learning_rate", "tokens_per_second")


def _csv(rows: list[list[object]]) -> str:
    """Rows as CSV text: ``None`` as an empty cell, one ``\n`` per line."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows([["" if cell is None else cell for cell in row] for row in rows])
    return out.getvalue()


def _runs_csv(report: MetricsReport) -> str:
    """One line per run: the run, its tokenization pass, its adapters and the final loss of the last."""
    rows: list[list[object]] = [list(RUN_COLUMNS)]
    for run in report.runs:
        event = run.tokenization
        adapters = run.training.adapters if run.training is not None else []
        rows.append(
            [
                run.run_id, run.command, run.status, run.started_at, run.finished_at, run.error,
                *(
                    [None] * 8 if event is None else [
                        event.total_sections, event.total_rows, event.cache_hits, event.cache_misses,
                        event.hit_rate, event.total_tokenize_seconds, event.cache_bytes_after, event.cache_mode,
                    ]
                ),
                " ".join(str(adapter.version) for adapter in adapters),
                adapters[-1].final_loss if adapters else None,
                run.duration_seconds,
                *_phase_cells(run, "sft"),
                *_phase_cells(run, "preference"),
                *_split_cells(run),
            ]
        )  # fmt: skip
    return _csv(rows)


def _phase_cells(run: RunMetrics, name: str) -> list[object]:
    """A phase's steps, final and best loss; empty cells when the run did not train it."""
    phase = next((phase for phase in run.phases if phase.phase == name), None)
    return [None] * 3 if phase is None else [phase.steps, phase.final_loss, phase.best_loss]


def _split_cells(run: RunMetrics) -> list[object]:
    """A train run's val rows, those that duplicate training rows and those kept out; empty cells
    for other runs."""
    found = run.contamination
    return [None] * 3 if found is None else [found.val_rows, found.contaminated_rows, found.kept_out_rows]


def _steps_csv(report: MetricsReport) -> str:
    """One line per logged step of the run, every phase, with a column per metric TRL logged."""
    steps = [
        (run.run_id, step)
        for run in report.runs
        if run.training is not None and run.training.steps
        for step in run.training.steps
    ]
    names = sorted({name for _, step in steps for name in step.metrics})
    rows: list[list[object]] = [[*STEP_COLUMNS, *names]]
    for run_id, step in steps:
        rows.append(
            [
                run_id, step.phase, step.step, step.epoch, step.loss, step.learning_rate,
                step.tokens_per_second, *(step.metrics.get(name) for name in names),
            ]
        )  # fmt: skip
    return _csv(rows)

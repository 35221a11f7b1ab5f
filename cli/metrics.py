"""``dlm metrics PATH``: runs newest first, with their tokenization numbers."""

from __future__ import annotations

import click

from .params import DURATION, RUN_ID
from .render import emit_json, human_bytes


@click.command("metrics")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--run-id", type=RUN_ID, help="Only this run.")
@click.option("--since", type=DURATION, help="Only runs started within this long (7d, 12h, ...).")
@click.option(
    "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="At most this many runs."
)
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON.")
def metrics_command(path: str, run_id: int | None, since: object, limit: int, as_json: bool) -> None:
    """List the runs recorded for the document at PATH, newest first."""
    from dlmstore.document.parser import parse_document
    from dlmstore.store.database import open_store
    from dlmstore.store.metrics import run_metrics

    document = parse_document(path)
    with open_store(document.dlm_id, create=False) as store:
        report = run_metrics(store, run_id=run_id, since=since, limit=limit)  # type: ignore[arg-type]
    if as_json:
        emit_json(report)
        return
    header = f"{'run':>5}  {'command':8}  {'status':9}  {'started (UTC)':23}  {'rows':>7}  {'hits':>7}  {'misses':>7}  {'hit rate':>8}  {'seconds':>8}  {'cache':>9}"
    click.echo(header)
    for run in report.runs:
        event = run.tokenization
        if event is None:
            numbers = f"{'':>7}  {'':>7}  {'':>7}  {'':>8}  {'':>8}  {'':>9}"
        else:
            rate = "n/a" if event.hit_rate is None else f"{event.hit_rate:.1%}"
            numbers = (
                f"{event.total_rows:>7,}  {event.cache_hits:>7,}  {event.cache_misses:>7,}  {rate:>8}  "
                f"{event.total_tokenize_seconds:>8.2f}  {human_bytes(event.cache_bytes_after):>9}"
            )
        click.echo(f"{run.run_id:>5}  {run.command:8}  {run.status:9}  {run.started_at:23}  {numbers}")
    for run in report.runs:
        train = run.training
        if train is None:
            continue
        if train.adapter_version is not None:
            loss = "n/a" if train.final_loss is None else f"{train.final_loss:.4f}"
            click.echo(
                f"run {run.run_id}: adapter v{train.adapter_version:04d}, {train.steps_taken} steps, "
                f"final loss {loss}, {train.adapter_sha256}"
            )
        if train.steps:
            click.echo(f"{'step':>6}  {'epoch':>7}  {'loss':>9}  {'learning rate':>13}  {'tokens/s':>9}")
            for step in train.steps:
                epoch = "" if step.epoch is None else f"{step.epoch:.3f}"
                loss = "" if step.loss is None else f"{step.loss:.4f}"
                rate = "" if step.learning_rate is None else f"{step.learning_rate:.3g}"
                speed = "" if step.tokens_per_second is None else f"{step.tokens_per_second:,.0f}"
                click.echo(f"{step.step:>6}  {epoch:>7}  {loss:>9}  {rate:>13}  {speed:>9}")
    if not report.runs:
        click.echo("(no runs yet: run `dlm tokenize` or `dlm train` first)")

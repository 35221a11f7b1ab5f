"""``dlm replay show|prune DOC``: the replay history of a document's store."""

from __future__ import annotations

import click

from .params import DURATION, LocalPath
from .render import emit_json, human_bytes, json_option, plural, printable


@click.group("replay")
def replay_group() -> None:
    """Show and prune the replay history: the rows completed runs trained on."""


@replay_group.command("show")
@click.argument("path", type=LocalPath(dir_okay=False))
@json_option("dlmstore.replay.show:ReplayReport")
def show_command(path: str, as_json: bool) -> None:
    """History by generation, its size, the candidates a run could replay and the superseded rows.

    The draw shown is the one the next `dlm train` would make with the
    document as it is now, under training.seed.
    """
    from dlmstore.replay.show import show

    report = show(path)
    if as_json:
        emit_json(report)
        return
    if not report.generations:
        click.echo("no replay history yet: `dlm train` records it")
    for item in report.generations:
        versions = ", ".join(f"v{v:04d}" for v in item.adapter_versions) or "-"
        runs = ", ".join(map(str, item.runs))
        click.echo(
            f"generation {item.generation}: {plural(len(item.runs), 'run')} ({runs}) -> {versions}; "
            f"{plural(item.rows, 'row')} trained, {item.rows_new:,} new, {item.rows_removed:,} dropped"
        )
    click.echo(
        f"history: {plural(report.history_rows, 'row')}, {human_bytes(report.history_bytes)} "
        f"({human_bytes(report.stored_bytes)} stored), {report.retention_rows:,} in the retention slice"
    )
    click.echo(
        f"next run: generation {report.next_generation}, {report.new_rows:,} new rows and "
        f"{report.new_triples:,} new triples; draw {report.draw_rows:,} rows and {report.draw_triples:,} triples "
        f"of {plural(len(report.candidates), 'candidate')}"
        + ("" if report.enabled else " (training.replay.enabled is false)")
    )
    for c in report.candidates:
        mark = "drawn" if c.drawn else "     "
        click.echo(
            f"  {mark} {c.row_key[:19]}  {c.kind:<10} weight {c.weight:.3f}  "
            f"gen {c.last_generation}  {printable(c.origin)}"
        )
    if report.superseded:
        click.echo(f"superseded: {plural(len(report.superseded), 'row')} (never replayed)")
    for s in report.superseded:
        click.echo(f"  {s.row_key[:19]}  {s.kind:<10} by {s.by_row_key[:19]}  {printable(s.origin)}")


@replay_group.command("prune")
@click.argument("path", type=LocalPath(dir_okay=False))
@click.option("--row", "row", metavar="KEY", help="Remove the row with this key (sha256:...).")
@click.option(
    "--older-than",
    type=DURATION,
    help="Remove rows whose latest run finished longer ago than this (30d, 12h, 45m, 10s).",
)
@click.option("--superseded", is_flag=True, help="Remove the rows an edit of the document replaced.")
@click.option("--all", "everything", is_flag=True, help="Remove every row.")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@json_option("dlmstore.replay.prune:PruneResult")
def prune_command(
    path: str, row: str | None, older_than: object, superseded: bool, everything: bool, dry_run: bool,
    as_json: bool,
) -> None:  # fmt: skip
    """Remove rows from the replay history: one of --row, --older-than, --superseded, --all.

    Refused while another dlm process (a dlm train) has the store open.
    """
    from datetime import timedelta

    from dlmstore.replay.prune import prune

    chosen = [row is not None, older_than is not None, superseded, everything]
    if sum(chosen) != 1:
        raise click.UsageError("give exactly one of --row, --older-than, --superseded, --all")
    result = prune(
        path,
        row=row,
        older_than=older_than if isinstance(older_than, timedelta) else None,
        superseded=superseded,
        everything=everything,
        dry_run=dry_run,
    )
    if as_json:
        emit_json(result)
        return
    for item in result.rows:
        click.echo(
            f"{'would remove' if dry_run else 'removed'} {item.row_key}  {item.kind}  {printable(item.origin)}"
        )
    verb = "would remove" if dry_run else "removed"
    click.echo(
        f"{verb} {plural(result.rows_removed, 'row')} ({human_bytes(result.bytes_removed)})"
        + ("; nothing was removed (--dry-run)" if dry_run else "")
    )

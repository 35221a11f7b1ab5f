"""``dlm report PATH``: one self-contained HTML page about the document's store."""

from __future__ import annotations

import click

from .params import LocalPath
from .render import emit_json, human_bytes, is_quiet, json_option, printable_line


@click.command("report")
@click.argument("path", type=LocalPath(dir_okay=False))
@click.option(
    "-o",
    "--output",
    default="report.html",
    show_default=True,
    type=LocalPath(dir_okay=False, allow_dash=True),
    help="Write the page here (- for stdout). A symlink is followed and a file replaced keeps its "
    "mode; the document itself is refused.",
)
@click.option(
    "--runs",
    "train_runs",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="Draw the curves of at most this many train runs, newest first.",
)
@json_option(
    "dlmstore.report.contents:StoreReport", help="Print the report's data as JSON instead of the page."
)
def report_command(path: str, output: str, train_runs: int, as_json: bool) -> None:
    """Write an HTML report of the store of the document at PATH.

    One page, opened offline in any browser (inline SVG charts, no script,
    nothing fetched): loss (with the val loss) and learning rate per train
    run and phase, the newest probes answered by the base and the adapter,
    cache hits, misses and tokenize time per run, cache size over time,
    tokens by source folder, adapters with their sha256, and the lock
    history with each change's severity.
    """
    from pathlib import Path

    from dlmstore.document.parser import parse_document
    from dlmstore.report.contents import build_report
    from dlmstore.report.page import render_page, write_page
    from dlmstore.store.database import open_store

    document = parse_document(path)
    with open_store(document.dlm_id, create=False) as store:
        report = build_report(store, train_runs=train_runs)
    if as_json:
        emit_json(report)
        return
    if output == "-":
        click.echo(render_page(report), nl=False)
        return
    size = write_page(report, Path(output), inputs=(path, store.db_path))
    if not is_quiet():  # what was written is a note, not data: stdout stays empty, -q drops it
        click.echo(f"wrote {printable_line(output)} ({human_bytes(size)})", err=True)

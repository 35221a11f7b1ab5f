"""``dlm stores`` and ``dlm stores gc``: the stores a home holds, and clearing out the orphans."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from .render import emit_json, human_bytes, json_option, plural, printable

if TYPE_CHECKING:
    from dlmstore.store.stores import StoreListing


@click.group("stores", invoke_without_command=True)
@json_option("dlmstore.store.stores:StoresReport", help="Print the stores as JSON.")
@click.pass_context
def stores_group(ctx: click.Context, as_json: bool) -> None:
    """List every store under the dlm home (read-only).

    For each: its document id, size (store.db and blobs), cache entries,
    newest run and the document it last ran on, marked "(missing)" when
    that file is gone. A store whose store.db cannot be read is listed with
    why. Nothing is migrated or locked, so a busy store lists like any
    other. `dlm stores gc` removes the stores whose document is missing.
    """
    if ctx.invoked_subcommand is not None:
        return
    from dlmstore.store.stores import list_stores

    report = list_stores()
    if as_json:
        emit_json(report)
        return
    if not report.stores:
        click.echo(f"no stores under {report.home}")
        return
    runs = [_last_run(store) for store in report.stores]
    width = max(len("last run"), *map(len, runs))
    click.echo(f"{'id':26}  {'size':>9}  {'cache':>8}  {'last run':{width}}  document")
    for store, run in zip(report.stores, runs, strict=True):
        click.echo(_line(store, run, width))
    click.echo(f"{plural(len(report.stores), 'store')}, {human_bytes(report.bytes)}, under {report.home}")


@stores_group.command("gc")
@click.option("--force", is_flag=True, help="Do not ask for confirmation.")
@json_option("dlmstore.store.stores:GcResult")
def gc_command(force: bool, as_json: bool) -> None:
    """Remove the stores whose document no longer exists.

    A store's document is the file its newest run read; a store that never
    ran is kept. A store another dlm process has open is kept too. Asks
    first; without a terminal pass --force. A document you moved counts as
    gone: run `dlm tokenize` on it at its new place first, and its store
    follows it.
    """
    from dlmstore.errors import DlmError
    from dlmstore.store.stores import garbage, gc, list_stores

    doomed = garbage(list_stores())
    if doomed and not force:
        size = human_bytes(sum(store.bytes for store in doomed))
        what = f"{plural(len(doomed), 'store')} ({size})"
        if not sys.stdin.isatty():
            raise DlmError(
                f"refusing to remove {what} without confirmation",
                hint="run `dlm stores` to see them, then `dlm stores gc --force`",
            )
        for store in doomed:
            click.echo(
                f"{store.dlm_id}  {human_bytes(store.bytes):>9}  {printable(store.document or '')}", err=True
            )
        click.confirm(f"Remove {what} whose document is gone?", abort=True, err=True)
    result = gc([store.dlm_id for store in doomed])
    if as_json:
        emit_json(result)
        return
    for store in result.removed:
        click.echo(
            f"removed {store.dlm_id} ({human_bytes(store.bytes)}), document was {printable(store.document or '')}"
        )
    for kept in result.kept:
        click.echo(f"kept {kept.dlm_id}: {_KEPT[kept.reason]}")
    click.echo(f"removed {plural(len(result.removed), 'store')} ({human_bytes(result.bytes_removed)})")


_KEPT = {
    "in_use": "another dlm process has it open (run gc again when it is done)",
    "document_present": "its document is back",
    "gone": "its folder was already removed",
}


def _last_run(store: StoreListing) -> str:
    """``2 train completed 2026-11-23 02:28``: id, command, status and start (UTC, to the minute)."""
    run = store.last_run
    if run is None:
        return "-"
    return f"{run.run_id} {run.command} {run.status} {run.started_at[:16].replace('T', ' ')}"


def _line(store: StoreListing, last: str, width: int) -> str:
    cache = "" if store.cache_entries is None else f"{store.cache_entries:,}"
    if store.status not in ("ok", "old_schema"):
        where = f"({store.status}: {store.detail})"
    elif store.document is None:
        where = "-"
    else:
        where = store.document + (" (missing)" if store.document_state == "missing" else "")
    return f"{store.dlm_id:26}  {human_bytes(store.bytes):>9}  {cache:>8}  {last:{width}}  {printable(where)}"

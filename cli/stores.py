"""``dlm stores`` and ``dlm stores gc``: the stores a home holds, and clearing out the orphans."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from .render import emit_json, human_bytes, json_option, plural, printable

if TYPE_CHECKING:
    from dlmstore.store.stores import DocumentPath, GcResult, KeptStore, StoreListing


@click.group("stores", invoke_without_command=True)
@json_option("dlmstore.store.stores:StoresReport", help="Print the stores as JSON.")
@click.pass_context
def stores_group(ctx: click.Context, as_json: bool) -> None:
    """List every store under the dlm home (read-only).

    For each: its document id, size (store.db and blobs), cache entries,
    newest run (`dead` when it is still marked running but its process is
    gone) and every path a document that used it was read at, marked
    "(missing)" when that file is gone and "(cannot tell: ...)" when that
    cannot be known (its folder missing or empty, no permission). A store
    whose store.db cannot be read is listed with why. Nothing is migrated,
    written or locked, so a busy store lists like any other. `dlm stores gc`
    removes the stores whose document is missing from every path.
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
        click.echo(_lines(store, run, width))
    click.echo(f"{plural(len(report.stores), 'store')}, {human_bytes(report.bytes)}, under {report.home}")


@stores_group.command("gc")
@click.option("--force", is_flag=True, help="Do not ask for confirmation.")
@click.option("--dry-run", is_flag=True, help="Only list what would be removed and why; remove nothing.")
@json_option("dlmstore.store.stores:GcResult")
def gc_command(force: bool, dry_run: bool, as_json: bool) -> None:
    """Remove the stores whose document is gone from every path it was used at.

    A store records every path a document was read at (resolved: through
    a symlink, the file it leads to); it is removed only when each one is
    gone: ENOENT, while its folder is there and holds other files. A path
    that cannot be checked (its folder missing or empty, as a disk that is
    not mounted leaves it; no permission; an I/O error) keeps the store,
    and so does a store that records no path or whose store.db cannot be
    read; each is listed with why. A store another dlm process has open is
    kept too. Asks first; without a terminal pass --force. --dry-run lists
    what would go and why, and removes nothing. A document you moved is
    gone from its old path: run `dlm tokenize` on it at its new place first,
    and its store records the new path.
    """
    from dlmstore.errors import DlmError
    from dlmstore.store.stores import garbage, gc, list_stores

    report = list_stores()
    doomed = garbage(report)
    if doomed and not force and not dry_run:
        size = human_bytes(sum(store.bytes for store in doomed))
        what = f"{plural(len(doomed), 'store')} ({size})"
        if not sys.stdin.isatty():
            raise DlmError(
                f"refusing to remove {what} without confirmation",
                hint="run `dlm stores gc --dry-run` to see them, then `dlm stores gc --force`",
            )
        for store in doomed:
            click.echo(f"{store.dlm_id}  {human_bytes(store.bytes):>9}  {_gone(store)}", err=True)
        click.confirm(f"Remove {what} whose document is gone?", abort=True, err=True)
    result = gc(report, dry_run=dry_run)
    if as_json:
        emit_json(result)
        return
    _print_gc(result)


def _print_gc(result: GcResult) -> None:
    verb = "would remove" if result.dry_run else "removed"
    for store in result.removed:
        click.echo(f"{verb} {store.dlm_id} ({human_bytes(store.bytes)}), document was {_gone(store)}")
    for kept in result.kept:
        click.echo(f"kept {kept.dlm_id}: {printable(_why_kept(kept))}")
    total = f"{verb} {plural(len(result.removed), 'store')} ({human_bytes(result.bytes_removed)})"
    click.echo(total + ("; nothing was removed (--dry-run)" if result.dry_run else ""))


def _gone(store: StoreListing) -> str:
    """Every path the store's document is gone from: ``/a/doc.dlm, /b/doc.dlm``."""
    return printable(", ".join(document.path for document in store.documents))


_KEPT = {
    "in_use": "another dlm process has it open (run gc again when it is done)",
    "document_present": "its document is there",
    "gone": "its folder was already removed",
    "no_path": "",
    "cannot_tell": "",
    "unreadable": "",
}


def _why_kept(kept: KeptStore) -> str:
    return _KEPT[kept.reason] or kept.detail or kept.reason


def _last_run(store: StoreListing) -> str:
    """``2 train completed 2026-11-23 02:28``: id, command, status and start (UTC, to the minute)."""
    run = store.last_run
    if run is None:
        return "-"
    return f"{run.run_id} {run.command} {run.status} {run.started_at[:16].replace('T', ' ')}"


def _lines(store: StoreListing, last: str, width: int) -> str:
    """The store's line, then one more for each further path its document was read at."""
    cache = "" if store.cache_entries is None else f"{store.cache_entries:,}"
    head = f"{store.dlm_id:26}  {human_bytes(store.bytes):>9}  {cache:>8}  {last:{width}}  "
    if store.status not in ("ok", "old_schema"):
        return head + printable(f"({store.status}: {store.detail})")
    if not store.documents:
        return head + printable(f"- ({store.document_detail}; gc keeps it)")
    wheres = [printable(_where(document)) for document in store.documents]
    return "\n".join([head + wheres[0], *(" " * len(head) + where for where in wheres[1:])])


def _where(document: DocumentPath) -> str:
    if document.state == "missing":
        return f"{document.path} (missing)"
    if document.state == "unknown":
        return f"{document.path} (cannot tell: {document.detail})"
    return document.path

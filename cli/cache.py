"""``dlm cache show|prune|clear|verify PATH``: look after the tokenized cache."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from .params import DURATION, LocalPath
from .render import emit_json, human_bytes, json_option, note, plural

if TYPE_CHECKING:
    from dlmstore.store.database import Store


@click.group("cache")
def cache_group() -> None:
    """Inspect and maintain the tokenized cache of a document's store."""


def _document_id(path: str) -> str:
    from dlmstore.document.parser import parse_document

    return parse_document(path).dlm_id


@cache_group.command("show")
@click.argument("path", type=LocalPath(dir_okay=False))
@json_option("dlmstore.cache.admin:CacheSummary", help="Print the summary as JSON.")
def show_command(path: str, as_json: bool) -> None:
    """Entries, size and last-run hit rate of the cache (read-only)."""
    from dlmstore.cache.admin import cache_summary

    summary = cache_summary(_document_id(path))
    if as_json:
        emit_json(summary)
        return
    click.echo(f"Cache for {summary.dlm_id}")
    click.echo(f"path: {summary.path}")
    click.echo(f"entries: {summary.entry_count:,}")
    click.echo(f"size: {human_bytes(summary.bytes)}")
    if summary.shared_entries:
        click.echo(
            f"shared: {summary.shared_entries:,} entries ({human_bytes(summary.shared_bytes)}) "
            "taken from other stores of the home"
        )
    if summary.last_run_hit_rate is None:
        click.echo("last-run hit rate: n/a (no cached run yet)")
    else:
        total = (summary.last_run_hits or 0) + (summary.last_run_misses or 0)
        click.echo(
            f"last-run hit rate: {summary.last_run_hit_rate:.1%} ({summary.last_run_hits:,}/{total:,})"
        )


@cache_group.command("prune")
@click.argument("path", type=LocalPath(dir_okay=False))
@click.option(
    "--older-than",
    type=DURATION,
    help="Drop entries not used for this long (30d, 12h, 45m, 10s). "
    "Default: training.cache.prune_older_than_days (90).",
)
@json_option("dlmstore.cache.admin:PruneResult")
def prune_command(path: str, older_than: object, as_json: bool) -> None:
    """Drop old entries, empty or sparse token files, orphans and temp files."""
    from datetime import timedelta

    from dlmstore.cache.admin import prune
    from dlmstore.document.parser import parse_document
    from dlmstore.store.database import open_store

    document = parse_document(path)
    cutoff = (
        older_than
        if isinstance(older_than, timedelta)
        else timedelta(days=document.frontmatter.training.cache.prune_older_than_days)
    )
    with open_store(document.dlm_id, create=False) as store:
        result = prune(store, older_than=cutoff)
    if as_json:
        emit_json(result)
        return
    click.echo(
        f"pruned {plural(result.entries_removed, 'entry', 'entries')} ({human_bytes(result.bytes_removed)}) "
        f"not used since {result.cutoff}"
    )
    click.echo(
        f"files: {result.segments_removed:,} empty and {plural(result.segments_compacted, 'sparse token file')}, "
        f"{plural(result.orphan_files_removed, 'orphan')}, {plural(result.temp_files_removed, 'temp file')}, "
        f"{plural(result.staging_dirs_removed, 'base conversion leftover')}"
    )
    if result.store_in_use:
        note(IN_USE_NOTE)


@cache_group.command("clear")
@click.argument("path", type=LocalPath(dir_okay=False))
@click.option("--force", is_flag=True, help="Do not ask for confirmation.")
@json_option("dlmstore.cache.admin:ClearResult")
def clear_command(path: str, force: bool, as_json: bool) -> None:
    """Delete every cache entry of the document's store."""
    from dlmstore.cache.admin import ClearResult, cache_summary, clear
    from dlmstore.errors import DlmError
    from dlmstore.store.database import open_store

    dlm_id = _document_id(path)
    summary = cache_summary(dlm_id)
    if summary.entry_count == 0:
        # Nothing to do is success: no question, no store created. An existing store still
        # records its dead runs as failed, as every command that writes does.
        # (Segment files no entry names are debris: `dlm cache verify --repair` removes them.)
        if summary.exists:
            from dlmstore.store.runs import fail_dead_runs

            with open_store(dlm_id, create=False) as store:
                fail_dead_runs(store)
        if as_json:
            emit_json(ClearResult(0, 0, 0))
        else:
            click.echo("nothing to clear: the cache is empty")
        return
    if not force:
        if not sys.stdin.isatty():
            raise DlmError(
                f"refusing to clear {plural(summary.entry_count, 'entry', 'entries')} ({human_bytes(summary.bytes)}) "
                "without confirmation",
                hint=f"pass --force: dlm cache clear {path} --force",
            )
        click.confirm(
            f"Delete {plural(summary.entry_count, 'cache entry', 'cache entries')} ({human_bytes(summary.bytes)})?",
            abort=True,
            err=True,  # the question is not data: stdout stays clean
        )
    with open_store(dlm_id, create=False) as store:
        result = clear(store)
    if as_json:
        emit_json(result)
        return
    click.echo(
        f"cleared {plural(result.entries_removed, 'entry', 'entries')} ({human_bytes(result.bytes_removed)})"
    )


@cache_group.command("verify")
@click.argument("path", type=LocalPath())
@click.option("--repair", is_flag=True, help="Fix what is found: drop broken entries, remove debris.")
@json_option("dlmstore.cache.admin:VerifyResult")
def verify_command(path: str, repair: bool, as_json: bool) -> None:
    """Check store.db, each entry's token bytes, each file and each replay history row's content.

    PATH is a document, or a dataset directory holding its own store.db
    (`dlm data build-all` and `dlm data build` make those).

    Exits 1 while problems remain. After --repair none should, unless store.db
    itself is damaged: repair never writes to it; restore it from a backup or
    move it aside. Temp files and unregistered token files are debris whatever
    their age, unless another dlm process has the store open: then those
    younger than an hour are left alone, in case that process is writing them.
    """
    from dlmstore.replay.verify import verify

    with _open_to_verify(path) as store:
        result = verify(store, repair=repair)
    if as_json:
        emit_json(result)
    else:
        for problem in result.problems:
            state = "repaired" if problem.repaired else "problem"
            click.echo(f"{state}: {problem.kind}: {problem.path}: {problem.detail}")
        click.echo(
            f"checked {plural(result.entries_checked, 'entry', 'entries')} in "
            f"{plural(result.segments_checked, 'token file')}: "
            f"{plural(len(result.problems), 'problem')}, {result.remaining:,} remaining"
        )
    if result.store_in_use:
        note(IN_USE_NOTE)
    if result.remaining:
        sys.exit(1)


IN_USE_NOTE = (
    "another dlm process may have this store open (its lock could not be taken); files younger "
    "than an hour were left alone in case it is writing them (run again when it is done)"
)


def _open_to_verify(path: str) -> Store:
    """The store of a document, or of a dataset directory, opened even when it lost history."""
    from pathlib import Path

    from dlmstore.errors import DlmError
    from dlmstore.store.connection import DB_NAME
    from dlmstore.store.database import open_store, open_store_at

    if Path(path).is_dir():
        if not (Path(path) / DB_NAME).is_file():
            raise DlmError(
                f"{path} is a directory without a {DB_NAME}",
                hint="pass a .dlm document, or a dataset directory built by `dlm data`",
            )
        return open_store_at(Path(path), create=False, check_history=False)
    return open_store(_document_id(path), create=False, check_history=False)

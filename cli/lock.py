"""``dlm lock show|diff PATH``, and the ``--strict-lock/--update-lock/--ignore-lock`` flags.

:func:`lock_mode_options` is shared with ``dlm train``: it adds the three
mutually exclusive flags to a command and hands the command one
``lock_mode`` argument (``validate``, ``strict``, ``update`` or ``ignore``),
the mode :func:`dlmstore.lock.check_lock` takes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from .params import RUN_ID, LocalPath
from .render import emit_json, json_option

if TYPE_CHECKING:
    from dlmstore.lock import Lock

F = TypeVar("F", bound=Callable[..., Any])

#: Flag -> lock mode; no flag means ``validate``.
LOCK_FLAGS = {"--strict-lock": "strict", "--update-lock": "update", "--ignore-lock": "ignore"}


def lock_mode_options(command: F) -> F:
    """Add ``--strict-lock``, ``--update-lock`` and ``--ignore-lock``; pass ``lock_mode``.

    The decorated function receives ``lock_mode: str`` instead of the three
    flags. Passing two of them is a usage error (exit 2).
    """

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        chosen = [flag for flag in LOCK_FLAGS if kwargs.pop(_param(flag))]
        if len(chosen) > 1:
            raise click.UsageError(
                f"{', '.join(chosen[:-1])} and {chosen[-1]} cannot be combined; "
                "pass at most one of --strict-lock, --update-lock, --ignore-lock"
            )
        kwargs["lock_mode"] = LOCK_FLAGS[chosen[0]] if chosen else "validate"
        return command(*args, **kwargs)

    options = [
        click.option(
            "--ignore-lock",
            _param("--ignore-lock"),
            is_flag=True,
            help="Skip the lock check and leave dlm.lock as it is (the run is still recorded).",
        ),
        click.option(
            "--update-lock",
            _param("--update-lock"),
            is_flag=True,
            help="Skip the lock check and rewrite dlm.lock (also replaces a corrupt one).",
        ),
        click.option(
            "--strict-lock",
            _param("--strict-lock"),
            is_flag=True,
            help="Treat every lock warning as an error.",
        ),
    ]
    decorated: Callable[..., Any] = wrapper
    for option in options:
        decorated = option(decorated)
    return decorated  # type: ignore[return-value]


def _param(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


@click.group("lock")
def lock_group() -> None:
    """Show and compare a document's reproducibility lock (dlm.lock)."""


@lock_group.command("show")
@click.argument("path", type=LocalPath(dir_okay=False))
@json_option("dlmstore.lock.model:Lock", help="Print the lock as JSON (the contents of dlm.lock).")
def show_command(path: str, as_json: bool) -> None:
    """Print the document's dlm.lock: the lock its last training run wrote."""
    from dlmstore.document.parser import parse_document
    from dlmstore.lock import current_lock
    from dlmstore.store.database import open_store

    with open_store(parse_document(path).dlm_id, create=False) as store:
        lock = current_lock(store)
    if as_json:
        emit_json(lock)
        return
    rows: list[tuple[str, object]] = []  # (label, value); nested dicts get a heading row
    for name, value in _fields(lock):
        rows.extend(_rows(name, value, ""))
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        click.echo(label if value is _HEADING else f"{label:{width}}  {_show(value)}")


_HEADING = object()


def _rows(name: str, value: Any, indent: str) -> list[tuple[str, Any]]:
    """``name: value``, or a heading and its keys indented below it (nested objects too)."""
    if isinstance(value, dict) and value:
        rows: list[tuple[str, Any]] = [(f"{indent}{name}:", _HEADING)]
        for key in sorted(value):
            rows.extend(_rows(key, value[key], indent + "  "))
        return rows
    return [(f"{indent}{name}:", "{}" if value == {} else value)]


@lock_group.command("diff")
@click.argument("path", type=LocalPath(dir_okay=False))
@click.option(
    "--against",
    "against",
    type=RUN_ID,
    metavar="RUN_ID",
    help="Compare with the lock of this run instead of the previous lock.",
)
@json_option("dlmstore.lock.records:LockDiff", help="Print the differences as JSON.")
def diff_command(path: str, against: int | None, as_json: bool) -> None:
    """Compare dlm.lock with the lock before it: field, old, new, severity.

    Without --against the other side is the previous written lock; with
    --against RUN_ID it is that run's record (an --ignore-lock run too).
    """
    from dlmstore.document.parser import parse_document
    from dlmstore.lock import lock_diff
    from dlmstore.store.database import open_store

    with open_store(parse_document(path).dlm_id, create=False) as store:
        diff = lock_diff(store, against_run_id=against)
    if as_json:
        emit_json(diff)
        return
    new = f"record {diff.new_record_id} (run {_show(diff.new_run_id)})"
    if diff.old_record_id is None:
        click.echo(f"{new} is the only lock recorded; nothing to compare")
        return
    click.echo(f"record {diff.old_record_id} (run {_show(diff.old_run_id)}) -> {new}")
    if not diff.rows:
        click.echo("no differences")
        return
    table = [("field", "old", "new", "severity")] + [
        (row.field, _short(_show(row.old)), _short(_show(row.new)), row.severity) for row in diff.rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(3)]
    for line in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)) + "  " + line[3])


def _fields(lock: Lock) -> list[tuple[str, object]]:
    import dataclasses

    return [(f.name, getattr(lock, f.name)) for f in dataclasses.fields(lock)]


def _short(text: str) -> str:
    """A sha256 hex digest cut to 12 digits, so the table fits a terminal (--json has it whole)."""
    import re

    match = re.fullmatch(r"(sha256:)?[0-9a-f]{64}", text)
    return text[: len(match.group(1) or "") + 12] if match else text


def _show(value: object) -> str:
    """Values as a person reads them: ``-`` for none, ``true``/``false`` as in JSON."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)

"""Runs: one row per ``dlm tokenize`` / ``dlm train`` invocation.

A run is inserted as ``running`` before any work starts and finished as
``completed`` or ``failed``. :func:`recorded_run` wraps the whole lifecycle:
an exception (Ctrl-C included) marks the run failed with a one-line reason
and re-raises, so the store never keeps a run that claims to be running
after its process is gone. Ids come from ``AUTOINCREMENT`` and are never
reused: the high-water mark beside store.db (``dlmstore.store.highwater``)
is raised once the run's row is committed and again when it finishes, so a
store.db that loses its latest runs (its WAL deleted) is refused instead
of handing an id out twice.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dlmstore import __version__
from dlmstore.clock import utc_now
from dlmstore.store import highwater
from dlmstore.store.database import Store

_COLUMNS = "id, command, status, started_at, finished_at, dlm_path, dlm_sha256, dlmstore_version, pid, error"

RUN_COMMANDS = ("tokenize", "train")


@dataclass(frozen=True)
class Run:
    """One row of the ``runs`` table."""

    id: int
    command: str
    status: str
    started_at: str
    finished_at: str | None
    dlm_path: str
    dlm_sha256: str
    dlmstore_version: str
    pid: int | None
    error: str | None


def start_run(store: Store, *, command: str, dlm_path: Path, dlm_sha256: str, world_size: int = 1) -> int:
    """Insert a ``running`` run and return its id.

    Runs still marked ``running`` whose process is gone (killed with
    SIGKILL, or the machine lost power) are marked ``failed`` first.
    """
    if command not in RUN_COMMANDS:
        raise ValueError(f"unknown run command {command!r}")
    with store.write() as conn:
        running = conn.execute("SELECT id, pid FROM runs WHERE status = 'running'").fetchall()
        dead = [run_id for run_id, pid in running if pid is not None and not _alive(pid)]
        if dead:
            conn.executemany(
                "UPDATE runs SET status = 'failed', finished_at = ?, "
                "error = 'the process ended without finishing the run' WHERE id = ?",
                [(utc_now(), run_id) for run_id in dead],
            )
        cursor = conn.execute(
            "INSERT INTO runs (command, status, started_at, dlm_path, dlm_sha256, dlmstore_version, pid, "
            "world_size) VALUES (?, 'running', ?, ?, ?, ?, ?, ?)",
            (command, utc_now(), str(dlm_path), dlm_sha256, __version__, os.getpid(), world_size),
        )
        run_id = int(cursor.lastrowid or 0)  # the AUTOINCREMENT id of the row just inserted
    highwater.record(store)
    return run_id


def finish_run(store: Store, run_id: int, *, status: str, error: str | None = None) -> None:
    """Mark run ``run_id`` as ``completed`` or ``failed``."""
    if status not in ("completed", "failed"):
        raise ValueError(f"a run finishes as completed or failed, not {status!r}")
    with store.write() as conn:
        conn.execute(
            "UPDATE runs SET status = ?, finished_at = ?, error = ? WHERE id = ?",
            (status, utc_now(), error, run_id),
        )
    highwater.record(store)  # counts what the run registered: lock records, adapters


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def set_resumed_from(store: Store, run_id: int, parent: int) -> None:
    """Record that run ``run_id`` continues the interrupted run ``parent`` (``dlm train --resume``)."""
    with store.write() as conn:
        conn.execute("UPDATE runs SET resumed_from = ? WHERE id = ?", (parent, run_id))


@contextmanager
def recorded_run(
    store: Store, *, command: str, dlm_path: Path, dlm_sha256: str, world_size: int = 1
) -> Iterator[int]:
    """Record a run around a block: completed on success, failed on any exception."""
    run_id = start_run(
        store, command=command, dlm_path=dlm_path, dlm_sha256=dlm_sha256, world_size=world_size
    )
    try:
        yield run_id
    except BaseException as exc:
        reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else (str(exc) or type(exc).__name__)
        finish_run(store, run_id, status="failed", error=reason.splitlines()[0] if reason else None)
        raise
    finish_run(store, run_id, status="completed")


def get_run(store: Store, run_id: int) -> Run | None:
    """The run with id ``run_id``, or ``None``."""
    with store.read() as conn:
        row = conn.execute(f"SELECT {_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
    return Run(**row) if row else None


def list_runs(store: Store, *, limit: int = 20, since: str | None = None) -> list[Run]:
    """Runs newest first; ``since`` is an ISO-8601 UTC lower bound on ``started_at``."""
    with store.read() as conn:
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM runs WHERE started_at >= ? ORDER BY id DESC LIMIT ?",
            (since or "", limit),
        ).fetchall()
    return [Run(**row) for row in rows]

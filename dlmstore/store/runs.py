"""Runs: one row per ``dlm tokenize`` / ``dlm train`` invocation.

A run is inserted as ``running`` before any work starts and finished as
``completed`` or ``failed``. :func:`recorded_run` wraps the whole lifecycle:
an exception (Ctrl-C and SIGTERM included) marks the run failed with a
one-line reason and re-raises, so the store never keeps a run that claims
to be running after its process is gone. Ids come from ``AUTOINCREMENT``
and are never reused: the high-water mark beside store.db
(``dlmstore.store.highwater``) is raised once the run's row is committed
and again when it finishes, so a store.db that loses its latest runs (its
WAL deleted) is refused instead of handing an id out twice.

**A run whose process died is failed by whoever notices.** A process
killed with SIGKILL (or a machine that lost power) cannot mark its own
run. Every command that opens a store to write (``dlm tokenize``, ``dlm
train``, ``dlm cache prune|clear|verify --repair``) first marks each
``running`` run whose process is gone ``failed``, with the reason
(:data:`DEAD_RUN_REASON`): :func:`fail_dead_runs`. ``dlm metrics`` and
``dlm stores`` only look: they show such a run as ``dead``
(:func:`shown_status`) and write nothing. A process is gone when
``kill(pid, 0)`` says there is no such process; a pid taken over by
another process since counts as alive (the run stays ``running`` until
that process ends too), which keeps a live run from ever being failed.

**Every path a document was read at is kept.** The run's transaction
also upserts the document's resolved path (symlinks followed,
``os.path.realpath``) into ``document_paths``, as ``dlm init`` does when
it creates the store: ``dlm stores gc`` removes a store only when every
one of them is gone (``dlmstore.store.stores``). ``runs.dlm_path`` keeps
the path as the command was given it.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dlmstore import __version__
from dlmstore.clock import utc_now
from dlmstore.store import highwater
from dlmstore.store.database import Store
from dlmstore.store.path_text import path_text

_COLUMNS = "id, command, status, started_at, finished_at, dlm_path, dlm_sha256, dlmstore_version, pid, error"

RUN_COMMANDS = ("tokenize", "train", "eval", "gate")

#: Why a run whose process is gone was failed (``{pid}``: the process recorded with it).
DEAD_RUN_REASON = "process {pid} ended without finishing the run (killed?)"


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


def start_run(
    store: Store,
    *,
    command: str,
    dlm_path: Path,
    dlm_sha256: str,
    world_size: int = 1,
    adapter: str | None = None,
) -> int:
    """Insert a ``running`` run, record where its document is, and return the run's id.

    ``adapter`` is the named adapter (``training.adapters``) a train run trains.

    Runs still marked ``running`` whose process is gone are marked
    ``failed`` first (:func:`fail_dead_runs`).
    """
    if command not in RUN_COMMANDS:
        raise ValueError(f"unknown run command {command!r}")
    run_id: int | None = None
    try:
        with store.write() as conn:
            _fail_dead(conn)
            now = utc_now()
            cursor = conn.execute(
                "INSERT INTO runs (command, status, started_at, dlm_path, dlm_sha256, dlmstore_version, pid, "
                "world_size, adapter) VALUES (?, 'running', ?, ?, ?, ?, ?, ?, ?)",
                (
                    command,
                    now,
                    path_text(dlm_path),
                    dlm_sha256,
                    __version__,
                    os.getpid(),
                    world_size,
                    adapter,
                ),
            )
            run_id = int(cursor.lastrowid or 0)  # the AUTOINCREMENT id of the row just inserted
            _note_document_path(conn, dlm_path, now=now, run_id=run_id)
        highwater.record(store)
    except BaseException as exc:
        # A SIGTERM or Ctrl-C that lands after the row committed (in the high-water mark's
        # write) would leave it running for the next writer to find dead: it is failed here,
        # as recorded_run fails one stopped a moment later. A row rolled back is not there to update.
        if run_id is not None:
            with store.write() as conn:
                conn.execute(
                    "UPDATE runs SET status = 'failed', finished_at = ?, error = ? "
                    "WHERE id = ? AND pid = ? AND status = 'running'",
                    (utc_now(), failure_reason(exc), run_id, os.getpid()),
                )
        raise
    return run_id


def record_document_path(store: Store, dlm_path: Path) -> None:
    """Record that the document at ``dlm_path`` uses ``store`` (``dlm init``, which starts no run)."""
    with store.write() as conn:
        _note_document_path(conn, dlm_path, now=utc_now(), run_id=None)


def _note_document_path(conn: sqlite3.Connection, dlm_path: Path, *, now: str, run_id: int | None) -> None:
    conn.execute(
        "INSERT INTO document_paths (path, first_seen_at, last_seen_at, last_run_id) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (path) DO UPDATE SET last_seen_at = excluded.last_seen_at, "
        "last_run_id = COALESCE(excluded.last_run_id, document_paths.last_run_id)",
        (path_text(os.path.realpath(dlm_path)), now, now, run_id),
    )


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


def fail_dead_runs(store: Store) -> list[int]:
    """Mark ``failed`` every ``running`` run whose process is gone; their ids.

    Every command that opens a store to write calls it (``start_run`` does).
    """
    with store.write() as conn:
        return _fail_dead(conn)


def _fail_dead(conn: sqlite3.Connection) -> list[int]:
    running = conn.execute("SELECT id, pid FROM runs WHERE status = 'running'").fetchall()
    dead = [(run_id, pid) for run_id, pid in running if not process_alive(pid)]
    conn.executemany(
        "UPDATE runs SET status = 'failed', finished_at = ?, error = ? WHERE id = ? AND status = 'running'",
        [(utc_now(), DEAD_RUN_REASON.format(pid=pid), run_id) for run_id, pid in dead],
    )
    return [run_id for run_id, _ in dead]


def fail_run_of(store: Store, pid: int, reason: str, *, since: str) -> int | None:
    """Record ``reason`` on the newest run process ``pid`` started at or after ``since``, unless it completed.

    Returns the run's id (``None`` when there is no such run).

    The ``dlm train --nproc`` launcher calls it once its ranks have ended:
    it alone knows that rank 1 was killed by SIGKILL, while rank 0 (whose
    pid the run records) saw only a peer that stopped answering, or was
    killed before it could write anything.
    """
    with store.write() as conn:
        row = conn.execute(
            "SELECT id, status FROM runs WHERE pid = ? AND started_at >= ? ORDER BY id DESC LIMIT 1",
            (pid, since),
        ).fetchone()
        if row is None or row["status"] == "completed":
            return None
        conn.execute(
            "UPDATE runs SET status = 'failed', finished_at = COALESCE(finished_at, ?), error = ? WHERE id = ?",
            (utc_now(), reason, row["id"]),
        )
        return int(row["id"])


def process_alive(pid: int | None) -> bool:
    """Whether process ``pid`` may still be running its run (``None``, not recorded: it may)."""
    if pid is None or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def shown_status(status: str, pid: int | None) -> tuple[str, str | None]:
    """How a read-only view shows a run: ``dead`` (and why) for one still ``running`` whose process is gone.

    ``dlm metrics`` and ``dlm stores`` write nothing; the next command that
    writes to the store records the run as ``failed`` with the same reason.
    """
    if status == "running" and not process_alive(pid):
        return "dead", DEAD_RUN_REASON.format(pid=pid)
    return status, None


def set_resumed_from(store: Store, run_id: int, parent: int) -> None:
    """Record that run ``run_id`` continues the interrupted run ``parent`` (``dlm train --resume``)."""
    with store.write() as conn:
        conn.execute("UPDATE runs SET resumed_from = ? WHERE id = ?", (parent, run_id))


@contextmanager
def recorded_run(
    store: Store,
    *,
    command: str,
    dlm_path: Path,
    dlm_sha256: str,
    world_size: int = 1,
    adapter: str | None = None,
) -> Iterator[int]:
    """Record a run around a block: completed on success, failed on any exception.

    Ctrl-C is recorded as ``interrupted``; a signal the CLI turned into an
    exception (SIGTERM: ``dlmstore.errors.Terminated``) by what it says
    (``terminated by SIGTERM``).
    """
    run_id = start_run(
        store,
        command=command,
        dlm_path=dlm_path,
        dlm_sha256=dlm_sha256,
        world_size=world_size,
        adapter=adapter,
    )
    try:
        yield run_id
    except BaseException as exc:
        finish_run(store, run_id, status="failed", error=failure_reason(exc))
        raise
    finish_run(store, run_id, status="completed")


def failure_reason(exc: BaseException) -> str | None:
    """What a failed run records of ``exc``: its first line (``interrupted`` for a bare Ctrl-C)."""
    if isinstance(exc, KeyboardInterrupt):
        reason = str(exc) or "interrupted"
    else:
        reason = str(exc) or type(exc).__name__
    # A path in it that is not UTF-8 is written as store.db records paths (path_text), or SQLite refuses it.
    return path_text(reason.splitlines()[0]) if reason else None


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

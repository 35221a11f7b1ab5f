"""The stores a home holds: list them, and remove those whose document is gone.

These back ``dlm stores`` and ``dlm stores gc``. Each store is a folder
``<home>/store/<dlm_id>/`` (``dlmstore.home``); what it knows about its
document is the path of its newest run (``runs.dlm_path``), so that is the
"document last seen". A store that never ran (``dlm init`` only) knows no
path, and is never taken for garbage.

**Listing looks, nothing more.** Each ``store.db`` is read through a
read-only SQLite connection (:func:`dlmstore.store.database.read_only`): no
store is migrated, created, or locked, so listing never waits for, nor
holds up, a ``dlm train`` running on another store. (SQLite may create the
empty ``-wal``/``-shm`` side files a reader of a WAL database needs; it
never writes store.db.) A store that cannot be
read is listed with a status instead of stopping the listing: ``damaged``
(SQLite finds the file malformed or not a database), ``newer_schema``
(written by a newer dlmstore; its tables are not read), ``no_database`` or
``unreadable``. A store at an older schema revision is read as far as its
tables go and migrates when next opened.

**Garbage collection asks the store lock.** :func:`gc` removes a store only
when it can hold its store lock exclusively (``dlmstore.store.flock``),
that is when no other dlm process has it open, and only after checking,
under that lock, that its document is still missing. The folder is first
renamed to a dot-name beside it (one atomic step: no store is ever seen
half-deleted under its own id), then deleted.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dlmstore.errors import DlmError, StoreDamagedError, StoreError
from dlmstore.home import dlm_home, store_dir
from dlmstore.store.connection import DB_NAME, first_value, read_only
from dlmstore.store.flock import STORE_LOCK_NAME, FileLock
from dlmstore.ulid import is_valid_ulid

#: How a store's database could be read.
StoreStatus = Literal["ok", "old_schema", "newer_schema", "damaged", "no_database", "unreadable"]

#: Whether the document last seen is still at its path.
DocumentState = Literal["present", "missing", "unknown"]

#: Prefix of a folder being removed by :func:`gc` (skipped by the listing).
REMOVING_PREFIX = ".removing-"


@dataclass(frozen=True)
class LastRun:
    """The newest run a store recorded.

    Attributes:
        run_id: ``runs.id``, the run's number in this store.
        command: What ran: ``tokenize`` or ``train``.
        status: ``running``, ``completed`` or ``failed``.
        started_at: When it started (ISO-8601 UTC).
        finished_at: When it ended; null while it runs (or if its process died).
    """

    run_id: int
    command: str
    status: str
    started_at: str
    finished_at: str | None


@dataclass(frozen=True)
class StoreListing:
    """One store under the home, as ``dlm stores`` lists it.

    Attributes:
        dlm_id: The document id the store belongs to (its folder's name).
        path: The store folder.
        status: How its store.db could be read: ``ok``, ``old_schema``
            (read as far as its tables go; migrated when next opened),
            ``newer_schema`` (written by a newer dlmstore; not read),
            ``damaged``, ``no_database`` or ``unreadable``.
        detail: Why the status is not ``ok``; null when it is.
        document: Absolute path of the document at its newest run; null
            when no run is recorded (or the database could not be read).
        document_state: ``present`` when a file is at that path,
            ``missing`` when none is, ``unknown`` when no path is known.
        bytes: Size of the files in the store folder: store.db, its WAL,
            token files, adapters (not ``store.db-shm``, an index SQLite
            rebuilds).
        db_bytes: Size of store.db with its ``-wal`` file.
        last_run: The newest run; null when none is recorded or readable.
        cache_entries: Entries in the tokenized cache; null when unreadable.
    """

    dlm_id: str
    path: str
    status: StoreStatus
    detail: str | None
    document: str | None
    document_state: DocumentState
    bytes: int
    db_bytes: int
    last_run: LastRun | None
    cache_entries: int | None


@dataclass(frozen=True)
class StoresReport:
    """Every store under the home (``dlm stores --json``).

    Attributes:
        home: The dlm home (``$DLM_HOME`` or the platform's data folder).
        stores: Each store, by id.
        bytes: Size of all the stores together.
    """

    home: str
    stores: list[StoreListing]
    bytes: int


@dataclass(frozen=True)
class KeptStore:
    """A store ``dlm stores gc`` was asked to remove and left alone.

    Attributes:
        dlm_id: The store's document id.
        path: The store folder.
        reason: Why it was kept: ``in_use`` (another dlm process has it
            open), ``document_present`` (its document is back) or ``gone``
            (the folder is no longer there).
    """

    dlm_id: str
    path: str
    reason: Literal["in_use", "document_present", "gone"]


@dataclass(frozen=True)
class GcResult:
    """What ``dlm stores gc`` removed (``--json``).

    Attributes:
        removed: The stores removed, as they were listed just before.
        kept: Stores whose document was missing but that were left alone.
        bytes_removed: Size of the removed stores together.
    """

    removed: list[StoreListing]
    kept: list[KeptStore]
    bytes_removed: int


def list_stores() -> StoresReport:
    """Every store under the home, read-only; a home without stores gives an empty list."""
    home = dlm_home()
    stores = [describe_store(folder) for folder in _store_folders(home)]
    return StoresReport(str(home), stores, sum(store.bytes for store in stores))


def garbage(report: StoresReport) -> list[StoreListing]:
    """The stores of ``report`` whose document no longer exists (what :func:`gc` would remove)."""
    return [store for store in report.stores if store.document_state == "missing"]


def gc(dlm_ids: list[str]) -> GcResult:
    """Remove the stores ``dlm_ids`` whose document is still missing and that no process has open.

    Each store is checked again under its exclusive store lock, so a store
    listed a moment ago whose document came back, or that a dlm process
    opened meanwhile, is kept (see :class:`KeptStore`).

    Raises:
        StoreError: a store folder could not be removed (its path and the
            reason are named).
    """
    removed: list[StoreListing] = []
    kept: list[KeptStore] = []
    for dlm_id in dlm_ids:
        folder = store_dir(dlm_id)
        if not folder.is_dir():
            kept.append(KeptStore(dlm_id, str(folder), "gone"))
            continue
        with FileLock(folder / STORE_LOCK_NAME) as lock:
            if not lock.try_exclusive():
                kept.append(KeptStore(dlm_id, str(folder), "in_use"))
                continue
            listing = describe_store(folder)
            if listing.document_state != "missing":
                kept.append(KeptStore(dlm_id, str(folder), "document_present"))
                continue
            doomed = folder.with_name(f"{REMOVING_PREFIX}{dlm_id}-{os.getpid()}")
            try:
                folder.rename(doomed)
                shutil.rmtree(doomed)
            except OSError as exc:
                raise StoreError(
                    f"cannot remove store {folder}: {exc.strerror or exc}",
                    hint=f"remove {doomed if doomed.exists() else folder} by hand",
                ) from None
        removed.append(listing)
    return GcResult(removed, kept, sum(store.bytes for store in removed))


def describe_store(folder: Path) -> StoreListing:
    """One store folder as listed: never raises for what its store.db holds."""
    db = folder / DB_NAME
    size, db_size = _sizes(folder)
    if not db.is_file():
        return StoreListing(
            folder.name, str(folder), "no_database", f"no {DB_NAME} in the folder", None, "unknown",
            size, db_size, None, None,
        )  # fmt: skip
    status: StoreStatus = "ok"
    detail: str | None = None
    document: str | None = None
    last: LastRun | None = None
    entries: int | None = None
    try:
        status, detail, document, last, entries = _read(db)
    except StoreDamagedError as exc:
        status, detail = "damaged", str(exc)
    except DlmError as exc:  # store.db cannot be opened (permissions, a folder in its place)
        status, detail = "unreadable", str(exc)
    except sqlite3.Error as exc:  # locked past the busy timeout, an I/O error
        status, detail = "unreadable", f"cannot read {db}: {exc}"
    if document is None:
        state: DocumentState = "unknown"
    else:
        state = "present" if os.path.lexists(document) else "missing"
    return StoreListing(
        folder.name, str(folder), status, detail, document, state, size, db_size, last, entries
    )


def _read(db: Path) -> tuple[StoreStatus, str | None, str | None, LastRun | None, int | None]:
    """Status, document last seen, newest run and cache entries of one store.db, read-only."""
    from dlmstore.store.revisions import HEAD_REVISION, REVISIONS

    with read_only(db) as conn:
        revision = _optional(conn, "SELECT version_num FROM alembic_version")
        if revision is not None and revision not in REVISIONS:
            return "newer_schema", f"schema revision {revision} (this dlmstore knows up to {HEAD_REVISION})", None, None, None  # fmt: skip
        status: StoreStatus = "ok" if revision == HEAD_REVISION else "old_schema"
        detail = None
        if status == "old_schema":
            stamp = "no schema revision" if revision is None else f"schema revision {revision}"
            detail = f"{stamp}; migrated when a command next opens it"
        entries = _optional(conn, "SELECT entry_count FROM cache_totals WHERE id = 1")
        try:
            row = conn.execute(
                "SELECT id, command, status, started_at, finished_at, dlm_path FROM runs "
                "ORDER BY id DESC LIMIT 1"
            ).fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):
                raise
            row = None
    if row is None:
        return status, detail, None, None, entries
    run_id, command, run_status, started, finished, document = row
    return status, detail, document, LastRun(run_id, command, run_status, started, finished), entries


def _optional(conn: sqlite3.Connection, sql: str) -> Any:
    """``first_value``, or ``None`` when the table is not there (an older schema)."""
    try:
        value = first_value(conn, sql)
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    return value


def _store_folders(home: Path) -> list[Path]:
    root = home / "store"
    try:
        entries = sorted(os.scandir(root), key=lambda entry: entry.name)
    except FileNotFoundError:
        return []
    return [
        Path(entry.path)
        for entry in entries
        if entry.is_dir(follow_symlinks=False) and is_valid_ulid(entry.name)
    ]


def _sizes(folder: Path) -> tuple[int, int]:
    """Bytes of the regular files under ``folder`` (links not followed), and of store.db and its WAL."""
    total = 0
    db = 0
    db_names = {DB_NAME, f"{DB_NAME}-wal"}
    shm = f"{DB_NAME}-shm"  # SQLite's shared-memory index: rebuilt by every reader, not data
    stack = [str(folder)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False) and entry.name != shm:
                    size = entry.stat(follow_symlinks=False).st_size
                    total += size
                    if entry.name in db_names and os.path.dirname(entry.path) == str(folder):
                        db += size
            except OSError:
                continue
    return total, db

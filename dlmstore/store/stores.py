"""The stores a home holds: list them, and remove those whose document is provably gone.

These back ``dlm stores`` and ``dlm stores gc``. Each store is a folder
``<home>/store/<dlm_id>/`` (``dlmstore.home``). What it knows about its
document is every path a command read it at: ``document_paths`` holds each
one, resolved (symlinks followed) when it was recorded by ``dlm init``,
``dlm tokenize`` or ``dlm train`` (``dlmstore.store.runs``). A store not
migrated yet (its table is missing) is read from its runs' paths, which is
what migrating it records.

**Orphaned means every path says ENOENT, with its folder there.** Each
recorded path is stat'ed (:func:`path_state`):

* it exists (a file, or anything else): the document is ``present``;
* ``ENOENT`` while its folder exists and holds something: ``missing``
  (the file was deleted or moved from a folder that is still there);
* anything else is ``unknown``, "cannot tell", and keeps the store: the
  folder itself is missing (renamed for a moment, a project moved, a disk
  not mounted), the folder is empty (the mount point of a disk not
  mounted), ``EACCES``, ``EIO``, ``ELOOP`` (a symlink loop on the way: where
  the path leads cannot be known), ``ENOTDIR`` (a folder on the path is now
  a file or a link to one: the path was resolved when recorded, so this is
  a changed tree, not a deleted document). A path longer than ``PATH_MAX``
  is walked a folder at a time, so ``ENAMETOOLONG`` is only the answer for
  a name no file can have, and that too is "cannot tell".

A store is ``present`` when one path is, ``missing`` (orphaned, what
:func:`gc` removes) only when every path is, and ``unknown`` otherwise or
when it records no path at all (made by an older ``dlm init``); it is
never taken for garbage then.

**Listing looks, nothing more.** Each ``store.db`` is read through a
read-only SQLite connection (:func:`dlmstore.store.database.read_only`): no
store is migrated, created, or locked, so listing never waits for, nor
holds up, a ``dlm train`` running on another store. (SQLite may create the
empty ``-wal``/``-shm`` side files a reader of a WAL database needs; it
never writes store.db.) A run still ``running`` whose process is gone is
shown ``dead`` (``dlmstore.store.runs.shown_status``), not written. A
store that cannot be read is listed with a status instead of stopping the
listing: ``damaged`` (SQLite finds the file malformed or not a database),
``newer_schema`` (written by a newer dlmstore; its tables are not read),
``no_database`` or ``unreadable``. A store at an older schema revision is
read as far as its tables go and migrates when next opened.

**Garbage collection asks the store lock.** :func:`gc` removes a store only
when it can hold its store lock exclusively (``dlmstore.store.flock``),
that is when no other dlm process has it open, and only after checking,
under that lock, that its document is still missing from every path. The
folder is first renamed to a dot-name beside it (one atomic step: no
store is ever seen half-deleted under its own id), then deleted. A dry run
decides the same way from the listing, and removes and locks nothing.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dlmstore.errors import DlmError, StoreDamagedError, StoreError
from dlmstore.home import dlm_home
from dlmstore.store.connection import DB_NAME, first_value, read_only
from dlmstore.store.flock import STORE_LOCK_NAME, FileLock
from dlmstore.store.path_text import text_paths
from dlmstore.store.runs import shown_status
from dlmstore.ulid import is_valid_ulid

#: How a store's database could be read.
StoreStatus = Literal["ok", "old_schema", "newer_schema", "damaged", "no_database", "unreadable"]

#: Whether a document is still where it was seen (``unknown``: cannot tell).
DocumentState = Literal["present", "missing", "unknown"]

#: Why ``dlm stores gc`` left a store alone.
KeptReason = Literal["in_use", "document_present", "gone", "cannot_tell", "no_path", "unreadable"]

#: Prefix of a folder being removed by :func:`gc` (skipped by the listing).
REMOVING_PREFIX = ".removing-"

#: Why a store with no recorded path is kept.
NO_PATH = "no document path is recorded: made by an older `dlm init`, never tokenized or trained"

# O_PATH opens a folder to walk through without needing to read it (Linux); elsewhere O_RDONLY.
_WALK = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY


@dataclass(frozen=True)
class LastRun:
    """The newest run a store recorded.

    Attributes:
        run_id: ``runs.id``, the run's number in this store.
        command: What ran: ``tokenize`` or ``train``.
        status: ``running``, ``completed`` or ``failed``; ``dead`` for a
            run still marked running whose process is gone (the listing
            writes nothing: the next command that writes to the store
            records it as failed).
        started_at: When it started (ISO-8601 UTC).
        finished_at: When it ended; null while it runs (or if its process died).
    """

    run_id: int
    command: str
    status: str
    started_at: str
    finished_at: str | None


@dataclass(frozen=True)
class DocumentPath:
    """A path a document that used the store was read at, and whether it is still there.

    Attributes:
        path: The document's path, resolved (symlinks followed) when it was
            recorded; a store not migrated yet gives its runs' paths as given.
        state: ``present`` (something is at the path), ``missing`` (ENOENT,
            while its folder is there and holds other files) or ``unknown``
            (cannot tell: ``detail`` says why).
        detail: Why the state is ``unknown``; null otherwise.
        last_seen_at: When a command last read the document there (ISO-8601 UTC).
    """

    path: str
    state: DocumentState
    detail: str | None
    last_seen_at: str | None


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
        document: Absolute path of the document at its newest run, as the
            command was given it; null when no run is recorded (or the
            database could not be read).
        documents: Every path a document that used the store was read at,
            most recently seen first, each with its state.
        document_state: ``present`` when the document is at one of
            ``documents``; ``missing`` when it is gone from every one (the
            store is orphaned: ``dlm stores gc`` removes it); ``unknown``
            when that cannot be told (``document_detail`` says why).
        document_detail: Why ``document_state`` is ``unknown``; null otherwise.
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
    documents: list[DocumentPath]
    document_state: DocumentState
    document_detail: str | None
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
    """A store ``dlm stores gc`` looked at and left alone.

    Attributes:
        dlm_id: The store's document id.
        path: The store folder.
        reason: Why it was kept: ``in_use`` (another dlm process has it
            open), ``document_present`` (its document is back),
            ``gone`` (the folder is no longer there), ``cannot_tell``
            (whether a recorded path still holds the document cannot be
            told), ``no_path`` (no path is recorded) or ``unreadable``
            (its store.db cannot be read).
        detail: What the reason is about: the path that cannot be told and
            why, or what made store.db unreadable; null for the others.
    """

    dlm_id: str
    path: str
    reason: KeptReason
    detail: str | None = None


@dataclass(frozen=True)
class GcResult:
    """What ``dlm stores gc`` removed, or would remove with ``--dry-run`` (``--json``).

    Attributes:
        dry_run: True when nothing was removed: ``removed`` lists what
            would be, decided from the listing (a store in use then is
            still kept by the real run).
        removed: The stores removed (or that would be), as they were
            listed just before, each with every path its document is gone from.
        kept: Stores whose document is not present that were left alone, and why.
        bytes_removed: Size of the removed stores together.
    """

    dry_run: bool
    removed: list[StoreListing]
    kept: list[KeptStore]
    bytes_removed: int


def list_stores() -> StoresReport:
    """Every store under the home, read-only; a home without stores gives an empty list."""
    home = dlm_home()
    stores = [describe_store(folder) for folder in _store_folders(home)]
    return StoresReport(str(home), stores, sum(store.bytes for store in stores))


def garbage(report: StoresReport) -> list[StoreListing]:
    """The stores of ``report`` whose document is gone from every path (what :func:`gc` removes)."""
    return [store for store in report.stores if store.document_state == "missing"]


def gc(report: StoresReport, *, dry_run: bool = False) -> GcResult:
    """Remove the stores ``report`` lists as orphaned (:func:`garbage`) that no process has open.

    Each is described again under its exclusive store lock, so a store
    listed a moment ago whose document came back, or that a dlm process
    opened meanwhile, is kept; a store the report did not list as orphaned
    is never removed, only reported kept with why when its document is not
    present (see :class:`KeptStore`). With ``dry_run`` nothing is locked or
    removed.

    Raises:
        StoreError: a store folder could not be removed (its path and the
            reason are named).
    """
    removed: list[StoreListing] = []
    kept: list[KeptStore] = []
    for listed in report.stores:
        if listed.document_state == "present":
            continue
        if (why := _kept(listed)) is not None:
            kept.append(why)
            continue
        if dry_run:
            removed.append(listed)
            continue
        folder = Path(listed.path)
        if not folder.is_dir():
            kept.append(KeptStore(listed.dlm_id, str(folder), "gone"))
            continue
        with FileLock(folder / STORE_LOCK_NAME) as lock:
            if not lock.try_exclusive():
                kept.append(KeptStore(listed.dlm_id, str(folder), "in_use"))
                continue
            listing = describe_store(folder)
            if (why := _kept(listing)) is not None:
                kept.append(why)
                continue
            doomed = folder.with_name(f"{REMOVING_PREFIX}{listed.dlm_id}-{os.getpid()}")
            try:
                folder.rename(doomed)
                shutil.rmtree(doomed)
            except OSError as exc:
                raise StoreError(
                    f"cannot remove store {folder}: {exc.strerror or exc}",
                    hint=f"remove {doomed if doomed.exists() else folder} by hand",
                ) from None
        removed.append(listing)
    return GcResult(dry_run, removed, kept, sum(store.bytes for store in removed))


def _kept(listing: StoreListing) -> KeptStore | None:
    """Why gc keeps the store ``listing`` describes; ``None`` when its document is gone from every path."""
    if listing.document_state == "missing":
        return None
    if listing.status not in ("ok", "old_schema"):
        return KeptStore(listing.dlm_id, listing.path, "unreadable", listing.detail)
    if listing.document_state == "present":
        return KeptStore(listing.dlm_id, listing.path, "document_present")
    if not listing.documents:
        return KeptStore(listing.dlm_id, listing.path, "no_path", NO_PATH)
    return KeptStore(listing.dlm_id, listing.path, "cannot_tell", listing.document_detail)


def describe_store(folder: Path) -> StoreListing:
    """One store folder as listed: never raises for what its store.db holds."""
    db = folder / DB_NAME
    size, db_size = _sizes(folder)
    if not db.is_file():
        return StoreListing(
            folder.name, str(folder), "no_database", f"no {DB_NAME} in the folder", None, [], "unknown",
            None, size, db_size, None, None,
        )  # fmt: skip
    status: StoreStatus = "ok"
    detail: str | None = None
    read = _Read(None, [], None, None)
    try:
        status, detail, read = _read(db)
    except StoreDamagedError as exc:
        status, detail = "damaged", str(exc)
    except DlmError as exc:  # store.db cannot be opened (permissions, a folder in its place)
        status, detail = "unreadable", str(exc)
    except sqlite3.Error as exc:  # locked past the busy timeout, an I/O error
        status, detail = "unreadable", f"cannot read {db}: {exc}"
    documents = [DocumentPath(path, *path_state(path), seen) for path, seen in read.paths]
    state, why = document_state(documents)
    if status not in ("ok", "old_schema"):
        state, why = "unknown", f"store.db cannot be read ({status})"
    return StoreListing(
        folder.name, str(folder), status, detail, read.document, documents, state, why,
        size, db_size, read.last_run, read.entries,
    )  # fmt: skip


def document_state(documents: list[DocumentPath]) -> tuple[DocumentState, str | None]:
    """A store's document state from its paths': present if one is, missing only if every one is."""
    if not documents:
        return "unknown", NO_PATH
    if any(document.state == "present" for document in documents):
        return "present", None
    for document in documents:
        if document.state == "unknown":
            return "unknown", f"cannot tell whether {document.path} exists: {document.detail}"
    return "missing", None


def path_state(path: str) -> tuple[DocumentState, str | None]:
    """Whether the document recorded at ``path`` is still there (see the module's rule), and why not known.

    A recorded path that may stand for two file names (``\\xNN`` escapes of
    a name that is not UTF-8, ``dlmstore.store.path_text``) is present when
    either is, and missing only when both are.
    """
    states = [_one_path_state(candidate) for candidate in text_paths(path)]
    for wanted in ("present", "unknown"):
        for state in states:
            if state[0] == wanted:
                return state
    return "missing", None


def _one_path_state(path: str) -> tuple[DocumentState, str | None]:
    try:
        _stat(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return "unknown", _cannot(path, exc)
    else:
        return "present", None
    # Where the path leads: the folder of a dangling symlink's target is the one that must be there.
    folder = os.path.dirname(os.path.realpath(path))
    try:
        if _folder_is_empty(folder):
            return "unknown", f"its folder {folder} is empty: the mount point of a disk not mounted?"
    except FileNotFoundError:
        return "unknown", f"its folder {folder} is not there: renamed or moved, or on a disk not mounted?"
    except OSError as exc:
        return "unknown", _cannot(folder, exc)
    return "missing", None


def _cannot(path: str, exc: OSError) -> str:
    reason = {
        errno.ENOTDIR: "a folder on the path is now a file",
        errno.ELOOP: "a symlink loop on the path",
        errno.ENAMETOOLONG: "a name on the path is too long for this system",
    }.get(exc.errno or 0, exc.strerror or str(exc))
    return f"cannot check {path}: {reason}"


def _stat(path: str) -> os.stat_result:
    """``os.stat(path)``, also of a path longer than ``PATH_MAX`` (walked a folder at a time)."""
    try:
        return os.stat(path)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
    folder, name = os.path.split(path)
    fd = _open_folder(folder, _WALK)
    try:
        return os.stat(name, dir_fd=fd)
    finally:
        os.close(fd)


def _folder_is_empty(folder: str) -> bool:
    """Whether the folder holds no entry (``FileNotFoundError`` when it is not there)."""
    fd = _open_folder(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(fd) as entries:
            return next(entries, None) is None
    finally:
        os.close(fd)


def _open_folder(folder: str, flags: int) -> int:
    """A descriptor of ``folder`` opened with ``flags``: in one step, or a folder at a time when too long."""
    try:
        return os.open(folder or ".", flags)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
    fd = os.open("/" if folder.startswith("/") else ".", _WALK)
    parts = [part for part in folder.split("/") if part]
    try:
        for index, part in enumerate(parts):
            inner = os.open(part, flags if index == len(parts) - 1 else _WALK, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass(frozen=True)
class _Read:
    """What one store.db says: the newest run's path, every recorded path, the newest run, the cache size."""

    document: str | None
    paths: list[tuple[str, str | None]]
    last_run: LastRun | None
    entries: int | None


def _read(db: Path) -> tuple[StoreStatus, str | None, _Read]:
    """Status and what :class:`_Read` holds of one store.db, read-only."""
    from dlmstore.store.revisions import HEAD_REVISION, REVISIONS

    with read_only(db) as conn:
        revision = _optional(conn, "SELECT version_num FROM alembic_version")
        if revision is not None and revision not in REVISIONS:
            newer = f"schema revision {revision} (this dlmstore knows up to {HEAD_REVISION})"
            return "newer_schema", newer, _Read(None, [], None, None)
        status: StoreStatus = "ok" if revision == HEAD_REVISION else "old_schema"
        detail: str | None = None
        if status == "old_schema":
            stamp = "no schema revision" if revision is None else f"schema revision {revision}"
            detail = f"{stamp}; migrated when a command next opens it"
        entries = _optional(conn, "SELECT entry_count FROM cache_totals WHERE id = 1")
        row = _optional_rows(
            conn,
            "SELECT id, command, status, started_at, finished_at, dlm_path, pid FROM runs ORDER BY id DESC LIMIT 1",
        )
        paths = _optional_rows(
            conn, "SELECT path, last_seen_at FROM document_paths ORDER BY last_seen_at DESC, path"
        )
        if paths is None:  # not migrated to 0011 yet: what migrating records, from the runs
            paths = _optional_rows(
                conn,
                "SELECT dlm_path, MAX(started_at) FROM runs GROUP BY dlm_path ORDER BY MAX(started_at) DESC, dlm_path",
            )
    recorded = [(path, seen) for path, seen in paths or []]
    if not row:
        return status, detail, _Read(None, recorded, None, entries)
    run_id, command, run_status, started, finished, document, pid = row[0]
    shown, _ = shown_status(run_status, pid)
    return (
        status,
        detail,
        _Read(document, recorded, LastRun(run_id, command, shown, started, finished), entries),
    )


def _optional(conn: sqlite3.Connection, sql: str) -> Any:
    """``first_value``, or ``None`` when the table is not there (an older schema)."""
    try:
        value = first_value(conn, sql)
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    return value


def _optional_rows(conn: sqlite3.Connection, sql: str) -> list[Any] | None:
    """Every row of ``sql``, or ``None`` when its table is not there (an older schema)."""
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise


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

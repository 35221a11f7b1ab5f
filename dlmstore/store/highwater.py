"""The high-water mark: what store.db must still hold, kept beside it in ``high-water.json``.

store.db runs in WAL mode: a commit lands in ``store.db-wal`` and reaches
store.db itself only at a checkpoint (normally when the last connection
closes). A process killed with ``kill -9`` leaves its last commits in the
WAL alone, and SQLite replays them on the next open. Delete that WAL
first, or put an older copy of store.db in place, and SQLite opens a sound
database that has silently lost its latest runs, lock records and adapter
registrations; worse, ``AUTOINCREMENT``'s counter lives in the same
database (``sqlite_sequence``) and goes back with it, so the next run would
reuse a run id that was already printed, written into ``dlm.lock`` and
named in adapter rows.

SQLite cannot notice this (the database is consistent, just old), so dlm
keeps its own record outside the database. After each run row is
committed, and again when the run finishes, :func:`record` writes the
newest run id, lock record id and adapter version into ``high-water.json``
(atomically). It runs in its own ``BEGIN IMMEDIATE`` transaction, so writers
take turns and the mark never goes backwards, and *after* the commit, so a
process killed in between leaves the mark behind the database (weaker for
that one run) and never ahead of it: a mark ahead of store.db always means
committed records were lost.

:func:`check` runs when a store is opened: when store.db holds less than
the mark, opening refuses with :class:`~dlmstore.errors.StoreDamagedError`
naming what is gone. ``dlm cache verify`` reports the same as
``lost_history``, and ``--repair`` accepts the loss (:func:`accept`): the
``AUTOINCREMENT`` counters are raised to what was handed out, so no id is
used twice, and the mark's expectation is lowered to what store.db holds.

The file holds two sets of counters: ``expected`` (what store.db must hold;
checked on open) and ``issued`` (the highest ever handed out; never lowered,
the floor for new ids). They differ only after an accepted loss.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dlmstore.errors import StoreDamagedError, StoreError
from dlmstore.store.atomic import write_bytes_atomic
from dlmstore.store.connection import DB_NAME, read_only


class Writable(Protocol):
    """What the mark needs of an open store: its folder and a write transaction.

    :class:`dlmstore.store.database.Store` is one; the mark knows nothing
    else of it, so the database module can import this one and not the
    other way round.
    """

    @property
    def path(self) -> Path: ...

    def write(self) -> AbstractContextManager[sqlite3.Connection]: ...


MARK_NAME = "high-water.json"
MARK_FORMAT = 1

#: ``AUTOINCREMENT`` tables whose ids are history a person sees (run ids,
#: lock records). Token segment ids are left out: a lost segment row only orphans
#: a file that ``dlm cache verify --repair`` removes.
_SEQUENCES = ("runs", "lock_records")


@dataclass(frozen=True)
class Counters:
    """The newest id of each kind of history store.db holds (0: none yet)."""

    runs: int = 0
    lock_records: int = 0
    adapter_version: int = 0

    def union(self, other: Counters) -> Counters:
        """The newer of the two, kind by kind."""
        return Counters(
            runs=max(self.runs, other.runs),
            lock_records=max(self.lock_records, other.lock_records),
            adapter_version=max(self.adapter_version, other.adapter_version),
        )


@dataclass(frozen=True)
class Mark:
    """The contents of ``high-water.json``."""

    expected: Counters
    issued: Counters


def current(conn: sqlite3.Connection) -> Counters:
    """What store.db holds, read through ``conn`` (rows as tuples or ``sqlite3.Row``)."""
    sequences = {row[0]: int(row[1] or 0) for row in conn.execute("SELECT name, seq FROM sqlite_sequence")}
    adapter = conn.execute("SELECT COALESCE(MAX(version), 0) FROM adapters").fetchone()[0]
    return Counters(
        runs=sequences.get("runs", 0),
        lock_records=sequences.get("lock_records", 0),
        adapter_version=int(adapter),
    )


def read_mark(store_path: Path) -> Mark | None:
    """The mark beside store.db; ``None`` when there is none or it cannot be read.

    An unreadable mark only weakens the check, so it is not an error here;
    ``dlm cache verify`` reports it and ``--repair`` writes it afresh.
    """
    try:
        data = json.loads((store_path / MARK_NAME).read_bytes())
        return Mark(Counters(**data["expected"]), Counters(**data["issued"]))
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        return None


def mark_problem(store_path: Path) -> str | None:
    """Why ``high-water.json`` cannot be used, when it exists and cannot; else ``None``."""
    path = store_path / MARK_NAME
    if not path.exists() or read_mark(store_path) is not None:
        return None
    return f"{MARK_NAME} cannot be read as a high-water mark; store.db's losses would go unnoticed"


def mark_bytes(mark: Mark) -> bytes:
    """The bytes of ``high-water.json`` holding ``mark``."""
    data = {
        "format": MARK_FORMAT,
        "expected": dataclasses.asdict(mark.expected),
        "issued": dataclasses.asdict(mark.issued),
    }
    return (json.dumps(data, indent=2) + "\n").encode()


def _write(store_path: Path, mark: Mark) -> None:
    path = store_path / MARK_NAME
    try:
        write_bytes_atomic(path, mark_bytes(mark))
    except OSError as exc:
        raise StoreError(
            f"cannot write {path}: {exc.strerror or exc}",
            hint="make the store writable and free some disk space",
        ) from None


def record(store: Writable) -> None:
    """Raise the mark to what store.db holds now (call after committing a run's rows)."""
    with store.write() as conn:
        now = current(conn)
        old = read_mark(store.path)
        new = Mark(now, now) if old is None else Mark(old.expected.union(now), old.issued.union(now))
        if new != old:
            _write(store.path, new)


def losses(store_path: Path, held: Counters) -> list[str]:
    """What the mark says store.db should hold beyond ``held``, one phrase per kind; empty when none."""
    mark = read_mark(store_path)
    if mark is None:
        return []
    expected = mark.expected
    found = []
    for name, singular, plural, fmt in (
        ("runs", "run", "runs", "{}"),
        ("lock_records", "lock record", "lock records", "{}"),
        ("adapter_version", "adapter", "adapters", "v{:04d}"),
    ):
        have, want = getattr(held, name), getattr(expected, name)
        if have < want:
            first, last = fmt.format(have + 1), fmt.format(want)
            found.append(f"{singular} {last}" if have + 1 == want else f"{plural} {first} to {last}")
    return found


def check(store_path: Path) -> None:
    """Refuse a store.db that holds less than its high-water mark.

    The mark is read before the database: a mark is written only after the
    records it counts are committed, so reading in this order never finds a
    concurrent run's mark ahead of the database it has already committed.

    Raises:
        StoreDamagedError: records the mark counts are missing from store.db.
    """
    db_path = store_path / DB_NAME
    if read_mark(store_path) is None:
        return
    with read_only(db_path) as conn:
        held = current(conn)
    lost = losses(store_path, held)
    if lost:
        raise StoreDamagedError(db_path, lost_reason(lost), hint=LOST_HINT)


def lost_reason(lost: list[str]) -> str:
    """The one-line reason for losses found by :func:`losses`."""
    return (
        f"records {MARK_NAME} counts are gone from it: {', '.join(lost)} "
        "(store.db-wal deleted, or store.db replaced by an older copy)"
    )


LOST_HINT = (
    "if you still have the store.db-wal that belongs with it, put it back beside store.db; otherwise run "
    "`dlm cache verify --repair` on the document to accept the loss (ids already handed out are not reused)"
)


def accept(store: Writable) -> None:
    """Accept what store.db lost, so the store opens again.

    First the ``AUTOINCREMENT`` counters go up to the highest ids ever
    issued (one transaction), so the next run gets a fresh id; then the
    mark's expectation comes down to what store.db holds. Killed in
    between, the store still refuses to open and accepting again finishes
    the job. Adapter versions have no counter in the database;
    :func:`adapter_floor` tells a new version where to start.
    """
    mark = read_mark(store.path)
    if mark is not None:
        with store.write() as conn:
            for name in _SEQUENCES:
                issued = getattr(mark.issued, name)
                raised = conn.execute(
                    "UPDATE sqlite_sequence SET seq = MAX(seq, ?) WHERE name = ?", (issued, name)
                ).rowcount
                if not raised and issued:
                    conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (name, issued))
    with store.write() as conn:
        held = current(conn)
        _write(store.path, Mark(held, held if mark is None else mark.issued.union(held)))


def adapter_floor(store_path: Path) -> int:
    """The highest adapter version ever handed out in this store (0: none, or no mark)."""
    mark = read_mark(store_path)
    return 0 if mark is None else mark.issued.adapter_version

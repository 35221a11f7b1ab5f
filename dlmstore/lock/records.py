"""Lock history: ``dlm.lock`` on disk plus one ``lock_records`` row per training run.

:func:`lock_transaction` is the one writer. It opens a write transaction,
inserts the run's row, lets the caller add its own rows (``dlm train``
registers the run's adapter versions there), then writes ``dlm.lock``
atomically (temp, fsync, rename) as the last step before the commit. So:

* a run whose rows fail (a constraint, a full disk) leaves ``dlm.lock`` as
  it was: the file is not written until everything else is in place;
* a ``dlm.lock`` that cannot be written rolls back the row and the
  caller's rows;
* a commit that fails after the file was written puts the previous
  ``dlm.lock`` back (or removes the new one when there was none).

Only a process killed between the rename and the commit leaves a file one
record ahead of the history (its run is then marked failed, and it owns no
adapter); the next run's record catches up. :func:`write_lock` is the same
with nothing added. ``--ignore-lock`` runs get a row (decision ``ignored``)
but no file.

The history is plain SQL (``lock_records.lock_json`` holds each lock
verbatim), so :func:`lock_history` and :func:`lock_diff` read rows and parse
them; the latest ``written``/``updated`` row is what ``dlm.lock`` holds.
"""

from __future__ import annotations

import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from dlmstore.clock import utc_now
from dlmstore.errors import LockError, StoreError
from dlmstore.lock.model import LOCK_NAME, Lock, parse_lock, read_lock
from dlmstore.lock.policy import Mismatch, compare
from dlmstore.store.atomic import write_bytes_atomic
from dlmstore.store.database import Store

DECISIONS = ("written", "updated", "ignored")

_COLUMNS = "id, run_id, created_at, decision, lock_json"

#: Decisions whose lock is (was) the content of dlm.lock.
_ON_DISK = "decision IN ('written', 'updated')"

_TRAIN_HINT = "run `dlm train` on the document; every run records its lock"


@dataclass(frozen=True)
class LockRecord:
    """One row of ``lock_records``, with its lock parsed."""

    id: int
    run_id: int | None
    created_at: str
    decision: str
    lock: Lock


@dataclass(frozen=True)
class LockDiff:
    """The JSON shape of ``dlm lock diff --json``.

    ``new_*`` is the record ``dlm.lock`` holds (the latest written or
    updated one); ``old_*`` the record it is compared with: the written or
    updated one before it, or the record of the run asked for. ``old_*``
    are None and ``rows`` is empty when there is no earlier record.

    Attributes:
        dlm_id: The document id.
        old_record_id: The lock record compared with; null when there is no earlier one.
        old_run_id: Its run; null when none or unknown.
        old_created_at: When it was captured; null when there is no earlier record.
        new_record_id: The record ``dlm.lock`` holds.
        new_run_id: Its run.
        new_created_at: When it was captured (ISO-8601 UTC).
        rows: Each field that differs, with its severity.
    """

    dlm_id: str
    old_record_id: int | None
    old_run_id: int | None
    old_created_at: str | None
    new_record_id: int
    new_run_id: int | None
    new_created_at: str
    rows: list[Mismatch] = field(default_factory=list)


def write_lock(store: Store, lock: Lock, *, decision: str) -> LockRecord:
    """Record ``lock`` for its run: its row, then ``dlm.lock`` (unless ignored), in one commit.

    Args:
        store: the document's store.
        lock: the lock captured for the run (its ``last_run_id`` is the row's run).
        decision: ``written``, ``updated`` or ``ignored`` (``LockDecision.decision``).

    Raises:
        StoreError: the database or ``dlm.lock`` cannot be written; nothing
            is recorded and ``dlm.lock`` is as it was.
    """
    with lock_transaction(store, lock, decision=decision) as (_, record):
        pass
    return record


@contextmanager
def lock_transaction(
    store: Store, lock: Lock, *, decision: str
) -> Iterator[tuple[sqlite3.Connection, LockRecord]]:
    """A write transaction recording ``lock``, which the caller adds its own rows to.

    Yields the connection (inside ``BEGIN IMMEDIATE``) and the record, whose
    row is already inserted. When the block ends, ``dlm.lock`` is written
    (unless ``decision`` is ``ignored``) and everything commits together;
    see the module docstring for what each failure leaves.

    Raises:
        StoreError: the database or ``dlm.lock`` cannot be written.
        ValueError: ``decision`` is not one of :data:`DECISIONS`.
    """
    if decision not in DECISIONS:
        raise ValueError(f"unknown lock decision {decision!r}; expected one of {', '.join(DECISIONS)}")
    text = lock.to_json()
    path = store.path / LOCK_NAME
    on_disk = decision != "ignored"
    previous = _snapshot(path) if on_disk else None
    written = False
    try:
        with store.write() as conn:
            created_at = utc_now()
            cursor = conn.execute(
                "INSERT INTO lock_records (run_id, created_at, decision, lock_version, dlm_sha256, "
                "base_model_revision, base_model_sha256, hardware_tier, determinism_class, seed, lock_json) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    lock.last_run_id,
                    created_at,
                    decision,
                    lock.lock_version,
                    lock.dlm_sha256,
                    lock.base_model_revision,
                    lock.base_model_sha256,
                    lock.hardware_tier,
                    lock.determinism_class,
                    lock.seed,
                    text,
                ),
            )
            record = LockRecord(int(cursor.lastrowid or 0), lock.last_run_id, created_at, decision, lock)
            yield conn, record
            if on_disk:
                try:
                    write_bytes_atomic(path, text.encode("utf-8"))
                except OSError as exc:
                    raise StoreError(
                        f"cannot write {path}: {exc.strerror or exc}",
                        hint="free some disk space or make the store writable, and run again "
                        "(nothing of this run was recorded)",
                    ) from None
                written = True
    except BaseException:
        if written and previous is not None:
            previous.restore()
        raise


@dataclass(frozen=True)
class _Snapshot:
    """What ``dlm.lock`` held before a write: its bytes, or None when there was no file."""

    path: Path
    content: bytes | None

    def restore(self) -> None:
        """Put the file back as it was, best effort (the caller is already raising)."""
        try:
            if self.content is None:
                self.path.unlink(missing_ok=True)
            else:
                write_bytes_atomic(self.path, self.content)
        except OSError:
            pass  # the error being raised says what went wrong; this one would hide it


def _snapshot(path: Path) -> _Snapshot | None:
    """A snapshot of ``path``; None when it is no readable file (then a failed run leaves what it wrote)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return None  # never read a FIFO or a device: it could block or never end
        return _Snapshot(path, path.read_bytes())
    except FileNotFoundError:
        return _Snapshot(path, None)
    except OSError:
        return None


def current_lock(store: Store) -> Lock:
    """The lock in the store's ``dlm.lock`` (``dlm lock show``).

    Raises:
        LockError: there is no ``dlm.lock`` yet, or it is corrupt.
    """
    lock = read_lock(store.path / LOCK_NAME)
    if lock is None:
        raise LockError(f"no {LOCK_NAME} for document {store.dlm_id} yet ({store.path})", hint=_TRAIN_HINT)
    return lock


def lock_history(store: Store, *, limit: int | None = None) -> list[LockRecord]:
    """Lock records newest first (every decision), at most ``limit`` of them."""
    with store.read() as conn:
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM lock_records ORDER BY id DESC LIMIT ?",
            (-1 if limit is None else limit,),
        ).fetchall()
    return [_record(row) for row in rows]


def lock_diff(store: Store, against_run_id: int | None = None) -> LockDiff:
    """Compare the lock ``dlm.lock`` holds with the one before it, or with run ``against_run_id``'s.

    Raises:
        LockError: no lock was written yet, or run ``against_run_id`` has
            no lock record (the hint lists the runs that have one).
    """
    with store.read() as conn:
        new_row = conn.execute(
            f"SELECT {_COLUMNS} FROM lock_records WHERE {_ON_DISK} ORDER BY id DESC LIMIT 1"
        ).fetchone()
        if new_row is None:
            raise LockError(f"no lock recorded for document {store.dlm_id} yet", hint=_TRAIN_HINT)
        if against_run_id is None:
            old_row = conn.execute(
                f"SELECT {_COLUMNS} FROM lock_records WHERE {_ON_DISK} AND id < ? ORDER BY id DESC LIMIT 1",
                (new_row["id"],),
            ).fetchone()
        else:
            old_row = conn.execute(
                f"SELECT {_COLUMNS} FROM lock_records WHERE run_id = ? ORDER BY id DESC LIMIT 1",
                (against_run_id,),
            ).fetchone()
            if old_row is None:
                runs = [
                    str(r["run_id"])
                    for r in conn.execute(
                        "SELECT DISTINCT run_id FROM lock_records WHERE run_id IS NOT NULL ORDER BY run_id"
                    ).fetchall()
                ]
                raise LockError(
                    f"run {against_run_id} has no lock record",
                    hint=f"runs with a lock record: {', '.join(runs)}",
                )
    new = _record(new_row)
    if old_row is None:
        return LockDiff(store.dlm_id, None, None, None, new.id, new.run_id, new.created_at)
    old = _record(old_row)
    return LockDiff(
        store.dlm_id,
        old.id,
        old.run_id,
        old.created_at,
        new.id,
        new.run_id,
        new.created_at,
        compare(old.lock, new.lock),
    )


def _record(row: sqlite3.Row) -> LockRecord:
    lock = parse_lock(str(row["lock_json"]), source=f"lock record {row['id']}")
    return LockRecord(row["id"], row["run_id"], row["created_at"], row["decision"], lock)

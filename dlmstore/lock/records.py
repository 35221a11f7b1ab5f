"""Lock history: ``dlm.lock`` on disk plus one ``lock_records`` row per training run.

:func:`write_lock` is the one writer. It writes ``dlm.lock`` atomically
first and inserts the row after, so a row whose decision says the file was
written never exists without that file; a crash in between leaves a file
one record ahead of the history, which the next run's record catches up.
``--ignore-lock`` runs get a row (decision ``ignored``) but no file.

The history is plain SQL (``lock_records.lock_json`` holds each lock
verbatim), so :func:`lock_history` and :func:`lock_diff` read rows and parse
them; the latest ``written``/``updated`` row is what ``dlm.lock`` holds.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from dlmstore.clock import utc_now
from dlmstore.errors import LockError
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
    """Record ``lock`` for its run: write ``dlm.lock`` (unless ignored), then the row.

    Args:
        store: the document's store.
        lock: the lock captured for the run (its ``last_run_id`` is the row's run).
        decision: ``written``, ``updated`` or ``ignored`` (``LockDecision.decision``).

    Raises:
        StoreError: the database cannot be written.
        OSError: ``dlm.lock`` cannot be written (nothing is recorded then).
    """
    if decision not in DECISIONS:
        raise ValueError(f"unknown lock decision {decision!r}; expected one of {', '.join(DECISIONS)}")
    text = lock.to_json()
    if decision != "ignored":
        write_bytes_atomic(store.path / LOCK_NAME, text.encode("utf-8"))
    created_at = utc_now()
    with store.write() as conn:
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
        record_id = int(cursor.lastrowid or 0)
    return LockRecord(record_id, lock.last_run_id, created_at, decision, lock)


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

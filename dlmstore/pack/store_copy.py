"""A consistent copy of a store's database for a pack, and the high-water mark that matches it.

The copy is made with SQLite's own ``VACUUM INTO`` from a read-only
connection: one read transaction, so it holds every commit up to one
moment and none after, while ``dlm train`` may keep writing the live
store (adapter and token files are published before the rows that name
them, so every file the copy names is complete). ``VACUUM`` writes pages
in a fixed order, so an unchanged store copies to the same bytes.

Without ``--include-cache`` the copy drops the token cache's rows (the
same three tables ``dlm cache clear`` empties), so the unpacked store has
no entry pointing at a file the pack does not carry; it fills again on
the next ``dlm train``. The copy is vacuumed again after that, so no
dropped row lingers in a free page.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from dlmstore.cache.admin import clear_rows
from dlmstore.errors import PackError
from dlmstore.store.connection import read_only
from dlmstore.store.database import Store
from dlmstore.store.highwater import Mark, current, mark_bytes, read_mark


@dataclass(frozen=True)
class PackedAdapter:
    """An adapter version as the copy registers it."""

    version: int
    path: str
    sha256: str
    phase: str
    run_id: int
    created_at: str
    name: str | None = None  # the named adapter (training.adapters) it is a version of


@dataclass(frozen=True)
class StoreCopy:
    """The copied database and what the pack needs to know from it.

    Attributes:
        db: The copy (a file in the caller's scratch folder).
        high_water: ``high-water.json`` for the copy.
        adapters: Every registered adapter version, oldest first.
        segments: The token files the copy's cache names (relative to the store), sorted.
        exports: The export folders recorded (absolute, as recorded), sorted.
        created_at: The store's newest timestamp: newest adapter, else newest run.
        gate: The newest learned gate's folder (relative to the store) and its weights' sha256 (None
            for a uniform gate); None when the store has no gate.
    """

    db: Path
    high_water: bytes
    adapters: list[PackedAdapter]
    segments: list[str]
    exports: list[str]
    created_at: str | None
    gate: tuple[str, str | None] | None = None


def copy_database(store: Store, scratch: Path, *, keep_cache: bool) -> StoreCopy:
    """Copy ``store``'s database into ``scratch`` (see the module docstring).

    Raises:
        PackError: the database cannot be read or copied.
    """
    db = scratch / "store.db"
    try:
        with read_only(store.db_path) as live:
            live.isolation_level = None
            live.execute(
                "PRAGMA temp_store = FILE"
            )  # VACUUM's scratch on disk: memory stays flat in the store's size
            live.execute("VACUUM INTO ?", (str(db),))
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            conn.execute("PRAGMA temp_store = FILE")
            if not keep_cache:
                conn.execute("BEGIN")
                clear_rows(conn)
                conn.execute("COMMIT")
                conn.execute("VACUUM")
            copy = _describe(conn, db, store)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise PackError(
            f"cannot copy {store.db_path}: {exc}", hint="run `dlm cache verify` on the store"
        ) from None
    return copy


def _describe(conn: sqlite3.Connection, db: Path, store: Store) -> StoreCopy:
    held = current(conn)
    mark = read_mark(store.path)
    issued = held if mark is None else held.union(mark.issued)
    high_water = mark_bytes(Mark(held, issued))
    adapters = [
        PackedAdapter(*row)
        for row in conn.execute(
            "SELECT version, path, sha256, phase, run_id, created_at, name FROM adapters ORDER BY version"
        )
    ]
    segments = sorted(row[0] for row in conn.execute("SELECT path FROM token_segments"))
    exports = sorted({row[0] for row in conn.execute("SELECT path FROM exports")})
    newest = conn.execute(
        "SELECT MAX(created_at) FROM adapters UNION ALL SELECT MAX(COALESCE(finished_at, started_at)) FROM runs"
    ).fetchall()
    created = next((row[0] for row in newest if row[0] is not None), None)
    gate = conn.execute("SELECT path, sha256 FROM gates ORDER BY id DESC LIMIT 1").fetchone()
    return StoreCopy(
        db, high_water, adapters, segments, exports, created, None if gate is None else tuple(gate)
    )

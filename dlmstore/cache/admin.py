"""Looking after the tokenized cache: show, prune, clear and verify.

These back ``dlm cache show|prune|clear|verify`` and are the functions the
tests call. All of them are SQL over ``cache_entries`` / ``token_packs`` plus
a listing of ``<store>/tokens/``:

* :func:`cache_summary` is read-only and creates nothing (a document that
  was never tokenized reports an empty cache);
* :func:`prune` drops entries not used since a cutoff (one indexed DELETE),
  deletes packs left empty, rewrites packs that are mostly dead space, and
  removes unregistered pack files and temp files older than a grace period
  (a concurrent writer's pack is on disk a moment before its rows commit);
* :func:`clear` drops everything;
* :func:`verify` checks store.db with SQLite's ``integrity_check``, then
  every entry against its bytes and every file against the rows, and with
  ``repair`` drops what is broken (never touching a damaged store.db).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta

from dlmstore.cache.entries import drop_dead_packs, unlink_packs
from dlmstore.cache.packs import PACK_DIR, PackReader, as_array, write_pack
from dlmstore.clock import iso_before, utc_now
from dlmstore.home import store_dir
from dlmstore.store.database import DB_NAME, Store, read_only

#: Unregistered files younger than this may belong to a writer that has not
#: committed yet, so prune and repair leave them alone.
ORPHAN_GRACE_S = 3600.0

#: Packs whose live bytes fall below this fraction are rewritten by prune.
COMPACT_BELOW = 0.5


@dataclass(frozen=True)
class CacheSummary:
    """The JSON shape of ``dlm cache show --json`` (and ``training_cache`` in ``dlm show``)."""

    dlm_id: str
    path: str
    exists: bool
    entry_count: int
    bytes: int
    last_run_id: int | None
    last_run_hits: int | None
    last_run_misses: int | None
    last_run_hit_rate: float | None


def cache_summary(dlm_id: str) -> CacheSummary:
    """Entries, size and the last run's hit rate; creates nothing.

    Raises:
        StoreDamagedError: store.db exists but SQLite finds it damaged.
    """
    import sqlite3

    path = store_dir(dlm_id)
    tokens_dir = str(path / PACK_DIR)
    db = path / DB_NAME
    if not db.is_file():
        return CacheSummary(dlm_id, tokens_dir, False, 0, 0, None, None, None, None)
    with read_only(db) as conn:
        try:
            count, size = conn.execute("SELECT entry_count, bytes FROM cache_totals WHERE id = 1").fetchone()
            last = conn.execute(
                "SELECT run_id, cache_hits, cache_misses FROM tokenization_events "
                "WHERE cache_mode = 'on' ORDER BY run_id DESC LIMIT 1"
            ).fetchone()
        except sqlite3.OperationalError:  # a store from before the cache existed
            count, size, last = 0, 0, None
    if last is None:
        return CacheSummary(dlm_id, tokens_dir, True, count, size, None, None, None, None)
    run_id, hits, misses = last
    rate = round(hits / (hits + misses), 4) if hits + misses else None
    return CacheSummary(dlm_id, tokens_dir, True, count, size, run_id, hits, misses, rate)


@dataclass(frozen=True)
class PruneResult:
    """What ``dlm cache prune`` removed."""

    cutoff: str
    entries_removed: int
    bytes_removed: int
    packs_removed: int
    packs_compacted: int
    orphan_files_removed: int
    temp_files_removed: int


def prune(store: Store, *, older_than: timedelta, grace_s: float = ORPHAN_GRACE_S) -> PruneResult:
    """Drop entries not used within ``older_than`` and reclaim their disk space."""
    cutoff = iso_before(older_than)
    with store.write() as conn:
        removed, removed_bytes = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM cache_entries WHERE last_access_at < ?",
            (cutoff,),
        ).fetchone()
        conn.execute("DELETE FROM cache_entries WHERE last_access_at < ?", (cutoff,))
        dead = drop_dead_packs(conn)
    unlink_packs(store, dead)
    compacted = _compact(store)
    orphans, temps = _sweep_files(store, grace_s=grace_s, remove=True)
    return PruneResult(cutoff, removed, removed_bytes, len(dead), compacted, len(orphans), len(temps))


def _compact(store: Store) -> int:
    """Rewrite packs that are mostly dead space; return how many."""
    with store.read() as conn:
        sparse = conn.execute(
            "SELECT id, path, dtype FROM token_packs WHERE live_bytes > 0 AND live_bytes < bytes * ?",
            (COMPACT_BELOW,),
        ).fetchall()
    reader = PackReader(store.path)
    done = 0
    for pack_id, relpath, dtype in sparse:
        with store.read() as conn:
            entries = conn.execute(
                "SELECT id, byte_offset, bytes, checksum FROM cache_entries WHERE pack_id = ? ORDER BY byte_offset",
                (pack_id,),
            ).fetchall()
        arrays, ids = [], []
        for entry in entries:
            data = reader.read(relpath, entry["byte_offset"], entry["bytes"], entry["checksum"])
            if data is not None:  # damaged entries are verify's business; skip them here
                arrays.append(as_array(data, dtype))
                ids.append(entry["id"])
        if not arrays:
            continue
        new = write_pack(store.path, arrays, arrays[0].dtype)
        with store.write() as conn:
            new_id = conn.execute(
                "INSERT INTO token_packs (path, dtype, bytes, live_bytes, created_at) VALUES (?, ?, ?, 0, ?)",
                (new.relpath, new.dtype, new.bytes, utc_now()),
            ).lastrowid
            conn.execute(
                "UPDATE cache_entries SET pack_id = ?, byte_offset = j.value ->> 1 "
                "FROM json_each(?) AS j WHERE cache_entries.id = j.value ->> 0 AND cache_entries.pack_id = ?",
                (
                    new_id,
                    json.dumps([[i, e.byte_offset] for i, e in zip(ids, new.entries, strict=True)]),
                    pack_id,
                ),
            )
            dead = drop_dead_packs(conn)
        unlink_packs(store, dead)
        done += 1
    reader.close()
    return done


def _sweep_files(store: Store, *, grace_s: float, remove: bool) -> tuple[list[str], list[str]]:
    """Unregistered pack files and leftover temp files older than ``grace_s``."""
    directory = store.path / PACK_DIR
    if not directory.is_dir():
        return [], []
    with store.read() as conn:
        known = {row["path"] for row in conn.execute("SELECT path FROM token_packs")}
    now = time.time()
    orphans: list[str] = []
    temps: list[str] = []
    for entry in os.scandir(directory):
        relpath = f"{PACK_DIR}/{entry.name}"
        if relpath in known or not entry.is_file(follow_symlinks=False):
            continue
        if now - entry.stat().st_mtime < grace_s:
            continue
        (temps if entry.name.endswith(".tmp") else orphans).append(relpath)
    if remove:
        for relpath in orphans + temps:
            (store.path / relpath).unlink(missing_ok=True)
    return orphans, temps


@dataclass(frozen=True)
class ClearResult:
    """What ``dlm cache clear`` removed."""

    entries_removed: int
    bytes_removed: int
    files_removed: int


def clear(store: Store) -> ClearResult:
    """Drop every cache entry and every pack file of the store."""
    with store.write() as conn:
        count, size = conn.execute("SELECT entry_count, bytes FROM cache_totals WHERE id = 1").fetchone()
        conn.execute("DELETE FROM cache_entries")
        conn.execute("DELETE FROM token_packs")
    files = 0
    directory = store.path / PACK_DIR
    if directory.is_dir():
        for entry in os.scandir(directory):
            if entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                files += 1
    return ClearResult(count, size, files)


@dataclass(frozen=True)
class Problem:
    """One thing ``verify`` found wrong."""

    kind: str  # damaged_database | missing_pack | short_pack | bad_entry | orphan_file | temp_file | wrong_totals
    path: str
    detail: str
    repaired: bool = False


@dataclass(frozen=True)
class VerifyResult:
    """The JSON shape of ``dlm cache verify --json``."""

    entries_checked: int
    packs_checked: int
    problems: list[Problem] = field(default_factory=list)

    @property
    def remaining(self) -> list[Problem]:
        return [p for p in self.problems if not p.repaired]


def verify(store: Store, *, repair: bool = False, grace_s: float = ORPHAN_GRACE_S) -> VerifyResult:
    """Check store.db itself, then every entry against its bytes and every file against the rows.

    A damaged store.db is the one problem reported: rows read from it cannot
    be trusted, so no entry or file is checked, and ``repair`` writes
    nothing to it (it is restored or moved aside by hand).
    """
    damage = store.integrity_problems()
    if damage:
        detail = (
            f"SQLite's integrity_check: {'; '.join(damage)}; nothing else was checked or repaired: "
            "restore store.db from a backup, or move it aside to start the store afresh"
        )
        return VerifyResult(0, 0, [Problem("damaged_database", DB_NAME, detail)])
    problems: list[Problem] = []
    with store.read() as conn:
        packs = conn.execute("SELECT id, path, bytes FROM token_packs").fetchall()
        entries = conn.execute(
            "SELECT e.id, e.row_key, p.path, e.byte_offset, e.bytes, e.checksum "
            "FROM cache_entries AS e JOIN token_packs AS p ON p.id = e.pack_id"
        ).fetchall()
        totals = tuple(conn.execute("SELECT entry_count, bytes FROM cache_totals WHERE id = 1").fetchone())
        actual = tuple(conn.execute("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM cache_entries").fetchone())
    for pack in packs:
        relpath, nbytes = pack["path"], pack["bytes"]
        path = store.path / relpath
        if not path.is_file():
            problems.append(Problem("missing_pack", relpath, "registered pack file is missing", repair))
        elif path.stat().st_size < nbytes:
            problems.append(
                Problem(
                    "short_pack", relpath, f"{path.stat().st_size} bytes on disk, {nbytes} registered", repair
                )
            )
    reader = PackReader(store.path)
    bad: list[int] = []
    for entry in entries:
        if reader.read(entry["path"], entry["byte_offset"], entry["bytes"], entry["checksum"]) is None:
            bad.append(entry["id"])
            problems.append(
                Problem(
                    "bad_entry",
                    entry["path"],
                    f"entry {entry['id']} ({entry['row_key'][:19]}...) is missing or fails its checksum",
                    repair,
                )
            )
    reader.close()
    if totals != actual:
        problems.append(
            Problem(
                "wrong_totals",
                "cache_totals",
                f"records {totals}, entries add up to {actual}",
                repair,
            )
        )
    orphans, temps = _sweep_files(store, grace_s=grace_s, remove=repair)
    problems += [Problem("orphan_file", p, "pack file not registered in store.db", repair) for p in orphans]
    problems += [Problem("temp_file", p, "leftover temporary file", repair) for p in temps]
    if repair:
        missing = [pack["path"] for pack in packs if not (store.path / pack["path"]).is_file()]
        with store.write() as conn:
            if bad:
                conn.execute(
                    "DELETE FROM cache_entries WHERE id IN (SELECT value FROM json_each(?))",
                    (json.dumps(bad),),
                )
            if missing:
                conn.execute(
                    "DELETE FROM token_packs WHERE path IN (SELECT value FROM json_each(?)) "
                    "AND NOT EXISTS (SELECT 1 FROM cache_entries WHERE pack_id = token_packs.id)",
                    (json.dumps(missing),),
                )
            conn.execute(
                "UPDATE cache_totals SET entry_count = (SELECT COUNT(*) FROM cache_entries), "
                "bytes = (SELECT COALESCE(SUM(bytes), 0) FROM cache_entries) WHERE id = 1"
            )
            conn.execute(
                "UPDATE token_packs SET live_bytes = (SELECT COALESCE(SUM(bytes), 0) FROM cache_entries "
                "WHERE pack_id = token_packs.id)"
            )
            dead = drop_dead_packs(conn)
        unlink_packs(store, dead)
    return VerifyResult(len(entries), len(packs), problems)

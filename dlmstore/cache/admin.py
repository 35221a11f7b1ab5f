"""Looking after the tokenized cache: show, prune, clear and verify.

These back ``dlm cache show|prune|clear|verify`` and are the functions the
tests call. All of them are SQL over ``cache_entries`` / ``token_segments`` plus
a listing of ``<store>/tokens/``:

* :func:`cache_summary` is read-only and creates nothing (a document that
  was never tokenized reports an empty cache);
* :func:`prune` drops entries not used since a cutoff (one indexed DELETE),
  deletes segments left empty, rewrites segments that are mostly dead space, and
  removes the debris of killed writers (:func:`_debris`);
* :func:`clear` drops everything;
* :func:`verify` checks store.db with SQLite's ``integrity_check`` and
  against its high-water mark, then every entry against its bytes and every
  file against the rows, and with ``repair`` fixes what is broken (never
  touching a damaged store.db).

A concurrent writer's segment is on disk a moment before its rows commit, so
an unregistered file is debris only when no other process has the store
open; the store lock (``dlmstore.store.flock``) says whether one has.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from dlmstore.cache.entries import drop_dead_segments, settle_segments, unlink_segments
from dlmstore.cache.segments import SEGMENT_DIR, SegmentReader, as_array, write_segment
from dlmstore.cache.uses import fold
from dlmstore.clock import iso_before, utc_now
from dlmstore.home import store_dir
from dlmstore.store.connection import DB_NAME, read_only
from dlmstore.store.database import Store
from dlmstore.store.regular_files import file_kind
from dlmstore.store.runs import fail_dead_runs

#: When another process has the store open, unregistered files younger than
#: this may belong to it (a writer that has not committed yet), so prune and
#: verify leave them alone. With the store to themselves, they take every one.
ORPHAN_GRACE_S = 3600.0

#: Segments whose live bytes fall below this fraction are rewritten by prune.
COMPACT_BELOW = 0.5


@dataclass(frozen=True)
class CacheSummary:
    """The JSON shape of ``dlm cache show --json`` (and ``training_cache`` in ``dlm show``).

    Attributes:
        dlm_id: The document id.
        path: The folder of the cache's token files.
        exists: Whether the store has been created.
        entry_count: Cache entries (tokenized rows) held.
        bytes: Bytes of token data they hold.
        last_run_id: The last run that used the cache; null before one.
        last_run_hits: Rows it served from the cache.
        last_run_misses: Rows it tokenized.
        last_run_hit_rate: ``hits / (hits + misses)`` (0 to 1); null before a run or when it had no
            rows.
        shared_entries: Of the entries, those taken from other stores of the home instead of
            tokenized here (their token files hard-linked or copied; ``training.cache.share``).
        shared_bytes: Bytes of token data those entries hold.
    """

    dlm_id: str
    path: str
    exists: bool
    entry_count: int
    bytes: int
    last_run_id: int | None
    last_run_hits: int | None
    last_run_misses: int | None
    last_run_hit_rate: float | None
    shared_entries: int = 0
    shared_bytes: int = 0


def cache_summary(dlm_id: str) -> CacheSummary:
    """Entries, size and the last run's hit rate; creates nothing.

    Raises:
        StoreDamagedError: store.db exists but SQLite finds it damaged.
    """
    import sqlite3

    path = store_dir(dlm_id)
    tokens_dir = str(path / SEGMENT_DIR)
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
        try:
            shared, shared_size = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(e.bytes), 0) FROM entry_origins AS o "
                "JOIN cache_entries AS e ON e.id = o.entry_id"
            ).fetchone()
        except sqlite3.OperationalError:  # a store from before entries were shared
            shared, shared_size = 0, 0
    if last is None:
        return CacheSummary(
            dlm_id, tokens_dir, True, count, size, None, None, None, None, shared, shared_size
        )
    run_id, hits, misses = last
    rate = round(hits / (hits + misses), 4) if hits + misses else None
    return CacheSummary(
        dlm_id, tokens_dir, True, count, size, run_id, hits, misses, rate, shared, shared_size
    )


@dataclass(frozen=True)
class PruneResult:
    """What ``dlm cache prune`` removed.

    Attributes:
        cutoff: Entries not used since this time were dropped (ISO-8601 UTC).
        entries_removed: Entries dropped.
        bytes_removed: Bytes of token data they held.
        segments_removed: Token files deleted because no entry was left in them.
        segments_compacted: Token files rewritten because most of their bytes were dead.
        orphan_files_removed: Token files no row registered, deleted.
        temp_files_removed: Temp files of writes that never finished, deleted.
        staging_dirs_removed: Leftover folders of base conversions that never finished, deleted.
        store_in_use: Another dlm process had the store open, so young files were left alone.
        signatures_removed: Duplicate-search signatures of rows no cache entry holds any more
            (``row_signatures``; a row that comes back is signed again).
    """

    cutoff: str
    entries_removed: int
    bytes_removed: int
    segments_removed: int
    segments_compacted: int
    orphan_files_removed: int
    temp_files_removed: int
    staging_dirs_removed: int
    store_in_use: bool
    signatures_removed: int = 0


def prune(store: Store, *, older_than: timedelta, grace_s: float = ORPHAN_GRACE_S) -> PruneResult:
    """Drop entries not used within ``older_than`` and reclaim their disk space."""
    cutoff = iso_before(older_than)
    fail_dead_runs(store)  # a run whose process died is recorded failed by whoever writes next
    with store.write() as conn:
        fold(conn)  # uses still in the log count as uses
        removed, removed_bytes = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM cache_entries WHERE last_access_at < ?",
            (cutoff,),
        ).fetchone()
        conn.execute("DELETE FROM cache_entries WHERE last_access_at < ?", (cutoff,))
        dead = drop_dead_segments(conn)
        # A row's signature lives as long as one of its entries (dlmstore.corpus.signatures).
        signatures = conn.execute(
            "DELETE FROM row_signatures WHERE row_key NOT IN (SELECT row_key FROM cache_entries)"
        ).rowcount
    unlink_segments(store, dead)
    compacted = _compact(store)
    debris = _debris(store, grace_s=grace_s, remove=True)
    return PruneResult(
        cutoff, removed, removed_bytes, len(dead), compacted, len(debris.orphans), len(debris.temps),
        len(debris.staging), debris.store_in_use, signatures,
    )  # fmt: skip


def _compact(store: Store) -> int:
    """Rewrite segments that are mostly dead space; return how many."""
    with store.read() as conn:
        sparse = conn.execute(
            "SELECT id, path, dtype FROM token_segments WHERE live_bytes > 0 AND live_bytes < bytes * ?",
            (COMPACT_BELOW,),
        ).fetchall()
    reader = SegmentReader(store.path)
    done = 0
    for segment_id, relpath, dtype in sparse:
        with store.read() as conn:
            entries = conn.execute(
                "SELECT id, byte_offset, bytes, checksum FROM cache_entries WHERE segment_id = ? ORDER BY byte_offset",
                (segment_id,),
            ).fetchall()
        arrays, ids = [], []
        for entry in entries:
            data = reader.read(relpath, entry["byte_offset"], entry["bytes"], entry["checksum"])
            if data is not None:  # damaged entries are verify's business; skip them here
                arrays.append(as_array(data, dtype))
                ids.append(entry["id"])
        if not arrays:
            continue
        new = write_segment(store.path, arrays, arrays[0].dtype)
        with store.write() as conn:
            new_id = conn.execute(
                "INSERT INTO token_segments (path, dtype, bytes, live_bytes, created_at) VALUES (?, ?, ?, 0, ?)",
                (new.relpath, new.dtype, new.bytes, utc_now()),
            ).lastrowid
            conn.execute(
                "UPDATE cache_entries SET segment_id = ?, byte_offset = j.value ->> 1 "
                "FROM json_each(?) AS j WHERE cache_entries.id = j.value ->> 0 AND cache_entries.segment_id = ?",
                (
                    new_id,
                    json.dumps([[i, e.byte_offset] for i, e in zip(ids, new.entries, strict=True)]),
                    segment_id,
                ),
            )
            dead = drop_dead_segments(conn)
        unlink_segments(store, dead)
        done += 1
    reader.close()
    return done


@dataclass(frozen=True)
class Debris:
    """Files and folders no row or live process owns (see :func:`_debris`)."""

    orphans: list[str]  # unregistered segment files in tokens/
    temps: list[str]  # temp files of atomic writes that never finished
    staging: list[str]  # base-conversion staging folders under <home>/bases/
    store_in_use: bool  # the store lock was not ours alone: young files were left alone


def _debris(store: Store, *, grace_s: float, remove: bool) -> Debris:
    """What crashed writers left behind, removed too when ``remove``.

    * unregistered ``tokens/segment-*.bin`` (``pack-*.bin`` before migration 0018; a pass killed between its segment's
      rename and the commit of its rows) and any ``tokens/*.tmp``;
    * temp files of atomic writes (``.<name>.<random>.tmp``) anywhere in the
      store directory or in a dataset directory registered in it
      (``.shard_*.tmp`` of a killed dataset build), not looking inside
      hidden folders, whose owners sweep them (adapter staging is
      ``dlm train``'s);
    * staging folders of killed base conversions
      (:func:`dlmstore.bases.stale_conversions`, decided by their own lock).

    Whether a file is debris is decided by the store lock, not its age:
    when this process can take the lock exclusively, no other process has
    the store open and everything found is debris, however new. When it
    cannot, a live writer may own the newest files, and only those older
    than ``grace_s`` are taken.
    """
    from dlmstore.bases import stale_conversions

    alone = store.flock.try_exclusive()
    try:
        with store.read() as conn:
            known = {row["path"] for row in conn.execute("SELECT path FROM token_segments")}
            datasets = [Path(row["path"]) for row in conn.execute("SELECT path FROM datasets")]
        cutoff = None if alone else time.time() - grace_s
        orphans: list[str] = []
        temps: list[str] = []
        tokens = store.path / SEGMENT_DIR
        for path in _files(tokens, recurse=False):
            relpath = f"{SEGMENT_DIR}/{path.name}"
            if relpath in known or not _old_enough(path, cutoff):
                continue
            (temps if path.name.endswith(".tmp") else orphans).append(relpath)
        roots = [store.path, *(d for d in datasets if not d.is_relative_to(store.path))]
        for root in roots:
            for path in _files(root, recurse=True, skip=tokens):
                if path.name.startswith(".") and path.name.endswith(".tmp") and _old_enough(path, cutoff):
                    temps.append(_shown(path, store.path))
        if remove:
            for relpath in orphans + temps:
                (store.path / relpath).unlink(missing_ok=True)  # an absolute relpath stays absolute
        staging = [str(p) for p in stale_conversions(remove=remove)]
    finally:
        store.flock.downgrade()
    return Debris(orphans, temps, staging, not alone)


def _files(directory: Path, *, recurse: bool, skip: Path | None = None) -> Iterator[Path]:
    """Plain files in ``directory`` (and, with ``recurse``, below it, hidden folders and ``skip`` aside)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:  # missing, not a directory, unreadable: nothing to sweep there
        return
    for entry in entries:
        if entry.is_file(follow_symlinks=False):
            yield Path(entry.path)
        elif recurse and entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
            if skip is None or Path(entry.path) != skip:
                yield from _files(Path(entry.path), recurse=True, skip=skip)


def _old_enough(path: Path, cutoff: float | None) -> bool:
    if cutoff is None:
        return True
    try:
        return path.stat(follow_symlinks=False).st_mtime < cutoff
    except OSError:
        return False  # gone meanwhile


def _shown(path: Path, store_path: Path) -> str:
    """``path`` relative to the store when inside it (as segment paths are), else absolute."""
    return str(path.relative_to(store_path)) if path.is_relative_to(store_path) else str(path)


@dataclass(frozen=True)
class ClearResult:
    """What ``dlm cache clear`` removed.

    Attributes:
        entries_removed: Entries dropped (all of them).
        bytes_removed: Bytes of token data they held.
        files_removed: Token files deleted.
    """

    entries_removed: int
    bytes_removed: int
    files_removed: int


def clear_rows(conn: sqlite3.Connection) -> None:
    """Delete every row of the cache's tables in the caller's transaction (its files stay: see :func:`clear`).

    ``dlm pack`` without ``--include-cache`` empties its copy of store.db the same way.
    """
    conn.execute("DELETE FROM cache_entries")
    conn.execute("DELETE FROM cache_uses")
    conn.execute("DELETE FROM token_segments")


def clear(store: Store) -> ClearResult:
    """Drop every cache entry and every segment file of the store."""
    fail_dead_runs(store)
    with store.write() as conn:
        count, size = conn.execute("SELECT entry_count, bytes FROM cache_totals WHERE id = 1").fetchone()
        clear_rows(conn)
    files = 0
    directory = store.path / SEGMENT_DIR
    if directory.is_dir():
        for entry in os.scandir(directory):
            if entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                files += 1
    return ClearResult(count, size, files)


@dataclass(frozen=True)
class Problem:
    """One thing ``verify`` found wrong.

    Attributes:
        kind: What is wrong: ``damaged_database``, ``lost_history``, ``unreadable_mark``,
            ``missing_segment``, ``short_segment``, ``bad_entry``, ``wrong_totals``, ``orphan_file``,
            ``temp_file``, ``staging_dir`` or ``damaged_history_row``.
        path: The file (or entry) concerned, relative to the store.
        detail: What was found, in words.
        repaired: Whether ``--repair`` fixed it.
    """

    kind: str  # one of PROBLEM_KINDS
    path: str
    detail: str
    repaired: bool = False


#: What ``verify`` reports, in the order it looks.
PROBLEM_KINDS = (
    "damaged_database",  # SQLite's integrity_check fails; nothing else is checked or repaired
    "lost_history",  # store.db holds less than its high-water mark (its WAL deleted, an old copy)
    "unreadable_mark",  # high-water.json is not a mark; repair writes it afresh
    "missing_segment",  # a registered segment file is gone
    "short_segment",  # a registered segment file is shorter than registered
    "bad_entry",  # an entry's bytes are missing or fail their checksum
    "wrong_totals",  # cache_totals disagrees with the entries
    "orphan_file",  # a segment file no row registers
    "temp_file",  # a temp file of an atomic write that never finished
    "staging_dir",  # a staging folder of a base conversion or an export that never finished
    "damaged_history_row",  # a replay history row's content is damaged (dlmstore.replay.verify adds it)
)


@dataclass(frozen=True)
class VerifyResult:
    """The JSON shape of ``dlm cache verify --json``.

    Attributes:
        entries_checked: Cache entries checked against their bytes.
        segments_checked: Token files checked against the rows.
        problems: Everything found, repaired or not.
        store_in_use: Another dlm process had the store open (or locks are unavailable), so files
            younger than an hour were neither reported nor removed.
        remaining: Problems not repaired; the command exits 1 when this is not 0.
    """

    entries_checked: int
    segments_checked: int
    problems: list[Problem] = field(default_factory=list)
    #: The store lock could not be taken exclusively (another process had the
    #: store open, or the filesystem has no ``flock``), so files younger than
    #: the grace period, which it may be writing, were neither reported nor removed.
    store_in_use: bool = False
    remaining: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "remaining", sum(not p.repaired for p in self.problems))


def verify(store: Store, *, repair: bool = False, grace_s: float = ORPHAN_GRACE_S) -> VerifyResult:
    """Check store.db itself, then every entry against its bytes and every file against the rows.

    A damaged store.db is the one problem reported: rows read from it cannot
    be trusted, so no entry or file is checked, and ``repair`` writes
    nothing to it (it is restored or moved aside by hand). Open the store
    with ``check_history=False``, or a store.db that lost its latest
    records cannot be opened to be verified.

    Args:
        repair: fix what is found: accept lost history (without reusing
            ids), drop broken entries, shrink short segments to what survives,
            recompute totals, remove debris (see :func:`_debris` for which).
        grace_s: when another process has the store open, leave files
            younger than this alone.
    """
    damage = store.integrity_problems()
    if damage:
        detail = (
            f"SQLite's integrity_check: {'; '.join(damage)}; nothing else was checked or repaired: "
            "restore store.db from a backup, or move it aside to start the store afresh"
        )
        return VerifyResult(0, 0, [Problem("damaged_database", DB_NAME, detail)])
    if repair:
        fail_dead_runs(store)
    problems = _history(store, repair)
    with store.read() as conn:
        segments = conn.execute("SELECT id, path, bytes FROM token_segments").fetchall()
        entries = conn.execute(
            "SELECT e.id, e.row_key, p.path, e.byte_offset, e.bytes, e.checksum "
            "FROM cache_entries AS e JOIN token_segments AS p ON p.id = e.segment_id"
        ).fetchall()
        totals = tuple(conn.execute("SELECT entry_count, bytes FROM cache_totals WHERE id = 1").fetchone())
        actual = tuple(conn.execute("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM cache_entries").fetchone())
    missing: list[str] = []
    short: dict[str, int] = {}
    for segment in segments:
        relpath, nbytes = segment["path"], segment["bytes"]
        try:
            st = (store.path / relpath).stat()
        except FileNotFoundError:
            missing.append(relpath)
            problems.append(Problem("missing_segment", relpath, "registered segment file is missing", repair))
            continue
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device: no tokens can come from it
            missing.append(relpath)
            problems.append(
                Problem(
                    "missing_segment",
                    relpath,
                    f"registered segment file is {file_kind(st.st_mode)}, not a file",
                    repair,
                )
            )
            continue
        size = st.st_size
        if size < nbytes:
            short[relpath] = size
            problems.append(
                Problem("short_segment", relpath, f"{size} bytes on disk, {nbytes} registered", repair)
            )
    reader = SegmentReader(store.path)
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
    if repair:
        _repair_rows(store, bad=bad, missing=missing, short=short)
    debris = _debris(store, grace_s=grace_s, remove=repair)
    problems += [
        Problem("orphan_file", p, "segment file not registered in store.db", repair) for p in debris.orphans
    ]
    problems += [Problem("temp_file", p, "leftover temporary file", repair) for p in debris.temps]
    problems += [
        Problem("staging_dir", p, "leftover folder of a base conversion that never finished", repair)
        for p in debris.staging
    ]
    problems += [
        Problem(
            "staging_dir",
            p,
            "leftover staging folder of an export that was killed before it finished",
            repair,
        )
        for p in _export_staging(store, remove=repair)
    ]
    return VerifyResult(len(entries), len(segments), problems, debris.store_in_use)


#: The store's folder of exports: ``dlm export``'s default ``-o`` (``dlmstore.export``, a layer above).
EXPORTS_DIR = "exports"


def _export_staging(store: Store, *, remove: bool) -> list[str]:
    """Staging folders killed exports left, removed too when ``remove``.

    Looked for in the store's ``exports/`` (every staging folder there) and
    beside each folder an export of this store was recorded in (those of an
    export into that folder). Whether one is a leftover is decided by its
    own owner lock (:func:`~dlmstore.store.atomic.stale_staging`), not by the
    store lock or its age: an export running in another process keeps its
    staging folder locked, and a folder dlm did not stage is never looked at.
    """
    from dlmstore.store.atomic import staging_prefix, stale_staging
    from dlmstore.store.path_text import text_paths

    exports = store.path / EXPORTS_DIR
    with store.read() as conn:
        recorded = [
            Path(path) for row in conn.execute("SELECT path FROM exports") for path in text_paths(row["path"])
        ]
    found = stale_staging(exports, ".", remove=remove)
    for folder in sorted(set(recorded)):
        if folder.parent != exports:
            found += stale_staging(folder.parent, staging_prefix(folder), remove=remove)
    return [_shown(path, store.path) for path in found]


def _history(store: Store, repair: bool) -> list[Problem]:
    """store.db against its high-water mark (``dlmstore.store.highwater``)."""
    from dlmstore.store import highwater

    with store.read() as conn:
        held = highwater.current(conn)
    problems = []
    if lost := highwater.losses(store.path, held):
        problems.append(Problem("lost_history", DB_NAME, highwater.lost_reason(lost), repair))
    if unreadable := highwater.mark_problem(store.path):
        problems.append(Problem("unreadable_mark", highwater.MARK_NAME, unreadable, repair))
    if problems and repair:
        highwater.accept(store)
    return problems


def _repair_rows(store: Store, *, bad: list[int], missing: list[str], short: dict[str, int]) -> None:
    """Drop bad entries and missing segments, shrink short segments, recompute the totals; one transaction."""
    with store.write() as conn:
        if bad:
            conn.execute(
                "DELETE FROM cache_entries WHERE id IN (SELECT value FROM json_each(?))",
                (json.dumps(bad),),
            )
        conn.execute(
            "UPDATE cache_totals SET entry_count = (SELECT COUNT(*) FROM cache_entries), "
            "bytes = (SELECT COALESCE(SUM(bytes), 0) FROM cache_entries) WHERE id = 1"
        )
        conn.execute(
            "UPDATE token_segments SET live_bytes = (SELECT COALESCE(SUM(bytes), 0) FROM cache_entries "
            "WHERE segment_id = token_segments.id)"
        )
        # As a lookup that meets the damage does: a short segment keeps the
        # entries that still read back and is registered at the size it has
        # (the next verify does not find it short again), a missing one goes.
        sizes: dict[str, int | None] = {**dict.fromkeys(missing), **short}
        dead = settle_segments(conn, sizes)
    unlink_segments(store, dead)

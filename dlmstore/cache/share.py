"""Tokens shared across the stores of a home: a miss here is looked up in the other stores first.

The cache key ``(row_key, tokenizer_sha256, sequence_len)`` names the
content, the tokenizer and the length, so an entry another store of the
same home holds under that key is exactly the tokens this store would make
(``dlmstore.cache.entries``). Two documents over one tree (one per
experiment, the usual way to fork a document) then tokenize it once: the
second store's pass takes the first store's tokens before it calls the
tokenizer (:func:`take_shared`, called by ``dlmstore.corpus.tokenize``).

**Each store stays self-contained.** What is taken becomes this store's
own: a segment file in its own ``tokens/`` registered in its own manifest,
with its own CRC-32s, and an ``entry_origins`` row saying where it came
from. Nothing points into another store, so deleting, clearing, pruning or
verifying one store never touches another, and ``dlm cache verify`` works
per store as before. The unit taken is one segment of the other store:

* **hard link** when the entries wanted are at least :data:`LINK_SHARE`
  of the segment's bytes: the segment file is linked (same inode, no new disk)
  under a new name in this store's ``tokens/``, registered at its full
  size, and only the wanted entries' byte ranges are registered; the rest
  of it is dead space (``token_segments.bytes - live_bytes``), as an evicted
  entry's range is, and ``dlm cache prune`` rewrites a segment that is mostly
  dead.
* **copy** of the wanted ranges into a new segment of this store when they
  are a small part of the segment (so one file's row does not drag a whole
  pass's segment along), and whenever a link cannot be made: another
  filesystem (``EXDEV``), a filesystem without hard links, a segment at its
  link limit. A copy costs the wanted bytes, never more.

A hard link is safe because dlm never writes a segment in place: a segment is
written once, to a temp file renamed into place (``segments.write_segment``);
eviction, prune, clear, compaction and ``verify --repair`` drop rows and
unlink files, and compaction writes a *new* segment. Unlinking removes one
name: the other store's link keeps the bytes. (A tool outside dlm that
rewrote a segment file in place would change both; the CRC-32 checks below
and at every use would find it.)

**Nothing damaged is taken.** Every entry is read back through this
store's own name for it (the link, or the source for a copy) and checked
against its CRC-32 before it is registered; an entry that fails stays a
miss and is tokenized. A link that turns out not to be a regular file is
removed again.

**Nor is a file read again.** A store with no stat records yet borrows
the other stores' records for the same paths (:func:`stat_records`): a
file whose ``stat`` fields still match is not read or hashed, as with the
store's own records, so the second document's first pass costs a walk,
a ``stat`` per file and the links, not a read of the tree.

**Another store's trouble never fails this pass.** Other stores are read
through read-only SQLite connections (``mode=ro``): never created,
migrated or locked, and waited for at most :data:`SIBLING_TIMEOUT_S`. A
store at another schema revision, a damaged or unreadable store.db, one
busy past the timeout, a segment removed between the lookup and the link (a
store being cleared), a segment name that is not one dlm writes: each is
skipped with a debug log line, and its rows are tokenized here. Two
passes racing to take the same keys each link or copy their own segment;
the manifest keeps the first registration of a key (``ON CONFLICT DO
NOTHING``) and a segment that registered nothing is removed again.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from dlmstore.cache.entries import unlink_segments
from dlmstore.cache.segments import (
    LEGACY_PREFIX,
    SEGMENT_DIR,
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    SegmentReader,
    as_array,
    write_segment,
)
from dlmstore.clock import utc_now
from dlmstore.sources.statcache import StatCache
from dlmstore.store.atomic import LINK_REFUSED, fsync_dir
from dlmstore.store.connection import DB_NAME
from dlmstore.store.database import Store
from dlmstore.store.revisions import HEAD_REVISION
from dlmstore.ulid import is_valid_ulid, new_ulid

_log = logging.getLogger(__name__)

#: A segment is hard-linked when the entries wanted from it are at least this
#: share of its bytes; below it the wanted ranges are copied. At 0.5 a
#: linked segment starts at least half live, so ``dlm cache prune`` (which
#: rewrites segments less than half live) does not rewrite it at once.
LINK_SHARE = 0.5

#: How long a read of another store's database waits for a writer. In WAL
#: mode a reader waits only while a database is recovered; a store busier
#: than this is skipped rather than waited for.
SIBLING_TIMEOUT_S = 1.0

#: The segment names dlm writes (and wrote before 0018); any other path in another store's manifest
#: is not followed.
_SEGMENT_PATH = re.compile(
    rf"{SEGMENT_DIR}/(?:{SEGMENT_PREFIX}|{LEGACY_PREFIX})[0-9A-HJKMNP-TV-Z]{{26}}\{SEGMENT_SUFFIX}"
)


@dataclass(frozen=True)
class Shared:
    """What :func:`take_shared` took from the other stores, now this store's own entries.

    Attributes:
        tokens: row_key -> (its bytes, checked against their CRC-32; dtype name).
        counts: row_key -> token count, for every key taken.
        ids: the ids of the entries registered here (a key another pass
            registered first is in ``tokens`` but not here).
        stores: the document ids of the stores entries were taken from.
        linked_segments, copied_segments: segments of theirs hard-linked, and segments
            of ours written from their copied ranges.
        linked_bytes, copied_bytes: the bytes of those segments: linked bytes
            take no new disk, copied ones do.
    """

    tokens: dict[str, tuple[memoryview, str]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    ids: list[int] = field(default_factory=list)
    stores: tuple[str, ...] = ()
    linked_segments: int = 0
    copied_segments: int = 0
    linked_bytes: int = 0
    copied_bytes: int = 0


def sibling_folders(folder: Path) -> list[Path]:
    """The other store folders beside the store ``folder`` that hold a store.db, most recently
    written first."""
    found: list[tuple[float, str, Path]] = []
    try:
        entries = list(os.scandir(folder.parent))
    except OSError:
        return []
    for entry in entries:
        if entry.name == folder.name or not is_valid_ulid(entry.name):
            continue  # ourselves, or a store being removed (.removing-...)
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            written = os.stat(os.path.join(entry.path, DB_NAME)).st_mtime
        except OSError:
            continue
        found.append((-written, entry.name, Path(entry.path)))
    return [path for _, _, path in sorted(found)]


@contextmanager
def sibling_reads(folder: Path) -> Iterator[Iterator[tuple[str, sqlite3.Connection]]]:
    """``(dlm_id, read-only connection)`` for each other store beside the store ``folder`` that can be read.

    A store is skipped (logged at debug level) when its store.db cannot be
    opened read-only, is at another schema revision, or is damaged. The
    caller's queries may still fail on a store (damage SQLite finds later,
    a writer holding it past the timeout): it catches ``sqlite3.Error``
    and skips that store too. Connections are closed when the block ends.
    """
    opened: list[sqlite3.Connection] = []

    def each() -> Iterator[tuple[str, sqlite3.Connection]]:
        for other in sibling_folders(folder):
            conn = _open_sibling(other)
            if conn is not None:
                opened.append(conn)
                yield other.name, conn

    try:
        yield each()
    finally:
        for conn in opened:
            conn.close()


def _open_sibling(folder: Path) -> sqlite3.Connection | None:
    try:
        conn = sqlite3.connect(f"file:{folder / DB_NAME}?mode=ro", uri=True, timeout=SIBLING_TIMEOUT_S)
    except sqlite3.Error as exc:
        _log.debug("sharing: skipping %s: %s", folder.name, exc)
        return None
    try:
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        if row is None or row[0] != HEAD_REVISION:
            _log.debug(
                "sharing: skipping %s: schema revision %s, not %s",
                folder.name, None if row is None else row[0], HEAD_REVISION,
            )  # fmt: skip
            conn.close()
            return None
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        _log.debug("sharing: skipping %s: %s", folder.name, exc)
        conn.close()
        return None
    return conn


class _Found(NamedTuple):
    """One entry of another store that this pass wants (a tuple: one is made per entry taken)."""

    entry_id: int
    row_key: str
    byte_offset: int
    nbytes: int
    dtype: str
    checksum: str
    token_count: int


def take_shared(
    store: Store, keys: Sequence[str], *, tokenizer_sha256: str, sequence_len: int, run_id: int
) -> Shared:
    """Take the entries of ``keys`` that other stores of the home hold, registered as this store's own.

    Stores are asked in turn (most recently written first) for the keys
    still wanted; their segments are hard-linked or their ranges copied (see
    the module docstring for which, and for what is skipped). Every entry is
    checked against its CRC-32 before it is registered. Keys no store
    holds, or whose bytes fail, are simply not in the result: the caller
    tokenizes them.
    """
    wanted = dict.fromkeys(keys)
    if not wanted:
        return Shared()
    taker = _Taker(store, tokenizer_sha256, sequence_len, run_id)
    stores: list[str] = []
    with sibling_reads(store.path) as others:
        for dlm_id, conn in others:
            if not wanted:
                break
            try:
                segments = _entries_of(conn, list(wanted), tokenizer_sha256, sequence_len)
            except (sqlite3.Error, UnicodeDecodeError) as exc:
                _log.debug("sharing: skipping %s: %s", dlm_id, exc)
                continue
            before = len(taker.tokens)
            for relpath, found in segments.items():
                found = [entry for entry in found if entry.row_key in wanted]
                if not found:
                    continue
                try:
                    got = taker.take_segment(dlm_id, relpath, found)
                except OSError as exc:  # removed meanwhile (a store being cleared), unreadable, ...
                    _log.debug("sharing: skipping %s/%s: %s", dlm_id, relpath, exc)
                    continue
                for key in got:
                    wanted.pop(key, None)
            taker.register(dlm_id)
            if len(taker.tokens) > before:
                stores.append(dlm_id)
    taker.own.close()  # the views handed out keep their mappings
    tokens = taker.tokens
    counts = {key: len(data) // (2 if dtype == "uint16" else 4) for key, (data, dtype) in tokens.items()}
    if tokens:
        _log.debug(
            "sharing: took %d entries from %s (%d segments linked, %d copied)",
            len(tokens), ", ".join(stores), taker.linked, taker.copied,
        )  # fmt: skip
    return Shared(
        tokens, counts, taker.ids, tuple(stores), taker.linked, taker.copied, taker.linked_bytes,
        taker.copied_bytes,
    )  # fmt: skip


def _entries_of(
    conn: sqlite3.Connection, keys: list[str], tokenizer_sha256: str, sequence_len: int
) -> dict[str, list[_Found]]:
    """The entries another store holds for ``keys``, by its segment path (names dlm writes only)."""
    rows = conn.execute(
        "SELECT p.path, e.id, e.row_key, e.byte_offset, e.bytes, e.dtype, e.checksum, e.token_count "
        "FROM json_each(?) AS k JOIN cache_entries AS e ON e.row_key = k.value "
        "AND e.tokenizer_sha256 = ? AND e.sequence_len = ? JOIN token_segments AS p ON p.id = e.segment_id "
        "ORDER BY p.path, e.byte_offset",
        (json.dumps(keys), tokenizer_sha256, sequence_len),
    ).fetchall()
    segments: dict[str, list[_Found]] = {}
    skipped: set[object] = set()
    for relpath, *entry in rows:  # ordered by path: each path is checked once
        found = segments.get(relpath)
        if found is None:
            if relpath in skipped:
                continue
            if not (isinstance(relpath, str) and _SEGMENT_PATH.fullmatch(relpath)):
                skipped.add(relpath)
                continue
            found = segments[relpath] = []
        found.append(_Found._make(entry))
    return segments


class _Taker:
    """One pass's taking: what it took so far, and how."""

    def __init__(self, store: Store, tokenizer_sha256: str, sequence_len: int, run_id: int) -> None:
        self.store = store
        self.tokenizer_sha256 = tokenizer_sha256
        self.sequence_len = sequence_len
        self.run_id = run_id
        self.own = SegmentReader(store.path)  # our names for linked segments; views of it are handed out
        self.tokens: dict[str, tuple[memoryview, str]] = {}
        self.ids: list[int] = []
        #: Segments linked or written, with their entries' offsets, not registered yet (see register).
        self.pending: list[tuple[str, int, list[tuple[_Found, int]], str]] = []
        self.linked = self.copied = self.linked_bytes = self.copied_bytes = 0

    def take_segment(self, dlm_id: str, relpath: str, found: list[_Found]) -> list[str]:
        """Link or copy one segment of store ``dlm_id``; register the entries that pass their CRC-32.

        Returns the keys taken (registered here, or by another pass first).

        Raises:
            OSError: the segment cannot be read (removed meanwhile, permissions).
        """
        source = self.store.path.parent / dlm_id / relpath
        st = os.lstat(source)
        if not stat.S_ISREG(st.st_mode):
            _log.debug("sharing: skipping %s/%s: not a regular file", dlm_id, relpath)
            return []
        (self.store.path / SEGMENT_DIR).mkdir(exist_ok=True)
        if sum(entry.nbytes for entry in found) >= LINK_SHARE * st.st_size:
            mine = f"{SEGMENT_DIR}/{SEGMENT_PREFIX}{new_ulid()}{SEGMENT_SUFFIX}"
            try:
                os.link(source, self.store.path / mine, follow_symlinks=False)
            except OSError as exc:
                if exc.errno not in LINK_REFUSED:  # after these the wanted ranges are copied instead
                    raise
                _log.debug("sharing: cannot link %s/%s (%s): copying", dlm_id, relpath, exc.strerror)
            else:
                return self._linked(dlm_id, mine, found)
        return self._copied(dlm_id, relpath, found)

    def _linked(self, dlm_id: str, mine: str, found: list[_Found]) -> list[str]:
        linked = os.lstat(self.store.path / mine)
        if not stat.S_ISREG(linked.st_mode):  # replaced by something else between the lstat and the link
            unlink_segments(self.store, [mine])
            return []
        # Checked through our own name: the bytes registered are the bytes checked.
        good = [(entry, data) for entry in found if (data := self.own.read(mine, *_range(entry))) is not None]
        if not good:
            unlink_segments(self.store, [mine])
            return []
        placed = [(entry, entry.byte_offset) for entry, _ in good]
        self.pending.append((mine, linked.st_size, placed, "link"))
        self.linked += 1
        self.linked_bytes += linked.st_size
        return self._keep(good)

    def _copied(self, dlm_id: str, relpath: str, found: list[_Found]) -> list[str]:
        theirs = SegmentReader(self.store.path.parent / dlm_id)
        try:
            good = [(e, data) for e in found if (data := theirs.read(relpath, *_range(e))) is not None]
            if not good:
                return []
            arrays = [as_array(data, entry.dtype) for entry, data in good]
            segment = write_segment(self.store.path, arrays, arrays[0].dtype)
        finally:
            theirs.close()
        placed = [(entry, at.byte_offset) for (entry, _), at in zip(good, segment.entries, strict=True)]
        self.pending.append((segment.relpath, segment.bytes, placed, "copy"))
        self.copied += 1
        self.copied_bytes += segment.bytes
        return self._keep(good)

    def _keep(self, good: list[tuple[_Found, memoryview]]) -> list[str]:
        for entry, data in good:
            self.tokens[entry.row_key] = (data, entry.dtype)
        return [entry.row_key for entry, _ in good]

    def register(self, dlm_id: str) -> None:
        """Register the segments taken from store ``dlm_id`` and their entries (with their origin), in one
        transaction, once every new name is durable (one ``fsync`` of ``tokens/`` for all the links).

        The entries of every segment go in with one statement, in row-key order
        (so the key index of a new store is filled in order rather than at
        random places), and their origins with another: what a pass takes
        costs SQLite's work per row, not a statement per segment. A key another
        pass registered meanwhile keeps its entry; a segment that registered
        nothing is dropped and its file removed.
        """
        if not self.pending:
            return
        if any(how == "link" for _, _, _, how in self.pending):
            fsync_dir(self.store.path / SEGMENT_DIR)  # the new names are durable before a row points at them
        now = utc_now()
        with self.store.write() as conn:
            segments: dict[int, str] = {}
            rows: list[tuple[str, int, int, int, str, int, str]] = []
            origin: dict[str, tuple[int, str]] = {}
            for relpath, size, placed, how in self.pending:
                dtype = placed[0][0].dtype
                (segment_id,) = conn.execute(
                    "INSERT INTO token_segments (path, dtype, bytes, live_bytes, created_at, run_id) "
                    "VALUES (?, ?, ?, 0, ?, ?) RETURNING id",
                    (relpath, dtype, size, now, self.run_id),
                ).fetchone()
                segments[segment_id] = relpath
                for entry, offset in placed:
                    rows.append((entry.row_key, segment_id, offset, entry.token_count, dtype, entry.nbytes, entry.checksum))  # fmt: skip
                    origin[entry.row_key] = (entry.entry_id, how)
            rows.sort()
            registered = conn.execute(
                "INSERT INTO cache_entries (row_key, tokenizer_sha256, sequence_len, segment_id, byte_offset, "
                "token_count, dtype, bytes, checksum, created_at, last_access_at, last_run_id) "
                "SELECT j.value ->> 0, ?, ?, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4, "
                "j.value ->> 5, j.value ->> 6, ?, ?, ? FROM json_each(?) AS j WHERE true "
                "ON CONFLICT (row_key, tokenizer_sha256, sequence_len) DO NOTHING RETURNING id, row_key, segment_id",
                (self.tokenizer_sha256, self.sequence_len, now, now, self.run_id, json.dumps(rows)),
            ).fetchall()
            conn.execute(
                "INSERT INTO entry_origins (entry_id, from_store, from_entry_id, how, run_id, created_at) "
                "SELECT j.value ->> 0, ?, j.value ->> 1, j.value ->> 2, ?, ? FROM json_each(?) AS j",
                (dlm_id, self.run_id, now, json.dumps([[i, *origin[key]] for i, key, _ in registered])),
            )
            empty = segments.keys() - {segment_id for _, _, segment_id in registered}
            if empty:
                conn.execute(
                    "DELETE FROM token_segments WHERE id IN (SELECT value FROM json_each(?))",
                    (json.dumps(sorted(empty)),),
                )
            self.ids += [entry_id for entry_id, _, _ in registered]
        self.pending.clear()
        unlink_segments(self.store, [segments[segment_id] for segment_id in sorted(empty)])


def _range(entry: _Found) -> tuple[int, int, str]:
    return entry.byte_offset, entry.nbytes, entry.checksum


class BorrowedStatCache(StatCache):
    """A new store's stat records, borrowed from the other stores of the home.

    A store that has no ``source_stats`` of its own yet (a new document
    over a tree another document already reads) would read and hash every
    file to learn row keys the other stores recorded for the same paths. A
    borrowed record is trusted exactly as an own one is: only when a fresh
    ``stat`` gives every recorded field and the record is not racily clean
    (``dlmstore.sources.statcache``), and a file loaded through it is hashed
    again and refused if its digest moved. The records a pass used are
    saved as this store's own; the others are left where they are.
    """

    def save(self, store: Store) -> None:
        used = self.seen & self.stamps.keys()
        for key in used:
            self.changed.setdefault(key, self.stamps[key])  # what the pass trusted becomes ours
        self.stamps = {key: self.stamps[key] for key in used}  # the rest were never ours to drop
        super().save(store)


def stat_records(store: Store, *, share: bool) -> StatCache:
    """``store``'s stat records; for a store with none yet and ``share``, the other stores' ones
    (read-only, the most recently written store's record first for a path)."""
    own = StatCache.load(store)
    if own.stamps or not share:
        return own
    borrowed: dict[tuple[str, str], Any] = {}
    with sibling_reads(store.path) as others:
        for dlm_id, conn in others:
            try:
                records = StatCache.from_connection(conn).stamps
            except (sqlite3.Error, UnicodeDecodeError) as exc:
                _log.debug("sharing: skipping the stat records of %s: %s", dlm_id, exc)
                continue
            for key, stamp in records.items():
                borrowed.setdefault(key, stamp)
    return BorrowedStatCache(borrowed) if borrowed else own

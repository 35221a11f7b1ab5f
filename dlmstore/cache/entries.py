"""The tokenized cache: tokens of rows, keyed by content, with LRU eviction in SQL.

Key: ``(row_key, tokenizer_sha256, sequence_len)``. ``row_key`` already
changes whenever a row's text could (``dlmstore.document.rows``); the tokenizer
fingerprint changes whenever its tokens could (``dlmstore.fingerprint``);
``sequence_len`` is part of the key as the spec fixes it, so entries made
for one training length are measured and pruned apart from another's.
Keys are exact, so a lookup never returns stale tokens; an edited file
simply has a new key and its old entry is orphaned until pruned.

Storage: the manifest is the ``cache_entries`` table of ``store.db``; the
tokens are byte ranges of segment files (``dlmstore.cache.segments``). A segment is durable
before its rows commit, so no row ever points at a partial file. Reading
tokens verifies each entry's CRC-32: a missing, truncated or damaged range is a
miss (the row is dropped and the caller re-tokenizes), never an exception. A
lookup that only counts (``verify=False``) reads no entry's bytes and checks
only that its segment is there and long enough (see :meth:`TokenCache.lookup`).
A lookup that finds a segment missing or short also settles the manifest in
the transaction that drops the rows (:func:`settle_segments`): every entry of
the segment that lies past its end goes, whichever tokenizer made it, the segment
is registered at the size it has, and a segment left with no entry is dropped
and its file removed, so ``dlm cache verify`` finds nothing left to repair.

Every batch operation is one SQL statement over a JSON array of keys or ids
(``json_each``), not one statement per entry: a warm lookup of 13K rows is
a single join.

Eviction keeps ``cache_totals.bytes`` (maintained by triggers, so reading it
is O(1)) under ``max_bytes`` by deleting least-recently-used entries in
``(last_access_at, last_run_id)`` order (indexed; the run id breaks ties
between accesses in the same millisecond), skipping entries the current run
touched: a cold cache never evicts what the run it is filling just wrote.
Its cost is proportional to the entries evicted, not to the cache size.
A lookup does not rewrite those marks: it logs the entries it used
(``dlmstore.cache.uses``), and eviction folds the log into the marks first,
only when the cache is over its limit.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dlmstore.cache.segments import SEGMENT_DIR, SegmentReader, dtype_name, write_segment
from dlmstore.cache.uses import fold, log_use
from dlmstore.clock import utc_now
from dlmstore.errors import StoreError
from dlmstore.store.connection import first_value
from dlmstore.store.database import Store

if TYPE_CHECKING:
    import numpy as np

EVICT_BATCH = 512


@dataclass(frozen=True)
class Lookup:
    """What a batch lookup found.

    Attributes:
        tokens: row_key -> (the entry's bytes, a read-only view of a segment
            mapping; its dtype name). ``dlmstore.cache.segments.as_array`` turns it
            into a numpy array without copying.
        damaged: keys whose rows pointed at missing or damaged bytes; the
            rows were dropped, the caller re-tokenizes them.
        counts: row_key -> token count, for every key found (``tokens`` is
            empty when the lookup did not verify).
        ids: the ids of the entries found (and logged as used).
        changes: ``cache_totals.changes`` read with them: while it has not
            moved, none of them was deleted or moved (``dlmstore.corpus.snapshot``).
    """

    tokens: dict[str, tuple[memoryview, str]]
    damaged: tuple[str, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)
    ids: list[int] = field(default_factory=list)
    changes: int | None = None


@dataclass(frozen=True)
class Eviction:
    """What one eviction pass removed."""

    entries: int = 0
    bytes: int = 0
    segments: tuple[str, ...] = field(default=())


class TokenCache:
    """The cache entries of one store for one tokenizer and sequence length."""

    def __init__(self, store: Store, *, tokenizer_sha256: str, sequence_len: int) -> None:
        self.store = store
        self.tokenizer_sha256 = tokenizer_sha256
        self.sequence_len = sequence_len
        self._reader = SegmentReader(store.path)

    def lookup(self, row_keys: Sequence[str], *, run_id: int, verify: bool = True) -> Lookup:
        """Find every cached key and log it as used by ``run_id`` (``dlmstore.cache.uses``).

        With ``verify`` (tokens about to be used: training, ``tokenize_document``)
        each entry's bytes are read and checked against its CRC-32 and returned
        in ``tokens``. Without it (``dlm tokenize``, which only counts) no entry's
        bytes are read: ``counts`` gives each found key's token count, and an
        entry is found when its segment is a regular file long enough to hold it,
        so a missing, replaced or truncated segment is still a miss. A flipped bit
        inside a segment is then found by the next pass that uses the tokens (it
        checks the CRC before anything is served) or by ``dlm cache verify``.
        """
        if not row_keys:
            return Lookup({})
        # Plain tuples, unpacked in SELECT order: a warm run looks up every
        # row of the corpus here, and building a sqlite3.Row per row and
        # reading it by name is a measurable share of the lookup
        # (bench/bench_tokenize.py times the warm pass). Counting needs no
        # offsets, checksums or segment paths, only where each entry ends in
        # which segment.
        if verify:
            columns = "e.id, e.row_key, p.path, e.byte_offset, e.bytes, e.dtype, e.checksum, e.token_count"
            segments = " JOIN token_segments AS p ON p.id = e.segment_id"
        else:
            columns, segments = "e.id, e.row_key, e.segment_id, e.byte_offset + e.bytes, e.token_count", ""
        extents: dict[int, int] = {}
        paths: dict[int, str] = {}
        counted = None
        rows: list[Any] = []
        with self.store.read() as conn:
            cursor = conn.cursor()
            cursor.row_factory = None
            totals = conn.execute("SELECT entry_count, changes FROM cache_totals WHERE id = 1").fetchone()
            entries, changes = (int(totals[0]), int(totals[1])) if totals is not None else (0, None)
            if not verify and 2 * len(row_keys) >= entries:
                counted = self._count_most(cursor, set(row_keys))
            if counted is None and 2 * len(row_keys) >= entries:
                # Asking for most of the cache (a warm pass): one scan of this
                # tokenizer's entries, kept by a set test, is about 3x cheaper
                # than one index search per key through json_each.
                wanted = set(row_keys)
                cursor.execute(
                    f"SELECT {columns} FROM cache_entries AS e{segments} "
                    "WHERE e.tokenizer_sha256 = ? AND e.sequence_len = ?",
                    (self.tokenizer_sha256, self.sequence_len),
                )
                rows = [row for row in cursor.fetchall() if row[1] in wanted]
            elif counted is None:
                rows = cursor.execute(
                    f"SELECT {columns} FROM json_each(?) AS k "
                    "JOIN cache_entries AS e ON e.row_key = k.value "
                    f"AND e.tokenizer_sha256 = ? AND e.sequence_len = ?{segments}",
                    (json.dumps(list(row_keys)), self.tokenizer_sha256, self.sequence_len),
                ).fetchall()
            if not verify and counted is None:
                # Where each segment ends on disk (-1: missing or not a regular
                # file): one ``open``/``fstat`` per segment, none per entry.
                size = self._reader.size
                for segment_id, relpath in cursor.execute("SELECT id, path FROM token_segments"):
                    extents[segment_id] = -1 if (found := size(relpath)) is None else found
                    paths[segment_id] = relpath
        if counted is not None:
            found_counts, found_ids = counted
            if found_ids:
                with self.store.write() as conn:
                    log_use(conn, found_ids, run_id=run_id, used_at=utc_now())
            return Lookup({}, (), found_counts, found_ids, changes)
        tokens: dict[str, tuple[memoryview, str]] = {}
        counts: dict[str, int] = {}
        good: list[int] = []
        bad: list[int] = []
        damaged: list[str] = []
        damaged_segments: set[str] = set()
        if verify:
            read = self._reader.read
            for entry_id, row_key, relpath, offset, nbytes, dtype, expected, _ in rows:
                data = read(relpath, offset, nbytes, expected)
                if data is None:
                    bad.append(entry_id)
                    damaged.append(row_key)
                    damaged_segments.add(relpath)
                    continue
                tokens[row_key] = (data, dtype)
                counts[row_key] = nbytes // (2 if dtype == "uint16" else 4)  # what was read, not the row
                good.append(entry_id)
        else:
            for entry_id, row_key, segment_id, end, count in rows:
                if end <= extents.get(segment_id, -1):
                    counts[row_key] = count
                    good.append(entry_id)
                else:
                    bad.append(entry_id)
                    damaged.append(row_key)
                    damaged_segments.add(paths[segment_id])
        dead: tuple[str, ...] = ()
        if good or bad:
            with self.store.write() as conn:
                log_use(conn, good, run_id=run_id, used_at=utc_now())
                if bad:
                    conn.execute(
                        "DELETE FROM cache_entries WHERE id IN (SELECT value FROM json_each(?))",
                        (json.dumps(bad),),
                    )
                    # A bad entry in a short or missing segment: the manifest follows the file.
                    dead = settle_segments(conn, {path: self._reader.size(path) for path in damaged_segments})
        unlink_segments(self.store, dead)
        return Lookup(tokens, tuple(damaged), counts, good, changes)

    def _count_most(
        self, cursor: sqlite3.Cursor, wanted: set[str]
    ) -> tuple[dict[str, int], list[int]] | None:
        """The token counts and entry ids of ``wanted`` keys, from one scan of this tokenizer's entries.

        A warm pass that only counts asks for most of the cache: instead of
        checking each entry against its segment's size, one aggregate finds how
        far into each segment this tokenizer's entries reach, and when every
        segment is a regular file that long (the usual case) no entry can be
        short. ``None`` when some segment falls short: the caller then checks
        entry by entry, so only the entries that lie past the end are misses.
        """
        size = self._reader.size
        for relpath, reach in cursor.execute(
            "SELECT p.path, MAX(e.byte_offset + e.bytes) FROM cache_entries AS e "
            "JOIN token_segments AS p ON p.id = e.segment_id "
            "WHERE e.tokenizer_sha256 = ? AND e.sequence_len = ? GROUP BY e.segment_id",
            (self.tokenizer_sha256, self.sequence_len),
        ).fetchall():
            extent = size(relpath)
            if extent is None or reach > extent:
                return None
        cursor.execute(
            "SELECT row_key, id, token_count FROM cache_entries WHERE tokenizer_sha256 = ? AND sequence_len = ?",
            (self.tokenizer_sha256, self.sequence_len),
        )
        found = [row for row in cursor.fetchall() if row[0] in wanted]
        if not found:
            return {}, []
        keys, ids, counts = zip(*found, strict=True)  # columns, transposed in C
        return dict(zip(keys, counts, strict=True)), list(ids)

    def store_many(
        self, items: Sequence[tuple[str, np.ndarray]], *, run_id: int, dtype: np.dtype
    ) -> list[int]:
        """Write ``(row_key, tokens)`` pairs as one segment, then register them.

        An entry another process registered meanwhile wins (``ON CONFLICT DO
        NOTHING``); its bytes in our segment stay unreferenced until pruned.
        Returns the ids of the entries registered (those that lost to another
        process's are not among them).
        """
        if not items:
            return []
        try:
            segment = write_segment(self.store.path, [tokens for _, tokens in items], dtype)
        except OSError as exc:
            raise StoreError(
                f"cannot write token file in {self.store.path / SEGMENT_DIR}: {exc.strerror or exc}",
                hint="make the store writable and free some disk space, or run with --no-cache",
            ) from None
        now = utc_now()
        payload = json.dumps(
            [
                [key, e.byte_offset, e.token_count, e.bytes, e.checksum]
                for (key, _), e in zip(items, segment.entries, strict=True)
            ]
        )
        with self.store.write() as conn:
            segment_id = conn.execute(
                "INSERT INTO token_segments (path, dtype, bytes, live_bytes, created_at, run_id) "
                "VALUES (?, ?, ?, 0, ?, ?)",
                (segment.relpath, segment.dtype, segment.bytes, now, run_id),
            ).lastrowid
            registered = conn.execute(
                "INSERT INTO cache_entries (row_key, tokenizer_sha256, sequence_len, segment_id, "
                "byte_offset, token_count, dtype, bytes, checksum, created_at, last_access_at, "
                "last_run_id) "
                "SELECT j.value ->> 0, ?, ?, ?, j.value ->> 1, j.value ->> 2, ?, j.value ->> 3, "
                "j.value ->> 4, ?, ?, ? FROM json_each(?) AS j WHERE true "
                "ON CONFLICT (row_key, tokenizer_sha256, sequence_len) DO NOTHING RETURNING id",
                (
                    self.tokenizer_sha256, self.sequence_len, segment_id, segment.dtype,
                    now, now, run_id, payload,
                ),
            ).fetchall()  # fmt: skip
        return [entry_id for (entry_id,) in registered]

    def close(self) -> None:
        self._reader.close()


def cache_bytes(store: Store) -> int:
    """Total bytes of all cache entries (O(1): a trigger-kept total)."""
    with store.read() as conn:
        return int(first_value(conn, "SELECT bytes FROM cache_totals WHERE id = 1") or 0)


def evict(store: Store, *, max_bytes: int, protect_run_id: int | None) -> Eviction:
    """Delete least-recently-used entries until the cache fits ``max_bytes``.

    Entries last used by ``protect_run_id`` are never evicted, even when the
    cache stays over the limit. Segments left without live entries are deleted
    after the transaction commits.
    """
    removed = removed_bytes = 0
    with store.write() as conn:
        total = int(first_value(conn, "SELECT bytes FROM cache_totals WHERE id = 1") or 0)
        if total > max_bytes:
            fold(conn)  # the LRU order needs every logged use in the marks
        while total > max_bytes:
            batch = conn.execute(
                "SELECT id, bytes FROM cache_entries "
                "WHERE last_run_id IS NOT ? ORDER BY last_access_at, last_run_id LIMIT ?",
                (protect_run_id, EVICT_BATCH),
            ).fetchall()
            if not batch:
                break  # everything left belongs to the protected run
            chosen: list[int] = []
            for entry_id, nbytes in batch:
                chosen.append(entry_id)
                total -= nbytes
                removed_bytes += nbytes
                if total <= max_bytes:
                    break
            conn.execute(
                "DELETE FROM cache_entries WHERE id IN (SELECT value FROM json_each(?))",
                (json.dumps(chosen),),
            )
            removed += len(chosen)
        dead = drop_dead_segments(conn) if removed else ()
    unlink_segments(store, dead)
    return Eviction(removed, removed_bytes, dead)


def drop_dead_segments(conn: sqlite3.Connection) -> tuple[str, ...]:
    """Delete segment rows no entry points into; return their paths (files go after commit)."""
    dead = tuple(
        row["path"]
        for row in conn.execute(
            "SELECT path FROM token_segments WHERE live_bytes = 0 "
            "AND NOT EXISTS (SELECT 1 FROM cache_entries WHERE segment_id = token_segments.id)"
        )
    )
    if dead:
        conn.execute(
            "DELETE FROM token_segments WHERE path IN (SELECT value FROM json_each(?))", (json.dumps(dead),)
        )
    return dead


def settle_segments(conn: sqlite3.Connection, sizes: Mapping[str, int | None]) -> tuple[str, ...]:
    """Make the rows agree with segments as found on disk: ``{path: bytes on disk, None: missing}``.

    Inside the caller's write transaction: every entry of a segment that
    reaches past the segment's end is deleted (all of a missing segment's), a
    short segment is registered at the size it has, and the segments left with no
    entry are dropped. A segment at least as long as registered is left as it
    is. Returns the dropped segments' paths: unlink them after the commit.
    """
    for relpath, size in sizes.items():
        segment = first_value(conn, "SELECT id FROM token_segments WHERE path = ?", (relpath,))
        if segment is None:
            continue
        conn.execute(
            "DELETE FROM cache_entries WHERE segment_id = ? AND byte_offset + bytes > ?",
            (segment, -1 if size is None else size),
        )
        if size is not None:
            conn.execute(
                "UPDATE token_segments SET bytes = ? WHERE id = ? AND bytes > ?", (size, segment, size)
            )
    return drop_dead_segments(conn)


def unlink_segments(store: Store, relpaths: Sequence[str]) -> None:
    for relpath in relpaths:
        (store.path / relpath).unlink(missing_ok=True)


__all__ = [
    "Eviction",
    "Lookup",
    "TokenCache",
    "cache_bytes",
    "drop_dead_segments",
    "dtype_name",
    "evict",
    "settle_segments",
    "unlink_segments",
]

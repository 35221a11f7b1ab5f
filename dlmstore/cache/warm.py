"""The stat records of a store's source files, with the cache entries their rows already have.

A warm pass needs two things per source file: its stat record (is it
unchanged? ``dlmstore.sources.statcache``) and the cache entry of its row
(how many tokens? ``dlmstore.cache.entries``). Read apart, that is two
100,000-row reads on a tree of 100,000 files, the second one returning
every entry's row key as a string only to match it against the first's.
The record keeps its row's key (``source_stats.row_key``), so one query
joins each record to its entry for the pass's tokenizer and sequence
length, and the lookup then asks the database only for the rows the
records do not cover (the document's own sections, files read again).

What the join gives is what :meth:`TokenCache.lookup` would have found in
the same transaction; the lookup still checks every such entry's pack on
disk and logs it as used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlmstore.sources.statcache import FileStamp, StatCache

if TYPE_CHECKING:
    from dlmstore.store.database import Store

#: A cache entry as the join gives it: ``(id, pack_id, end in the pack, token_count)``.
KnownEntry = tuple[int, int, int, int]


def load_with_entries(
    store: Store, *, tokenizer_sha256: str, sequence_len: int
) -> tuple[StatCache, dict[str, KnownEntry]]:
    """The store's stat records, and the cache entry each record's row key has (by row key)."""
    with store.read() as conn:
        cursor = conn.cursor()
        cursor.row_factory = None
        cursor.execute(
            f"SELECT {', '.join('s.' + name for name in FileStamp._fields)}, "
            "e.id, e.pack_id, e.byte_offset + e.bytes, e.token_count "
            "FROM source_stats AS s LEFT JOIN cache_entries AS e ON e.row_key = s.row_key "
            "AND e.tokenizer_sha256 = ? AND e.sequence_len = ?",
            (tokenizer_sha256, sequence_len),
        )
        rows = cursor.fetchall()
    # Each row is the record (its first ten columns) followed by the entry.
    stamps = {(row[0], row[1]): row for row in rows}
    entries = {row[9]: row[10:] for row in rows if row[10] is not None}
    return StatCache(stamps), entries


__all__ = ["KnownEntry", "load_with_entries"]

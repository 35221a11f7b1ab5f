"""Which cache entries each pass used: a log, folded into the entries' LRU marks when needed.

Every entry carries an LRU mark (``last_access_at``, ``last_run_id``):
eviction drops the oldest marks first and never the current run's, and
``dlm cache prune`` drops marks older than a cutoff. Rewriting the mark of
every entry a pass used made a warm pass over 100,000 rows write all
100,000 rows (and the LRU index) again: about half a second, to say "used
again". Instead a pass appends one row to ``cache_uses``: its run, its time
and the ids of the entries it used, packed as 64-bit integers (800 KB for
100,000 entries, one insert). The marks are brought up to date from the
log (:func:`fold`) only when something reads them:

* eviction, when the cache is over its limit (``entries.evict``);
* ``dlm cache prune`` (``admin.prune``);
* when the log holds more than :data:`FOLD_AFTER` rows, so it stays small.

A new row also deletes older rows whose ids it covers (a warm pass over an
unchanged corpus uses the same entries as the one before): their marks
would be overwritten by the newer one anyway, so the log of repeated warm
passes stays one row long and is never folded.

Folding applies, for each entry, the newest use that names it, and only
moves a mark forward (a mark newer than the use is kept), so it is
idempotent, order-free, and harmless for an id that was deleted or reused
since. Readers that ask "which entries did run R use" (``dlm report``)
combine ``last_run_id = R`` with R's unfolded rows (:func:`entries_used_by`).
"""

from __future__ import annotations

import json
import sqlite3

from dlmstore.id_arrays import pack_ids, unpack_ids

#: Fold the log into the marks once it holds more rows than this.
FOLD_AFTER = 8


def log_use(conn: sqlite3.Connection, entry_ids: list[int], *, run_id: int, used_at: str) -> None:
    """Record that ``run_id`` used ``entry_ids`` at ``used_at`` (inside the caller's write transaction).

    Older log rows whose ids all appear in ``entry_ids`` are deleted (this
    row supersedes them); past :data:`FOLD_AFTER` rows the log is folded.
    """
    if not entry_ids:
        return
    used = set(entry_ids)
    covered = [
        row_id
        for row_id, count, blob in conn.execute("SELECT id, entries, entry_ids FROM cache_uses")
        if count <= len(used) and used.issuperset(unpack_ids(blob))
    ]
    if covered:
        conn.execute(
            "DELETE FROM cache_uses WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(covered),)
        )
    conn.execute(
        "INSERT INTO cache_uses (run_id, used_at, entries, entry_ids) VALUES (?, ?, ?, ?)",
        (run_id, used_at, len(entry_ids), pack_ids(entry_ids)),
    )
    if int(conn.execute("SELECT COUNT(*) FROM cache_uses").fetchone()[0]) > FOLD_AFTER:
        fold(conn)


def fold(conn: sqlite3.Connection) -> int:
    """Move every logged use into its entries' marks and empty the log; returns the rows folded.

    Runs inside the caller's write transaction. Newest uses first: each
    entry gets the newest mark that names it, and a mark only moves forward.
    """
    rows = conn.execute("SELECT id, run_id, used_at, entry_ids FROM cache_uses ORDER BY id DESC").fetchall()
    if not rows:
        return 0
    assigned: set[int] = set()
    for _, run_id, used_at, blob in rows:
        ids = [entry_id for entry_id in unpack_ids(blob) if entry_id not in assigned]
        if not ids:
            continue
        assigned.update(ids)
        conn.execute(
            "UPDATE cache_entries SET last_access_at = ?, last_run_id = ? "
            "WHERE id IN (SELECT value FROM json_each(?)) "
            "AND (last_access_at, COALESCE(last_run_id, 0)) < (?, ?)",
            (used_at, run_id, json.dumps(ids), used_at, run_id),
        )
    conn.execute("DELETE FROM cache_uses WHERE id <= ?", (rows[0][0],))
    return len(rows)


def entries_used_by(conn: sqlite3.Connection, run_id: int) -> list[int]:
    """Ids of the entries ``run_id`` logged as used and not yet folded (the folded ones have it as ``last_run_id``)."""
    ids: list[int] = []
    for (blob,) in conn.execute("SELECT entry_ids FROM cache_uses WHERE run_id = ?", (run_id,)):
        ids.extend(unpack_ids(blob))
    return ids


__all__ = ["FOLD_AFTER", "entries_used_by", "fold", "log_use"]

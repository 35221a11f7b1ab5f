"""Skip re-reading source files a stat check proves unchanged (like git's index).

For every source file it reads, the walk remembers the file's stat fields
(size, mtime, ctime, inode), what reading it found (``ok``, ``binary`` or
``encoding``) and the section digest, in ``source_stats``. On the next run a
file whose stat fields are all unchanged gets its section from that record,
with the text loaded only if a cache miss needs it (``Section(load=...)``).

Same-second edits: a file modified within :data:`RACY_NS` of the moment it
was read can change again without its mtime moving (coarse timestamps,
edits in the same clock tick), so such a record is "racily clean" and not
trusted: the file is read again, and the record is refreshed once its mtime
is safely in the past. ctime and inode catch ``touch -d`` and replace-by-
rename, which can restore an old mtime. The lazy loader re-hashes what it
reads and refuses a file whose digest no longer matches, so a file edited
during a run is an error, never wrong tokens.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, NamedTuple

from dlmstore.document.rows import text_row_key

if TYPE_CHECKING:
    import sqlite3
    from pathlib import Path

    from dlmstore.store.database import Store

#: Records younger than this relative to the file's mtime are not trusted.
RACY_NS = 2_000_000_000


class FileStamp(NamedTuple):
    """One file as it was when last read: a ``source_stats`` row, in column order.

    A named tuple rather than a frozen dataclass, and loaded as the plain
    tuples SQLite returns (same fields, same order; :meth:`StatCache.from_connection`):
    a run loads one per source file, and building an object per row was
    most of the load's time on 100,000 files. ``row_key`` is the key of the
    file's text row (``dlmstore.document.rows.text_row_key`` of ``digest``),
    kept so that an unchanged file's key is read, not hashed again; ``None``
    for a skipped file, and in records written before it was kept.
    """

    path: str
    relpath: str
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    status: str  # ok | binary | encoding
    digest: str | None
    checked_ns: int
    row_key: str | None = None


#: A record as loaded: a plain tuple laid out as :class:`FileStamp`.
Stamp = tuple[str, str, int, int, int, int, str, "str | None", int, "str | None"]


def proves_unchanged(stamp: Stamp, st: os.stat_result) -> bool:
    """Whether ``st`` (a fresh ``stat``) proves the file is as ``stamp`` recorded it.

    Every stat field must match, and the record must not be racily clean
    (read within :data:`RACY_NS` of the file's mtime).
    """
    return (
        stamp[2] == st.st_size
        and stamp[3] == st.st_mtime_ns
        and stamp[4] == st.st_ctime_ns
        and stamp[5] == st.st_ino
        and stamp[8] - stamp[3] >= RACY_NS
    )


class StatCache:
    """The stamps of one store's source files, loaded once per run.

    ``stamps`` maps ``(path, relpath)`` to the record; a reader
    (``dlmstore.sources.read``) looks a file up there, checks it with
    :func:`proves_unchanged`, and adds the key to ``seen`` (records of files
    no run saw are dropped on :meth:`save`).
    """

    def __init__(self, stamps: dict[tuple[str, str], Stamp] | None = None) -> None:
        self.stamps = stamps or {}
        self.changed: dict[tuple[str, str], Stamp] = {}
        self.seen: set[tuple[str, str]] = set()

    def record(
        self, path: str, relpath: str, st: os.stat_result, status: str, digest: str | None, checked_ns: int
    ) -> None:
        """Remember what reading ``path`` found (saved by :meth:`save`)."""
        key = (path, relpath)
        self.seen.add(key)
        row_key = text_row_key(digest) if digest is not None else None
        stamp = FileStamp(
            path, relpath, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, status, digest, checked_ns,
            row_key,
        )  # fmt: skip
        if self.stamps.get(key) != stamp:
            self.changed[key] = stamp

    def current_of(self, files: Sequence[tuple[str, str]]) -> list[Stamp | None]:
        """The record of each ``(relpath, path)`` as :meth:`save` would leave it (new or
        changed, else as loaded), ``None`` for a file with none."""
        changed, stamps = self.changed.get, self.stamps.get
        keys = zip(map(itemgetter(1), files), map(itemgetter(0), files), strict=True)  # (path, relpath), in C
        return [changed(key) or stamps(key) for key in keys]

    def keyed(self, key: tuple[str, str], stamp: Stamp) -> str:
        """The row key of a trusted record written before keys were kept; saved with it."""
        row_key = text_row_key(stamp[7] or "")
        self.changed[key] = FileStamp._make(stamp)._replace(row_key=row_key)
        return row_key

    @classmethod
    def load(cls, store: Store) -> StatCache:
        """All records of ``store`` (one query)."""
        with store.read() as conn:
            return cls.from_connection(conn)

    @classmethod
    def load_read_only(cls, db_path: Path) -> StatCache | None:
        """All records of the store.db at ``db_path``, read without opening the store
        (``dlm show``, which never writes); ``None`` when there is no store.db or no
        ``source_stats`` table in it yet.

        Raises:
            StoreDamagedError: SQLite finds the database damaged.
        """
        from dlmstore.store.connection import read_if_there

        return read_if_there(db_path, cls.from_connection)

    @classmethod
    def from_connection(cls, conn: sqlite3.Connection) -> StatCache:
        """All records readable through ``conn`` (one query)."""
        # The rows as SQLite returns them, in FileStamp's field order: this
        # reads one row per source file on every run, and building a
        # sqlite3.Row or a FileStamp per row (or a slice) is a measurable
        # share of this load (bench/bench_tokenize.py times the warm pass).
        cursor = conn.cursor()
        cursor.row_factory = None
        rows = cursor.execute(f"SELECT {', '.join(FileStamp._fields)} FROM source_stats")
        return cls({(row[0], row[1]): row for row in rows})

    def save(self, store: Store) -> None:
        """Write new and changed records; drop records of files no run saw this time."""
        gone = self.stamps.keys() - self.seen
        if not self.changed and not gone:
            return
        with store.write() as conn:
            conn.executemany(
                "INSERT INTO source_stats (path, relpath, size, mtime_ns, ctime_ns, inode, status, digest, "
                "checked_ns, row_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (path, relpath) "
                "DO UPDATE SET size = excluded.size, mtime_ns = excluded.mtime_ns, "
                "ctime_ns = excluded.ctime_ns, inode = excluded.inode, status = excluded.status, "
                "digest = excluded.digest, checked_ns = excluded.checked_ns, row_key = excluded.row_key",
                list(self.changed.values()),
            )
            conn.executemany("DELETE FROM source_stats WHERE path = ? AND relpath = ?", gone)

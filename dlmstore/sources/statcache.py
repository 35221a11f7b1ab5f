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
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import sqlite3
    from pathlib import Path

    from dlmstore.store.database import Store

#: Records younger than this relative to the file's mtime are not trusted.
RACY_NS = 2_000_000_000


class FileStamp(NamedTuple):
    """One file as it was when last read.

    A named tuple rather than a frozen dataclass: a run loads one per source
    file, and a tuple is built in one step where a frozen dataclass sets
    each field through ``object.__setattr__`` (on 100,000 files that was a
    quarter of a second).
    """

    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    status: str  # ok | binary | encoding
    digest: str | None
    checked_ns: int


class StatCache:
    """The stamps of one store's source files, loaded once per run."""

    def __init__(self, stamps: dict[tuple[str, str], FileStamp] | None = None) -> None:
        self.stamps = stamps or {}
        self.changed: dict[tuple[str, str], FileStamp] = {}
        self.seen: set[tuple[str, str]] = set()
        self.trusted = 0

    def lookup(self, path: str, relpath: str, st: os.stat_result) -> FileStamp | None:
        """The record of ``path`` if ``st`` proves the file unchanged since, else ``None``."""
        key = (path, relpath)
        self.seen.add(key)
        stamp = self.stamps.get(key)
        if (
            stamp is None
            or stamp.size != st.st_size
            or stamp.mtime_ns != st.st_mtime_ns
            or stamp.ctime_ns != st.st_ctime_ns
            or stamp.inode != st.st_ino
            or stamp.checked_ns - stamp.mtime_ns < RACY_NS
        ):
            return None
        self.trusted += 1
        return stamp

    def record(
        self, path: str, relpath: str, st: os.stat_result, status: str, digest: str | None, checked_ns: int
    ) -> None:
        """Remember what reading ``path`` found (saved by :meth:`save`)."""
        key = (path, relpath)
        self.seen.add(key)
        stamp = FileStamp(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, status, digest, checked_ns)
        if self.stamps.get(key) != stamp:
            self.changed[key] = stamp

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
        import sqlite3

        from dlmstore.store.database import read_only

        if not db_path.is_file():
            return None
        with read_only(db_path) as conn:
            try:
                return cls.from_connection(conn)
            except sqlite3.OperationalError:  # a store from before the stat cache existed
                return None

    @classmethod
    def from_connection(cls, conn: sqlite3.Connection) -> StatCache:
        """All records readable through ``conn`` (one query)."""
        # Plain tuples, the stamp columns in FileStamp's field order: this
        # reads one row per source file on every run, and building a
        # sqlite3.Row per row and reading it by name is a measurable share
        # of this load (bench/bench_tokenize.py times the warm pass).
        cursor = conn.cursor()
        cursor.row_factory = None
        rows = cursor.execute(
            "SELECT path, relpath, size, mtime_ns, ctime_ns, inode, status, digest, checked_ns "
            "FROM source_stats"
        ).fetchall()
        make = FileStamp._make
        return cls({(row[0], row[1]): make(row[2:]) for row in rows})

    def save(self, store: Store) -> None:
        """Write new and changed records; drop records of files no run saw this time."""
        gone = [key for key in self.stamps if key not in self.seen]
        if not self.changed and not gone:
            return
        with store.write() as conn:
            conn.executemany(
                "INSERT INTO source_stats (path, relpath, size, mtime_ns, ctime_ns, inode, status, digest, "
                "checked_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (path, relpath) DO UPDATE SET "
                "size = excluded.size, mtime_ns = excluded.mtime_ns, ctime_ns = excluded.ctime_ns, "
                "inode = excluded.inode, status = excluded.status, digest = excluded.digest, "
                "checked_ns = excluded.checked_ns",
                [
                    (path, rel, s.size, s.mtime_ns, s.ctime_ns, s.inode, s.status, s.digest, s.checked_ns)
                    for (path, rel), s in self.changed.items()
                ],
            )
            conn.executemany("DELETE FROM source_stats WHERE path = ? AND relpath = ?", gone)

"""Connections to a store.db that look without opening a store: read-only, damage named.

:mod:`dlmstore.store.database` opens a store (creating, migrating and
locking it) and hands out its read and write transactions; this module is
what sits below it and below the high-water mark
(:mod:`dlmstore.store.highwater`): the file's name, how long a connection
waits for a writer, how SQLite's "this is not a sound database" is told
apart from other errors (:func:`is_damage`) and turned into one
:class:`~dlmstore.errors.StoreDamagedError` naming the file, and the
read-only connection that ``dlm stores``, ``dlm show`` and the high-water
check use to look at a database without creating, migrating or locking it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from dlmstore.errors import StoreDamagedError, StoreError

DB_NAME = "store.db"
BUSY_TIMEOUT_S = 30.0

#: SQLite's primary result codes for a file whose bytes are not a sound
#: database. Python raises both as plain ``sqlite3.DatabaseError``; busy,
#: locked, read-only and I/O errors are ``OperationalError`` with codes of
#: their own and keep their own handling.
_DAMAGE_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


def is_damage(exc: BaseException) -> bool:
    """True when ``exc`` is SQLite saying the file's bytes are not a sound database."""
    if isinstance(exc, UnicodeDecodeError):
        return _undecodable_damage(exc)
    code = getattr(exc, "sqlite_errorcode", None) if isinstance(exc, sqlite3.DatabaseError) else None
    return code is not None and code & 0xFF in _DAMAGE_CODES  # the low byte is the primary code


#: How SQLite's messages about damage begin. Garbage over the schema makes
#: SQLite quote it ("malformed database schema (<garbage>)"), and Python's
#: sqlite3 then fails to decode the message as UTF-8: a ``UnicodeDecodeError``
#: whose bytes are SQLite's message stands for the ``DatabaseError`` it was
#: meant to be. No other UTF-8 decoding inside a transaction produces these bytes.
_DAMAGE_MESSAGES = (b"malformed database schema", b"database disk image is malformed")


def _undecodable_damage(exc: UnicodeDecodeError) -> bool:
    return isinstance(exc.object, bytes) and exc.object.startswith(_DAMAGE_MESSAGES)


def damaged_error(db_path: Path, exc: BaseException) -> StoreDamagedError:
    """The error for a damaged ``db_path``: what SQLite said, and the two ways out."""
    if isinstance(exc, UnicodeDecodeError) and _undecodable_damage(exc):
        reason = bytes(exc.object).decode("utf-8", "backslashreplace")
    else:
        reason = str(exc)
    return StoreDamagedError(
        db_path,
        reason,
        hint=f"restore it from a backup, or move it aside (rename it {DB_NAME}.damaged) to start the "
        "store afresh, losing the runs, metrics, lock history and cache, adapter and dataset records "
        "it holds (the files beside it stay; the cache refills on the next run)",
    )


T = TypeVar("T")


@contextmanager
def read_only(db_path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to an existing ``db_path``, for looking without opening a store.

    Nothing is created or migrated. Rows are plain tuples.

    Raises:
        StoreDamagedError: SQLite finds the database damaged (any statement
            run inside the block).
    """
    try:
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open {db_path}: {exc}") from None
    try:
        yield conn
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        if is_damage(exc):
            raise damaged_error(db_path, exc) from None
        raise
    finally:
        conn.close()


def read_if_there(db_path: Path, read: Callable[[sqlite3.Connection], T]) -> T | None:
    """``read`` over a :func:`read_only` connection to ``db_path``; ``None`` when there is no
    store.db, or the store predates the table ``read`` asks for (``dlm show`` never migrates).

    Raises:
        StoreDamagedError: SQLite finds the database damaged.
    """
    if not db_path.is_file():
        return None
    with read_only(db_path) as conn:
        try:
            return read(conn)
        except sqlite3.OperationalError:  # no such table: an older store
            return None


def first_value(conn: sqlite3.Connection, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Any:
    """The first column of the first row ``sql`` returns; ``None`` when it returns no row."""
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]

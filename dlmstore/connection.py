"""A thin connection over ``sqlite3`` that also runs SQLAlchemy Core statements.

Why not a SQLAlchemy engine: importing SQLAlchemy costs ~140 ms, more than
everything else a warm ``dlm tokenize`` does on a 1K-file corpus. The store
therefore talks to SQLite through the standard library, and hot paths are
plain SQL (``conn.execute("SELECT ...", params)``). SQLAlchemy stays the
source of truth for the schema (``dlmstore.store.schema``), runs the migrations
(Alembic), and Core statements built from those tables can still be passed
to :meth:`Connection.execute`: they are compiled for SQLite on the spot,
importing SQLAlchemy only then.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from typing import Any


class Result:
    """The rows of one statement, with the few SQLAlchemy-style helpers we use."""

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor

    @property
    def lastrowid(self) -> int | None:
        return self._cursor.lastrowid

    @property
    def inserted_primary_key(self) -> tuple[int | None]:
        return (self._cursor.lastrowid,)

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._cursor.fetchall()

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._cursor.fetchone()

    first = fetchone

    def one(self) -> tuple[Any, ...]:
        row = self._cursor.fetchone()
        if row is None:
            raise LookupError("the statement returned no row")
        return row

    def scalar(self) -> Any:
        row = self._cursor.fetchone()
        return None if row is None else row[0]

    def mappings(self) -> list[dict[str, Any]]:
        names = [d[0] for d in self._cursor.description or ()]
        return [dict(zip(names, row, strict=True)) for row in self._cursor.fetchall()]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._cursor)


class Connection:
    """A ``sqlite3`` connection in a transaction opened by ``dlmstore.store.database.Store``."""

    def __init__(self, raw: sqlite3.Connection) -> None:
        self.raw = raw

    def execute(
        self,
        statement: Any,
        parameters: Sequence[Any] | Mapping[str, Any] | list[Mapping[str, Any]] | None = None,
    ) -> Result:
        """Run SQL text (``?`` placeholders) or a SQLAlchemy Core statement."""
        if isinstance(statement, str):
            return Result(self.raw.execute(statement, parameters or ()))
        sql, rows = _compile(statement, parameters)
        if len(rows) > 1:
            return Result(self.raw.executemany(sql, rows))
        return Result(self.raw.execute(sql, rows[0] if rows else ()))

    #: SQLAlchemy's name for running SQL text; kept so call sites read the same.
    exec_driver_sql = execute


_DIALECT: Any = None


def _compile(statement: Any, parameters: Any) -> tuple[str, list[tuple[Any, ...]]]:
    global _DIALECT
    if _DIALECT is None:
        from sqlalchemy.dialects import sqlite

        _DIALECT = sqlite.dialect(paramstyle="qmark")
    batches = parameters if isinstance(parameters, list) else [parameters or {}]
    compiled = statement.compile(dialect=_DIALECT, column_keys=list(batches[0]) if batches[0] else None)
    order = compiled.positiontup or []
    rows = []
    for batch in batches:
        params = compiled.construct_params(batch or None)
        rows.append(tuple(_plain(params[name]) for name in order))
    return compiled.string, rows


def _plain(value: Any) -> Any:
    if callable(value):  # a column default given as a Python callable
        return value()
    return value

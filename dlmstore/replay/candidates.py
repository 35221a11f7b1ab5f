"""Which history rows a run could replay: those the document no longer holds, and not superseded.

A history row is a **candidate** when its key is absent from the current
document's rows, it is not in the retention slice, and it is not
**superseded**: its ``supersede_key`` (a Q/A pair's question, a preference
triple's prompt, a ``training.sources`` file's path) is still in the
document, with another row key. An edited answer is the document's
correction of the old one, so the old one is never replayed; a prose
section, a pair or a file that was removed is.

An unchanged document has no candidates: every history row is still in it.

Each question is one SQL statement over ``history_rows`` with the
document's keys passed as JSON (``json_each``, as the cache looks up its
entries), so 1,000,000 history rows are answered in SQLite, not in Python
(``bench/bench_replay.py``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Current:
    """The current document's rows as the candidates query needs them: keys and supersede keys."""

    row_keys: tuple[str, ...]
    supersede_keys: tuple[str, ...]

    @classmethod
    def of(cls, pairs: Sequence[tuple[str, str | None]]) -> Current:
        return cls(
            tuple(key for key, _ in pairs), tuple(sorted({sup for _, sup in pairs if sup is not None}))
        )


@dataclass(frozen=True)
class Candidate:
    """A history row the next run could replay."""

    row_key: str
    kind: str
    origin: str
    probe: bool
    last_generation: int


_ABSENT = (
    "h.row_key NOT IN (SELECT value FROM json_each(:keys)) "
    "AND (h.supersede_key IS NULL OR h.supersede_key NOT IN (SELECT value FROM json_each(:supersede)))"
)


def _params(current: Current) -> dict[str, str]:
    return {"keys": json.dumps(current.row_keys), "supersede": json.dumps(current.supersede_keys)}


def candidates(conn: sqlite3.Connection, current: Current) -> list[Candidate]:
    """The candidates, in ``row_key`` order."""
    query = (
        "SELECT h.row_key, h.kind, h.origin, h.probe, h.last_generation FROM history_rows AS h "
        f"WHERE h.retention = 0 AND {_ABSENT}"
    )
    found = [Candidate(r[0], r[1], r[2], bool(r[3]), r[4]) for r in conn.execute(query, _params(current))]
    found.sort(key=lambda c: c.row_key)  # in Python: SQLite's ORDER BY walks the key index, 3x slower
    return found


def candidate_pairs(conn: sqlite3.Connection, current: Current, *, preference: bool) -> list[tuple[str, int]]:
    """``(row_key, last_generation)`` of the SFT (or preference) candidates, in no order (the draw
    sorts them): what :func:`dlmstore.replay.draw.draw` takes."""
    kinds = "h.kind = 'preference'" if preference else "h.kind <> 'preference'"
    query = (
        f"SELECT h.row_key, h.last_generation FROM history_rows AS h "
        f"WHERE h.retention = 0 AND {kinds} AND {_ABSENT}"
    )
    return [(r[0], r[1]) for r in conn.execute(query, _params(current))]


@dataclass(frozen=True)
class Superseded:
    """A history row an edit replaced, and the current row that replaced it."""

    row_key: str
    kind: str
    origin: str
    supersede_key: str
    by_row_key: str
    last_generation: int


def superseded(conn: sqlite3.Connection, current: Sequence[tuple[str, str | None]]) -> list[Superseded]:
    """History rows absent from the document whose supersede key it still holds, by ``row_key``.

    ``current`` is the document's ``(row_key, supersede_key)`` pairs; the
    first current row with the same supersede key is named as what replaced it.
    """
    by: dict[str, str] = {}
    for key, sup in current:
        if sup is not None:
            by.setdefault(sup, key)
    query = (
        "SELECT h.row_key, h.kind, h.origin, h.supersede_key, h.last_generation FROM history_rows AS h "
        "WHERE h.supersede_key IN (SELECT value FROM json_each(:supersede)) "
        "AND h.row_key NOT IN (SELECT value FROM json_each(:keys)) ORDER BY h.row_key"
    )
    params = {"keys": json.dumps([key for key, _ in current]), "supersede": json.dumps(sorted(by))}
    return [Superseded(r[0], r[1], r[2], r[3], by[r[3]], r[4]) for r in conn.execute(query, params)]

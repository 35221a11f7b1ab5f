"""Which history rows a run could replay: those the document no longer holds, and not superseded.

A history row is a **candidate** when its key is absent from the current
document's rows, it is not in the retention slice, and it is not
**superseded**: its ``supersede_key`` (a Q/A pair's question, a preference
triple's prompt, a ``training.sources`` file's path) is still in the
document, with another row key. An edited answer is the document's
correction of the old one, so the old one is never replayed; a prose
section, a pair or a file that was removed is.

An unchanged document has no candidates: every history row is still in it.

The draw's candidates (:func:`candidate_pool`) are read in one scan of
``history_rows`` whose two ``group_concat`` columns (the keys' bytes, the
last generations) land in numpy arrays, and one more that finds the
superseded keys in SQL; those and the document's keys are taken out in
numpy (``np.isin``), not by a per-row ``NOT IN`` probe in SQL, which cost
1.7 s over 1,000,000 rows (``bench/bench_replay.py``). ``dlm replay show``
lists them row by row (:func:`candidates`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlmstore.replay.history import BODY, KEYS, KINDS, digest, keys_params, row_key_of

if TYPE_CHECKING:
    from dlmstore.replay.draw import Pool


@dataclass(frozen=True)
class Current:
    """The current document's rows as the candidates query needs them: keys and supersede keys."""

    row_keys: tuple[str, ...]
    supersede_keys: tuple[int, ...]

    @classmethod
    def of(cls, pairs: Sequence[tuple[str, int | None]]) -> Current:
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


def candidates(conn: sqlite3.Connection, current: Current) -> list[Candidate]:
    """The candidates, in ``row_key`` order."""
    keys = {digest(key) for key in current.row_keys}
    supersede = set(current.supersede_keys)
    found = [
        Candidate(row_key_of(r[0]), KINDS[r[1]], BODY if r[2] is None else r[2], bool(r[3]), r[4])
        for r in conn.execute(
            "SELECT key, kind, source, probe, last_generation, supersede FROM history_rows "
            "WHERE retention = 0 ORDER BY key"
        )
        if r[0] not in keys and r[5] not in supersede
    ]
    return found


def absent(conn: sqlite3.Connection, current: Current, condition: str, *, order: str = "key") -> list[str]:
    """The keys of the history rows matching the SQL ``condition`` that the document no longer holds
    and that are not superseded, in ``order``."""
    keys = {digest(key) for key in current.row_keys}
    supersede = set(current.supersede_keys)
    return [
        row_key_of(r[0])
        for r in conn.execute(f"SELECT key, supersede FROM history_rows WHERE {condition} ORDER BY {order}")
        if r[0] not in keys and r[1] not in supersede
    ]


def candidate_pool(conn: sqlite3.Connection, current: Current, *, preference: bool) -> Pool:
    """The SFT (or preference) candidates as the arrays :func:`dlmstore.replay.draw.draw` takes.

    One scan returns every key outside the retention slice as one byte
    string (``group_concat`` of the 32-byte blobs, read as bytes: no hex
    round trip) with their last generations; a second, in SQL, finds the
    superseded ones (their supersede key is the document's). Those and the
    document's own keys are taken out in numpy, by their first 8 bytes,
    then confirmed on all 32.
    """
    import numpy as np

    from dlmstore.replay.draw import Pool

    kinds = "kind = 2" if preference else "kind <> 2"
    factory = conn.text_factory
    conn.text_factory = bytes  # the keys' bytes as they are (the database is UTF-8: nothing is converted)
    try:
        blob, generations = conn.execute(
            f"SELECT group_concat(key, ''), group_concat(last_generation) FROM history_rows "
            f"WHERE retention = 0 AND {kinds}"
        ).fetchone()
        superseded = [
            bytes(row[0])
            for row in conn.execute(
                f"SELECT key FROM history_rows WHERE retention = 0 AND {kinds} "
                "AND supersede IN (SELECT value FROM json_each(:supersede))",
                {"supersede": json.dumps(current.supersede_keys)},
            )
        ] if current.supersede_keys else []  # fmt: skip
    finally:
        conn.text_factory = factory
    if blob is None:
        return Pool(np.zeros((0, 32), dtype=np.uint8), np.zeros(0, dtype=np.int64))
    lasts = np.array(generations.split(b","), dtype=np.int64)
    if len(blob) != 32 * len(lasts):  # not what SQLite returns for blobs in a UTF-8 database
        raise RuntimeError("history_rows.key did not read back as 32-byte blobs")
    keys = np.frombuffer(blob, dtype=np.uint8).reshape(-1, 32)
    keep = np.ones(len(lasts), dtype=bool)
    out = [*superseded, *(digest(key) for key in current.row_keys)]
    if out:
        held = np.frombuffer(b"".join(out), dtype=np.uint8).reshape(-1, 32)
        maybe = np.flatnonzero(
            np.isin(keys[:, :8].copy().view("<u8")[:, 0], held[:, :8].copy().view("<u8")[:, 0])
        )
        exact = set(out)
        for index in maybe.tolist():
            if bytes(keys[index]) in exact:
                keep[index] = False
    return Pool(keys[keep], lasts[keep])


@dataclass(frozen=True)
class Superseded:
    """A history row an edit replaced, and the current row that replaced it."""

    row_key: str
    kind: str
    origin: str
    supersede_key: int
    by_row_key: str
    last_generation: int


def superseded(conn: sqlite3.Connection, current: Sequence[tuple[str, int | None]]) -> list[Superseded]:
    """History rows absent from the document whose supersede key it still holds, by ``row_key``.

    ``current`` is the document's ``(row_key, supersede_key)`` pairs; the
    first current row with the same supersede key is named as what replaced it.
    """
    by: dict[int, str] = {}
    for key, sup in current:
        if sup is not None:
            by.setdefault(sup, key)
    query = (
        "SELECT key, kind, source, supersede, last_generation FROM history_rows "
        f"WHERE supersede IN (SELECT value FROM json_each(:supersede)) AND key NOT IN ({KEYS}) ORDER BY key"
    )
    params = {"supersede": json.dumps(sorted(by)), **keys_params(key for key, _ in current)}
    return [
        Superseded(row_key_of(r[0]), KINDS[r[1]], BODY if r[2] is None else r[2], r[3], by[r[3]], r[4])
        for r in conn.execute(query, params)
    ]

"""The replay history: every row a completed ``dlm train`` trained on, recorded by content.

Issue 38 asks that an edited document retrain without forgetting what its
earlier versions taught. This module is the record that makes it possible:
``history_rows`` holds one row per trained row key (its kind, where it came
from, what an edit of it replaces, the runs and generations that trained
it) and ``history_content`` its canonical JSON, zlib-compressed, so that it
can be tokenized again after a base-model or ``sequence_len`` change or a
``dlm cache clear``. Tokens stay in the cache: history never holds them.

**What is recorded.** Exactly what the run trained: the SFT train rows
(after the validation split and ``training.dedup``'s drops; never val rows,
never token-dataset rows) and the preference triples when the preference
phase ran. It is written in the transaction that publishes the run's
adapters and lock (``dlmstore.train.stages.publish``), so a run killed at
any point leaves no history and a completed one always has it.

**Generations.** A generation is one version of the document as trained:
a completed run whose trained row keys equal the latest generation's joins
it, any other opens the next. Retraining an unchanged document therefore
changes nothing the draw depends on (``dlmstore.replay.draw``), and no
clock is read anywhere.

**Speed.** The content of a row is read (a source file loaded) and
compressed only when its key is new to history, before the transaction
(:func:`pending`). A row already there only has its last run and
generation moved, by one ``UPDATE ... FROM json_each(?)`` for all of them:
a warm retrain of a 13K-file document makes no per-row round trip
(``bench/bench_replay.py`` measures it).

**Retention slice.** Whether a row belongs to the slice that is held out
of the draw (to measure forgetting later) is decided once, as it enters,
from its key alone: ``sha256(b"retention\\0" + row_key)``'s first 8 bytes
below ``retention_fraction * 2**64``. When the slice would stay empty, the
entering row with the smallest such hash joins it. It is never recomputed.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import zlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from dlmstore.clock import utc_now
from dlmstore.document.rows import Row, canonical_json

if TYPE_CHECKING:
    from dlmstore.corpus.assemble import Corpus
    from dlmstore.document.frontmatter import ReplaySettings
    from dlmstore.store.database import Store

#: zlib's level for history content: level 9 saves about 1% more for twice the time.
CONTENT_LEVEL = 6

BODY = "body"

_BUCKETS = 1 << 64


@dataclass(frozen=True)
class TrainedRow:
    """A row of the document as history describes it; its data is read only when history needs it.

    Attributes:
        row: the row (its ``data`` loads a source file's text when asked).
        supersede_key: what an edit of it replaces (see :func:`supersede_key`).
        origin: ``body``, or the ``training.sources`` file (``directive/relpath``).
        probe: the row is a ``### Q !probe`` pair.
    """

    row: Row
    supersede_key: str | None
    origin: str
    probe: bool

    @property
    def row_key(self) -> str:
        return self.row.row_key


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def supersede_key(row: Row, origin: str) -> str | None:
    """What an edit of ``row`` replaces: the thing that stays when its content changes.

    ``question:`` and the sha256 of a Q/A pair's first user message,
    ``prompt:`` and the sha256 of a preference triple's prompt, ``source:``
    and the sha256 of a ``training.sources`` file's path; ``None`` for prose
    written in the body (it has no identity but its text).
    """
    if row.kind == "messages":
        first = next((m["content"] for m in row.data["messages"] if m["role"] == "user"), "")
        return "question:" + _sha(first)
    if row.kind == "preference":
        return "prompt:" + _sha(row.data["prompt"])
    if origin != BODY:
        return "source:" + _sha(origin)
    return None


def describe(corpus: Corpus, probe_keys: Collection[str]) -> list[TrainedRow]:
    """Every row of ``corpus`` as history records it, in corpus order (no source file is read).

    A source file's origin is its directive as written in the frontmatter
    joined with its path below the directive's root: it stays the same when
    the document's folder moves, and names the file ``dlm replay show`` lists.
    """
    rows = corpus.rows()
    origins: list[str] = []
    for provenance in corpus.expansion.provenance:
        origins.extend([provenance.directive] * provenance.files_included)
    sources = corpus.source_sections
    first_source = len(rows) - len(sources)  # source sections come last, one text row each
    described: list[TrainedRow] = []
    for index, row in enumerate(rows):
        origin = BODY
        if index >= first_source:
            position = index - first_source
            relpath = sources[position].source or ""
            origin = str(PurePosixPath(origins[position]) / relpath) if position < len(origins) else relpath
        described.append(TrainedRow(row, supersede_key(row, origin), origin, row.row_key in probe_keys))
    return described


def encode(kind: str, data: dict[str, Any]) -> bytes:
    """The canonical JSON of a row, as UTF-8: what ``content_sha256`` and ``bytes`` describe."""
    return canonical_json({"kind": kind, "data": data}).encode("utf-8", "surrogatepass")


def content_sha256(payload: bytes) -> str:
    return "sha256:" + hashlib.sha256(payload).hexdigest()


class DamagedContent(ValueError):
    """A history row's stored content does not decompress, parse, or match its sha256."""


def decode(content: bytes, expected_sha256: str) -> tuple[str, dict[str, Any]]:
    """The ``(kind, data)`` of stored ``content``, checked against ``expected_sha256``.

    Raises:
        DamagedContent: it does not decompress, is not the JSON history
            writes, or its sha256 differs.
    """
    try:
        payload = zlib.decompress(content)
    except zlib.error as exc:
        raise DamagedContent(f"does not decompress ({exc})") from None
    found = content_sha256(payload)
    if found != expected_sha256:
        raise DamagedContent(f"content is {found}, recorded {expected_sha256}")
    try:
        value = json.loads(payload.decode("utf-8", "surrogatepass"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedContent(f"is not JSON ({exc})") from None
    if not isinstance(value, dict) or not isinstance(value.get("data"), dict):
        raise DamagedContent("is not a history row's JSON")
    return str(value.get("kind")), value["data"]


def retention_hash(row_key: str) -> int:
    """The 64-bit number that decides, once, whether a row joins the retention slice."""
    return int.from_bytes(hashlib.sha256(b"retention\0" + row_key.encode()).digest()[:8], "big")


def rows_sha256(row_keys: Iterable[str]) -> str:
    """The identity of a set of row keys (a generation's)."""
    return "sha256:" + hashlib.sha256("\n".join(sorted(row_keys)).encode()).hexdigest()


@dataclass(frozen=True)
class Pending:
    """What a run will record, prepared before its publish transaction.

    Attributes:
        rows: every row the run trained (new to history or not), in order.
        new: of those, the keys history did not hold, with their
            ``(uncompressed bytes, content sha256, compressed content)``.
        current_keys: every row key of the document now (eviction keeps them).
        settings: ``training.replay``: the retention fraction and the byte cap.
    """

    rows: tuple[TrainedRow, ...]
    new: dict[str, tuple[int, str, bytes]]
    current_keys: tuple[str, ...]
    settings: ReplaySettings


def pending(
    store: Store, trained: Sequence[TrainedRow], current_keys: Iterable[str], settings: ReplaySettings
) -> Pending:
    """Read which of ``trained`` history lacks and compress their content (outside any write transaction).

    Only the rows new to history have their ``data`` read: a source file
    already recorded is not loaded again.
    """
    unique: dict[str, TrainedRow] = {}
    for item in trained:
        unique.setdefault(item.row_key, item)
    with store.read() as conn:
        missing = {
            row[0]
            for row in conn.execute(
                "SELECT value FROM json_each(?) WHERE value NOT IN (SELECT row_key FROM history_rows)",
                (json.dumps(list(unique)),),
            )
        }
    new: dict[str, tuple[int, str, bytes]] = {}
    for key, item in unique.items():
        if key in missing:
            payload = encode(item.row.kind, item.row.data)
            new[key] = (len(payload), content_sha256(payload), zlib.compress(payload, CONTENT_LEVEL))
    return Pending(tuple(unique.values()), new, tuple(current_keys), settings)


def record_run(conn: sqlite3.Connection, run_id: int, pending: Pending) -> int:
    """Record that run ``run_id`` trained ``pending.rows``, inside the caller's write transaction.

    Returns:
        The generation the run belongs to.
    """
    keys = [item.row_key for item in pending.rows]
    identity = rows_sha256(keys)
    latest = conn.execute(
        "SELECT generation, rows_sha256 FROM history_generations ORDER BY generation DESC LIMIT 1"
    ).fetchone()
    if latest is not None and latest[1] == identity:
        generation = int(latest[0])
    else:
        generation = 1 if latest is None else int(latest[0]) + 1
        conn.execute(
            "INSERT INTO history_generations (generation, rows_sha256, rows, first_run_id, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (generation, identity, len(keys), run_id, utc_now()),
        )
    conn.execute("INSERT INTO history_runs (run_id, generation) VALUES (?, ?)", (run_id, generation))
    _insert_new(conn, run_id, generation, pending, pending.settings.retention_fraction)
    # Every trained row, new or not, in one statement: the warm path of an unchanged document.
    conn.execute(
        "UPDATE history_rows SET last_run_id = ?, last_generation = ?, origin = j.value ->> 1, "
        "supersede_key = j.value ->> 2, probe = j.value ->> 3 "
        "FROM json_each(?) AS j WHERE history_rows.row_key = j.value ->> 0",
        (
            run_id,
            generation,
            json.dumps([[i.row_key, i.origin, i.supersede_key, int(i.probe)] for i in pending.rows]),
        ),
    )
    evict(conn, pending.current_keys, pending.settings.max_bytes)
    return generation


def _insert_new(
    conn: sqlite3.Connection, run_id: int, generation: int, pending: Pending, fraction: float
) -> None:
    """Insert the rows new to history with their content, and decide their retention once."""
    if not pending.new:
        return
    threshold = int(fraction * _BUCKETS)
    hashes = {key: retention_hash(key) for key in pending.new}
    new = [item for item in pending.rows if item.row_key in pending.new]
    conn.executemany(
        "INSERT OR IGNORE INTO history_rows (row_key, kind, supersede_key, origin, probe, retention, "
        "first_run_id, last_run_id, first_generation, last_generation, bytes, content_sha256) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                item.row_key,
                item.row.kind,
                item.supersede_key,
                item.origin,
                int(item.probe),
                int(hashes[item.row_key] < threshold),
                run_id,
                run_id,
                generation,
                generation,
                pending.new[item.row_key][0],
                pending.new[item.row_key][1],
            )  # fmt: skip
            for item in new
        ],
    )
    # OR IGNORE: a row another run recorded meanwhile has its content already.
    conn.executemany(
        "INSERT OR IGNORE INTO history_content (history_id, content) "
        "SELECT id, ? FROM history_rows WHERE row_key = ?",
        [(pending.new[item.row_key][2], item.row_key) for item in new],
    )
    if fraction > 0:
        empty = conn.execute("SELECT NOT EXISTS (SELECT 1 FROM history_rows WHERE retention = 1)").fetchone()[
            0
        ]
        if empty:
            chosen = min(pending.new, key=lambda key: (hashes[key], key))
            conn.execute("UPDATE history_rows SET retention = 1 WHERE row_key = ?", (chosen,))


def evict(conn: sqlite3.Connection, current_keys: Sequence[str], max_bytes: int) -> int:
    """Remove history rows the document no longer holds while the history is over ``max_bytes``.

    The oldest last generation goes first, then the smallest id; rows the
    document still holds are never evicted. Returns the rows removed.
    """
    total = conn.execute("SELECT COALESCE(SUM(bytes), 0) FROM history_rows").fetchone()[0]
    excess = int(total) - max_bytes
    if excess <= 0:
        return 0
    cursor = conn.execute(
        "DELETE FROM history_rows WHERE id IN (SELECT id FROM (SELECT id, bytes, "
        "SUM(bytes) OVER (ORDER BY last_generation, id) AS freed FROM history_rows "
        "WHERE row_key NOT IN (SELECT value FROM json_each(?))) WHERE freed - bytes < ?)",
        (json.dumps(list(current_keys)), excess),
    )
    return cursor.rowcount


@dataclass(frozen=True)
class HistoryRow:
    """A history row read back, with its content."""

    row_key: str
    kind: str
    supersede_key: str | None
    origin: str
    probe: bool
    retention: bool
    first_run_id: int
    last_run_id: int
    first_generation: int
    last_generation: int
    data: dict[str, Any]


def read_rows(conn: sqlite3.Connection, row_keys: Iterable[str] | None = None) -> list[HistoryRow]:
    """History rows (all, or those keyed ``row_keys``) by id, their content decoded and checked.

    Raises:
        DamagedContent: a row's content is damaged (``dlm cache verify`` finds and removes such rows).
    """
    query = (
        "SELECT h.row_key, h.kind, h.supersede_key, h.origin, h.probe, h.retention, h.first_run_id, "
        "h.last_run_id, h.first_generation, h.last_generation, h.content_sha256, c.content "
        "FROM history_rows AS h JOIN history_content AS c ON c.history_id = h.id"
    )
    params: tuple[Any, ...] = ()
    if row_keys is not None:
        query += " WHERE h.row_key IN (SELECT value FROM json_each(?))"
        params = (json.dumps(list(row_keys)),)
    rows: list[HistoryRow] = []
    for found in conn.execute(query + " ORDER BY h.id", params):
        kind, data = decode(found[11], found[10])
        rows.append(
            HistoryRow(
                found[0],
                kind,
                found[2],
                found[3],
                bool(found[4]),
                bool(found[5]),
                found[6],
                found[7],
                found[8],
                found[9],
                data,
            )  # fmt: skip
        )
    return rows


def damaged(conn: sqlite3.Connection) -> list[tuple[int, str, str]]:
    """``(id, row_key, what is wrong)`` of every history row whose stored content is damaged."""
    found: list[tuple[int, str, str]] = []
    query = (
        "SELECT h.id, h.row_key, h.content_sha256, c.content FROM history_rows AS h "
        "LEFT JOIN history_content AS c ON c.history_id = h.id ORDER BY h.id"
    )
    for row in conn.execute(query):
        if row[3] is None:
            found.append((row[0], row[1], "has no content"))
            continue
        try:
            decode(row[3], row[2])
        except DamagedContent as exc:
            found.append((row[0], row[1], str(exc)))
    return found

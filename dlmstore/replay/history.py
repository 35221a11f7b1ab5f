"""The replay history: every row a completed ``dlm train`` trained on, recorded by content.

Issue 38 asks that an edited document retrain without forgetting what its
earlier versions taught. This module is the record that makes it possible:
``history_rows`` holds one row per trained row key (its kind, where it came
from, what an edit of it replaces, the generations that trained it) and
``history_content`` its canonical JSON, zlib-compressed, so that it can be
tokenized again after a base-model or ``sequence_len`` change or a
``dlm cache clear``. Tokens stay in the cache: history never holds them.

**What is recorded.** Exactly what the run trained: the SFT train rows
(after the validation split and ``training.dedup``'s drops; never val rows,
never token-dataset rows) and the preference triples when the preference
phase ran. It is written in the transaction that publishes the run's
adapters and lock (``dlmstore.train.stages.publish``), so a run killed at
any point leaves no history and a completed one always has it.

**Generations.** A generation is one version of the document as trained:
a completed run whose trained row keys (in the order trained) equal the
latest generation's joins it, any other opens the next. Retraining an
unchanged document therefore changes nothing the draw depends on
(``dlmstore.replay.draw``), and no clock is read anywhere. The runs that
trained a row are those of its generations (``history_runs``), so they are
not stored per row.

**Layout and speed** (issue 38: 1,000,000 rows; ``bench/bench_replay.py``).
A key is stored once, as its 32-byte digest, in the primary key of a
WITHOUT ROWID table; the supersede key is an 8-byte integer and the
content check a CRC-32 (of the key digest then the content, so content
under the wrong row is found too). An unchanged retrain is found by its
identity alone (:func:`pending` compares it with the latest generation's)
and records one ``history_runs`` row: no row key is looked up and no
history row is written. A run that trains another row set has its new
rows' content read (a source file loaded) and compressed before the
transaction, and moves the last generation of every row it trained in
one ``UPDATE``.

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
from collections.abc import Callable, Collection, Iterable, Sequence
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

#: ``history_rows.kind``: the row kinds as stored (the view ``history`` shows the words).
KINDS = ("text", "messages", "preference")

_BUCKETS = 1 << 64
_PREFIX = "sha256:"

#: The keys of a statement's ``:keys`` blob (32-byte digests one after another, ``:count`` of them) as
#: rows: SQLite 3.40 has no ``unhex``, and JSON cannot carry blobs.
KEYS = (
    "WITH RECURSIVE i(n) AS (SELECT 0 WHERE :count > 0 UNION ALL SELECT n + 1 FROM i WHERE n + 1 < :count) "
    "SELECT substr(:keys, n * 32 + 1, 32) FROM i"
)


def digest(row_key: str) -> bytes:
    """The 32-byte digest a ``sha256:`` row key names (what ``history_rows.key`` holds).

    Raises:
        ValueError: ``row_key`` is not ``sha256:`` and 64 hex digits.
    """
    if not row_key.startswith(_PREFIX) or len(row_key) != 71:
        raise ValueError(f"not a row key: {row_key!r}")
    return bytes.fromhex(row_key[7:])


def row_key_of(key: bytes) -> str:
    """The row key whose digest is ``key``."""
    return _PREFIX + key.hex()


def keys_params(row_keys: Iterable[str]) -> dict[str, object]:
    """The ``:keys`` and ``:count`` parameters of :data:`KEYS` for ``row_keys``."""
    blobs = [digest(key) for key in row_keys]
    return {"keys": b"".join(blobs), "count": len(blobs)}


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
    supersede_key: int | None
    origin: str
    probe: bool

    @property
    def row_key(self) -> str:
        return self.row.row_key


def _int64(material: str) -> int:
    """The first 8 bytes of the sha256 of ``material``, signed, never 0 (0 stands for none in bulk reads)."""
    value = int.from_bytes(hashlib.sha256(material.encode("utf-8", "surrogatepass")).digest()[:8], "big")
    value -= (value >> 63) << 64
    return value or 1


def supersede_key(row: Row, origin: str) -> int | None:
    """What an edit of ``row`` replaces: the thing that stays when its content changes.

    The first 8 bytes of the sha256 of ``question\\0`` and a Q/A pair's first
    user message, of ``prompt\\0`` and a preference triple's prompt, of
    ``source\\0`` and a ``training.sources`` file's path; ``None`` for prose
    written in the body (it has no identity but its text). Two different
    questions share a value with probability 2**-64 a pair; the cost of it
    is that a removed row whose value equals a current row's is taken for
    superseded, and not replayed (about 1e-9 over 1,000,000 history rows
    and a 13,000-row document).
    """
    if row.kind == "messages":
        first = next((m["content"] for m in row.data["messages"] if m["role"] == "user"), "")
        return _int64("question\0" + first)
    if row.kind == "preference":
        return _int64("prompt\0" + row.data["prompt"])
    if origin != BODY:
        return _int64("source\0" + origin)
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
        # Each directive as PurePosixPath writes it, once: joined below to 13,000 paths, it was most
        # of this function's time.
        origins.extend([str(PurePosixPath(provenance.directive))] * provenance.files_included)
    sources = corpus.source_sections
    first_source = len(rows) - len(sources)  # source sections come last, one text row each
    described: list[TrainedRow] = []
    for index, row in enumerate(rows):
        origin = BODY
        if index >= first_source:
            position = index - first_source
            relpath = sources[position].source or ""
            origin = _joined(origins[position], relpath) if position < len(origins) else relpath
        described.append(TrainedRow(row, supersede_key(row, origin), origin, row.row_key in probe_keys))
    return described


def _joined(directive: str, relpath: str) -> str:
    """``str(PurePosixPath(directive) / relpath)`` for a directive already written so, by string
    concatenation where that gives the same (a plain relative path below a plain directive)."""
    if (
        not relpath
        or directive in (".", "")
        or directive.endswith("/")
        or relpath.startswith("/")
        or relpath.endswith("/")
        or "//" in relpath
        or relpath.startswith("./")
        or "/./" in relpath
        or relpath == "."
    ):
        return str(PurePosixPath(directive) / relpath)
    return f"{directive}/{relpath}"


def encode(kind: str, data: dict[str, Any]) -> bytes:
    """The canonical JSON of a row, as UTF-8: what ``bytes`` and ``checksum`` describe."""
    return canonical_json({"kind": kind, "data": data}).encode("utf-8", "surrogatepass")


def checksum(key: bytes, payload: bytes) -> int:
    """CRC-32 of the key digest then ``payload``, less 2**31 (SQLite keeps it in 4 bytes)."""
    return zlib.crc32(payload, zlib.crc32(key)) - (1 << 31)


class DamagedContent(ValueError):
    """A history row's stored content does not decompress, parse, or match its checksum."""


def decode(key: bytes, content: bytes, expected: int) -> tuple[str, dict[str, Any]]:
    """The ``(kind, data)`` of the stored ``content`` of the row ``key``, checked against ``expected``.

    Raises:
        DamagedContent: it does not decompress, is not the JSON history
            writes, or its checksum differs.
    """
    try:
        payload = zlib.decompress(content)
    except zlib.error as exc:
        raise DamagedContent(f"does not decompress ({exc})") from None
    found = checksum(key, payload)
    if found != expected:
        raise DamagedContent(f"content checksum is {found}, recorded {expected}")
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


def rows_sha256(row_keys: Sequence[str]) -> str:
    """The identity of the row keys a run trained, in the order trained (a generation's)."""
    return "sha256:" + hashlib.sha256("\n".join(row_keys).encode()).hexdigest()


@dataclass(frozen=True)
class New:
    """A row new to history, prepared: its content's size and checksum, and the content compressed."""

    size: int
    checksum: int
    content: bytes


@dataclass(frozen=True)
class Pending:
    """What a run will record, prepared before its publish transaction.

    Attributes:
        identity: :func:`rows_sha256` of the keys the run trained.
        row_keys: those keys, in the order trained (distinct, as a corpus's are).
        described: the document's rows as history describes them
            (:func:`describe`; called only when history needs them).
        rows: the trained rows, described, and ``new``: those history did
            not hold, prepared; both ``None`` when the run trained the latest
            generation's rows (nothing was described or looked up:
            :func:`record_run` does it if history moved since).
        settings: ``training.replay``: the retention fraction and the byte cap.
    """

    identity: str
    row_keys: tuple[str, ...]
    described: Callable[[], Sequence[TrainedRow]]
    rows: tuple[TrainedRow, ...] | None
    new: dict[str, New] | None
    settings: ReplaySettings


def _latest(conn: sqlite3.Connection) -> tuple[int, str] | None:
    found = conn.execute(
        "SELECT generation, rows_sha256 FROM history_generations ORDER BY generation DESC LIMIT 1"
    ).fetchone()
    return None if found is None else (int(found[0]), str(found[1]))


def _prepare_new(conn: sqlite3.Connection, rows: Sequence[TrainedRow]) -> dict[str, New]:
    """The rows of ``rows`` history lacks, their content read and compressed."""
    held = {
        row_key_of(found[0])
        for found in conn.execute(
            f"SELECT key FROM history_rows WHERE key IN ({KEYS})", keys_params(item.row_key for item in rows)
        )
    }
    new: dict[str, New] = {}
    for item in rows:
        if item.row_key not in held:
            payload = encode(item.row.kind, item.row.data)
            new[item.row_key] = New(
                len(payload), checksum(digest(item.row_key), payload), zlib.compress(payload, CONTENT_LEVEL)
            )
    return new


def _trained(described: Sequence[TrainedRow], row_keys: Sequence[str]) -> tuple[TrainedRow, ...]:
    """The rows keyed ``row_keys`` of ``described``, in that order."""
    by_key = {item.row_key: item for item in described}
    return tuple(by_key[key] for key in row_keys)


def pending(
    store: Store,
    row_keys: Sequence[str],
    described: Callable[[], Sequence[TrainedRow]],
    settings: ReplaySettings,
) -> Pending:
    """Prepare what a run that trained ``row_keys`` records (outside any write transaction).

    A run that trains the latest generation's rows (an unchanged document)
    costs one digest of its keys and one read of that generation's
    identity: ``described`` is not called. Otherwise the rows new to
    history have their content read (a source file already recorded is not
    loaded again) and compressed.
    """
    keys = tuple(row_keys)  # distinct: a corpus's row keys are
    identity = rows_sha256(keys)
    with store.read() as conn:
        latest = _latest(conn)
        if latest is not None and latest[1] == identity:
            return Pending(identity, keys, described, None, None, settings)
        rows = _trained(described(), keys)
        return Pending(identity, keys, described, rows, _prepare_new(conn, rows), settings)


def record_run(conn: sqlite3.Connection, run_id: int, pending: Pending) -> int:
    """Record that run ``run_id`` trained ``pending.row_keys``, inside the caller's write transaction.

    Returns:
        The generation the run belongs to.
    """
    latest = _latest(conn)
    if latest is not None and latest[1] == pending.identity:
        # The latest generation's rows again: the run joins it, and no history row changes.
        conn.execute("INSERT INTO history_runs (run_id, generation) VALUES (?, ?)", (run_id, latest[0]))
        return latest[0]
    generation = 1 if latest is None else latest[0] + 1
    conn.execute(
        "INSERT INTO history_generations (generation, rows_sha256, rows, first_run_id, created_at) "
        "VALUES (?, ?, ?, ?, ?)",
        (generation, pending.identity, len(pending.row_keys), run_id, utc_now()),
    )
    conn.execute("INSERT INTO history_runs (run_id, generation) VALUES (?, ?)", (run_id, generation))
    # Prepared before the transaction, unless history moved since (then prepared here).
    rows = _trained(pending.described(), pending.row_keys) if pending.rows is None else pending.rows
    new = _prepare_new(conn, rows) if pending.new is None else pending.new
    conn.execute(
        f"UPDATE history_rows SET last_generation = :generation WHERE key IN ({KEYS})",
        {"generation": generation, **keys_params(pending.row_keys)},
    )
    _insert_new(conn, generation, rows, new, pending.settings.retention_fraction)
    if new:
        evict(conn, [item.row_key for item in pending.described()], pending.settings.max_bytes)
    return generation


def _insert_new(
    conn: sqlite3.Connection,
    generation: int,
    rows: Sequence[TrainedRow],
    new: dict[str, New],
    fraction: float,
) -> None:
    """Insert the rows new to history with their content, and decide their retention once."""
    entering = [item for item in rows if item.row_key in new]
    # A row another run recorded meanwhile has its content already.
    held = {
        row_key_of(found[0])
        for found in conn.execute(
            f"SELECT key FROM history_rows WHERE key IN ({KEYS})",
            keys_params(item.row_key for item in entering),
        )
    }
    entering = [item for item in entering if item.row_key not in held]
    if not entering:
        return
    threshold = int(fraction * _BUCKETS)
    hashes = {item.row_key: retention_hash(item.row_key) for item in entering}
    first_id = int(conn.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM history_content").fetchone()[0])
    conn.executemany(
        "INSERT INTO history_content (id, content) VALUES (?, ?)",
        [(first_id + index, new[item.row_key].content) for index, item in enumerate(entering)],
    )
    conn.executemany(
        "INSERT INTO history_rows (key, kind, supersede, source, probe, retention, first_generation, "
        "last_generation, bytes, checksum, content_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                digest(item.row_key),
                KINDS.index(item.row.kind),
                item.supersede_key,
                None if item.origin == BODY else item.origin,
                int(item.probe),
                int(hashes[item.row_key] < threshold),
                generation,
                generation,
                new[item.row_key].size,
                new[item.row_key].checksum,
                first_id + index,
            )  # fmt: skip
            for index, item in enumerate(entering)
        ],
    )
    if fraction > 0:
        empty = conn.execute("SELECT NOT EXISTS (SELECT 1 FROM history_rows WHERE retention = 1)").fetchone()[
            0
        ]
        if empty:
            chosen = min(hashes, key=lambda key: (hashes[key], key))
            conn.execute("UPDATE history_rows SET retention = 1 WHERE key = ?", (digest(chosen),))


def evict(conn: sqlite3.Connection, current_keys: Sequence[str], max_bytes: int) -> int:
    """Remove history rows the document no longer holds while the history is over ``max_bytes``.

    The oldest last generation goes first, then the earliest recorded; rows
    the document still holds are never evicted. Returns the rows removed.
    """
    total = conn.execute("SELECT COALESCE(SUM(bytes), 0) FROM history_rows").fetchone()[0]
    excess = int(total) - max_bytes
    if excess <= 0:
        return 0
    cursor = conn.execute(
        f"DELETE FROM history_rows WHERE key IN (SELECT key FROM (SELECT key, bytes, "
        f"SUM(bytes) OVER (ORDER BY last_generation, content_id) AS freed FROM history_rows "
        f"WHERE key NOT IN ({KEYS})) WHERE freed - bytes < :excess)",
        {"excess": excess, **keys_params(current_keys)},
    )
    return cursor.rowcount


def delete(conn: sqlite3.Connection, row_keys: Iterable[str]) -> None:
    """Remove the history rows keyed ``row_keys`` (their content goes with them: a trigger)."""
    conn.execute(f"DELETE FROM history_rows WHERE key IN ({KEYS})", keys_params(row_keys))


@dataclass(frozen=True)
class HistoryRow:
    """A history row read back, with its content."""

    row_key: str
    kind: str
    supersede_key: int | None
    origin: str
    probe: bool
    retention: bool
    first_run_id: int
    last_run_id: int
    first_generation: int
    last_generation: int
    data: dict[str, Any]


#: ``history_rows`` with the runs of its generations: what :func:`read_rows` reads.
_ROWS = (
    "SELECT h.key, h.kind, h.supersede, h.source, h.probe, h.retention, "
    "(SELECT first_run_id FROM history_generations WHERE generation = h.first_generation), "
    "(SELECT max(run_id) FROM history_runs WHERE generation = h.last_generation), "
    "h.first_generation, h.last_generation, h.checksum, c.content "
    "FROM history_rows AS h JOIN history_content AS c ON c.id = h.content_id"
)


def read_rows(conn: sqlite3.Connection, row_keys: Iterable[str] | None = None) -> list[HistoryRow]:
    """History rows (all, or those keyed ``row_keys``) in the order recorded, content decoded and checked.

    Raises:
        DamagedContent: a row's content is damaged (``dlm cache verify`` finds and removes such rows).
    """
    query, params = _ROWS, {}
    if row_keys is not None:
        query += f" WHERE h.key IN ({KEYS})"
        params = keys_params(row_keys)
    rows: list[HistoryRow] = []
    for found in conn.execute(query + " ORDER BY h.content_id", params):
        kind, data = decode(found[0], found[11], found[10])
        rows.append(
            HistoryRow(
                row_key_of(found[0]),
                kind,
                found[2],
                BODY if found[3] is None else found[3],
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


def damaged(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """``(row_key, what is wrong)`` of every history row whose stored content is damaged."""
    found: list[tuple[str, str]] = []
    query = (
        "SELECT h.key, h.checksum, c.content FROM history_rows AS h "
        "LEFT JOIN history_content AS c ON c.id = h.content_id ORDER BY h.content_id"
    )
    for row in conn.execute(query):
        if row[2] is None:
            found.append((row_key_of(row[0]), "has no content"))
            continue
        try:
            decode(row[0], row[2], row[1])
        except DamagedContent as exc:
            found.append((row_key_of(row[0]), str(exc)))
    return found

"""The replay history at scale: 1,000,000 rows, the candidates query and the draw, disk, publish cost.

Targets (issue 38): the candidates query plus the draw over a history of
1,000,000 rows in at most 1 s; history's disk at most its rows' compressed
content plus 64 B a row; recording an unchanged 13K-row run costs the
publish no more than today's (printed beside a publish without history),
and so does its replay plan before it trains.

    python bench/bench_replay.py [--rows 1000000] [--repeat 3]

The history is filled synthetically, in SQL and with zlib, as
``dlmstore.replay.history`` writes it: 80% short Q/A pairs (about 150 B of
JSON), 20% prose of about 1 KB, words drawn from a 5,000-word vocabulary
(so zlib finds what it would in text), over 10 generations. The current
document is 13,000 rows, 1,000 of them in history: every other row is a
candidate (the worst case for the draw). Figures are medians of --repeat.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

TARGET_DRAW_S = 1.0
TARGET_BYTES_PER_ROW = 64
#: An unchanged retrain's publish costs what it did without history: within this much of it.
TARGET_PUBLISH_EXTRA_MS = 1.0
DOC_ROWS = 13_000
ID = "01KPQ1FFEDGPPSMWRAS18SAZST"


def _key(i: int, salt: str = "") -> str:
    return "sha256:" + hashlib.sha256(f"{salt}{i}".encode()).hexdigest()


def _text(rng: random.Random, vocab: list[str], size: int) -> str:
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(vocab)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


def fill(db: Path, rows: int) -> int:
    """Fill history with ``rows`` synthetic rows; returns the bytes of their compressed content."""
    from dlmstore.document.rows import Row
    from dlmstore.replay.history import CONTENT_LEVEL, KINDS, checksum, encode, retention_hash, supersede_key

    rng = random.Random(0)
    vocab = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        for _ in range(5000)
    ]
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO history_generations (generation, rows_sha256, rows, first_run_id, created_at) "
        "VALUES (?, 'sha256:x', ?, 1, '2026-01-01T00:00:00.000Z')",
        [(g, rows // 10) for g in range(1, 11)],
    )
    compressed = 0
    batch: list[tuple[object, ...]] = []
    contents: list[tuple[int, bytes]] = []
    threshold = int(0.05 * 2**64)
    for i in range(1, rows + 1):
        key = _key(i)
        if i % 5:
            data: dict[str, object] = {
                "messages": [
                    {"role": "user", "content": _text(rng, vocab, 50)},
                    {"role": "assistant", "content": _text(rng, vocab, 60)},
                ]
            }
            row, source = Row(key, "s", 0, "messages", data), None
        else:
            row, source = (
                Row(key, "s", 0, "text", {"text": _text(rng, vocab, 1000)}),
                f"src/pkg{i % 97}/mod{i}.py",
            )
        payload = encode(row.kind, row.data)
        blob = zlib.compress(payload, CONTENT_LEVEL)
        compressed += len(blob)
        g = 1 + i % 10
        digest = bytes.fromhex(key[7:])
        batch.append(
            (digest, KINDS.index(row.kind), supersede_key(row, source or "body"), source, 0,
             int(retention_hash(key) < threshold), g, g, len(payload), checksum(digest, payload), i)
        )  # fmt: skip
        contents.append((i, blob))
        if len(batch) == 20_000:
            _flush(conn, batch, contents)
    _flush(conn, batch, contents)
    conn.execute("COMMIT")
    conn.close()
    return compressed


def _flush(
    conn: sqlite3.Connection, batch: list[tuple[object, ...]], contents: list[tuple[int, bytes]]
) -> None:
    conn.executemany("INSERT INTO history_content (id, content) VALUES (?, ?)", contents)
    conn.executemany(
        "INSERT INTO history_rows (key, kind, supersede, source, probe, retention, first_generation, "
        "last_generation, bytes, checksum, content_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        batch,
    )
    batch.clear()
    contents.clear()


def candidates_and_draw(store: object, repeat: int) -> tuple[float, float, int, int]:
    """Median seconds of the candidates query and of the draw, the candidates and rows drawn."""
    from dlmstore.document.frontmatter import ReplaySettings
    from dlmstore.replay.candidates import Current, candidate_pool
    from dlmstore.replay.draw import draw, size

    # 80% of the document's rows are Q/A pairs with a supersede key (their question), as in history.
    rng = random.Random(1)
    current = Current.of(
        [(_key(i), None) for i in range(1, 1001)]
        + [(_key(i, "new"), rng.getrandbits(63) or 1 if i % 5 else None) for i in range(DOC_ROWS - 1000)]
    )
    query: list[float] = []
    drawing: list[float] = []
    found: object = None
    taken = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        with store.read() as conn:  # type: ignore[attr-defined]
            found = candidate_pool(conn, current, preference=False)
        t1 = time.perf_counter()
        k = size(DOC_ROWS - 1000, len(found), ReplaySettings())  # type: ignore[arg-type]
        taken = len(draw(found, k, generation=11, seed=42, floor=0.01).row_keys)  # type: ignore[arg-type]
        t2 = time.perf_counter()
        query.append(t1 - t0)
        drawing.append(t2 - t1)
    return statistics.median(query), statistics.median(drawing), len(found), taken  # type: ignore[arg-type]


def disk(db: Path, rows: int, compressed: int, empty: int) -> tuple[float, dict[str, int]]:
    """Bytes a row costs beyond its compressed content, and the bytes of each table and index."""
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    try:
        parts = dict(
            conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC").fetchall()
        )
    except sqlite3.OperationalError:  # SQLite built without dbstat
        parts = {}
    conn.close()
    size = db.stat().st_size - empty
    return (size - compressed) / rows, parts


def publish_cost(repeat: int) -> tuple[float, float, float]:
    """Median seconds of a publish transaction recording an unchanged 13K-row run, and of one without,
    and of the replay plan such a run makes before it trains (the generation found, nothing to draw)."""
    from dlmstore.document.frontmatter import ReplaySettings
    from dlmstore.document.rows import Row
    from dlmstore.replay.candidates import Current
    from dlmstore.replay.history import TrainedRow, pending, record_run, supersede_key
    from dlmstore.replay.run_plan import plan
    from dlmstore.store.database import open_store

    rng = random.Random(1)
    rows = []
    for i in range(DOC_ROWS):
        row = Row(_key(i, "doc"), "s", 0, "text", {"text": f"file {i} " + "x" * rng.randint(200, 4000)})
        origin = f"Lib/mod{i}.py"
        rows.append(TrainedRow(row, supersede_key(row, origin), origin, False))
    keys = [item.row_key for item in rows]

    def described() -> list[TrainedRow]:
        return rows

    settings = ReplaySettings()
    with open_store(ID) as store:

        def new_run() -> int:
            with store.write() as conn:
                cursor = conn.execute(
                    "INSERT INTO runs (command, status, started_at, dlm_path, dlm_sha256, dlmstore_version, pid) "
                    "VALUES ('train', 'completed', '2026-01-01T00:00:00.000Z', '/d.dlm', 'ab', '0', 1)"
                )
            return int(cursor.lastrowid or 0)

        first = new_run()
        found = pending(store, keys, described, settings)
        with store.write() as conn:
            record_run(conn, first, found)  # the first run: every row is new
        with_history: list[float] = []
        without: list[float] = []
        planning: list[float] = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            with store.read() as conn:
                drawn = plan(
                    conn, trained=keys, preference_keys=frozenset(), settings=settings, seed=42, phases=("sft",),
                    current=lambda: Current.of([(item.row_key, item.supersede_key) for item in rows]),
                )  # fmt: skip
            planning.append(time.perf_counter() - t0)
            assert not drawn.drawn and drawn.generation == 1
            run_id = new_run()
            t0 = time.perf_counter()
            found = pending(store, keys, described, settings)
            with store.write() as conn:
                record_run(conn, run_id, found)
            with_history.append(time.perf_counter() - t0)
            other = new_run()
            t0 = time.perf_counter()
            with store.write() as conn:  # what publish's transaction does without history: a few rows
                conn.execute("UPDATE runs SET status = 'completed' WHERE id = ?", (other,))
            without.append(time.perf_counter() - t0)
    return statistics.median(with_history), statistics.median(without), statistics.median(planning)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        os.environ["DLM_HOME"] = home
        from dlmstore.store.database import open_store

        with open_store(ID) as store:
            with store.write():
                pass
            empty = store.db_path.stat().st_size
            t0 = time.perf_counter()
            compressed = fill(store.db_path, args.rows)
            print(f"filled {args.rows:,} history rows in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            query, drawing, found, taken = candidates_and_draw(store, args.repeat)
        per_row, parts = disk(store.db_path, args.rows, compressed, empty)
    with tempfile.TemporaryDirectory() as home:
        os.environ["DLM_HOME"] = home
        recorded, plain, planned = publish_cost(args.repeat)
    total = query + drawing
    print(f"candidates query + draw over {args.rows:,} history rows ({found:,} candidates, {taken:,} drawn): "
          f"{total:.3f} s (query {query:.3f} s, draw {drawing:.3f} s)  target <= {TARGET_DRAW_S:.1f} s  "
          f"{'ok' if total <= TARGET_DRAW_S else 'OVER'}")  # fmt: skip
    print(f"disk beyond the compressed content: {per_row:.0f} B a row  target <= {TARGET_BYTES_PER_ROW} B  "
          f"{'ok' if per_row <= TARGET_BYTES_PER_ROW else 'OVER'}  (compressed content {compressed / args.rows:.0f} B a row)")  # fmt: skip
    for name, size in parts.items():
        if name.startswith("history") or name.startswith("sqlite_autoindex_history"):
            print(f"  {name:<32} {size / args.rows:8.1f} B a row")
    extra = (recorded - plain) * 1000
    print(f"publish of an unchanged {DOC_ROWS:,}-row run: with history {recorded * 1000:.1f} ms, "
          f"without {plain * 1000:.1f} ms (+{extra:.1f} ms)  target <= +{TARGET_PUBLISH_EXTRA_MS:.0f} ms  "
          f"{'ok' if extra <= TARGET_PUBLISH_EXTRA_MS else 'OVER'}")  # fmt: skip
    print(f"replay plan of that unchanged run before it trains: {planned * 1000:.1f} ms (one digest of its keys "
          f"and two queries; nothing drawn)")  # fmt: skip
    print(json.dumps({"draw_s": round(total, 3), "plan_unchanged_ms": round(planned * 1000, 1), "bytes_per_row": round(per_row, 1),
                      "publish_ms": round(recorded * 1000, 1), "publish_without_ms": round(plain * 1000, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()

"""Validation rows that duplicate training rows: what a train run records, and reading it back.

A train run holds out about a tenth of its rows (``dlmstore.eval.split``)
and measures its loss on them. A held-out row that is a copy, or a near
copy, of a row that trains measures a row the model learnt: the loss reads
low. ``dlmstore.corpus.holdout`` finds such rows from the run's duplicate
clusters; this module is their record in store.db, which ``dlm metrics``,
``dlm report`` and ``dlm show`` read:

* ``val_splits``: one row per train run: the split's seed and
  ``training.dedup``, the rows held out, how many duplicated a training row
  and how many ``training.dedup`` kept out of the split (they train);
* ``val_contamination``: each such row, the training row it is most like,
  ``exact`` or ``near``, their similarity and whether it was kept out.

The classes live here, below the layers that find and show them, because
``dlm metrics`` (:mod:`dlmstore.store.metrics`) lists them beside each run.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field

from dlmstore.clock import utc_now


@dataclass(frozen=True)
class ContaminatedRow:
    """A validation row that duplicates a row that trains.

    Attributes:
        path: Where the validation row comes from, as ``dlm show`` lists cluster members (a
            source file under its directive's path, or ``document:LINE``).
        row_key: Its row key.
        train_path: Where the training row it is most like comes from.
        train_row_key: That row's key.
        kind: ``exact`` (the two rows have the same text) or ``near``.
        similarity: Estimated Jaccard similarity of the two rows' 5-word shingles; 1.0 when exact.
        kept_out: Whether ``training.dedup`` kept it out of the validation split (it trains
            instead); false when it was held out and its loss measured.
    """

    path: str
    row_key: str
    train_path: str
    train_row_key: str
    kind: str
    similarity: float
    kept_out: bool


@dataclass(frozen=True)
class Contamination:
    """The validation rows that duplicate training rows (``contamination`` in ``dlm show --json``
    and in each train run of ``dlm metrics --json``).

    Attributes:
        mode: ``training.dedup``: ``off`` holds such rows out (the val loss reads low on them);
            ``exact`` and ``near`` keep them out of the split.
        seed: The seed the validation split is drawn with.
        val_rows: Rows of the document the split held out, those kept out not counted; null where
            no split was drawn (``dlm show`` before a train run with this seed).
        contaminated_rows: Validation rows, as drawn, that duplicate a training row.
        kept_out_rows: Of those, rows ``training.dedup`` kept out of the split.
        rows: Each of them, by path.
        from_run: The train run whose record this is; null when it was found now.
        seconds: Time spent finding them.
    """

    mode: str
    seed: int
    val_rows: int | None = None
    contaminated_rows: int = 0
    kept_out_rows: int = 0
    rows: list[ContaminatedRow] = field(default_factory=list)
    from_run: int | None = None
    seconds: float = 0.0

    def kept_out(self) -> frozenset[str]:
        """The keys of the rows kept out of the split (they train)."""
        return frozenset(row.row_key for row in self.rows if row.kept_out)


def record(conn: sqlite3.Connection, run_id: int, found: Contamination) -> None:
    """Insert ``found`` as ``run_id``'s split (in the caller's write transaction).

    ``found.from_run`` names the run it was read from (kept as
    ``from_run_id``); its rows are written again under ``run_id``, so each
    run's record reads on its own.
    """
    if found.val_rows is None:
        raise ValueError("a split is recorded with the number of rows it held out")
    conn.execute(
        "INSERT INTO val_splits (run_id, mode, seed, val_rows, contaminated_rows, kept_out_rows, from_run_id, "
        "seconds, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run_id, found.mode, found.seed, found.val_rows, found.contaminated_rows, found.kept_out_rows,
            found.from_run, found.seconds, utc_now(),
        ),
    )  # fmt: skip
    conn.executemany(
        "INSERT INTO val_contamination (run_id, row_key, path, train_row_key, train_path, kind, similarity, "
        "kept_out) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                run_id,
                row.row_key,
                row.path,
                row.train_row_key,
                row.train_path,
                row.kind,
                row.similarity,
                int(row.kept_out),
            )  # fmt: skip
            for row in found.rows
        ],
    )


def recorded(conn: sqlite3.Connection, run_ids: Iterable[int]) -> dict[int, Contamination]:
    """The records of ``run_ids`` that have one, by run (two queries, whatever their number)."""
    import json

    wanted = json.dumps(list(run_ids))
    rows: dict[int, list[ContaminatedRow]] = {}
    for row in conn.execute(
        "SELECT c.run_id, c.path, c.row_key, c.train_path, c.train_row_key, c.kind, c.similarity, c.kept_out "
        "FROM json_each(?) AS w JOIN val_contamination AS c ON c.run_id = w.value ORDER BY c.run_id, c.path, "
        "c.row_key",
        (wanted,),
    ):
        run_id, path, key, train_path, train_key, kind, similarity, kept_out = tuple(row)
        rows.setdefault(run_id, []).append(
            ContaminatedRow(path, key, train_path, train_key, kind, similarity, bool(kept_out))
        )
    return {
        row[0]: Contamination(
            mode=row[1],
            seed=row[2],
            val_rows=row[3],
            contaminated_rows=row[4],
            kept_out_rows=row[5],
            rows=rows.get(row[0], []),
            from_run=row[0],
            seconds=row[6],
        )  # fmt: skip
        for row in conn.execute(
            "SELECT s.run_id, s.mode, s.seed, s.val_rows, s.contaminated_rows, s.kept_out_rows, s.seconds "
            "FROM json_each(?) AS w JOIN val_splits AS s ON s.run_id = w.value",
            (wanted,),
        )
    }


def recorded_over(conn: sqlite3.Connection, members_run: int, *, seed: int, mode: str) -> int | None:
    """The newest train run that recorded a split over the clusters ``members_run`` holds (the
    same rows), with ``seed`` and ``mode``: its contaminated rows are the same. ``None``: none did."""
    row = conn.execute(
        "SELECT s.run_id FROM val_splits AS s JOIN dedup_runs AS d ON d.run_id = s.run_id "
        "WHERE d.members_run_id = ? AND s.seed = ? AND s.mode = ? ORDER BY s.run_id DESC LIMIT 1",
        (members_run, seed, mode),
    ).fetchone()
    return None if row is None else int(row[0])

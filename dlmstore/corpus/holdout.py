"""The validation split against the duplicate clusters: held-out rows that duplicate training rows.

``dlm train`` holds out about a tenth of its rows (``dlmstore.eval.split``:
a row is held out when the sha256 of the seed and its key falls low) and
measures the loss on them. A held-out row that is a copy, or a near copy,
of a row that trains measures what the model learnt, and the loss reads
low: the validation split is **contaminated**. The duplicate clusters
(``dlmstore.corpus.dedup``) say which rows those can be; this module finds
them for a seed, without the split itself:

* a cluster contaminates when, of the members training keeps
  (``training.dedup`` drops the others first), some are held out and some
  train. Each held-out one is listed with the training member it is most
  like: one with the same text (``exact``, similarity 1.0), else the one
  whose signature agrees with its own in the most positions (``near``, the
  share of agreeing positions; ties go to the kept row, then by path).
  Only text rows are clustered, and the split holds out rows by key alone
  (the ``!probe`` pairs it never holds out are instruction rows): a
  cluster with members on both sides means both sides are non-empty, so
  the split it meets is exactly the trainer's.
* with ``training.dedup: off`` such rows stay held out and the run warns
  (:func:`warning`); with ``exact`` or ``near`` they are kept out of the
  split and train, as that mode trains them. ``near`` leaves one member of
  each cluster, so it never meets one; ``exact`` leaves near copies, and
  keeps out the held-out ones.

A train run records what it found (``dlmstore.store.contamination``). A run
over the same clusters (the same ``dedup_runs.members_run_id``) with the
same seed and mode reads the earlier run's rows back instead of finding
them: no signature is read. ``dlm show`` reads back the newest such record
of the document's ``training.seed`` when there is one, and finds them
otherwise, writing nothing.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from operator import eq
from pathlib import Path
from typing import TYPE_CHECKING

from dlmstore.corpus import signatures
from dlmstore.corpus.dedup import DedupMember, DedupReport, text_rows
from dlmstore.corpus.signatures import NUM_PERM, Signature
from dlmstore.eval.split import is_val
from dlmstore.store import contamination as records
from dlmstore.store.contamination import ContaminatedRow, Contamination

if TYPE_CHECKING:
    from dlmstore.corpus.assemble import Corpus
    from dlmstore.store.database import Store


def find(store: Store, corpus: Corpus, dedup: DedupReport, *, run_id: int, seed: int) -> Contamination:
    """The contaminated rows of ``run_id``'s split under ``seed`` (its clusters are ``dedup``, which
    :func:`dlmstore.corpus.dedup.analyse` recorded): read back from an earlier run over the same
    clusters, seed and mode, else found (signatures kept here or in another store of the home, the
    rest made from ``corpus``). Nothing is recorded: the trainer records it with the split."""
    start = time.perf_counter()
    with store.read() as conn:
        members_run = conn.execute(
            "SELECT members_run_id FROM dedup_runs WHERE run_id = ?", (run_id,)
        ).fetchone()
        earlier = None
        if members_run is not None:
            earlier = records.recorded_over(conn, members_run[0], seed=seed, mode=dedup.mode)
        if earlier is not None:
            return _read_back(records.recorded(conn, [earlier])[earlier], dedup, start)
        meeting = _meeting(dedup, seed)
        needed = _needed(meeting)
        signed = signatures.cached(conn, needed) if needed else {}
    signed = _completed(signed, needed, store.path, corpus)
    return _contamination(dedup, seed, meeting, signed, start)


def inspect_recorded(db_path: Path, dedup: DedupReport, *, seed: int) -> Contamination | None:
    """What :func:`find` would give, without writing (``dlm show`` with recorded clusters and no
    corpus): a train run's record over the clusters ``dedup`` was read from, else found from kept
    signatures; ``None`` when a signature needed is kept nowhere (then :func:`inspect` it)."""
    start = time.perf_counter()
    earlier = _recorded_over(db_path, dedup, seed)
    if earlier is not None:
        return _read_back(earlier, dedup, start)
    meeting = _meeting(dedup, seed)
    needed = _needed(meeting)
    signed = _kept(db_path, needed, None)
    if not needed <= signed.keys():
        return None
    return _contamination(dedup, seed, meeting, signed, start)


def inspect(db_path: Path, corpus: Corpus, dedup: DedupReport, *, seed: int) -> Contamination:
    """:func:`inspect_recorded`, signing in memory (and keeping nothing) what no store has signed."""
    start = time.perf_counter()
    earlier = _recorded_over(db_path, dedup, seed)
    if earlier is not None:
        return _read_back(earlier, dedup, start)
    meeting = _meeting(dedup, seed)
    return _contamination(dedup, seed, meeting, _kept(db_path, _needed(meeting), corpus), start)


def warning(found: Contamination) -> str | None:
    """A warning when rows held out for validation duplicate rows that train; ``None`` when none is
    held out (none found, or ``training.dedup`` kept each out)."""
    held = [row.path for row in found.rows if not row.kept_out]
    if not held:
        return None
    shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
    return (
        f"{len(held)} validation {'row duplicates' if len(held) == 1 else 'rows duplicate'} training rows "
        f"({shown}; `dlm show` lists the clusters): the held-out loss reads low on them; "
        "training.dedup: exact or near keeps a duplicate out of the validation split"
    )


#: A cluster that meets the split: its kind, its members held out, its members that train.
Meeting = list[tuple[str, list[DedupMember], list[DedupMember]]]


def _meeting(dedup: DedupReport, seed: int) -> Meeting:
    """The clusters of ``dedup`` whose members training keeps fall on both sides of the split."""
    meeting: Meeting = []
    for cluster in dedup.clusters:
        kept = [member for member in cluster.members if not member.dropped]
        held = [member for member in kept if is_val(member.row_key, seed)]
        if held and len(held) < len(kept):
            out = {member.row_key for member in held}
            meeting.append((cluster.kind, held, [member for member in kept if member.row_key not in out]))
    return meeting


def _needed(meeting: Meeting) -> set[str]:
    """The rows whose signatures tell which training row each held-out one is most like: the
    members of near clusters (an exact cluster's rows all have one text)."""
    return {m.row_key for kind, held, train in meeting if kind == "near" for m in (*held, *train)}


def _contamination(
    dedup: DedupReport, seed: int, meeting: Meeting, signed: dict[str, Signature], start: float
) -> Contamination:
    """Each held-out member of ``meeting``, with the training member it is most like."""
    kept_out = dedup.mode != "off"
    rows = []
    for kind, held, train in meeting:
        for member in held:
            if kind == "exact":
                partner, similarity, exact = train[0], 1.0, True
            else:
                partner, similarity, exact = _closest(member, train, signed)
            rows.append(
                ContaminatedRow(
                    member.path,
                    member.row_key,
                    partner.path,
                    partner.row_key,
                    "exact" if exact else "near",
                    similarity,
                    kept_out,
                )  # fmt: skip
            )
    rows.sort(key=lambda row: (row.path, row.row_key))
    return Contamination(
        mode=dedup.mode,
        seed=seed,
        contaminated_rows=len(rows),
        kept_out_rows=len(rows) if kept_out else 0,
        rows=rows,
        seconds=round(time.perf_counter() - start, 4),
    )


def _closest(
    member: DedupMember, train: list[DedupMember], signed: dict[str, Signature]
) -> tuple[DedupMember, float, bool]:
    """The training member most like ``member`` (the first with its text, else the one whose
    signature agrees with its own in the most positions), their similarity and whether their
    texts are the same.

    The signatures are compared in plain Python (NUM_PERM values each, a few held-out rows):
    importing numpy for it cost ``dlm show`` 0.1 s. Equal values are equal 4-byte words
    whichever way the machine reads them, so the words are compared as native integers.
    """
    own = signed[member.row_key]
    for other in train:
        if signed[other.row_key].content_sha256 == own.content_sha256:
            return other, 1.0, True
    values = memoryview(own.minhash).cast("I")
    agree = [sum(map(eq, memoryview(signed[other.row_key].minhash).cast("I"), values)) for other in train]
    best = max(range(len(train)), key=lambda index: (agree[index], -index))
    return train[best], round(agree[best] / NUM_PERM, 4), False


def _completed(
    found: dict[str, Signature], keys: set[str], folder: Path, corpus: Corpus | None
) -> dict[str, Signature]:
    """``found`` with the signatures of the rest of ``keys``: from the other stores beside
    ``folder``, else made from ``corpus``'s text (not kept); without a corpus, those stay missing."""
    missing = keys - found.keys()
    if missing:
        found = {**found, **signatures.from_other_stores(folder, missing)}
        missing = keys - found.keys()
    if missing and corpus is not None:
        for item in text_rows(corpus):
            if item.row.row_key in missing:
                found[item.row.row_key] = signatures.sign(
                    signatures.row_text(item.row.data["text"], item.source)
                )
    return found


def _kept(db_path: Path, keys: set[str], corpus: Corpus | None) -> dict[str, Signature]:
    """The signatures of ``keys`` through a read-only connection, completed (:func:`_completed`)."""
    from dlmstore.store.connection import read_if_there

    if not keys:
        return {}
    found = read_if_there(db_path, lambda conn: signatures.cached(conn, keys)) or {}
    return _completed(found, keys, db_path.parent, corpus)


def _recorded_over(db_path: Path, dedup: DedupReport, seed: int) -> Contamination | None:
    """The newest train run's record over the clusters of the run ``dedup`` was read from (read-only)."""
    from dlmstore.store.connection import read_if_there

    if dedup.from_run is None:
        return None
    run = dedup.from_run

    def read(conn: sqlite3.Connection) -> Contamination | None:
        members_run = conn.execute(
            "SELECT members_run_id FROM dedup_runs WHERE run_id = ?", (run,)
        ).fetchone()
        if members_run is None:
            return None
        earlier = records.recorded_over(conn, members_run[0], seed=seed, mode=dedup.mode)
        return None if earlier is None else records.recorded(conn, [earlier]).get(earlier)

    return read_if_there(db_path, read)


def _read_back(earlier: Contamination, dedup: DedupReport, start: float) -> Contamination:
    """``earlier``'s rows, their paths as ``dedup`` shows them (the rows are the same; a body
    row's path carries the document's name, which may have changed)."""
    paths = {member.row_key: member.path for cluster in dedup.clusters for member in cluster.members}
    rows = [
        dataclasses.replace(
            row,
            path=paths.get(row.row_key, row.path),
            train_path=paths.get(row.train_row_key, row.train_path),
        )
        for row in earlier.rows
    ]
    return dataclasses.replace(earlier, rows=rows, seconds=round(time.perf_counter() - start, 4))

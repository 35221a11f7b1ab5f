"""``dlm replay show DOC``: the replay history of a document's store, and what the next run would replay.

The history by generation (its runs, the adapter versions they published,
rows trained, new and dropped), its size, the retention slice, the
candidates now with their weights and whether the draw the next run would
make (with the document as it is now, under ``training.seed``) takes them,
and the superseded rows with what replaced them.

The draw shown is the one the next ``dlm train`` makes
(:func:`dlmstore.replay.run_plan.plan`, the same function). The rows it counts
as trained are the document's rows less the validation split under
``training.seed`` (``training.dedup``'s drops are not applied: a run with
``exact`` or ``near`` may train fewer, and then draw for another generation).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dlmstore.replay.candidates import Current, candidates, superseded
from dlmstore.replay.history import TrainedRow

if TYPE_CHECKING:
    from dlmstore.document.frontmatter import TrainingSettings


@dataclass(frozen=True)
class GenerationReport:
    """One version of the document as trained.

    Attributes:
        generation: Its number (1, 2, ...).
        runs: The completed train runs that trained it, oldest first.
        adapter_versions: The adapter versions those runs published.
        rows: Rows its runs trained.
        rows_new: Rows history holds that it trained first.
        rows_removed: Rows history holds that the generation before trained and no run since
            (0 for the first).
        created_at: When its first run published.
    """

    generation: int
    runs: list[int]
    adapter_versions: list[int]
    rows: int
    rows_new: int
    rows_removed: int
    created_at: str


@dataclass(frozen=True)
class CandidateReport:
    """A history row the next run could replay.

    Attributes:
        row_key: Its key.
        kind: text, messages or preference.
        origin: body, or the training.sources file it came from.
        probe: It was a `### Q !probe` pair.
        last_generation: The latest generation that trained it.
        weight: Its weight in the draw.
        drawn: The next run's draw takes it.
    """

    row_key: str
    kind: str
    origin: str
    probe: bool
    last_generation: int
    weight: float
    drawn: bool


@dataclass(frozen=True)
class SupersededReport:
    """A history row an edit replaced: never replayed.

    Attributes:
        row_key: Its key.
        kind: text, messages or preference.
        origin: body, or the training.sources file it came from.
        by_row_key: The current row that replaced it (the same question, prompt or file).
        last_generation: The latest generation that trained it.
    """

    row_key: str
    kind: str
    origin: str
    by_row_key: str
    last_generation: int


@dataclass(frozen=True)
class ReplayReport:
    """The JSON shape of ``dlm replay show --json``.

    Attributes:
        dlm_id: The document id.
        enabled: training.replay.enabled.
        generations: The history by generation, oldest first.
        history_rows: Rows history holds.
        history_bytes: Their content, uncompressed.
        stored_bytes: Their content as stored (zlib).
        retention_rows: Rows in the retention slice (never drawn).
        next_generation: The generation the next run would have with the document as it is.
        new_rows: The document's SFT rows history does not hold (val split left out).
        new_triples: Its preference triples history does not hold.
        draw_rows: SFT rows the next run's draw would take.
        draw_triples: Preference triples it would take.
        candidates: The candidates now, by row key.
        superseded: The rows an edit replaced, by row key.
    """

    dlm_id: str
    enabled: bool
    history_rows: int
    history_bytes: int
    stored_bytes: int
    retention_rows: int
    next_generation: int
    new_rows: int
    new_triples: int
    draw_rows: int
    draw_triples: int
    generations: list[GenerationReport] = field(default_factory=list)
    candidates: list[CandidateReport] = field(default_factory=list)
    superseded: list[SupersededReport] = field(default_factory=list)


def show(path: str | Path) -> ReplayReport:
    """The replay report of the document at ``path`` (nothing is created for a store that is not there).

    Raises:
        DocumentError, SourceError: the document or its sources are invalid.
        StoreError: the store cannot be opened.
    """
    from dlmstore.corpus.assemble import load_corpus
    from dlmstore.document.parser import parse_document
    from dlmstore.eval.probes import marked_keys
    from dlmstore.home import store_dir
    from dlmstore.replay.history import describe
    from dlmstore.sources.statcache import StatCache
    from dlmstore.store.connection import DB_NAME
    from dlmstore.store.database import open_store

    document = parse_document(path)
    settings = document.frontmatter.training
    probes = marked_keys(document.sections)
    if not (store_dir(document.dlm_id) / DB_NAME).is_file():
        corpus = load_corpus(document)
        rows = describe(corpus, probes)
        return ReplayReport(
            document.dlm_id, settings.replay.enabled, 0, 0, 0, 0, 1,
            *_new_counts(rows, set(), settings.seed, probes), 0, 0,
        )  # fmt: skip
    with open_store(document.dlm_id, create=False) as store:
        corpus = load_corpus(document, stat_cache=StatCache.load(store))
        rows = describe(corpus, probes)
        with store.read() as conn:
            return _report(conn, document.dlm_id, rows, settings, probes)


def _trained(rows: list[TrainedRow], seed: int, probes: frozenset[str]) -> tuple[list[str], list[str]]:
    """The document's row keys a run would train (its SFT rows less the val split, then its triples)
    in corpus order, and the triples' keys."""
    from dlmstore.eval.split import split_rows

    sft = [item.row_key for item in rows if item.row.kind != "preference"]
    split = split_rows(sft, seed, always_train=probes)
    held_out = set() if not split.val or not split.train else {sft[i] for i in split.val}
    trained = [item.row_key for item in rows if item.row_key not in held_out]
    return trained, [item.row_key for item in rows if item.row.kind == "preference"]


def _new_counts(rows: list[TrainedRow], held: set[str], seed: int, probes: frozenset[str]) -> tuple[int, int]:
    """SFT rows (val split left out) and preference triples of the document that history does not hold."""
    trained, triples = _trained(rows, seed, probes)
    preference = set(triples)
    return (
        sum(key not in held for key in trained if key not in preference),
        sum(key not in held for key in triples),
    )


def _report(
    conn: sqlite3.Connection,
    dlm_id: str,
    rows: list[TrainedRow],
    settings: TrainingSettings,
    probes: frozenset[str],
) -> ReplayReport:
    from dlmstore.replay.draw import weight
    from dlmstore.replay.run_plan import plan

    replay = settings.replay
    current = Current.of([(item.row_key, item.supersede_key) for item in rows])
    trained, triples = _trained(rows, settings.seed, probes)
    phases = ("sft", "preference") if settings.preference.enabled else ("sft",)
    if not settings.preference.enabled:
        trained = [key for key in trained if key not in set(triples)]
    # The next run's own plan, drawn by the function dlm train calls (its rows are read back and checked).
    upcoming = plan(
        conn, trained=trained, preference_keys=frozenset(triples), current=lambda: current, settings=replay,
        seed=settings.seed, phases=phases,
    )  # fmt: skip
    totals = conn.execute(
        "SELECT count(*), COALESCE(SUM(bytes), 0), COALESCE(SUM(retention), 0) FROM history_rows"
    ).fetchone()
    stored = conn.execute("SELECT COALESCE(SUM(length(content)), 0) FROM history_content").fetchone()[0]
    generations = _generations(conn)
    generation, floor = upcoming.generation, replay.weight_floor
    found = candidates(conn, current)
    taken = {item.row.row_key for item in upcoming.drawn}
    new_rows, new_triples = upcoming.sft_new, upcoming.preference_new
    draw_rows, draw_triples = len(upcoming.rows("sft")), len(upcoming.rows("preference"))
    return ReplayReport(
        dlm_id=dlm_id,
        enabled=replay.enabled,
        history_rows=totals[0],
        history_bytes=totals[1],
        stored_bytes=stored,
        retention_rows=totals[2],
        next_generation=generation,
        new_rows=new_rows,
        new_triples=new_triples,
        draw_rows=draw_rows,
        draw_triples=draw_triples,
        generations=generations,
        candidates=[
            CandidateReport(
                c.row_key,
                c.kind,
                c.origin,
                c.probe,
                c.last_generation,
                weight(c.last_generation, generation, floor),
                c.row_key in taken,
            )  # fmt: skip
            for c in found
        ],
        superseded=[
            SupersededReport(s.row_key, s.kind, s.origin, s.by_row_key, s.last_generation)
            for s in superseded(conn, [(item.row_key, item.supersede_key) for item in rows])
        ],
    )


def _generations(conn: sqlite3.Connection) -> list[GenerationReport]:
    runs: dict[int, list[int]] = {}
    for run_id, generation in conn.execute("SELECT run_id, generation FROM history_runs ORDER BY run_id"):
        runs.setdefault(generation, []).append(run_id)
    versions: dict[int, list[int]] = {}
    for version, generation in conn.execute(
        "SELECT a.version, r.generation FROM adapters AS a JOIN history_runs AS r ON r.run_id = a.run_id "
        "ORDER BY a.version"
    ):
        versions.setdefault(generation, []).append(version)
    first = dict(
        conn.execute("SELECT first_generation, count(*) FROM history_rows GROUP BY first_generation")
    )
    last = dict(conn.execute("SELECT last_generation, count(*) FROM history_rows GROUP BY last_generation"))
    return [
        GenerationReport(
            generation,
            runs.get(generation, []),
            versions.get(generation, []),
            rows,
            first.get(generation, 0),
            last.get(generation - 1, 0) if generation > 1 else 0,
            created_at,
        )  # fmt: skip
        for generation, rows, created_at in conn.execute(
            "SELECT generation, rows, created_at FROM history_generations ORDER BY generation"
        )
    ]

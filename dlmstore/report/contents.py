"""What ``dlm report`` shows, read from ``store.db`` into one dataclass.

:func:`build_report` reads every table the page draws from in one read
transaction, so the page is one consistent snapshot of the store, and
returns a :class:`StoreReport`: ``dlm report --json`` prints it, and
:mod:`dlmstore.report.page` draws it. Nothing is computed from files
outside the database: the page describes what the store recorded.

* **Training curves**: the loss and learning rate of every logged step,
  per run and phase (``train_steps``), for the newest ``limit`` train runs.
* **Cache passes**: one per tokenize or train pass (``tokenization_events``):
  hits, misses, the pass's wall time and the cache size after it.
* **Tokens by source folder**: ``source_stats`` holds, for each source file
  the last walk read, its section digest; the key of a source file's row
  follows from that digest alone (:func:`dlmstore.document.rows.text_row_key`),
  and ``cache_entries`` holds that row's token count. The pass counted is
  the newest one that used the cache; its other entries (the document's
  own sections and the preference rows' parts) are counted as the
  document's. A file whose row that pass did not cache is counted under
  ``uncounted_files`` rather than guessed at.
* **Evaluation**: each phase's val loss beside its train loss (``val_steps``),
  and the probes of the newest run that asked any, each model's answer and
  scores side by side (:mod:`dlmstore.report.evaluation`).
* **Retention**: what each train run drew from the replay history
  (``replay_runs``), and what its evaluations, and the newest probe
  table's, measured of retention: the probes of earlier versions and the
  retention slice's loss with its delta (``evaluations``).
* **Contamination**: each train run's validation rows that duplicate
  training rows (``val_splits``, ``val_contamination``), listed under its
  curves.
* **Adapters** with their sha256, phase and parent (``adapters``).
* **Lock history**: every ``lock_records`` row, oldest first, compared with
  the lock ``dlm.lock`` held before it (the previous written or updated
  record, what that run was checked against) by the severity table of
  :func:`dlmstore.lock.compare`.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field

from dlmstore.cache.uses import entries_used_by
from dlmstore.clock import utc_now
from dlmstore.document.rows import text_row_key
from dlmstore.errors import LockError
from dlmstore.lock.model import Lock, parse_lock
from dlmstore.lock.policy import Mismatch, compare
from dlmstore.report.evaluation import (
    ProbeTable,
    ReplayDraw,
    RetentionFigures,
    ValPoint,
    newest_probes,
    replay_draws,
    retention_figures,
    val_points,
)
from dlmstore.store.contamination import Contamination, recorded
from dlmstore.store.database import Store
from dlmstore.store.metrics import ExportSummary, duration_seconds, list_exports
from dlmstore.store.path_text import path_text

#: How many train runs get their curves drawn unless told otherwise (newest first).
DEFAULT_TRAIN_RUNS = 20

#: Severities, mildest first: an entry's severity is its worst change's.
SEVERITY_ORDER = ("ALLOW", "WARN", "ERROR")


@dataclass(frozen=True)
class StepPoint:
    """One logged step: its loss and learning rate (``None`` where TRL logged NaN or nothing).

    Attributes:
        step: The optimizer step.
        loss: Its loss; null where TRL logged NaN or nothing.
        learning_rate: Its learning rate; null where none was logged.
    """

    step: int
    loss: float | None
    learning_rate: float | None


@dataclass(frozen=True)
class PhaseCurve:
    """The steps of one phase of a train run; ``method`` is dpo or orpo for a preference phase.

    Attributes:
        phase: ``sft`` or ``preference``.
        method: ``dpo`` or ``orpo`` for the preference phase; null for SFT.
        steps: Its logged steps in order.
        val: The val loss at each of its evaluation steps, in order (``val_steps``).
    """

    phase: str
    method: str | None
    steps: list[StepPoint]
    val: list[ValPoint] = field(default_factory=list)


@dataclass(frozen=True)
class TrainingRun:
    """A train run and its phases' curves, sft first.

    Attributes:
        run_id: The train run.
        status: ``running``, ``completed`` or ``failed``.
        started_at: When it started (ISO-8601 UTC).
        phases: Each phase's curve, SFT first.
        duration_seconds: How long the run took (``finished_at`` minus ``started_at``); null
            while it runs.
        error: Why it failed; null when it did not.
        contamination: Its validation split's rows that duplicate training rows; null when it
            drew no split (it failed before, or ran before they were recorded).
        replay: What it drew from the replay history; null when it recorded no draw (it failed,
            or ``training.replay.enabled`` is false).
        retention: What its evaluations measured of retention (the probes of earlier versions,
            the retention slice's loss), base and adapter after each phase; empty when the
            document held everything its history did.
    """

    run_id: int
    status: str
    started_at: str
    phases: list[PhaseCurve]
    duration_seconds: float | None = None
    error: str | None = None
    contamination: Contamination | None = None
    replay: ReplayDraw | None = None
    retention: list[RetentionFigures] = field(default_factory=list)


@dataclass(frozen=True)
class CachePass:
    """One tokenization pass, as ``tokenization_events`` recorded it.

    Attributes:
        run_id: The run the pass belonged to.
        command: ``tokenize`` or ``train``.
        status: The run's status.
        created_at: When the pass was recorded.
        cache_hits: Rows served from the cache.
        cache_misses: Rows tokenized.
        total_tokenize_seconds: Seconds the pass spent tokenizing.
        cache_bytes_after: Cache size after the pass.
        cache_mode: ``on``, ``off`` or ``bypassed``.
        cache_shared: Of the hits, rows whose tokens were taken from other stores of the home.
        dedup_clusters: Duplicate clusters among the run's text rows; null when it did not look.
        duplicate_rows: Rows in those clusters besides the one each keeps; null when it did not look.
        dropped_rows: Rows left out of training by ``training.dedup`` (what a tokenize run's
            training would leave out); null when it did not look.
    """

    run_id: int
    command: str
    status: str
    created_at: str
    cache_hits: int
    cache_misses: int
    total_tokenize_seconds: float
    cache_bytes_after: int
    cache_mode: str
    cache_shared: int = 0
    dedup_clusters: int | None = None
    duplicate_rows: int | None = None
    dropped_rows: int | None = None


@dataclass(frozen=True)
class SourceFolder:
    """The source files of one folder and their tokens in the counted pass.

    ``folder`` is relative to the document's folder (``.`` for that folder
    itself, ``../docs`` for a sibling), or absolute when it is three or more
    levels up.

    Attributes:
        folder: The folder, relative to the document's folder (or absolute when far away).
        files: Source files in it.
        tokens: Their tokens in the counted pass.
    """

    folder: str
    files: int
    tokens: int


@dataclass(frozen=True)
class SourceTokens:
    """Tokens of the counted pass by source folder, biggest first (see the module docstring).

    ``run_id`` is the pass counted (``None`` when no pass used the cache:
    then nothing is counted).

    Attributes:
        run_id: The pass counted; null when no pass used the cache.
        folders: Source folders, biggest first.
        document_tokens: Tokens of the document's own sections.
        uncounted_files: Source files whose tokens the cache no longer holds.
    """

    run_id: int | None
    folders: list[SourceFolder]
    document_tokens: int
    uncounted_files: int


@dataclass(frozen=True)
class ReportAdapter:
    """An adapter version, as registered in ``adapters``.

    Attributes:
        version: Its version number (``vNNNN``).
        run_id: The run that trained it.
        phase: ``sft`` or ``preference``.
        method: ``dpo`` or ``orpo`` for a preference adapter; null for SFT.
        parent_version: The adapter a preference phase started from; null for SFT.
        sha256: sha256 of its ``adapter_model.safetensors``.
        bytes: Size of the adapter folder.
        steps: Optimizer steps trained.
        final_loss: Loss at the last logged step; null when none.
        created_at: When it was registered.
        name: The named adapter (``training.adapters``) it is a version of; null for a document's one adapter.
    """

    version: int
    run_id: int
    phase: str
    method: str | None
    parent_version: int | None
    sha256: str
    bytes: int
    steps: int
    final_loss: float | None
    created_at: str
    name: str | None = None


@dataclass(frozen=True)
class LockEntry:
    """One lock record and how it differs from the lock before it.

    ``compared_with`` is the record it was compared with (``None`` for the
    first); ``severity`` is the worst of ``changes`` (``None`` when nothing
    changed); ``problem`` says why a record could not be read, if so.

    Attributes:
        record_id: The ``lock_records`` row.
        run_id: The run it was captured for; null when unknown.
        created_at: When it was recorded.
        decision: ``written``, ``updated`` or ``ignored``.
        compared_with: The record it was compared with; null for the first.
        changes: How it differs from that record, field by field.
        severity: The worst severity among the changes; null when nothing changed.
        problem: Why the record could not be read; null when it could.
    """

    record_id: int
    run_id: int | None
    created_at: str
    decision: str
    compared_with: int | None
    changes: list[Mismatch] = field(default_factory=list)
    severity: str | None = None
    problem: str | None = None


@dataclass(frozen=True)
class StoreReport:
    """The JSON shape of ``dlm report --json``: everything the page shows.

    ``document_path`` is the document the newest run read (``None`` before
    any run). ``training`` is newest first; ``cache_passes``, ``adapters``
    and ``lock_history`` oldest first.

    Attributes:
        dlm_id: The document id.
        store_path: The store's folder.
        document_path: The document the newest run read; null before any run.
        generated_at: When the report was built.
        run_count: Runs recorded.
        cache_entries: Entries in the token cache.
        cache_bytes: Bytes the cache holds.
        training: Train runs, newest first, with their loss and learning-rate curves.
        cache_passes: Tokenize passes, oldest first.
        sources: Tokens by source folder.
        adapters: Adapter versions, oldest first.
        lock_history: Lock records, oldest first, each with its changes.
        probes: The probes of the newest run that asked any, the models side by side; null before any.
        exports: Every ``dlm export`` of the adapters, newest first.
    """

    dlm_id: str
    store_path: str
    document_path: str | None
    generated_at: str
    run_count: int
    cache_entries: int
    cache_bytes: int
    training: list[TrainingRun]
    cache_passes: list[CachePass]
    sources: SourceTokens
    adapters: list[ReportAdapter]
    lock_history: list[LockEntry]
    exports: list[ExportSummary] = field(default_factory=list)
    probes: ProbeTable | None = None


def build_report(store: Store, *, train_runs: int = DEFAULT_TRAIN_RUNS) -> StoreReport:
    """Read the report of ``store``: one read transaction, one query per table.

    Args:
        store: an open store.
        train_runs: draw the curves of at most this many train runs, newest first.

    Raises:
        ValueError: ``train_runs`` is below 1.
    """
    if train_runs < 1:
        raise ValueError(f"train_runs must be at least 1, not {train_runs}")
    with store.read() as conn:
        run_count, newest_path = conn.execute(
            "SELECT COUNT(*), (SELECT dlm_path FROM runs ORDER BY id DESC LIMIT 1) FROM runs"
        ).fetchone()
        totals = conn.execute("SELECT entry_count, bytes FROM cache_totals WHERE id = 1").fetchone()
        adapters = [
            ReportAdapter(**row)
            for row in conn.execute(
                "SELECT version, run_id, phase, method, parent_version, sha256, bytes, steps, final_loss, "
                "created_at, name FROM adapters ORDER BY version"
            )
        ]
        training = _training(conn, adapters, train_runs)
        passes = [
            CachePass(**row)
            for row in conn.execute(
                "SELECT e.run_id, r.command, r.status, e.created_at, e.cache_hits, e.cache_misses, "
                "e.total_tokenize_seconds, e.cache_bytes_after, e.cache_mode, e.cache_shared, "
                "d.clusters AS dedup_clusters, d.duplicate_rows, d.dropped_rows "
                "FROM tokenization_events AS e JOIN runs AS r ON r.id = e.run_id "
                "LEFT JOIN dedup_runs AS d ON d.run_id = e.run_id ORDER BY e.run_id"
            )
        ]
        document_dir = os.path.dirname(newest_path) if newest_path else None
        sources = _source_tokens(conn, document_dir)
        locks = _lock_history(conn)
        exports = list_exports(conn)
        probes = newest_probes(conn)
    return StoreReport(
        dlm_id=store.dlm_id,
        store_path=path_text(store.path),  # as document_path: UTF-8 text for the page and the JSON
        document_path=newest_path,
        generated_at=utc_now(),
        run_count=run_count,
        cache_entries=totals["entry_count"] if totals else 0,
        cache_bytes=totals["bytes"] if totals else 0,
        training=training,
        cache_passes=passes,
        sources=sources,
        adapters=adapters,
        lock_history=locks,
        exports=exports,
        probes=probes,
    )


def _training(conn: sqlite3.Connection, adapters: list[ReportAdapter], limit: int) -> list[TrainingRun]:
    """The newest ``limit`` train runs with their steps by phase, their splits, replay draws and
    retention figures (seven queries)."""
    runs = conn.execute(
        "SELECT id, status, started_at, finished_at, error FROM runs WHERE command = 'train' "
        "ORDER BY id DESC LIMIT ?",
        (limit,),
    ).fetchall()
    steps: dict[tuple[int, str], list[StepPoint]] = defaultdict(list)
    for row in conn.execute(
        "SELECT run_id, phase, step, loss, learning_rate FROM train_steps WHERE run_id IN "
        "(SELECT id FROM runs WHERE command = 'train' ORDER BY id DESC LIMIT ?) "
        "ORDER BY run_id, phase <> 'sft', step",
        (limit,),
    ):
        steps[(row["run_id"], row["phase"])].append(StepPoint(row["step"], row["loss"], row["learning_rate"]))
    methods = {(a.run_id, a.phase): a.method for a in adapters}
    val = val_points(conn, [run["id"] for run in runs])
    splits = recorded(conn, [run["id"] for run in runs])
    draws = replay_draws(conn, [run["id"] for run in runs])
    kept = retention_figures(conn, [run["id"] for run in runs])
    result = []
    for run in runs:
        phases = [
            PhaseCurve(
                phase, methods.get((run["id"], phase)), steps[(run["id"], phase)], val[(run["id"], phase)]
            )
            for phase in ("sft", "preference")
            if (run["id"], phase) in steps
        ]
        took = duration_seconds(run["started_at"], run["finished_at"])
        result.append(
            TrainingRun(
                run["id"], run["status"], run["started_at"], phases, took, run["error"], splits.get(run["id"]),
                draws.get(run["id"]), kept.get(run["id"], []),
            )
        )  # fmt: skip
    return result


def _source_tokens(conn: sqlite3.Connection, document_dir: str | None) -> SourceTokens:
    """Tokens of the newest pass that used the cache, by source folder (see the module docstring)."""
    counted = conn.execute(
        "SELECT run_id, tokenizer_sha256, sequence_len FROM tokenization_events WHERE cache_mode = 'on' "
        "ORDER BY run_id DESC LIMIT 1"
    ).fetchone()
    if counted is None:
        return SourceTokens(None, [], 0, 0)
    # The pass's entries: those it wrote or whose logged use is folded have
    # its run as last_run_id; the rest are in its rows of the use log.
    tokens: dict[str, int] = dict(
        conn.execute(
            "SELECT row_key, token_count FROM cache_entries "
            "WHERE tokenizer_sha256 = ? AND sequence_len = ? "
            "AND (last_run_id = ? OR id IN (SELECT value FROM json_each(?)))",
            (
                counted["tokenizer_sha256"],
                counted["sequence_len"],
                counted["run_id"],
                json.dumps(entries_used_by(conn, counted["run_id"])),
            ),
        ).fetchall()
    )
    folders: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # folder -> [files, tokens]
    seen: set[str] = set()
    uncounted = 0
    for path, digest, known in conn.execute(
        "SELECT path, digest, row_key FROM source_stats WHERE status = 'ok'"
    ):
        key = known or (text_row_key(digest) if digest else None)
        if key is None or key not in tokens:
            uncounted += 1
            continue
        seen.add(key)
        entry = folders[_folder(path, document_dir)]
        entry[0] += 1
        entry[1] += tokens[key]
    ordered = sorted(folders.items(), key=lambda item: (-item[1][1], item[0]))
    return SourceTokens(
        run_id=counted["run_id"],
        folders=[SourceFolder(name, files, count) for name, (files, count) in ordered],
        document_tokens=sum(count for key, count in tokens.items() if key not in seen),
        uncounted_files=uncounted,
    )


#: A folder this many levels above the document's folder, or more, is shown by its absolute path.
_FAR = 3


def _folder(path: str, document_dir: str | None) -> str:
    """The folder of ``path``, relative to the document's folder (``notes``, ``../docs``) when near it."""
    folder = os.path.dirname(path)
    if document_dir is not None:
        relative = os.path.relpath(folder, document_dir)
        if relative.split(os.sep)[:_FAR] != [os.pardir] * _FAR:
            return relative
    return folder


def _lock_history(conn: sqlite3.Connection) -> list[LockEntry]:
    """Every lock record oldest first, compared with the lock on disk before it."""
    entries = []
    on_disk: tuple[int, Lock] | None = None  # the record dlm.lock held: (id, lock)
    for row in conn.execute(
        "SELECT id, run_id, created_at, decision, lock_json FROM lock_records ORDER BY id"
    ):
        try:
            lock = parse_lock(str(row["lock_json"]), source=f"lock record {row['id']}")
        except LockError as exc:
            entries.append(
                LockEntry(
                    row["id"], row["run_id"], row["created_at"], row["decision"], None, problem=str(exc)
                )
            )
            continue
        changes = compare(on_disk[1], lock) if on_disk is not None else []
        worst = max((SEVERITY_ORDER.index(c.severity) for c in changes), default=None)
        entries.append(
            LockEntry(
                record_id=row["id"],
                run_id=row["run_id"],
                created_at=row["created_at"],
                decision=row["decision"],
                compared_with=on_disk[0] if on_disk is not None else None,
                changes=changes,
                severity=None if worst is None else SEVERITY_ORDER[worst],
            )
        )
        if row["decision"] in ("written", "updated"):
            on_disk = (row["id"], lock)
    return entries

"""The ``dlm train --watch`` loop: the first run, then a capped run per save that changed the rows.

:func:`watch_document` yields a :class:`WatchCycle` as each cycle starts
and ends, for the CLI to draw. Each cycle:

1. waits for a save (:class:`~dlmstore.watch.saves.Saves`) and then for
   ``debounce_ms`` without one, so a burst of saves is one cycle;
2. meanwhile (as soon as the first save arrives, and again after the wait
   when another save came during it) reads the document and its sources as
   ``dlm show`` does (files the
   store's stat records prove unchanged are not read) and compares their
   row keys, in order, the copies tag weights give each row
   (``.dlm/training.yaml``, :mod:`dlmstore.corpus.weights`) and the
   frontmatter with those of the last run: a save that changes none is skipped;
3. otherwise trains, through the cache, a run of at most ``max_steps``
   steps (``dlm train --max-steps``), recorded like any other run.

Saves that land during a run are gathered meanwhile and make one more
cycle after it, however many there were. A document that cannot be read
(or a run that fails) ends its cycle with the error's line; the loop goes
on watching. Ctrl-C and SIGTERM are not caught here: a run they interrupt
is recorded as any interrupted ``dlm train`` (and resumes as one), the
watcher threads are stopped on the way out, and the command ends as every
interrupted command does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlmstore.errors import DlmError

if TYPE_CHECKING:
    from dlmstore.train.summary import NamedTrainSummary, TrainSummary


@dataclass(frozen=True)
class WatchCycle:
    """Where one cycle of ``dlm train --watch`` is.

    Attributes:
        number: 0 for the first run, then 1, 2, ... for each settled burst of saves.
        stage: ``training`` (a run starts), ``trained`` (it completed), ``skipped`` (no row and no
            setting changed), or ``failed`` (the document could not be read or the run failed).
        saved: the paths saved in the burst (empty for the first run).
        rows: the document's rows now (0 when it could not be read).
        added: rows not in the last run's rows.
        removed: rows of the last run no longer there.
        summary: the run's summary (``trained`` only): a run per named adapter for a document that
            declares them.
        error: the error's message (``failed`` only).
        hint: its hint, if any.
        seconds: from the end of the debounce to this point.
    """

    number: int
    stage: str
    saved: tuple[str, ...] = ()
    rows: int = 0
    added: int = 0
    removed: int = 0
    summary: TrainSummary | NamedTrainSummary | None = None
    error: str | None = None
    hint: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class _Rows:
    """What a run would train on: the row keys in order, their copies under tag weights, the frontmatter,
    and the adapter each in-body section is routed to (``::instruction#tone::``)."""

    keys: tuple[str, ...]
    settings: Mapping[str, Any]
    copies: tuple[int, ...] = ()  # one per key when a training.yaml sets weights
    routes: tuple[str | None, ...] = ()


def watch_document(
    path: str,
    *,
    debounce_ms: int,
    max_steps: int,
    options: Mapping[str, Any],
    force_polling: bool | None = None,
) -> Iterator[WatchCycle]:
    """Train the document at ``path``, then again after each save that changes its rows; never returns.

    Args:
        path: the .dlm document.
        debounce_ms: how long no save must come after one before its cycle starts.
        max_steps: the most steps of each cycle after the first (the first runs as ``dlm train`` would):
            fewer where ``options["max_steps"]`` or the document's ``training.max_steps`` is smaller.
            A document that trains by epochs trains exactly this many (as DLM's watch mode does).
        options: keyword arguments of :func:`~dlmstore.train.trainer.train_document` for the
            first run; the cycles after it use them without ``resume`` and ``fresh``. A document
            with named adapters trains each of them (:func:`dlmstore.train.named.adapter_runs.train`).
        force_polling: watchfiles' polling instead of the system's notifications (``None``: its default).

    Raises:
        whatever the first run raises (as ``dlm train``); KeyboardInterrupt and
        :class:`~dlmstore.errors.Terminated` from any point.
    """
    from dlmstore.bases import tokenizers_kept
    from dlmstore.train.named.adapter_runs import train
    from dlmstore.watch.saves import Saves, watched_paths

    later = {name: value for name, value in options.items() if name != "max_steps"}
    later.update(resume=False, fresh=False)
    # Every cycle's run loads the base's tokenizer: loaded again from unchanged files, it is the same.
    with Saves(force_polling=force_polling) as saves, tokenizers_kept():
        document, last = _read(path)
        saves.watch(watched_paths(document))  # before the first run: a save during it is a cycle after it
        started = time.monotonic()
        yield WatchCycle(0, "training", rows=len(last.keys))
        summary = train(path, **options)
        yield WatchCycle(
            0, "trained", rows=len(last.keys), summary=summary, seconds=time.monotonic() - started
        )
        number = 0
        while True:
            # The rows are read as soon as a save arrives, while the debounce waits for quiet; a save
            # during the read or the wait makes them read again once it is quiet.
            batches = saves.arrived()
            try:
                read: tuple[Any, _Rows] | DlmError = _read(path)
            except DlmError as exc:
                read = exc
            saved = saves.settled(debounce_ms / 1000)
            number += 1
            started = time.monotonic()
            if saves.since(batches):
                try:
                    read = _read(path)
                except DlmError as exc:
                    read = exc
            if isinstance(read, DlmError):
                yield _failed(number, saved, read, started)
                continue
            document, now = read
            saves.watch(watched_paths(document))  # its sources may have changed
            added, removed = _difference(last, now)
            if now == last:
                yield WatchCycle(number, "skipped", saved, len(now.keys), seconds=time.monotonic() - started)
                continue
            yield WatchCycle(number, "training", saved, len(now.keys), added, removed)
            try:
                summary = train(path, **later, max_steps=_cap(max_steps, options, document))
            except DlmError as exc:
                yield _failed(number, saved, exc, started, rows=len(now.keys))
                continue
            last = now
            yield WatchCycle(number, "trained", saved, len(now.keys), added, removed, summary,
                             seconds=time.monotonic() - started)  # fmt: skip


def _read(path: str) -> tuple[Any, _Rows]:
    """The document at ``path`` and its rows, read as ``dlm show`` reads them.

    Raises:
        DocumentError, SourceError: the document or its sources cannot be read.
    """
    from dlmstore.collector import paused
    from dlmstore.corpus.assemble import load_corpus
    from dlmstore.corpus.weights import row_weights
    from dlmstore.document.parser import parse_document
    from dlmstore.home import store_dir
    from dlmstore.sources.statcache import StatCache
    from dlmstore.store.connection import DB_NAME

    document = parse_document(path)
    with paused():  # one object per source file, none in a cycle (dlmstore.collector)
        stats = StatCache.load_read_only(store_dir(document.dlm_id) / DB_NAME)
        corpus = load_corpus(document, stat_cache=stats)
        keys = tuple(row.row_key for row in corpus.rows())
        weights = row_weights(corpus)
    seed = document.frontmatter.training.seed
    copies = () if weights is None else tuple(weights.copies(key, seed) for key in keys)
    routes = tuple(section.adapter for section in document.sections)
    return document, _Rows(keys, document.frontmatter.model_dump(mode="json"), copies, routes)


def _cap(max_steps: int, options: Mapping[str, Any], document: Any) -> int:
    """A cycle's steps: ``max_steps``, or fewer where ``--max-steps`` or ``training.max_steps`` says fewer."""
    given = [options.get("max_steps"), document.frontmatter.training.max_steps]
    return min([max_steps, *(int(steps) for steps in given if steps is not None)])


def _difference(last: _Rows, now: _Rows) -> tuple[int, int]:
    before, after = set(last.keys), set(now.keys)
    return len(after - before), len(before - after)


def _failed(
    number: int, saved: tuple[str, ...], exc: DlmError, started: float, *, rows: int = 0
) -> WatchCycle:
    message, hint = exc.reports()[0]
    return WatchCycle(
        number, "failed", saved, rows, error=message, hint=hint, seconds=time.monotonic() - started
    )


__all__ = ["WatchCycle", "watch_document"]

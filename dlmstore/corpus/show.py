"""``dlm show``: a read-only summary of a document and its store.

Nothing here writes: the store is only looked at (path, existence, cache
totals and the stat records of source files read through a read-only
connection), so ``dlm show`` on a document that has never been tokenized
creates nothing. The stat records let it skip reading source files the last
``dlm tokenize`` saw unchanged, racily clean ones excepted
(``dlmstore.sources.statcache``).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dlmstore.bases import resolve_base
from dlmstore.cache.admin import cache_summary
from dlmstore.collector import paused
from dlmstore.corpus import dedup as duplicates
from dlmstore.corpus import holdout
from dlmstore.corpus import snapshot as snapshots
from dlmstore.corpus.dedup import DedupReport
from dlmstore.corpus.weights import WeightCount
from dlmstore.document.parser import body_sections, parse_document, preference_triples
from dlmstore.document.rows import Row, row_counts
from dlmstore.document.sections import SECTION_TYPES, Section
from dlmstore.errors import BaseModelError
from dlmstore.home import store_dir
from dlmstore.sources.provenance import SourceProvenance
from dlmstore.sources.statcache import StatCache
from dlmstore.store.connection import DB_NAME
from dlmstore.store.contamination import Contamination

if TYPE_CHECKING:
    from dlmstore.document.parser import Document


@dataclass(frozen=True)
class BaseModelInfo:
    """How ``base_model`` resolves; ``kind`` is ``unresolved`` with an ``error`` when it does not.

    Attributes:
        name: ``base_model`` as the document writes it.
        kind: What it names: ``builtin``, ``registry``, ``hub`` or ``local``; ``unresolved`` when it
            names nothing usable.
        location: Where the weights come from (hub id, folder, package file); null when unresolved.
        error: Why it does not resolve; null when it does.
    """

    name: str
    kind: str
    location: str | None
    error: str | None = None


@dataclass(frozen=True)
class StoreInfo:
    """Where the document's store lives and whether it has been created.

    Attributes:
        path: The store folder (``<home>/store/<dlm_id>``).
        exists: Whether its store.db has been created yet.
    """

    path: str
    exists: bool


@dataclass(frozen=True)
class TrainingCacheInfo:
    """The tokenized cache at a glance (``training_cache`` in ``dlm show --json``).

    Attributes:
        path: The folder of the cache's token files.
        entry_count: Cache entries (tokenized rows) held.
        bytes: Bytes of token data they hold.
        last_run_hit_rate: Share of rows served from the cache by the last cached run (0 to 1); null
            before one.
        last_run_id: That run's id; null before one.
    """

    path: str
    entry_count: int
    bytes: int
    last_run_hit_rate: float | None
    last_run_id: int | None


@dataclass(frozen=True)
class AdapterRows:
    """What one named adapter (``training.adapters``) trains on, by DLM's routing table.

    Attributes:
        name: The adapter.
        sections: In-body sections routed to it, by type (untagged prose trains every adapter,
            untagged instruction and preference sections the first-declared one).
        rows: Training rows those sections and the sources' files give it, by row kind (every
            source file trains every adapter).
    """

    name: str
    sections: dict[str, int]
    rows: dict[str, int]


def adapter_rows(
    sections: Sequence[Section], names: Sequence[str], source_sections: int
) -> list[AdapterRows]:
    """Each named adapter's sections and rows, in declaration order (none for a one-adapter document)."""
    from dlmstore.document.adapter_routing import routes_to

    out = []
    for name in names:
        routed = [section for section in sections if routes_to(section, name, names)]
        rows = row_counts(routed)
        rows["text"] += source_sections
        by_type = Counter(section.type for section in routed)
        out.append(AdapterRows(name, {kind: by_type.get(kind, 0) for kind in SECTION_TYPES}, rows))
    return out


@dataclass(frozen=True)
class DocumentSummary:
    """The JSON shape of ``dlm show --json`` (a documented contract).

    Attributes:
        path: The document (as given).
        dlm_id: Its document id.
        dlm_version: The frontmatter schema version it is written at.
        base_model: How its ``base_model`` resolves.
        system_prompt: ``system_prompt`` from the frontmatter; null when unset.
        sequence_len: ``training.sequence_len``: tokens per training row at most.
        seed: ``training.seed``.
        sections: Sections in the body by type (``prose``, ``instruction``, ``preference``, ...),
            every type listed.
        source_sections: Sections that came from ``training.sources`` files.
        rows: Training rows the sections become, by row kind.
        sources: Each ``training.sources`` directive: what it included and what it skipped, with
            why.
        store: Where the document's store is.
        training_cache: The tokenized cache at a glance.
        dedup: The duplicate clusters among the text rows, and what ``training.dedup`` drops.
        contamination: The rows the validation split holds out under ``training.seed`` that
            duplicate rows that train (``dlm train --seed`` draws another split), and whether
            ``training.dedup`` keeps them out: as the newest train run over these rows with that
            seed recorded them, else found now.
        not_used: Frontmatter keys set in the document that dlmstore accepts but does not use.
        warnings: Warnings about the document (also printed on stderr).
        tag_weights: Each ``(tag, value)`` a ``.dlm/training.yaml`` weighs, with the rows tagged
            with it and the copies it adds or rows it drops under ``training.seed``, counted over
            every row (a run repeats only the rows that train, not those held out); empty when no
            ``training.yaml`` sets ``weights``.
        adapters: Each named adapter's sections and rows (``training.adapters``); empty for a
            document with one adapter.
    """

    path: str
    dlm_id: str
    dlm_version: int
    base_model: BaseModelInfo
    system_prompt: str | None
    sequence_len: int
    seed: int
    sections: dict[str, int]
    source_sections: int
    rows: dict[str, int]
    sources: list[SourceProvenance]
    store: StoreInfo
    training_cache: TrainingCacheInfo
    dedup: DedupReport
    contamination: Contamination
    not_used: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    tag_weights: list[WeightCount] = field(default_factory=list)
    adapters: list[AdapterRows] = field(default_factory=list)


def summarize(path: str | Path) -> DocumentSummary:
    """Parse the document at ``path``, expand its sources and describe it.

    Raises:
        DocumentError: the document is missing or malformed.
        SourceError: a ``training.sources`` directive cannot be expanded.
    """
    # What the last all-hits `dlm tokenize` found, from the document's bytes alone when they
    # are the bytes it parsed (dlmstore.corpus.snapshot.unparsed): no frontmatter validated.
    found = snapshots.unparsed(os.fspath(path))
    if found is not None:
        answered = _answered(found)
        if answered is not None:
            return answered
    from dlmstore.corpus.assemble import load_corpus
    from dlmstore.corpus.weights import row_weights
    from dlmstore.document.frontmatter import unused_keys

    document = parse_document(path)
    store_path = store_dir(document.dlm_id)
    rows = row_counts(document.sections)
    # What the last all-hits `dlm tokenize` found, when a stat of every folder
    # and file proves the tree unchanged (dlmstore.corpus.snapshot): no walk.
    snapshot = snapshots.load_read_only(store_path / DB_NAME, document)
    mode = document.frontmatter.training.dedup
    seed = document.frontmatter.training.seed
    dedup = None
    contamination = None
    weighed: list[WeightCount] = []
    if snapshot is not None and snapshots.tree_holds(snapshot, document):
        source_sections = snapshot.counts.source_sections
        provenance = snapshots.provenance(snapshot)
        source_warnings: tuple[str, ...] = ()  # a snapshot is only taken of a pass without warnings
        # The same rows as that run's: its recorded clusters, when it read these document bytes.
        dedup = duplicates.recorded_for(
            store_path / DB_NAME,
            snapshot.run_id,
            document=document.path.name,
            dlm_sha256=document.sha256,
            mode=mode,
        )
        if dedup is not None:  # None when a signature it needs is kept nowhere: then the walk below
            contamination = holdout.inspect_recorded(store_path / DB_NAME, dedup, seed=seed)
    if dedup is None or contamination is None:
        # Else the stat records the last `dlm tokenize` kept, read-only: files they
        # prove unchanged are not read (their rows need only the recorded digest).
        with paused():  # one object per source file, none in a cycle (dlmstore.collector)
            corpus = load_corpus(document, stat_cache=StatCache.load_read_only(store_path / DB_NAME))
            dedup = duplicates.inspect(store_path / DB_NAME, corpus, mode=mode)
            contamination = holdout.inspect(store_path / DB_NAME, corpus, dedup, seed=seed)
            # A tree with a .dlm/ folder is never proven by a snapshot (sources.walk), so its weights
            # are always counted here.
            weights = row_weights(corpus)
            if weights is not None:
                weighed = list(weights.counts([row.row_key for row in corpus.rows()], seed))
        source_sections = len(corpus.source_sections)
        provenance = list(corpus.expansion.provenance)
        source_warnings = corpus.expansion.warnings
    rows["text"] += source_sections  # each source file is one prose section: one text row
    try:
        ref = resolve_base(document.base_model, relative_to=document.directory)
        base = BaseModelInfo(ref.name, ref.kind, ref.location)
    except BaseModelError as exc:
        base = BaseModelInfo(document.base_model, "unresolved", None, exc.message)
    by_type = Counter(section.type for section in document.sections)
    cache = cache_summary(document.dlm_id)
    training = document.frontmatter.training
    return DocumentSummary(
        path=str(document.path),
        dlm_id=document.dlm_id,
        dlm_version=document.frontmatter.dlm_version,
        base_model=base,
        system_prompt=document.frontmatter.system_prompt,
        sequence_len=training.sequence_len,
        seed=training.seed,
        sections={kind: by_type.get(kind, 0) for kind in SECTION_TYPES},
        source_sections=source_sections,
        rows=rows,
        sources=provenance,
        store=StoreInfo(str(store_path), (store_path / DB_NAME).is_file()),
        training_cache=TrainingCacheInfo(
            cache.path, cache.entry_count, cache.bytes, cache.last_run_hit_rate, cache.last_run_id
        ),
        dedup=dedup,
        contamination=contamination,
        not_used=unused_keys(document.frontmatter),
        warnings=[*document_warnings(document), *source_warnings],
        tag_weights=weighed,
        adapters=adapter_rows(document.sections, list(training.adapters or ()), source_sections),
    )


def _answered(found: snapshots.Unparsed) -> DocumentSummary | None:
    """:func:`summarize` from the snapshot of the document's bytes when it holds (checks 1 and
    3) and the tokenize run it was taken by recorded the clusters; else ``None``."""
    snapshot, settings = found.snapshot, found.settings
    if not snapshot.proof.holds():
        return None
    store_path = store_dir(settings.dlm_id)
    db_path = store_path / DB_NAME
    dedup = duplicates.recorded_for(
        db_path, snapshot.run_id, document=found.path.name, dlm_sha256=found.sha256, mode=settings.dedup
    )
    contamination = None if dedup is None else holdout.inspect_recorded(db_path, dedup, seed=settings.seed)
    if dedup is None or contamination is None:
        return None
    sections = body_sections(found.data, str(found.path))
    rows = row_counts(sections)
    rows["text"] += snapshot.counts.source_sections
    try:
        ref = resolve_base(settings.base_model, relative_to=found.path.parent)
        base = BaseModelInfo(ref.name, ref.kind, ref.location)
    except BaseModelError as exc:
        base = BaseModelInfo(settings.base_model, "unresolved", None, exc.message)
    by_type = Counter(section.type for section in sections)
    cache = cache_summary(settings.dlm_id)
    return DocumentSummary(
        path=str(found.path),
        dlm_id=settings.dlm_id,
        dlm_version=settings.dlm_version,
        base_model=base,
        system_prompt=settings.system_prompt,
        sequence_len=snapshot.sequence_len,
        seed=settings.seed,
        sections={kind: by_type.get(kind, 0) for kind in SECTION_TYPES},
        source_sections=snapshot.counts.source_sections,
        rows=rows,
        sources=snapshots.provenance(snapshot),
        store=StoreInfo(str(store_path), db_path.is_file()),
        training_cache=TrainingCacheInfo(
            cache.path, cache.entry_count, cache.bytes, cache.last_run_hit_rate, cache.last_run_id
        ),
        dedup=dedup,
        contamination=contamination,
        not_used=list(settings.not_used),
        warnings=_warnings(found.path, settings.not_used, sections),
        adapters=adapter_rows(sections, settings.adapters, snapshot.counts.source_sections),
    )


def document_warnings(document: Document) -> list[str]:
    """What a document asks for that dlmstore does not do (``dlm show``, ``dlm train``)."""
    from dlmstore.document.frontmatter import unused_keys

    return _warnings(document.path, unused_keys(document.frontmatter), document.sections)


def _warnings(path: Path, not_used: Sequence[str], sections: Sequence[Section]) -> list[str]:
    out = []
    if not_used:
        out.append(f"{path}: not used by dlmstore: {', '.join(not_used)}")
    for section in sections:
        if section.type == "preference":
            for number, (_, chosen, rejected) in enumerate(preference_triples(section), start=1):
                if chosen == rejected:
                    out.append(
                        f"{path}:{section.line}: preference triple {number}: chosen and rejected are "
                        "the same text; it teaches no preference, and preference training refuses it"
                    )
    return out


def document_rows(path: str | Path) -> list[Row]:
    """The rows ``dlm train`` would train on, in order (``dlm show --rows``)."""
    from dlmstore.corpus.assemble import load_corpus

    return load_corpus(parse_document(path)).rows()

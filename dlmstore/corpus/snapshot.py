"""Pass snapshots: answer a warm ``dlm tokenize`` (and ``dlm show``) without walking the tree.

After a tokenize pass in which every row was a cache hit, what that pass
found is kept in ``pass_snapshots``, one row per document: its counts, each
directive's provenance, the ids of the cache entries it used, and a
:class:`~dlmstore.sources.proof.SourceProof` (a stat per folder listed
and per file examined). The next ``dlm tokenize`` of the same document
checks, in this order, and answers from the snapshot only when all hold:

1. the document's bytes (sha256), the tokenizer, ``sequence_len`` and the
   :func:`context` (dlmstore's version and these rules, each directive's
   resolved root, the document's real path, the policy) are the same;
2. no cache entry was deleted or moved since the entries were found
   (``cache_totals.changes``, kept by triggers), and every segment those
   entries lie in is a regular file long enough to hold them (as a pass
   that only counts checks, ``TokenCache.lookup``);
3. the proof holds: every folder and file has the stat fields recorded.

Anything else does the full pass, which takes a new snapshot when it ends
all hits.

The snapshot also keeps what the document's frontmatter said
(:class:`SnapshotDocument`: its id, base model, cache limit, dedup mode, its
directives' paths...), so a warm pass is answered from the document's bytes
without validating its frontmatter (:func:`unparsed`): pydantic, YAML and
the modules of the walk cost about 0.15 s to import, more than the rest of
a warm pass over 13,000 files. The bytes are the key: the snapshot of
``path`` holds only when their sha256 is the one it was taken of, in the
store the document's ``dlm_id`` names, by this dlmstore (the context), so
what they said then they say now. The ``dlm_id`` itself is read from its
``dlm_id:`` line (:func:`~dlmstore.document.parser.declared_id`) only to
find that store: a document written another way is parsed in full. A pass that materialises tokens (``dlm train``) never uses one:
it reads and checksums the entries it trains on. Damage inside a segment (a
flipped bit) is therefore found as a counting pass finds it: by the next
pass that reads the tokens, or by ``dlm cache verify``.

What the snapshot's answer leaves out is only work: the event, the run,
the use log (the entries' LRU marks) and eviction are recorded exactly as
the full pass records them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlmstore import __version__
from dlmstore.clock import utc_now
from dlmstore.id_arrays import pack_ids, unpack_ids
from dlmstore.plural import plural
from dlmstore.sources.proof import SourceProof
from dlmstore.sources.roots import anchor_dir, source_root
from dlmstore.store.path_text import path_text

if TYPE_CHECKING:
    import sqlite3
    from array import array

    from dlmstore.corpus.assemble import Corpus
    from dlmstore.corpus.pass_result import PassResult
    from dlmstore.document.parser import Document
    from dlmstore.sources.provenance import SourceProvenance
    from dlmstore.store.database import Store

_log = logging.getLogger("dlmstore.corpus.tokenize")  # the pass's own log, however it was answered

#: Bump when what a tree expands to changes for the same files (walk, read or row rules).
RULES_VERSION = 1


@dataclass(frozen=True)
class SnapshotCounts:
    """What an all-hits pass counted (the ``result`` column).

    Attributes:
        total_sections: sections, in-body and sourced.
        total_rows: rows, preference rows included.
        token_count: tokens of the text and conversation rows.
        preference_rows: preference rows.
        preference_tokens: tokens of their chosen and rejected conversations.
        source_sections: sections that came from ``training.sources`` files.
        provenance: each directive's ``SourceProvenance``, as a mapping.
    """

    total_sections: int
    total_rows: int
    token_count: int
    preference_rows: int
    preference_tokens: int
    source_sections: int
    provenance: list[dict[str, Any]]


@dataclass(frozen=True)
class SnapshotDocument:
    """What the document's frontmatter said when the snapshot was taken (kept in its context).

    Attributes:
        dlm_id: the document id (the store the snapshot is in).
        base_model: ``base_model``, as written (resolved again each pass: its tokenizer may change).
        max_bytes: ``training.cache.max_bytes``.
        dedup: ``training.dedup``.
        sources_policy: ``training.sources_policy``.
        source_paths: each directive's ``path``, as written.
        dlm_version: ``dlm_version`` (``dlm show``).
        system_prompt: ``system_prompt`` (``dlm show``).
        seed: ``training.seed`` (``dlm show``).
        not_used: the keys set that dlmstore does not use (``dlm show``).
        adapters: the named adapters ``training.adapters`` declares, in order (``dlm show``).
    """

    dlm_id: str
    base_model: str
    max_bytes: int
    dedup: str
    sources_policy: str
    source_paths: list[str]
    dlm_version: int
    system_prompt: str | None
    seed: int
    not_used: list[str]
    adapters: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, document: Document) -> SnapshotDocument:
        from dlmstore.document.frontmatter import unused_keys

        training = document.frontmatter.training
        return cls(
            dlm_id=document.dlm_id,
            base_model=document.base_model,
            max_bytes=training.cache.max_bytes,
            dedup=training.dedup,
            sources_policy=training.sources_policy,
            source_paths=[directive.path for directive in training.sources],
            dlm_version=document.frontmatter.dlm_version,
            system_prompt=document.frontmatter.system_prompt,
            seed=training.seed,
            not_used=unused_keys(document.frontmatter),
            adapters=list(training.adapters or ()),
        )


@dataclass(frozen=True)
class PassSnapshot:
    """One ``pass_snapshots`` row, loaded."""

    run_id: int
    dlm_sha256: str
    tokenizer_sha256: str
    sequence_len: int
    context: str
    proof: SourceProof
    cache_changes: int
    segment_reach: dict[str, int]
    entry_ids: array[int]
    counts: SnapshotCounts
    document: SnapshotDocument


def context(document: Document) -> str | None:
    """What a document's expansion depends on besides its bytes and the tree, as one string.

    ``None`` when a directive's path does not exist (the full pass reports it).
    """
    return _context(document.path, SnapshotDocument.of(document))


def _context(path: Path, said: SnapshotDocument) -> str | None:
    """:func:`context` of the document at ``path`` (absolute) whose frontmatter said ``said``.

    What the frontmatter said is kept in the context (``frontmatter``) rather than a column
    of its own: it is the same for the same bytes, so it never makes two contexts differ
    that would not differ anyway, and a dlmstore from before it, reading this context,
    finds it unlike its own and only takes the full pass (a new key in the ``result``
    counts would make it fail).
    """
    doc_dir = anchor_dir(path.parent)
    roots = []
    for source in said.source_paths:
        root = source_root(source, doc_dir)
        if root is None:
            return None
        roots.append(root)
    return json.dumps(
        {
            "dlmstore": __version__,
            "rules": RULES_VERSION,
            "document": os.path.realpath(path),
            "doc_root": os.path.realpath(doc_dir),
            "home": os.path.realpath(os.path.expanduser("~")),
            "policy": said.sources_policy,
            "roots": roots,
            "frontmatter": asdict(said),
        },
        sort_keys=True,
    )


def take(
    conn: sqlite3.Connection,
    document: Document,
    *,
    run_id: int,
    tokenizer_sha256: str,
    sequence_len: int,
    proof: SourceProof,
    entry_ids: list[int],
    cache_changes: int,
    counts: SnapshotCounts,
) -> bool:
    """Keep (replacing the document's previous one) the snapshot of an all-hits pass.

    Runs inside the caller's write transaction. ``cache_changes`` is the
    ``cache_totals.changes`` read with the entries: when it moved since,
    an entry may be gone and nothing is kept (``False``).
    """
    where = context(document)
    changes = conn.execute("SELECT changes FROM cache_totals WHERE id = 1").fetchone()
    if where is None or changes is None or changes[0] != cache_changes:
        return False
    reach = dict(
        conn.execute(
            "SELECT p.path, MAX(e.byte_offset + e.bytes) FROM cache_entries AS e "
            "JOIN token_segments AS p ON p.id = e.segment_id "
            "WHERE e.id IN (SELECT value FROM json_each(?)) GROUP BY p.path",
            (json.dumps(entry_ids),),
        ).fetchall()
    )
    dir_paths, dir_stamps, file_paths, file_stamps = proof.to_blobs()
    conn.execute(
        "INSERT INTO pass_snapshots (document, context, dlm_sha256, tokenizer_sha256, sequence_len, run_id, "
        "created_at, dir_paths, dir_stamps, file_paths, file_stamps, cache_changes, segment_reach, entry_ids, "
        "result) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (document) DO UPDATE SET "
        "context = excluded.context, dlm_sha256 = excluded.dlm_sha256, "
        "tokenizer_sha256 = excluded.tokenizer_sha256, sequence_len = excluded.sequence_len, "
        "run_id = excluded.run_id, created_at = excluded.created_at, dir_paths = excluded.dir_paths, "
        "dir_stamps = excluded.dir_stamps, file_paths = excluded.file_paths, "
        "file_stamps = excluded.file_stamps, cache_changes = excluded.cache_changes, "
        "segment_reach = excluded.segment_reach, entry_ids = excluded.entry_ids, result = excluded.result",
        (
            path_text(os.path.realpath(document.path)), where, document.sha256, tokenizer_sha256, sequence_len, run_id,
            utc_now(), dir_paths, dir_stamps, file_paths, file_stamps, cache_changes, json.dumps(reach),
            pack_ids(entry_ids), json.dumps(asdict(counts)),
        ),
    )  # fmt: skip
    return True


def load(conn: sqlite3.Connection, document: Document) -> PassSnapshot | None:
    """The snapshot of ``document`` when one was taken of these very bytes, else ``None``."""
    return _load(conn, document.path, document.sha256)


def _load(conn: sqlite3.Connection, path: Path, dlm_sha256: str) -> PassSnapshot | None:
    """The snapshot of the document at ``path`` whose bytes have ``dlm_sha256``, else ``None``
    (also for one taken before snapshots kept the document's settings: the next full pass
    takes it again)."""
    row = conn.execute(
        "SELECT run_id, dlm_sha256, tokenizer_sha256, sequence_len, context, dir_paths, dir_stamps, "
        "file_paths, file_stamps, cache_changes, segment_reach, entry_ids, result FROM pass_snapshots "
        "WHERE document = ? AND dlm_sha256 = ?",
        (path_text(os.path.realpath(path)), dlm_sha256),
    ).fetchone()
    if row is None:
        return None
    run_id, dlm_sha256, tokenizer, sequence_len, where, dirs, dir_stamps, files, file_stamps = row[:9]
    changes, reach, ids, result = row[9:]
    said = json.loads(where).get("frontmatter")
    if said is None or set(said) != {item.name for item in fields(SnapshotDocument)}:
        return None
    return PassSnapshot(
        run_id, dlm_sha256, tokenizer, sequence_len, where,
        SourceProof.from_blobs(dirs, dir_stamps, files, file_stamps),
        changes, json.loads(reach), unpack_ids(ids), SnapshotCounts(**json.loads(result)), SnapshotDocument(**said),
    )  # fmt: skip


@dataclass(frozen=True)
class Unparsed:
    """A document read as bytes, and the snapshot those bytes have (see :func:`unparsed`).

    Attributes:
        path: the document, absolute (as ``Document.path``).
        data: its bytes.
        sha256: their sha256 hex (as ``Document.sha256``).
        snapshot: the snapshot taken of these bytes at this path, by this dlmstore.
    """

    path: Path
    data: bytes
    sha256: str
    snapshot: PassSnapshot

    @property
    def settings(self) -> SnapshotDocument:
        return self.snapshot.document


def unparsed(path: str) -> Unparsed | None:
    """The snapshot of the document at ``path``, found from its bytes without validating them
    (no pydantic, no YAML), through a read-only connection; ``None`` when there is none to find
    so (no ``dlm_id:`` line to read the id from, no store, no snapshot of these bytes, or a
    context that moved): then parse the document and take the full way.

    Only check 1 (bytes and context) is made: the tokenizer, the cache and the tree
    are checked by :func:`holds_in` once the store is open.

    Raises:
        DocumentError: the file is missing or cannot be read (as ``parse_document`` says).
        StoreDamagedError: SQLite finds the store's database damaged.
    """
    import hashlib

    from dlmstore.document.parser import declared_id, document_bytes
    from dlmstore.home import store_dir
    from dlmstore.store.connection import DB_NAME, read_if_there

    data = document_bytes(path)
    dlm_id = declared_id(data)
    if dlm_id is None:
        return None
    absolute = Path(os.path.abspath(path))
    sha256 = hashlib.sha256(data).hexdigest()
    snapshot = read_if_there(store_dir(dlm_id) / DB_NAME, lambda conn: _load(conn, absolute, sha256))
    if snapshot is None or snapshot.document.dlm_id != dlm_id:
        return None
    settings = snapshot.document
    if snapshot.context != _context(absolute, settings):
        return None
    return Unparsed(absolute, data, sha256, snapshot)


def load_read_only(db_path: Path, document: Document) -> PassSnapshot | None:
    """:func:`load`, through a read-only connection to the store.db at ``db_path`` (``dlm show``);
    ``None`` when there is no store.db, or no ``pass_snapshots`` table in it yet.

    Raises:
        StoreDamagedError: SQLite finds the database damaged.
    """
    from dlmstore.store.connection import read_if_there

    return read_if_there(db_path, lambda conn: load(conn, document))


def tree_holds(snapshot: PassSnapshot, document: Document) -> bool:
    """Whether the document would expand as when ``snapshot`` was taken (checks 1 and 3, no cache)."""
    return snapshot.context == context(document) and snapshot.proof.holds()


def holding(
    store: Store, document: Document, *, tokenizer_sha256: str, sequence_len: int
) -> PassSnapshot | None:
    """The snapshot of ``document`` when a tokenize pass would find what it found (all three
    checks), else ``None``."""
    with store.read() as conn:
        snapshot = load(conn, document)
        if snapshot is None or (snapshot.tokenizer_sha256, snapshot.sequence_len) != (
            tokenizer_sha256,
            sequence_len,
        ):
            return None
        if not _cache_holds(store, conn, snapshot):
            return None
    return snapshot if tree_holds(snapshot, document) else None


def holds_in(store: Store, snapshot: PassSnapshot, *, tokenizer_sha256: str) -> bool:
    """Checks 2 and 3 of a snapshot :func:`unparsed` found (check 1 made), and its tokenizer."""
    if snapshot.tokenizer_sha256 != tokenizer_sha256:
        return False
    with store.read() as conn:
        if not _cache_holds(store, conn, snapshot):
            return False
    return snapshot.proof.holds()


def _cache_holds(store: Store, conn: sqlite3.Connection, snapshot: PassSnapshot) -> bool:
    """Check 2: no entry deleted or moved since, every segment long enough."""
    from dlmstore.cache.segments import SegmentReader

    changes = conn.execute("SELECT changes FROM cache_totals WHERE id = 1").fetchone()
    if changes is None or changes[0] != snapshot.cache_changes:
        return False
    segments = SegmentReader(store.path)
    for relpath, reach in snapshot.segment_reach.items():
        size = segments.size(relpath)
        if size is None or size < reach:
            return False
    return True


def replay(store: Store, snapshot: PassSnapshot, *, run_id: int, max_bytes: int) -> PassResult:
    """The result of a counting pass, from a snapshot that holds: what the full pass would record.

    The entries are logged as used by ``run_id`` and the cache is kept under
    ``max_bytes``, as ``tokenize_pass`` does; no row is built, looked up or read.
    """
    from dlmstore.cache.entries import cache_bytes, evict
    from dlmstore.cache.uses import log_use
    from dlmstore.corpus.pass_result import PassResult
    from dlmstore.store.events import TokenizationEvent

    start = time.perf_counter()
    counts = snapshot.counts
    ids = snapshot.entry_ids.tolist()
    with store.write() as conn:
        log_use(conn, ids, run_id=run_id, used_at=utc_now())
    evicted = evict(store, max_bytes=max_bytes, protect_run_id=run_id).entries
    _log.debug(
        "tokenize pass: %s, all found in the cache (the snapshot of run %d holds)",
        plural(counts.total_rows, "row"), snapshot.run_id,
    )  # fmt: skip
    event = TokenizationEvent(
        total_sections=counts.total_sections,
        total_rows=counts.total_rows,
        cache_hits=counts.total_rows,
        cache_misses=0,
        total_tokenize_seconds=round(time.perf_counter() - start, 4),
        cache_bytes_after=cache_bytes(store),
        cache_mode="on",
        hit_rate=TokenizationEvent.rate(counts.total_rows, 0),
    )
    return PassResult(
        event, None, counts.token_count, counts.preference_rows, counts.preference_tokens, None, 0, evicted,
        snapshot.tokenizer_sha256, entry_ids=ids, cache_changes=snapshot.cache_changes,
    )  # fmt: skip


def keep(store: Store, corpus: Corpus, result: PassResult, *, run_id: int, sequence_len: int) -> None:
    """Take the snapshot of a pass that just ended, when it can be proven again."""
    proof = corpus.expansion.proof
    if (
        proof is None
        or result.entry_ids is None
        or result.cache_changes is None
        or result.damaged_entries
        or result.warnings
    ):
        return
    counts = SnapshotCounts(
        total_sections=result.event.total_sections,
        total_rows=result.event.total_rows,
        token_count=result.token_count,
        preference_rows=result.preference_rows,
        preference_tokens=result.preference_tokens,
        source_sections=len(corpus.source_sections),
        provenance=[asdict(item) for item in corpus.expansion.provenance],
    )
    with store.write() as conn:
        take(
            conn, corpus.document, run_id=run_id, tokenizer_sha256=result.tokenizer_sha256,
            sequence_len=sequence_len, proof=proof, entry_ids=result.entry_ids,
            cache_changes=result.cache_changes, counts=counts,
        )  # fmt: skip


def provenance(snapshot: PassSnapshot) -> list[SourceProvenance]:
    """Each directive's provenance, as the full pass reported it."""
    from dlmstore.sources.provenance import SourceProvenance

    return [SourceProvenance(**item) for item in snapshot.counts.provenance]


__all__ = [
    "RULES_VERSION",
    "PassSnapshot",
    "SnapshotCounts",
    "SnapshotDocument",
    "Unparsed",
    "context",
    "holding",
    "holds_in",
    "keep",
    "load",
    "load_read_only",
    "provenance",
    "replay",
    "take",
    "tree_holds",
    "unparsed",
]

"""Duplicate text rows: found on every run, reported by ``dlm show``, dropped by ``training.dedup``.

Code trees hold vendored copies, generated files and near-identical
versions; trained as often as they appear, they over-weight what they
repeat. Every ``dlm tokenize`` and ``dlm train`` run (and ``dlm show``,
read-only) finds the duplicate clusters among the document's **text rows**
(prose sections and ``training.sources`` files; see
``dlmstore.corpus.signatures`` for each row's content hash and MinHash):

* **exact** duplicates have the same content hash (a source file's text
  without its ``# source:`` header, so a copy at another path counts);
* **near** duplicates have signatures that agree in at least
  :data:`THRESHOLD` of their positions (estimated Jaccard similarity of
  their 5-word shingle sets). Candidates are the pairs that share one of
  16 bands of 8 signature positions (:func:`lsh_candidates`: the pairs
  datasketch's ``MinHashLSH`` with those bands finds, a test checks, done
  with a sort per band instead of a Python call per row), over one row per
  distinct text, and each candidate pair is checked on its signatures; up
  to :data:`ALL_PAIRS` distinct texts every pair is checked instead. Pairs are joined
  into clusters (union-find), so a cluster can hold two rows less similar
  than the threshold through a third one similar to both.

Each cluster keeps the member with the smallest ``(path, row key)``, the
same whatever order the files were walked in. ``training.dedup``:

* ``off`` (the default) trains every row, exactly as before, and only
  reports: every adapter stays what it was;
* ``exact`` drops every row whose text equals a kept one (in each set of
  identical texts, all but the smallest ``(path, row key)``);
* ``near`` drops every member of a cluster but the one it keeps.

Instruction pairs and preference triples are not compared: they are
written by hand, and repeating one is deliberate (DLM trains ``!probe``
pairs on purpose, to measure what a document taught).

What a run found is recorded in ``dedup_runs`` (one row per run) and
``dedup_members`` (each cluster's rows, their similarity to the kept row
and what each mode drops). A run over the same rows as an earlier one
(same keys and paths: ``corpus_sha256``) points at that run's members
instead of finding and writing them again, so a warm pass costs one query.
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dlmstore.clock import utc_now
from dlmstore.corpus import signatures
from dlmstore.corpus.signatures import NUM_PERM, SCHEME, Signature
from dlmstore.document.rows import Row
from dlmstore.store.events import DedupEvent

if TYPE_CHECKING:
    import numpy as np

    from dlmstore.corpus.assemble import Corpus
    from dlmstore.corpus.pass_result import TokenizedRows
    from dlmstore.store.database import Store

_log = logging.getLogger(__name__)

#: ``training.dedup`` values.
MODES = ("off", "exact", "near")

#: Estimated Jaccard similarity at or above which two texts are near duplicates.
THRESHOLD = 0.8

#: Up to this many distinct texts every pair is compared; above, LSH finds the candidates.
ALL_PAIRS = 256

#: LSH bands and rows per band (16 x 8 = NUM_PERM). Two texts of similarity s share a band with
#: probability 1 - (1 - s**8)**16: 0.95 at 0.8, 0.9998 at 0.9, 0.24 at 0.6 (those are then
#: checked on their signatures and dropped). datasketch's own choice at 0.8, 9 bands of 13,
#: finds only 40% of the pairs at 0.8.
BANDS = (16, 8)

#: Candidate pairs checked on their signatures at once.
PAIR_BLOCK = 1 << 16

#: What the clusters were found with: the signatures' scheme and the threshold.
CLUSTER_SCHEME = f"{SCHEME}:t{THRESHOLD}"


@dataclass(frozen=True)
class DedupMember:
    """One row of a duplicate cluster.

    Attributes:
        path: Where the row comes from: a source file (under its directive's path as the
            frontmatter writes it) or ``document:line`` for a prose section of the body.
        row_key: The row's key.
        similarity: Estimated Jaccard similarity of its 5-word shingles to the kept row's; 1.0
            when its text is the kept row's.
        kept: Whether it is the row the cluster keeps (the smallest path, then row key).
        dropped: Whether training leaves it out under the document's ``training.dedup``.
    """

    path: str
    row_key: str
    similarity: float
    kept: bool
    dropped: bool


@dataclass(frozen=True)
class DedupCluster:
    """Text rows that duplicate each other, the kept one first.

    Attributes:
        kind: ``exact`` when every member has the same text, else ``near``.
        members: The kept row, then the others by path.
    """

    kind: str
    members: list[DedupMember]


@dataclass(frozen=True)
class DedupReport:
    """The duplicate clusters among a document's text rows (``dedup`` in ``dlm show --json``).

    Attributes:
        mode: ``training.dedup``: ``off`` (report only), ``exact`` or ``near``.
        rows: Text rows compared.
        clusters: Each cluster of two or more duplicate rows.
        duplicate_rows: Rows in clusters besides the kept ones.
        exact_duplicate_rows: Of those, rows whose text equals another row's (what ``exact`` drops).
        dropped_rows: Rows training leaves out under ``mode`` (0 when it is ``off``).
        scheme: How rows were compared: MinHash scheme (words per shingle, permutations, seed) and
            threshold.
        from_run: The run whose recorded clusters these are; null when they were found now.
        signatures_computed: Rows whose signature was made for this report (0 when every one was
            kept or recorded).
        seconds: Time spent finding them.
    """

    mode: str
    rows: int
    clusters: list[DedupCluster] = field(default_factory=list)
    duplicate_rows: int = 0
    exact_duplicate_rows: int = 0
    dropped_rows: int = 0
    scheme: str = CLUSTER_SCHEME
    from_run: int | None = None
    signatures_computed: int = 0
    seconds: float = 0.0

    def event(self) -> DedupEvent:
        """The run-level numbers (what ``dlm metrics`` shows)."""
        return DedupEvent(
            self.mode, self.rows, len(self.clusters), self.duplicate_rows, self.dropped_rows,
            self.signatures_computed, self.seconds,
        )  # fmt: skip

    def dropped(self) -> set[str]:
        """The row keys training leaves out."""
        return {m.row_key for cluster in self.clusters for m in cluster.members if m.dropped}


@dataclass(frozen=True)
class TextRow:
    """A text row and where it comes from."""

    row: Row
    source: str | None  # the section's relpath, for a training.sources file
    path: str


@dataclass(frozen=True)
class _Member:
    """A cluster member as recorded: mode-independent."""

    cluster: int
    row_key: str
    path: str
    similarity: float
    drop_exact: bool
    drop_near: bool


def text_rows(corpus: Corpus) -> list[TextRow]:
    """The text rows of ``corpus`` with their paths, in corpus order."""
    # Each section's directive: None for the body's; (path as written, whether it names one file).
    directives: list[tuple[str, bool] | None] = [None] * len(corpus.body_sections)
    for provenance in corpus.expansion.provenance:
        one_file = Path(provenance.root).is_file()
        directives += [(provenance.directive, one_file)] * provenance.files_included
    out: list[TextRow] = []
    sections = iter(zip(corpus.sections, directives, strict=True))
    section, directive = None, None
    for row in corpus.rows():
        if row.index == 0:
            section, directive = next(sections)
        if row.kind != "text" or section is None:
            continue
        if directive is None or section.source is None:
            path = f":{section.line}"  # shown as document:line (_shown): the same for every copy of it
        elif directive[1]:
            path = directive[0]
        else:
            path = posixpath.normpath(posixpath.join(directive[0], section.source))
        out.append(TextRow(row, section.source, path))
    return out


def corpus_sha256(items: Sequence[TextRow]) -> str:
    """What the clusters of ``items`` depend on: their keys and paths, in order, and the scheme."""
    digest = hashlib.sha256(CLUSTER_SCHEME.encode())
    for item in items:
        digest.update(f"\n{item.row.row_key}\t{item.path}".encode("utf-8", "surrogateescape"))
    return "sha256:" + digest.hexdigest()


def signing(store: Store, corpus: Corpus) -> signatures.Signing:
    """What signs ``corpus``'s text rows while the tokenize pass encodes them (``tokenize_pass``'s
    ``signer``; :func:`analyse` takes its signatures)."""
    return signatures.Signing(store, lambda: {item.row.row_key: item.source for item in text_rows(corpus)})


def analyse(
    store: Store,
    corpus: Corpus,
    *,
    run_id: int,
    mode: str,
    signed: signatures.Signing | None = None,
    share: bool = True,
) -> DedupReport:
    """Find the duplicate clusters of ``corpus``'s text rows and record them for ``run_id``.

    Rows without a kept signature take the one ``signed`` made while the
    tokenize pass encoded them (:func:`signing`), else one from another
    store of the home, else are signed (their text loaded when it is not
    yet); new signatures are kept. A corpus with the same rows as a
    recorded run reuses that run's clusters and signs nothing; so does one
    with the same rows as a run of another store of the home (a second
    document over the same tree). Without ``share`` (``--no-share``,
    ``training.cache.share: false``) no other store is read: what is not
    kept here is signed and clustered here, as the pass tokenized it here.
    """
    start = time.perf_counter()
    items = text_rows(corpus)
    digest = corpus_sha256(items)
    with store.read() as conn:
        prior = _run_with(conn, digest)
        members = _members(conn, prior) if prior is not None else None
        known = signatures.cached(conn, [item.row.row_key for item in items]) if members is None else {}
    if members is None and len(known) < len(items) and share:
        members = _recorded_elsewhere(store.path, digest)
    computed = 0
    if members is None:
        early = {} if signed is None else signed.made
        made = {item.row.row_key: early[item.row.row_key] for item in items
                if item.row.row_key in early and item.row.row_key not in known}  # fmt: skip
        missing = [item for item in items if item.row.row_key not in known and item.row.row_key not in made]
        taken = (
            signatures.from_other_stores(store.path, [item.row.row_key for item in missing])
            if missing and share
            else {}
        )
        made.update(
            (item.row.row_key, signatures.sign(signatures.row_text(item.row.data["text"], item.source)))
            for item in missing
            if item.row.row_key not in taken
        )
        computed = len(made)
        signatures.save(store, {**taken, **made})
        members = find_clusters(items, {**known, **taken, **made})
    report = _report(
        members, document=corpus.document.path.name, mode=mode, rows=len(items), from_run=None,
        computed=computed, start=start,
    )  # fmt: skip
    _record(store, run_id, report.event(), digest=digest, members=members, members_run=prior)
    return report


def inspect(db_path: Path, corpus: Corpus, *, mode: str) -> DedupReport:
    """:func:`analyse` without writing (``dlm show``): recorded clusters when a run had the same
    rows, else signatures kept here or in another store, the rest made in memory and not kept."""
    from dlmstore.store.connection import read_if_there

    start = time.perf_counter()
    items = text_rows(corpus)
    digest = corpus_sha256(items)

    def recorded(conn: sqlite3.Connection) -> tuple[int | None, list[_Member] | None, dict[str, Signature]]:
        prior = _run_with(conn, digest)
        if prior is not None:
            return prior, _members(conn, prior), {}
        return None, None, signatures.cached(conn, [item.row.row_key for item in items])

    prior, members, known = read_if_there(db_path, recorded) or (None, None, {})
    if members is None and len(known) < len(items):
        members = _recorded_elsewhere(db_path.parent, digest)
    if members is not None:
        return _report(
            members, document=corpus.document.path.name, mode=mode, rows=len(items), from_run=prior,
            computed=0, start=start,
        )  # fmt: skip
    missing = [item for item in items if item.row.row_key not in known]
    if missing:
        known = {**known, **signatures.from_other_stores(db_path.parent, [i.row.row_key for i in missing])}
    made = {
        item.row.row_key: signatures.sign(signatures.row_text(item.row.data["text"], item.source))
        for item in items
        if item.row.row_key not in known
    }
    members = find_clusters(items, {**known, **made})
    return _report(
        members, document=corpus.document.path.name, mode=mode, rows=len(items), from_run=None,
        computed=len(made), start=start,
    )  # fmt: skip


def recorded_for(
    db_path: Path, run_id: int, *, document: str, dlm_sha256: str, mode: str
) -> DedupReport | None:
    """The clusters recorded for ``run_id`` when it read a document of ``dlm_sha256`` (``dlm
    show``, when that run's pass snapshot proves the tree unchanged: then the rows are the same);
    ``None`` when it recorded none, or read other document bytes."""
    from dlmstore.store.connection import read_if_there

    start = time.perf_counter()

    def read(conn: sqlite3.Connection) -> DedupReport | None:
        row = conn.execute(
            "SELECT d.members_run_id, d.rows FROM dedup_runs AS d JOIN runs AS r ON r.id = d.run_id "
            "WHERE d.run_id = ? AND r.dlm_sha256 = ?",
            (run_id, dlm_sha256),
        ).fetchone()
        if row is None:
            return None
        members = _members(conn, row[0])
        return _report(
            members, document=document, mode=mode, rows=row[1], from_run=run_id, computed=0, start=start
        )

    return read_if_there(db_path, read)


def copy_record(store: Store, from_run: int, to_run: int, *, mode: str) -> DedupEvent | None:
    """Record for ``to_run`` what ``from_run`` found (a pass answered from ``from_run``'s snapshot:
    the same rows); ``None`` when ``from_run`` recorded nothing.

    Only the run's numbers are needed (the members stay ``from_run``'s), so they are counted in
    SQL: building the clusters to count them cost a warm pass over the stdlib 15 ms.
    """
    start = time.perf_counter()
    with store.read() as conn:
        row = conn.execute(
            "SELECT members_run_id, rows, corpus_sha256 FROM dedup_runs WHERE run_id = ?", (from_run,)
        ).fetchone()
        if row is None:
            return None
        clusters, duplicate_rows, exact_rows = conn.execute(
            "SELECT COUNT(DISTINCT cluster), COALESCE(SUM(drop_near), 0), COALESCE(SUM(drop_exact), 0) "
            "FROM dedup_members WHERE run_id = ?",
            (row["members_run_id"],),
        ).fetchone()
    dropped = exact_rows if mode == "exact" else duplicate_rows if mode == "near" else 0  # as _drops
    event = DedupEvent(
        mode, row["rows"], clusters, duplicate_rows, dropped, 0, round(time.perf_counter() - start, 4)
    )
    _record(store, to_run, event, digest=row["corpus_sha256"], members=[], members_run=row["members_run_id"])
    return event


def find_clusters(items: Sequence[TextRow], signed: dict[str, Signature]) -> list[_Member]:
    """The clusters of ``items`` (each with a signature in ``signed``), as recorded members."""
    import numpy as np

    # One representative per distinct text; identical texts are one node of the graph.
    by_content: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        by_content.setdefault(signed[item.row.row_key].content_sha256, []).append(index)
    groups = list(by_content.values())
    values = np.frombuffer(
        b"".join(signed[items[g[0]].row.row_key].minhash for g in groups), dtype="<u4"
    ).reshape(len(groups), NUM_PERM)
    words = [signed[items[g[0]].row.row_key].shingles > 0 for g in groups]
    parent = list(range(len(groups)))

    def root(node: int) -> int:
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for left, right in _near_pairs(values, words):
        a, b = root(left), root(right)
        if a != b:
            parent[max(a, b)] = min(a, b)
    components: dict[int, list[int]] = {}
    for group in range(len(groups)):
        components.setdefault(root(group), []).append(group)
    clusters = []
    for nodes in components.values():
        indices = [index for node in nodes for index in groups[node]]
        if len(indices) < 2:
            continue
        clusters.append(sorted(indices, key=lambda i: (items[i].path, items[i].row.row_key)))
    clusters.sort(key=lambda c: (items[c[0]].path, items[c[0]].row.row_key))
    members: list[_Member] = []
    node_of = {index: node for node, group in enumerate(groups) for index in group}
    for number, indices in enumerate(clusters, start=1):
        kept = indices[0]
        kept_values = values[node_of[kept]]
        first_of_text: set[int] = set()
        seen: set[int] = set()
        for index in indices:  # in (path, key) order: the first of each text is kept by `exact`
            if node_of[index] not in seen:
                seen.add(node_of[index])
                first_of_text.add(index)
        for index in indices:
            same = node_of[index] == node_of[kept]
            similarity = (
                1.0 if same else float(np.count_nonzero(values[node_of[index]] == kept_values)) / NUM_PERM
            )
            members.append(
                _Member(
                    number,
                    items[index].row.row_key,
                    items[index].path,
                    round(similarity, 4),
                    index not in first_of_text,
                    index != kept,
                )  # fmt: skip
            )
    return members


def _near_pairs(values: np.ndarray, words: list[bool]) -> Iterable[tuple[int, int]]:
    """Pairs of rows of ``values`` (distinct texts) whose signatures agree in at least THRESHOLD
    of their positions; rows of texts with no word are never near anything."""
    import numpy as np

    count = len(values)
    least = int(np.ceil(THRESHOLD * NUM_PERM - 1e-9))
    if count <= ALL_PAIRS:
        for left in range(count - 1):
            if not words[left]:
                continue
            agree = np.count_nonzero(values[left + 1 :] == values[left], axis=1)
            for offset in np.flatnonzero(agree >= least):
                right = left + 1 + int(offset)
                if words[right]:
                    yield left, right
        return
    nodes = np.flatnonzero(words)
    first, second = lsh_candidates(values[nodes])
    for begin in range(0, len(first), PAIR_BLOCK):  # candidates checked in blocks: bounded memory
        a, b = nodes[first[begin : begin + PAIR_BLOCK]], nodes[second[begin : begin + PAIR_BLOCK]]
        near = np.count_nonzero(values[a] == values[b], axis=1) >= least
        yield from zip(a[near].tolist(), b[near].tolist(), strict=True)


def lsh_candidates(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs ``(i, j)``, ``i < j``, of rows of ``values`` that share a band: what datasketch's
    ``MinHashLSH(num_perm=NUM_PERM, params=BANDS)`` returns when each row queries the index of all.

    Each band's values are one key; rows with equal keys in any band are
    candidates. Done on whole arrays (a sort per band) rather than one
    ``insert`` and ``query`` per row (``tests/test_dedup.py`` checks the
    pairs against ``MinHashLSH``'s).
    """
    import numpy as np

    bands, width = BANDS
    count = len(values)
    pairs: set[tuple[int, int]] = set()
    for band in range(bands):
        keys = np.ascontiguousarray(values[:, band * width : (band + 1) * width]).view(
            np.dtype((np.void, 4 * width))
        )[:, 0]
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
        starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
        sizes = np.diff(np.append(starts, count))
        for begin, size in zip(starts[sizes > 1].tolist(), sizes[sizes > 1].tolist(), strict=True):
            members = sorted(order[begin : begin + size].tolist())
            pairs.update((a, b) for index, a in enumerate(members) for b in members[index + 1 :])
    if not pairs:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    both = np.array(sorted(pairs), dtype=np.int64)
    return both[:, 0], both[:, 1]


def kept_rows(rows: TokenizedRows, dropped: set[str]) -> TokenizedRows:
    """``rows`` without the rows whose keys are in ``dropped`` (the same object when none is)."""
    keep = [index for index, key in enumerate(rows.row_keys) if key not in dropped]
    if len(keep) == len(rows):
        return rows
    return rows.take(keep)


def _report(
    members: list[_Member],
    *,
    document: str,
    mode: str,
    rows: int,
    from_run: int | None,
    computed: int,
    start: float,
) -> DedupReport:
    clusters: dict[int, list[_Member]] = {}
    for member in members:
        clusters.setdefault(member.cluster, []).append(member)
    shown = []
    for number in sorted(clusters):
        group = sorted(clusters[number], key=lambda m: (m.drop_near, m.path, m.row_key))
        kind = "exact" if sum(not m.drop_exact for m in group) == 1 else "near"  # one text, or several
        shown.append(
            DedupCluster(
                kind,
                [
                    DedupMember(
                        _shown(m.path, document), m.row_key, m.similarity, not m.drop_near, _drops(m, mode)
                    )
                    for m in group
                ],
            )
        )
    return DedupReport(
        mode=mode,
        rows=rows,
        clusters=shown,
        duplicate_rows=sum(m.drop_near for m in members),
        exact_duplicate_rows=sum(m.drop_exact for m in members),
        dropped_rows=sum(_drops(m, mode) for m in members),
        from_run=from_run,
        signatures_computed=computed,
        seconds=round(time.perf_counter() - start, 4),
    )


def _shown(path: str, document: str) -> str:
    """A member's path as shown: a body row's ``:LINE`` as ``document:LINE``."""
    return f"{document}{path}" if path.startswith(":") else path


def _drops(member: _Member, mode: str) -> bool:
    return member.drop_exact if mode == "exact" else member.drop_near if mode == "near" else False


def _run_with(conn: sqlite3.Connection, digest: str) -> int | None:
    """The newest run whose clusters were found over rows with ``digest`` (its members' run)."""
    row = conn.execute(
        "SELECT members_run_id FROM dedup_runs WHERE corpus_sha256 = ? AND scheme = ? "
        "ORDER BY run_id DESC LIMIT 1",
        (digest, CLUSTER_SCHEME),
    ).fetchone()
    return None if row is None else int(row[0])


def _recorded_elsewhere(folder: Path, digest: str) -> list[_Member] | None:
    """The clusters another store of the home recorded for rows with ``digest`` (read-only; a
    store that cannot be read is skipped); ``None`` when none did."""
    from dlmstore.cache.share import sibling_reads

    with sibling_reads(folder) as others:
        for dlm_id, conn in others:
            try:
                prior = _run_with(conn, digest)
                if prior is not None:
                    return _members(conn, prior)
            except (sqlite3.Error, UnicodeDecodeError) as exc:
                _log.debug("dedup: skipping %s: %s", dlm_id, exc)
    return None


def _members(conn: sqlite3.Connection, run_id: int) -> list[_Member]:
    cursor = conn.cursor()
    cursor.row_factory = None
    rows = cursor.execute(
        "SELECT cluster, row_key, path, similarity, drop_exact, drop_near FROM dedup_members "
        "WHERE run_id = ? ORDER BY cluster",
        (run_id,),
    ).fetchall()
    return [_Member(c, k, p, s, bool(e), bool(n)) for c, k, p, s, e, n in rows]


def _record(
    store: Store,
    run_id: int,
    event: DedupEvent,
    *,
    digest: str,
    members: list[_Member],
    members_run: int | None,
) -> None:
    """One ``dedup_runs`` row for ``run_id``; its members too unless ``members_run`` holds them."""
    with store.write() as conn:
        conn.execute(
            "INSERT INTO dedup_runs (run_id, mode, scheme, corpus_sha256, members_run_id, rows, clusters, "
            "duplicate_rows, dropped_rows, signatures_computed, seconds, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id, event.mode, CLUSTER_SCHEME, digest, run_id if members_run is None else members_run,
                event.rows, event.clusters, event.duplicate_rows, event.dropped_rows,
                event.signatures_computed, event.seconds, utc_now(),
            ),
        )  # fmt: skip
        if members_run is None and members:
            conn.execute(
                "INSERT INTO dedup_members (run_id, cluster, row_key, path, similarity, drop_exact, drop_near) "
                "SELECT ?, j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, j.value ->> 4, "
                "j.value ->> 5 FROM json_each(?) AS j",
                (
                    run_id,
                    json.dumps(
                        [
                            [m.cluster, m.row_key, m.path, m.similarity, int(m.drop_exact), int(m.drop_near)]
                            for m in members
                        ]
                    ),
                ),
            )

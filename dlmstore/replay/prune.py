"""``dlm replay prune DOC``: remove rows from the replay history, chosen by one selector.

* ``row``: the one row with that key (one ``error:`` line when history has none);
* ``older_than``: rows whose latest run finished longer ago than that
  (the same durations as ``dlm cache prune --older-than``);
* ``superseded``: rows an edit replaced (``dlmstore.replay.candidates``);
* ``everything``: every row (the generations and runs stay: they say what
  was trained, and the next run's generation keeps counting from them).

Rows and their content go in one transaction. A ``dlm train`` publishes
history in its last transaction, so pruning while one holds the store could
remove what that run is about to count on: prune takes the store lock
exclusively (``dlmstore.store.flock``) and refuses, in one line, when
another dlm process has the store open.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from dlmstore.errors import DlmError, StoreError
from dlmstore.replay.history import BODY, KEYS, KINDS, delete, keys_params, row_key_of

if TYPE_CHECKING:
    from dlmstore.document.parser import Document
    from dlmstore.store.database import Store


@dataclass(frozen=True)
class PrunedRow:
    """A history row prune removed (or, with --dry-run, would remove).

    Attributes:
        row_key: Its key.
        kind: text, messages or preference.
        origin: body, or the training.sources file it came from.
        last_generation: The latest generation that trained it.
        bytes: Its content, uncompressed.
    """

    row_key: str
    kind: str
    origin: str
    last_generation: int
    bytes: int


@dataclass(frozen=True)
class PruneResult:
    """The JSON shape of ``dlm replay prune --json``.

    Attributes:
        selector: row, older_than, superseded or all.
        dry_run: Nothing was removed (--dry-run).
        rows_removed: Rows removed (or that would be).
        bytes_removed: Their content, uncompressed.
        rows: Each of them, by row key.
    """

    selector: str
    dry_run: bool
    rows_removed: int
    bytes_removed: int
    rows: list[PrunedRow] = field(default_factory=list)


SELECTORS = ("row", "older_than", "superseded", "all")


def prune(
    path: str | Path,
    *,
    row: str | None = None,
    older_than: timedelta | None = None,
    superseded: bool = False,
    everything: bool = False,
    dry_run: bool = False,
) -> PruneResult:
    """Remove the history rows one selector chooses from the store of the document at ``path``.

    Raises:
        ValueError: not exactly one selector (the CLI makes that a usage error).
        DlmError: ``row`` is not in history; another dlm process has the store open.
        StoreError: the document has no store.
    """
    from dlmstore.clock import iso_before
    from dlmstore.document.parser import parse_document
    from dlmstore.home import store_dir
    from dlmstore.store.connection import DB_NAME
    from dlmstore.store.database import open_store

    chosen = [
        name
        for name, value in zip(
            SELECTORS, (row is not None, older_than is not None, superseded, everything), strict=True
        )
        if value
    ]
    if len(chosen) != 1:
        raise ValueError(f"exactly one selector of {SELECTORS} is needed, not {chosen}")
    selector = chosen[0]
    document = parse_document(path)
    if not (store_dir(document.dlm_id) / DB_NAME).is_file():
        raise StoreError(
            f"{path} has no store yet, so no replay history",
            hint=f"history is recorded by `dlm train {path}`",
        )
    with open_store(document.dlm_id, create=False) as store:
        if store.flock.usable and not store.flock.try_exclusive():
            raise DlmError(
                "another dlm process has this store open (a dlm train records history as it finishes); "
                "nothing was pruned",
                hint="run dlm replay prune again when it is done",
            )
        where: str = "1"  # all
        params: dict[str, object] = {}
        if row is not None:
            where, params = f"h.key IN ({KEYS})", _row_param(row)
        elif older_than is not None:
            # A row's latest run is the latest run of its last generation.
            where = (
                "h.last_generation IN (SELECT g.generation FROM history_runs AS g JOIN runs AS r "
                "ON r.id = g.run_id GROUP BY g.generation HAVING max(r.finished_at) < :before)"
            )
            params = {"before": iso_before(older_than)}
        elif selector == "superseded":
            where, params = _superseded(store, document)
        with store.write() as conn:
            found = [
                (row_key_of(r[0]), KINDS[r[1]], BODY if r[2] is None else r[2], r[3], r[4])
                for r in conn.execute(
                    "SELECT h.key, h.kind, h.source, h.last_generation, h.bytes FROM history_rows AS h "
                    f"WHERE {where} ORDER BY h.key",
                    params,
                )
            ]
            if selector == "row" and not found:
                raise DlmError(
                    f"no row {row} in the replay history of {path}",
                    hint=f"`dlm replay show {path}` lists the candidates and superseded rows",
                )
            if not dry_run and found:
                delete(conn, [r[0] for r in found])
    rows = [PrunedRow(*r) for r in found]
    return PruneResult(selector, dry_run, len(rows), sum(r.bytes for r in rows), rows)


def _row_param(row: str) -> dict[str, object]:
    """The :data:`KEYS` parameters naming ``row`` (none when it is not a row key: no row matches)."""
    try:
        return keys_params([row])
    except ValueError:
        return keys_params([])


def _superseded(store: Store, document: Document) -> tuple[str, dict[str, object]]:
    """The WHERE clause that chooses the superseded rows of ``document``'s history."""
    from dlmstore.corpus.assemble import load_corpus
    from dlmstore.eval.probes import marked_keys
    from dlmstore.replay.history import describe
    from dlmstore.sources.statcache import StatCache

    rows = describe(load_corpus(document, stat_cache=StatCache.load(store)), marked_keys(document.sections))
    supersede = json.dumps(sorted({item.supersede_key for item in rows if item.supersede_key is not None}))
    return (
        f"h.supersede IN (SELECT value FROM json_each(:supersede)) AND h.key NOT IN ({KEYS})",
        {"supersede": supersede, **keys_params(item.row_key for item in rows)},
    )

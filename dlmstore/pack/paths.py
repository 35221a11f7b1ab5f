"""Absolute paths in an unpacked store.db, rewritten for the place it now lives.

store.db records some paths absolutely: the document's (``runs.dlm_path``,
``document_paths``), folders in the store (``exports.path``) and the
sources a run read (``source_stats.path``). On unpack every TEXT value
that is one of the old places, or lies under one, is rewritten to the new
place; values elsewhere (a dataset folder built outside the store) are
left as they were, since nothing moved them. The document's old paths are
then forgotten: ``document_paths`` says where the document is now, so
``dlm stores gc`` judges the store by its new home alone.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence


def rewrite(conn: sqlite3.Connection, moves: Sequence[tuple[str, str]]) -> int:
    """Rewrite every TEXT value equal to or under each ``old`` of ``moves`` to ``new``; return the values changed.

    Moves apply in order, each to values no earlier move changed, so an
    exact path listed before a folder holding it wins.
    """
    tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    changed = 0
    for table in tables:
        if table.startswith("sqlite_"):
            continue
        columns = [
            row[1] for row in conn.execute(f'PRAGMA table_info("{table}")') if str(row[2]).upper() == "TEXT"
        ]
        for column in columns:
            done: list[str] = []
            for old, new in moves:
                if old == new:
                    continue
                prefix = old.rstrip("/") + "/"
                where = f'("{column}" = ? OR substr("{column}", 1, ?) = ?)'
                guard = "".join(f' AND NOT ("{column}" = ? OR substr("{column}", 1, ?) = ?)' for _ in done)
                params: list[object] = [new, len(old) + 1, old, len(prefix), prefix]
                for previous in done:
                    params += [previous, len(previous.rstrip("/")) + 1, previous.rstrip("/") + "/"]
                cursor = conn.execute(
                    f'UPDATE "{table}" SET "{column}" = ? || substr("{column}", ?) WHERE {where}{guard}',
                    params,
                )
                changed += cursor.rowcount
                done.append(new)
    return changed

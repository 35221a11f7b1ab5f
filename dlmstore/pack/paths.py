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
    """Rewrite every TEXT value equal to or under an ``old`` of ``moves`` to its ``new``; return the values changed.

    The first move that matches a value wins, so an exact path listed
    before a folder holding it is rewritten as itself. Each TEXT column is
    read once, whatever the number of moves.
    """
    moves = [(old, new) for old, new in moves if old != new]
    if not moves:
        return 0
    cases: list[str] = []
    tests: list[str] = []
    case_params: list[object] = []
    test_params: list[object] = []
    for old, new in moves:
        prefix = old.rstrip("/") + "/"
        test = "(c = ? OR substr(c, 1, ?) = ?)"
        cases.append(f"WHEN {test} THEN ? || substr(c, ?)")
        case_params += [old, len(prefix), prefix, new, len(old) + 1]
        tests.append(test)
        test_params += [old, len(prefix), prefix]
    changed = 0
    tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        if table.startswith("sqlite_"):
            continue
        columns = [
            row[1] for row in conn.execute(f'PRAGMA table_info("{table}")') if str(row[2]).upper() == "TEXT"
        ]
        for column in columns:
            quoted = f'"{column}"'
            sql = (
                (f'UPDATE "{table}" SET {quoted} = CASE {" ".join(cases)} END WHERE {" OR ".join(tests)}')
                .replace("(c ", f"({quoted} ")
                .replace("substr(c,", f"substr({quoted},")
            )
            changed += conn.execute(sql, [*case_params, *test_params]).rowcount
    return changed

"""An export in store.db: its ``exports`` row, and the llama.cpp version the lock pins.

:func:`record_export` runs after the folder is published: one write
transaction inserts the ``exports`` row (the adapter version (a mix's first part, with the mix in ``mix``), target,
quantisation, folder (as ``store.path_text`` writes a path), every file's sha256, the tools' versions, the
seconds it took) and, when the store has a ``dlm.lock``, records the lock
again with ``pinned_versions.llama_cpp`` set to the llama-cpp-python that
wrote the GGUF files. A different version from the one the lock pinned is
a WARN (the severity table of docs/reproducibility.md), returned as the
line to print; the first pin (none before) is not. The lock's other fields are the trained run's, unchanged.

:func:`newest_export` is what ``dlm prompt --backend llama.cpp`` answers
from, and :func:`checked_file` checks a file of an export against the
sha256 recorded when it was written, so a damaged GGUF is an error, never
an answer.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dlmstore.clock import utc_now
from dlmstore.errors import ExportError
from dlmstore.export.folder import ExportedFile
from dlmstore.lock.model import LLAMA_CPP, LOCK_NAME, read_lock
from dlmstore.lock.policy import compare
from dlmstore.lock.records import lock_transaction
from dlmstore.store.database import Store
from dlmstore.store.digests import file_sha256
from dlmstore.store.path_text import path_text, text_paths

_COLUMNS = "id, adapter_version, target, quant, path, files, manifest_sha256, tool_versions, seconds, created_at, mix"


@dataclass(frozen=True)
class ExportRecord:
    """One row of ``exports``."""

    id: int
    adapter_version: int
    target: str
    quant: str | None
    path: str
    files: dict[str, dict[str, object]]
    manifest_sha256: str
    tool_versions: dict[str, str | None]
    seconds: float
    created_at: str
    mix: dict[str, object] | None = None


def record_export(
    store: Store,
    *,
    adapter_version: int,
    target: str,
    quant: str | None,
    folder: Path,
    files: Sequence[ExportedFile],
    manifest_sha256: str,
    tools: dict[str, str | None],
    seconds: float,
    mix: dict[str, object] | None = None,
) -> tuple[int, list[str]]:
    """Insert the export's row and pin its llama.cpp in the lock; returns the row id and lock warnings.

    ``mix`` is what an ``--adapter-mix`` export mixed (the ``exports.mix`` column), None for one adapter.

    Raises:
        StoreError: store.db or ``dlm.lock`` cannot be written; nothing is recorded.
        LockError: ``dlm.lock`` is damaged (``dlm train --update-lock`` replaces it).
    """
    row = (
        adapter_version, target, quant, path_text(folder),
        json.dumps({f.path: {"sha256": f.sha256, "bytes": f.bytes} for f in files}, sort_keys=True),
        manifest_sha256, json.dumps(tools, sort_keys=True), round(seconds, 3), utc_now(),
        None if mix is None else json.dumps(mix, sort_keys=True),
    )  # fmt: skip
    insert = f"INSERT INTO exports ({_COLUMNS.removeprefix('id, ')}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    version = tools.get(LLAMA_CPP)
    previous = read_lock(store.path / LOCK_NAME) if target != "hf" else None
    if previous is None or previous.pinned_versions.get(LLAMA_CPP) == version:
        with store.write() as conn:
            return _insert(conn, insert, row), []
    lock = dataclasses.replace(
        previous, created_at=utc_now(), pinned_versions={**previous.pinned_versions, LLAMA_CPP: version}
    )
    # The first pin is no change: the lock had no llama.cpp to compare with.
    warnings = [
        f"{LOCK_NAME}: {m.describe()}"
        for m in compare(previous, lock)
        if m.severity == "WARN" and m.old is not None
    ]
    with lock_transaction(store, lock, decision="written") as (conn, _):
        export_id = _insert(conn, insert, row)
    return export_id, warnings


def _insert(conn: sqlite3.Connection, insert: str, row: tuple[object, ...]) -> int:
    return int(conn.execute(insert, row).lastrowid or 0)


def newest_export(store: Store, *, gguf: bool = True) -> ExportRecord | None:
    """The newest export (with GGUF files, when ``gguf``), or None."""
    where = "WHERE quant IS NOT NULL " if gguf else ""
    with store.read() as conn:
        row = conn.execute(f"SELECT {_COLUMNS} FROM exports {where}ORDER BY id DESC LIMIT 1").fetchone()
    if row is None:
        return None
    fields = dict(row)
    fields["files"] = json.loads(fields["files"])
    fields["tool_versions"] = json.loads(fields["tool_versions"])
    fields["mix"] = None if fields["mix"] is None else json.loads(fields["mix"])
    return ExportRecord(**fields)


def checked_file(export: ExportRecord, name: str) -> Path:
    """``name`` in the export's folder, once its bytes match the sha256 recorded when it was written.

    Raises:
        ExportError: the file is missing, or its bytes changed.
    """
    # The folder as path_text recorded it: the first path it stands for that is a folder.
    folder = next((Path(p) for p in text_paths(export.path) if Path(p).is_dir()), Path(export.path))
    path = folder / name
    recorded = export.files.get(name, {}).get("sha256")
    try:
        actual = file_sha256(path)
    except OSError as exc:
        raise ExportError(
            f"export {export.id}: cannot read {path}: {exc.strerror or exc}",
            hint="export the adapter again: dlm export DOC",
        ) from None
    if actual != recorded:
        raise ExportError(
            f"export {export.id}: {path} is damaged (its sha256 is not the one recorded when it was written)",
            hint="export the adapter again: dlm export DOC",
        )
    return path

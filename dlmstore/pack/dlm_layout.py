"""Packs written by DocumentLanguageModel (DLM): read, checked, and turned into a dlmstore store.

DLM's pack format 1 has the same header, manifest, checksums and document
as a dlmstore pack, but its store is DLM's folder: ``store/manifest.json``
(its training runs), ``store/adapter/versions/vNNNN/`` (PEFT adapters),
``store/replay/corpus.zst`` with ``index.json`` (one zstd frame of CBOR per
section snapshot), ``store/dlm.lock``, and optionally optimizer state,
exports and logs.

Checking. DLM's ``CHECKSUMS.sha256`` lists every member but itself and
``manifest.json``, so every member but those two must be listed, found
and hash as listed; the manifest, unchecked by DLM, is trusted for
nothing but what the checked members confirm: its ``dlm_id`` must be the
one the packed document declares, and its sizes those of the members.

The store built. Each of DLM's training runs that made an adapter version
becomes a completed ``train`` run (its ``dlmstore_version`` says DLM made
it, with DLM's own version) registering that version, its weights' sha256
taken as dlmstore's training takes it. The replay corpus becomes history:
each snapshot's section is split into rows as dlmstore splits a section
(so a section the document still holds has the same row keys, and is
never replayed), recorded as one generation under the newest run; the
next ``dlm train`` replays the rows the document no longer holds. What
does not carry over is named in one note: DLM's lock (its format is not
dlmstore's; the next train writes one), optimizer state, exports, logs,
the snapshots' timestamps (recency comes from generations here).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmstore.errors import PackError
from dlmstore.pack import checksums, layout
from dlmstore.pack.manifest import load_json

_VERSIONS = f"{layout.STORE_DIR}/adapter/versions/"
_CORPUS = f"{layout.STORE_DIR}/replay/corpus.zst"
_INDEX = f"{layout.STORE_DIR}/replay/index.json"
_STORE_MANIFEST = f"{layout.STORE_DIR}/manifest.json"
_WEIGHTS = "adapter_model.safetensors"
#: The largest section snapshot read back from the replay corpus.
_MAX_FRAME = 64 * 1024**2


@dataclass(frozen=True)
class DlmPack:
    """A checked DLM pack in its staging folder.

    Attributes:
        root: The staging folder.
        dlm_id: The document's id (the manifest's, equal to the document's).
        document: The packed document.
        tool_version: The DLM version that wrote it.
        adapter_versions: The adapter versions it carries.
        runs: DLM's training runs (``store/manifest.json``), by the version each made.
        sections: The replay corpus's sections (type, content), in index order.
        left: What the pack holds that the store cannot take, for the note.
    """

    root: Path
    dlm_id: str
    document: Path
    tool_version: str
    adapter_versions: tuple[int, ...]
    runs: dict[int, dict[str, Any]]
    sections: tuple[tuple[str, str], ...]
    left: tuple[str, ...]


def is_dlm_layout(header: Mapping[str, Any]) -> bool:
    """Whether a pack's header is DLM's (no ``tool``; DLM's format fields)."""
    return "tool" not in header and "pack_format_version" in header and "content_type" in header


def read_dlm_pack(root: Path, found: Mapping[str, str]) -> DlmPack:
    """Check the DLM pack extracted at ``root`` (``found``: member -> sha256 hex) and read it.

    Raises:
        PackError: a member missing, extra or changed; a manifest that
            disagrees with the document or the members; no document, or
            several; a replay corpus that cannot be read.
    """
    from dlmstore.document.parser import declared_id

    listed = checksums.parse(_read(root, found, layout.CHECKSUMS))
    checksums.check(listed, found, unlisted=frozenset({layout.CHECKSUMS, layout.MANIFEST}))
    manifest = load_json(_read(root, found, layout.MANIFEST), layout.MANIFEST)
    header = load_json(_read(root, found, layout.HEADER), layout.HEADER)
    documents = [
        name for name in found if name.startswith(f"{layout.DOCUMENT_DIR}/") and name.endswith(".dlm")
    ]
    if len(documents) != 1 or documents[0].count("/") != 1:
        raise PackError(f"the pack holds {len(documents)} documents under {layout.DOCUMENT_DIR}/, not one")
    document = root / documents[0]
    declared = declared_id(document.read_bytes())
    if declared is None:
        raise PackError(f"the packed document {documents[0]} declares no dlm_id: the pack is damaged")
    if manifest.get("dlm_id") != declared:
        raise PackError(
            f"pack member {layout.MANIFEST} says dlm_id {manifest.get('dlm_id')}, but the packed document "
            f"declares {declared}: refused (the manifest was swapped)"
        )
    entries = manifest.get("entries", {})
    if not isinstance(entries, dict) or any(
        (root / name).stat().st_size != size for name, size in _sizes(entries, found)
    ):
        raise PackError(
            f"pack member {layout.MANIFEST} disagrees with the members' sizes: the pack is damaged"
        )
    versions = sorted(
        int(name[len(_VERSIONS) + 1 : len(_VERSIONS) + 5])
        for name in found
        if name.startswith(_VERSIONS) and name.endswith(f"/{_WEIGHTS}") and name.count("/") == 4
        and name[len(_VERSIONS)] == "v" and name[len(_VERSIONS) + 1 : len(_VERSIONS) + 5].isdigit()
    )  # fmt: skip
    runs: dict[int, dict[str, Any]] = {}
    if _STORE_MANIFEST in found:
        store_manifest = load_json((root / _STORE_MANIFEST).read_bytes(), _STORE_MANIFEST)
        for run in store_manifest.get("training_runs", []) or []:
            if isinstance(run, dict) and isinstance(run.get("adapter_version"), int):
                runs[run["adapter_version"]] = run
    sections = _sections(root, found) if _CORPUS in found and _INDEX in found else ()
    carried = {
        layout.HEADER,
        layout.MANIFEST,
        layout.CHECKSUMS,
        documents[0],
        _STORE_MANIFEST,
        _CORPUS,
        _INDEX,
    }
    carried |= {name for name in found if name.startswith(_VERSIONS)}
    left = sorted({_kind(name) for name in found if name not in carried})
    return DlmPack(
        root, declared, document, str(header.get("tool_version", "unknown")), tuple(versions), runs, sections,
        tuple(left),
    )  # fmt: skip


def _read(root: Path, found: Mapping[str, str], name: str) -> bytes:
    if name not in found:
        raise PackError(f"the pack has no {name}: it is not a .dlm.pack, or it is damaged")
    return (root / name).read_bytes()


def _sizes(entries: dict[str, Any], found: Mapping[str, str]) -> list[tuple[str, int]]:
    checked: list[tuple[str, int]] = []
    for name, size in entries.items():
        if name not in found or not isinstance(size, int):
            raise PackError(f"pack member {layout.MANIFEST} lists {name}, which the pack does not hold")
        checked.append((name, size))
    return checked


def _kind(member: str) -> str:
    """How the note names a member left behind."""
    parts = member.split("/")
    if len(parts) > 2 and parts[0] == layout.STORE_DIR:
        return {"exports": "exports", "logs": "run logs", "cache": "the base model's cache"}.get(
            parts[1], f"store/{parts[1]}"
        )
    return {
        "store/training_state.pt": "optimizer state (training_state.pt)",
        "store/training_state.pt.sha256": "optimizer state (training_state.pt)",
        "store/dlm.lock": "DLM's dlm.lock (the next dlm train writes dlmstore's)",
    }.get(member, member)


def _sections(root: Path, found: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """Every section snapshot of the replay corpus, in index order (DLM's sort: by section id)."""
    import cbor2
    import zstandard

    try:
        index = json.loads((root / _INDEX).read_bytes())
        if not isinstance(index, list):
            raise ValueError("not a list")
        corpus = (root / _CORPUS).read_bytes()
        sections: list[tuple[str, str]] = []
        for entry in index:
            start, length = int(entry["byte_offset"]), int(entry["length"])
            if start < 0 or length <= 0 or start + length > len(corpus):
                raise ValueError(f"entry {entry.get('section_id')} lies outside corpus.zst")
            payload = zstandard.ZstdDecompressor().decompress(
                corpus[start : start + length], max_output_size=_MAX_FRAME
            )
            snapshot = cbor2.loads(payload)
            kind, content = snapshot["section_type"], snapshot["content"]
            if kind not in ("prose", "instruction", "preference") or not isinstance(content, str):
                raise ValueError(f"section {snapshot.get('section_id')} has type {kind!r}")
            sections.append((kind, content))
    except (ValueError, KeyError, TypeError, zstandard.ZstdError, cbor2.CBORDecodeError) as exc:
        raise PackError(f"the pack's replay corpus cannot be read ({exc}): the pack is damaged") from None
    return tuple(sections)


def build_store(pack: DlmPack, folder: Path, document: Path) -> list[str]:
    """Make in the empty ``folder`` the dlmstore store of ``pack`` (see the module docstring).

    ``document`` is where the document is being installed (recorded as
    each run's document path). Returns the notes: one line naming what did
    not carry over, or none.

    Raises:
        PackError: the document cannot be read by this dlmstore.
    """
    from dlmstore.document.parser import parse_document
    from dlmstore.store import highwater
    from dlmstore.store.database import open_store_at

    frontmatter = parse_document(pack.document).frontmatter
    with open_store_at(folder, pack.dlm_id) as store:
        run_ids = _register_adapters(store, pack, frontmatter.base_model, document)
        if pack.sections and run_ids:
            _record_history(store, pack, run_ids[-1], frontmatter.training.replay)
        highwater.record(store)
    left = list(pack.left)
    if pack.sections:
        left.append("the replay corpus's timestamps (its sections are one generation of history here)")
    return [f"from DLM's pack, not carried over: {', '.join(left)}"] if left else []


def _register_adapters(store: Any, pack: DlmPack, base_model: str, document: Path) -> list[int]:
    """Copy each adapter version in, each registered by a completed train run of its own; the run ids."""
    import hashlib

    from dlmstore.clock import utc_now
    from dlmstore.store.digests import file_sha256
    from dlmstore.store.path_text import path_text

    digest = "sha256:" + hashlib.sha256(pack.document.read_bytes()).hexdigest()
    run_ids: list[int] = []
    for version in pack.adapter_versions:
        source = pack.root / f"{_VERSIONS}v{version:04d}"
        relpath = f"adapter/versions/v{version:04d}"
        shutil.copytree(source, store.path / relpath)
        weights = store.path / relpath / _WEIGHTS
        run = pack.runs.get(version, {})
        started = str(run.get("started_at") or utc_now())
        finished = str(run.get("ended_at") or started)
        with store.write() as conn:
            cursor = conn.execute(
                "INSERT INTO runs (command, status, started_at, finished_at, dlm_path, dlm_sha256, dlmstore_version) "
                "VALUES ('train', 'completed', ?, ?, ?, ?, ?)",
                (
                    started,
                    finished,
                    path_text(document),
                    digest,
                    f"DocumentLanguageModel {pack.tool_version}",
                ),
            )
            run_id = int(cursor.lastrowid or 0)
            conn.execute(
                "INSERT INTO adapters (version, run_id, phase, path, sha256, bytes, base_model, steps, final_loss, "
                "created_at) VALUES (?, ?, 'sft', ?, ?, ?, ?, ?, ?, ?)",
                (
                    version, run_id, relpath, file_sha256(weights), weights.stat().st_size, base_model,
                    int(run.get("steps") or 0), run.get("final_train_loss"), finished,
                ),
            )  # fmt: skip
        run_ids.append(run_id)
    return run_ids


def _record_history(store: Any, pack: DlmPack, run_id: int, settings: Any) -> None:
    """The replay corpus's sections as one generation of history, recorded under run ``run_id``."""
    from dlmstore.document.rows import section_rows
    from dlmstore.document.sections import Section
    from dlmstore.replay.history import BODY, TrainedRow, pending, record_run, supersede_key

    described: list[TrainedRow] = []
    seen: set[str] = set()
    for kind, content in pack.sections:
        for row in section_rows(Section(kind, content)):
            if row.row_key not in seen:
                seen.add(row.row_key)
                described.append(TrainedRow(row, supersede_key(row, BODY), BODY, False))
    prepared = pending(store, [item.row_key for item in described], lambda: described, settings)
    with store.write() as conn:
        record_run(conn, run_id, prepared)

"""Packs written by DocumentLanguageModel (DLM): read, checked, and turned into a dlmstore store.

DLM's pack format 1 has the same header, manifest, checksums and document
as a dlmstore pack, but its store is DLM's folder: ``store/manifest.json``
(its training runs), ``store/adapter/versions/vNNNN/`` (each a PEFT adapter
with the tokenizer, the optimizer state and DLM's sidecars),
``store/adapter/current.txt`` (the version in use), ``store/replay/``
(``corpus.zst`` and ``index.json``, read by :mod:`~dlmstore.pack.dlm_replay`),
``store/dlm.lock``, and optionally exports, logs and caches.

Checking. DLM's ``CHECKSUMS.sha256`` lists every member but itself and
``manifest.json``, so every member but those two must be listed, found
and hash as listed; the manifest, unchecked by DLM, is trusted for
nothing but what the checked members confirm: its ``dlm_id`` must be the
one the packed document declares, its sizes those of the members and its
``content_sha256`` DLM's rollup of their checksums.

The store built. Each of DLM's training runs that made an adapter version
becomes a completed ``train`` run (its ``dlmstore_version`` says DLM made
it, with DLM's own version; its times are DLM's) registering that
version, its weights' sha256 taken as dlmstore's training takes it, and
the files dlmstore keeps in a version folder copied in (the adapter, its
config, the tokenizer, the model card). The replay corpus becomes one
generation of history under the newest run; the next ``dlm train``
replays the rows the document no longer holds. What does not carry over
is named in one note: DLM's lock (its format is not dlmstore's; the next
train writes one), optimizer state, DLM's sidecars, exports, logs,
caches, named adapters, the snapshots' timestamps.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from dlmstore.errors import PackError
from dlmstore.pack import checksums, layout
from dlmstore.pack.manifest import check_format, load_json, rollup

_ADAPTER = f"{layout.STORE_DIR}/adapter"
_VERSIONS = f"{_ADAPTER}/versions"
_CURRENT = f"{_ADAPTER}/current.txt"
_CORPUS = f"{layout.STORE_DIR}/replay/corpus.zst"
_INDEX = f"{layout.STORE_DIR}/replay/index.json"
_STORE_MANIFEST = f"{layout.STORE_DIR}/manifest.json"
_WEIGHTS = "adapter_model.safetensors"
#: What dlmstore keeps in a version folder (the adapter, then the tokenizer, as training saves them).
_KEPT = frozenset({
    "adapter_config.json", _WEIGHTS, "README.md", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "vocab.json", "merges.txt",
    "tokenizer.model",
})  # fmt: skip
#: How the note names what a pack holds and the store does not take, by the store's folder or file.
_LEFT = {
    "exports": "exports", "logs": "run logs", "cache": "the base model's download cache",
    "tokenized-cache": "DLM's tokenized-section cache", "blobs": "media blobs", "controls": "control vectors",
    "vl-cache": "DLM's preprocessor caches", "audio-cache": "DLM's preprocessor caches",
    "audio-waveform-cache": "DLM's preprocessor caches", "training_state.pt": "optimizer state (training_state.pt)",
    "training_state.pt.sha256": "optimizer state (training_state.pt)",
    "dlm.lock": "DLM's dlm.lock (the next dlm train writes dlmstore's)",
}  # fmt: skip


@dataclass(frozen=True)
class DlmPack:
    """A checked DLM pack in its staging folder.

    Attributes:
        root: The staging folder.
        dlm_id: The document's id (the manifest's, equal to the document's).
        document: The packed document.
        tool_version: The DLM version that wrote it.
        packed_at: When DLM wrote it (its header's ``created_at``), or None.
        adapter_versions: The adapter versions it carries (those with weights), oldest first.
        runs: DLM's training runs (``store/manifest.json``), by the version each made.
        sections: The replay corpus's sections (type, content), in index order.
        left: What the pack holds that the store cannot take, each named once, for the note.
    """

    root: Path
    dlm_id: str
    document: Path
    tool_version: str
    packed_at: str | None
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
        PackError: a newer format; a member missing, extra or changed; a
            manifest that disagrees with the document or the members; no
            document, or several; a replay corpus that cannot be read.
    """
    from dlmstore.document.parser import declared_id
    from dlmstore.pack.dlm_replay import read_sections

    header = load_json(_read(root, found, layout.HEADER), layout.HEADER)
    check_format(header)
    listed = checksums.parse(_read(root, found, layout.CHECKSUMS))
    checksums.check(listed, found, unlisted=frozenset({layout.CHECKSUMS, layout.MANIFEST}))
    manifest = load_json(_read(root, found, layout.MANIFEST), layout.MANIFEST)
    documents = [name for name in found if PurePosixPath(name).parent.as_posix() == layout.DOCUMENT_DIR]
    documents = [name for name in documents if name.endswith(".dlm")]
    if len(documents) != 1:
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
    _check_entries(root, manifest, found)
    versions = _versions(found)
    runs: dict[int, dict[str, Any]] = {}
    if _STORE_MANIFEST in found:
        store_manifest = load_json((root / _STORE_MANIFEST).read_bytes(), _STORE_MANIFEST)
        for run in store_manifest.get("training_runs") or []:
            if isinstance(run, dict) and isinstance(run.get("adapter_version"), int):
                runs[run["adapter_version"]] = run
    sections = read_sections(root / _CORPUS, root / _INDEX) if _CORPUS in found and _INDEX in found else ()
    packed_at = header.get("created_at")
    return DlmPack(
        root, declared, document, str(header.get("tool_version", "unknown")),
        packed_at if isinstance(packed_at, str) else None, versions, runs, sections,
        _left(root, found, documents[0], versions, bool(sections)),
    )  # fmt: skip


def _read(root: Path, found: Mapping[str, str], name: str) -> bytes:
    if name not in found:
        raise PackError(f"the pack has no {name}: it is not a .dlm.pack, or it is damaged")
    return (root / name).read_bytes()


def _check_entries(root: Path, manifest: Mapping[str, Any], found: Mapping[str, str]) -> None:
    """The manifest's sizes are the members', and its ``content_sha256`` DLM's rollup of their checksums."""
    entries = manifest.get("entries")
    if not isinstance(entries, dict):
        raise PackError(f"pack member {layout.MANIFEST} has no entries: the pack is damaged")
    for name, size in entries.items():
        if name not in found or not isinstance(size, int) or (root / name).stat().st_size != size:
            raise PackError(
                f"pack member {layout.MANIFEST} disagrees with member {name}: the pack is damaged"
            )
    # DLM rolls up every checksummed member but the header (which holds the clock).
    content = {name: digest for name, digest in found.items() if name not in (layout.HEADER, layout.MANIFEST)}
    content.pop(layout.CHECKSUMS, None)
    if manifest.get("content_sha256") != rollup(content):
        raise PackError(
            f"pack member {layout.MANIFEST} disagrees with the members' content_sha256: the pack is damaged"
        )


def _versions(found: Mapping[str, str]) -> tuple[int, ...]:
    """The adapter versions whose weights the pack holds (``store/adapter/versions/vNNNN/adapter_model...``)."""
    versions = []
    for name in found:
        path = PurePosixPath(name)
        if path.name == _WEIGHTS and path.parent.parent.as_posix() == _VERSIONS:
            folder = path.parent.name
            if len(folder) == 5 and folder[0] == "v" and folder[1:].isdigit() and int(folder[1:]) > 0:
                versions.append(int(folder[1:]))
    return tuple(sorted(versions))


def _left(root: Path, found: Mapping[str, str], document: str, versions: tuple[int, ...], replay: bool) -> tuple[str, ...]:  # fmt: skip
    """Every kind of member the store does not take, named for the note, in first-seen order."""
    taken = {layout.HEADER, layout.MANIFEST, layout.CHECKSUMS, document, _STORE_MANIFEST, _CORPUS, _INDEX}
    folders = {f"{_VERSIONS}/v{version:04d}" for version in versions}
    newest = f"adapter/versions/v{versions[-1]:04d}" if versions else None
    left: dict[str, None] = {}
    sidecars: set[str] = set()
    for name in sorted(found):
        path = PurePosixPath(name)
        if name in taken or (path.parent.as_posix() in folders and path.name in _KEPT):
            continue
        if name == _CURRENT and (root / name).read_text(errors="replace").strip().strip("/") == newest:
            continue  # it points at the newest version, the one dlmstore answers with
        parts = path.parts
        if path.parent.as_posix() in folders or (len(parts) == 5 and name.startswith(f"{_VERSIONS}/")):
            if path.name in _LEFT:
                left[_LEFT[path.name]] = None
            else:
                sidecars.add(path.name)
        elif name == _CURRENT:
            left[f"adapter/current.txt's choice of version (dlmstore answers with the newest, {newest})"] = (
                None
            )
        elif len(parts) > 3 and name.startswith(f"{_ADAPTER}/") and parts[2] != "versions":
            left[f"named adapter {parts[2]} (adapter/{parts[2]}/)"] = None
        elif len(parts) > 1 and parts[0] == layout.STORE_DIR and parts[1] in _LEFT:
            left[_LEFT[parts[1]]] = None
        else:
            left[name] = None
    if sidecars:
        left[f"DLM's adapter sidecars ({', '.join(sorted(sidecars))})"] = None
    if replay:
        left["the replay corpus's timestamps (its sections are one generation of history here)"] = None
    return tuple(left)


def build_store(pack: DlmPack, folder: Path, document: Path) -> list[str]:
    """Make in the empty ``folder`` the dlmstore store of ``pack`` (see the module docstring).

    ``document`` is where the document is being installed (recorded as
    each run's document path). Returns the notes: one line naming what did
    not carry over, or none.

    Raises:
        PackError: the document cannot be read by this dlmstore.
    """
    from dlmstore.document.parser import parse_document
    from dlmstore.pack.dlm_replay import record_history
    from dlmstore.store import highwater
    from dlmstore.store.database import open_store_at

    frontmatter = parse_document(pack.document).frontmatter
    left = list(pack.left)
    with open_store_at(folder, pack.dlm_id) as store:
        run_ids = _register_adapters(store, pack, frontmatter.base_model, document)
        if pack.sections and run_ids:
            record_history(store, pack.sections, run_ids[-1], frontmatter.training.replay)
        elif pack.sections:
            left.append("the replay corpus (no adapter version to record its history under)")
        highwater.record(store)
    return [f"from DLM's pack, not carried over: {', '.join(left)}"] if left else []


def _register_adapters(store: Any, pack: DlmPack, base_model: str, document: Path) -> list[int]:
    """Copy each adapter version in, each registered by a completed train run of its own; the run ids."""
    import hashlib

    from dlmstore.clock import utc_now
    from dlmstore.store.digests import file_sha256
    from dlmstore.store.path_text import path_text
    from dlmstore.train.adapters import VERSIONS_DIR

    digest = "sha256:" + hashlib.sha256(pack.document.read_bytes()).hexdigest()
    packed = _stamp(pack.packed_at) or utc_now()
    run_ids: list[int] = []
    for version in pack.adapter_versions:
        source = pack.root / f"{_VERSIONS}/v{version:04d}"
        relpath = f"{VERSIONS_DIR}/v{version:04d}"
        (store.path / relpath).mkdir(parents=True)
        for path in sorted(source.iterdir()):
            if path.name in _KEPT and path.is_file():
                shutil.copyfile(path, store.path / relpath / path.name)
        weights = store.path / relpath / _WEIGHTS
        run = pack.runs.get(version, {})
        started = _stamp(run.get("started_at")) or packed
        finished = _stamp(run.get("ended_at")) or started
        steps = run.get("steps")
        loss = run.get("final_train_loss")
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
                "INSERT INTO adapters (version, run_id, phase, method, parent_version, path, sha256, bytes, "
                "base_model, steps, final_loss, created_at) VALUES (?, ?, 'sft', NULL, NULL, ?, ?, ?, ?, ?, ?, ?)",
                (
                    version, run_id, relpath, file_sha256(weights), weights.stat().st_size, base_model,
                    steps if isinstance(steps, int) and steps >= 0 else 0,
                    float(loss) if isinstance(loss, int | float) else None, finished,
                ),
            )  # fmt: skip
        run_ids.append(run_id)
    return run_ids


def _stamp(value: Any) -> str | None:
    """DLM's ISO timestamp (naive UTC) in store.db's format, or None when there is none to read."""
    from dlmstore.clock import utc_text

    if not isinstance(value, str):
        return None
    try:
        return utc_text(datetime.fromisoformat(value))
    except ValueError:
        return None

"""The export folder: whose it is, its manifest, and how a new export replaces an old one.

**A folder is written only when it is dlm's.** ``-o DIR`` may be absent
(it is created), empty, or an export dlm wrote: one holding its manifest
``dlm-export.json`` with dlm's format tag (:data:`FORMAT`), or the marker
:data:`PARTIAL` an export leaves while it replaces an earlier one (so an
interrupted export is dlm's to redo). Any other folder is refused, naming
it, before anything heavy runs, unless the user consents with ``--force``;
even then only the names an export writes are replaced (:func:`export_name`)
and every other file is left alone.

**Writing.** Everything is written into a staging folder beside ``DIR``
(``.DIR-xxxx``), so a failure part way (a full disk, a crash) leaves
``DIR`` as it was and the staging folder is removed. A kill (SIGKILL, a
power cut) cannot remove it, so the staging folder holds an owner file its
export keeps locked (:class:`~dlmstore.store.atomic.StagingDir`'s
``owned``): the next export (:func:`sweep`) and ``dlm cache verify
--repair`` remove a staging folder whose export is gone, and never one an
export in another process is still filling. Publishing then
renames: a new ``DIR`` is the staging folder renamed in one step. An
existing one is marked :data:`PARTIAL` and its manifest removed first (a
half-replaced folder never passes for a complete export), then each new
file is renamed in, the files the previous manifest listed and this export
did not write are removed, and the manifest is written last.

**The manifest** names every file with its sha256 and size, the adapter,
the choices and the tool versions. It holds no time, so two exports of the
same adapter are byte-identical, manifest included.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmstore.errors import ExportError
from dlmstore.store.atomic import (
    OWNER_NAME,
    StagingDir,
    fsync_dir,
    fsync_tree,
    staging_prefix,
    stale_staging,
    write_bytes_atomic,
)
from dlmstore.store.digests import file_sha256
from dlmstore.store.regular_files import load_json, read_regular

MANIFEST = "dlm-export.json"
#: The manifest's format tag: a folder whose manifest carries it is an export dlm wrote.
FORMAT = "dlmstore-export/1"
#: Present while an export replaces the files of an earlier one.
PARTIAL = ".dlm-export-partial"
#: The merged model's Hugging Face folder.
HF_DIR = "hf"
#: A manifest is a few kilobytes; a larger file by that name is not one.
MAX_MANIFEST_BYTES = 1 << 20

#: Every name an export writes at the top of its folder.
_EXPORT_NAMES = re.compile(
    r"(?:hf|adapter\.gguf|(?:model|base)\.(?:Q4_K_M|Q5_K_M|Q6_K|Q8_0|F16)\.gguf|Modelfile|llama-server\.sh"
    r"|dlm-export\.json|\.dlm-export-partial)"
)


def export_name(name: str) -> bool:
    """Whether ``name`` (a top-level entry) is one an export writes."""
    return _EXPORT_NAMES.fullmatch(name) is not None


@dataclass(frozen=True)
class ExportedFile:
    """One file of an export.

    Attributes:
        path: Relative to the export folder (``hf/config.json``, ``model.Q4_K_M.gguf``).
        sha256: ``sha256:`` and the hex digest of its bytes.
        bytes: Its size.
    """

    path: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Claim:
    """An output folder an export may write: where, and what the previous export there listed."""

    folder: Path
    previous: frozenset[str]


def claim_folder(folder: Path, *, force: bool) -> Claim:
    """Decide, before anything is written, whether an export may write into ``folder``.

    Raises:
        ExportError: ``folder`` is not a folder, or holds files and is no
            export dlm wrote (unless ``force``), or its manifest is damaged.
    """
    folder = folder.expanduser().absolute()
    if not folder.exists():
        if folder.is_symlink():
            raise ExportError(
                f"{folder} is a symlink to nothing", hint="remove it or choose another folder with -o"
            )
        return Claim(folder, frozenset())
    if not folder.is_dir():
        raise ExportError(f"{folder} is not a folder", hint="choose a new or empty folder with -o")
    folder = folder.resolve()
    try:
        entries = sorted(os.listdir(folder))
    except OSError as exc:
        raise ExportError(f"cannot list {folder}: {exc.strerror}") from None
    if not entries:
        return Claim(folder, frozenset())
    manifest = read_manifest(folder)
    if manifest is not None:
        return Claim(folder, frozenset(manifest.get("files", {})))
    if PARTIAL in entries:
        return Claim(folder, frozenset())
    if not force:
        raise ExportError(
            f"{folder} is not a folder dlm export wrote (it holds files and no {MANIFEST}), so nothing is "
            "written into it",
            hint="choose a new or empty folder with -o, or pass --force to write the export's files into it "
            "(hf/, *.gguf, Modelfile, llama-server.sh, dlm-export.json are replaced; other files are left alone)",
        )
    return Claim(folder, frozenset())


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest in ``folder`` when it is one dlm wrote; None when there is none or it is not dlm's.

    Raises:
        ExportError: a ``dlm-export.json`` with dlm's format tag that is damaged.
    """
    path = folder / MANIFEST
    try:
        raw = read_regular(path, limit=MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        return None
    except OSError:
        return None  # a folder or FIFO by that name: not dlm's manifest
    try:
        data = load_json(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    if not isinstance(data.get("files"), dict):
        raise ExportError(f"{path}: its files field is damaged", hint="remove the folder and export again")
    return data


def manifest_bytes(fields: dict[str, Any]) -> bytes:
    """The manifest's bytes: ``fields`` with the format tag, sorted keys, two-space indents."""
    return (
        json.dumps({"format": FORMAT, **fields}, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    ).encode()


def hash_files(root: Path) -> list[ExportedFile]:
    """Every file under ``root`` (the staging folder), sorted by path, with its sha256 and size."""
    out: list[ExportedFile] = []
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = Path(directory) / name
            if directory == str(root) and name == OWNER_NAME:
                continue  # the staging folder's own lock, not the export's
            relative = path.relative_to(root).as_posix()
            out.append(ExportedFile(relative, file_sha256(path), path.stat().st_size))
    return sorted(out, key=lambda item: item.path)


def stage(claim: Claim) -> StagingDir:
    """A staging folder beside the claimed folder (its parent is created when needed).

    Raises:
        ExportError: the parent cannot be created or written.
    """
    try:
        claim.folder.parent.mkdir(parents=True, exist_ok=True)
        return StagingDir(claim.folder.parent, prefix=staging_prefix(claim.folder), owned=True)
    except OSError as exc:
        raise ExportError(
            f"cannot write beside {claim.folder}: {exc.strerror or exc}",
            hint="choose a folder on a writable disk with -o",
        ) from None


def sweep(claim: Claim, exports: Path) -> list[Path]:
    """Remove the staging folders killed exports left, in ``exports`` and beside the claimed folder.

    ``exports`` is the store's folder of exports: every staging folder in it
    is looked at. Beside an ``-o`` folder elsewhere, only those of an export
    into that folder are. Only owned staging folders whose export is gone
    are removed (:func:`~dlmstore.store.atomic.stale_staging`): a user's
    folder never, an export running in another process never.

    Returns:
        The folders removed.
    """
    removed = stale_staging(exports, ".", remove=True)
    if claim.folder.parent != exports:
        removed += stale_staging(claim.folder.parent, staging_prefix(claim.folder), remove=True)
    return removed


def publish(staging: StagingDir, claim: Claim, manifest: bytes) -> None:
    """Put the staged export in place and write its manifest last (see the module docstring).

    Raises:
        OSError: a rename or write failed (the caller reports it).
    """
    folder = claim.folder
    if not folder.exists():
        write_bytes_atomic(staging.path / MANIFEST, manifest)
        staging.publish(folder)
        return
    fsync_tree(staging.path)
    marker = folder / PARTIAL
    write_bytes_atomic(marker, b"an export is being replaced; `dlm export` redoes it\n")
    (folder / MANIFEST).unlink(missing_ok=True)
    new = sorted(name for name in os.listdir(staging.path) if name != OWNER_NAME)
    for name in new:
        target = folder / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        os.rename(staging.path / name, target)
    written = set(new)
    for name in sorted({entry.split("/", 1)[0] for entry in claim.previous} - written):
        stale = folder / name
        if not export_name(name) or name in (MANIFEST, PARTIAL):
            continue
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale)
        else:
            stale.unlink(missing_ok=True)
    fsync_dir(folder)
    write_bytes_atomic(folder / MANIFEST, manifest)
    marker.unlink(missing_ok=True)
    fsync_dir(folder)
    staging.abort()

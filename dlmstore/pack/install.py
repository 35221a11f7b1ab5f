"""``dlm unpack PACK``: check every member, then install the document, its store and what travelled with them.

Nothing is installed before the whole pack is read and checked: it is
extracted into a staging folder inside the home's ``store/`` (an owned
staging folder: the next unpack sweeps one a killed unpack left, and
``dlm stores`` never lists it), every member's sha256 is compared with
``CHECKSUMS.sha256`` (:mod:`~dlmstore.pack.checksums`), the manifest's id
with the packed document's own, the signature's shape. Then:

1. the user's files are planned: the document in ``--to`` (default: the
   pack's folder), the sources and a local base around it as they lay
   around it when packed (:mod:`~dlmstore.pack.carried`). A file already
   there with the same bytes is kept; one with other bytes, or a file
   where one of their folders goes, is refused by name, before anything
   is written (a user's file is never overwritten);
2. the staged store.db has its absolute paths rewritten for the new
   places (:mod:`~dlmstore.pack.paths`), is opened once as a store (which
   migrates a pack made by an older dlmstore, and checks its high-water
   mark), and records the document's new path;
3. the user's files are written, each atomically; a built-in base goes to
   the home's ``bases/`` unless the home has it already (should this or
   step 4 fail, the user's files and folders written are removed again);
4. the store is renamed into ``<home>/store/<dlm_id>``: the one step that
   makes the unpack visible. A store already there is refused unless
   ``--force``; even then one whose history is newer than the pack's (more
   runs, lock records or adapter versions) is kept. ``--force`` holds the
   old store's lock exclusively (refusing while another dlm process has it
   open), renames it aside, renames the new one in and only then removes
   the old; a failure in between renames the old one back, and the next
   unpack puts back one that a kill between the two renames left aside.

A pack written by DocumentLanguageModel (no ``tool`` in its header) is
read by :mod:`~dlmstore.pack.dlm_layout`, which builds the store instead
of step 2's rewrite.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from dlmstore.document.parser import declared_id
from dlmstore.errors import PackError, StoreError
from dlmstore.home import bases_dir, dlm_home
from dlmstore.pack import checksums, layout
from dlmstore.pack.archive import Extracted, extract
from dlmstore.pack.manifest import (
    PackManifest,
    check_format,
    load_json,
    parse_header,
    parse_manifest,
    rollup,
)
from dlmstore.pack.paths import rewrite
from dlmstore.store.atomic import StagingDir, publish_dir, stale_staging, write_bytes_atomic
from dlmstore.store.connection import DB_NAME
from dlmstore.store.flock import STORE_LOCK_NAME, FileLock
from dlmstore.store.highwater import read_mark

#: How staging folders of unpacks begin (in ``<home>/store/``).
STAGING_PREFIX = ".unpack-"

#: How a store that ``--force`` renamed aside is named until the pack's store is in its place.
REPLACED_PREFIX = f"{STAGING_PREFIX}replaced-"


@dataclass(frozen=True)
class UnpackResult:
    """What ``dlm unpack`` installed (``--json``).

    Attributes:
        document: Where the document now is.
        store: The store's folder.
        dlm_id: The document's id.
        format: ``dlmstore``, or ``dlm`` for a pack DocumentLanguageModel wrote.
        adapters: The adapter versions installed.
        files_written: The user's files written (document, sources, a local base).
        files_kept: Those already there with the same bytes, left as they were.
        base: Where the base carried was installed (null when none was, or the home had it).
        replaced: Whether an existing store was replaced (``--force``).
        notes: What could not be carried or installed, one line each.
    """

    document: str
    store: str
    dlm_id: str
    format: str
    adapters: list[int]
    files_written: int
    files_kept: int
    base: str | None
    replaced: bool
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Staged:
    """A checked pack in its staging folder, ready to install."""

    root: Path
    store: Path
    dlm_id: str
    format: str
    document: Path
    document_dir: str
    adapters: list[int]
    user_files: list[tuple[str, str]]  # member, path relative to --to
    builtin: tuple[str, str] | None  # member folder, base name
    notes: list[str]
    manifest: PackManifest | None
    members: int
    bytes: int


def unpack(pack: Path, *, to: Path | None = None, force: bool = False) -> UnpackResult:
    """Install the pack at ``pack`` into the dlm home (see the module docstring).

    Raises:
        PackError: the pack is refused, a user's file is in the way, or a
            store of the same id is there (without ``force``, or newer).
        StoreError: the home cannot be written.
    """
    to = (pack.parent if to is None else to).absolute()
    stores = dlm_home() / "store"
    try:
        stores.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create {stores}: {exc.strerror or exc}") from None
    _restore_replaced(stores)
    stale_staging(stores, STAGING_PREFIX, remove=True)
    with StagingDir(stores, prefix=STAGING_PREFIX, owned=True) as staging:
        staged = stage(pack, staging.path)
        target = stores / staged.dlm_id
        document = to / staged.document_dir / staged.document.name
        plan, kept = _plan(staged, to)
        _prepare_store(staged, target, document, to)
        _refuse_existing(target, staged, force)
        written: list[Path] = []
        try:
            _write_user_files(plan, written)
            base = _install_builtin(staged)
            replaced = _publish(staged.store, target, force)
        except BaseException:
            _remove(written)  # the store was not installed: neither are the user's files
            raise
    return UnpackResult(
        document=str(document),
        store=str(target),
        dlm_id=staged.dlm_id,
        format=staged.format,
        adapters=staged.adapters,
        files_written=len(plan),
        files_kept=kept,
        base=base,
        replaced=replaced,
        notes=staged.notes,
    )


def stage(pack: Path, folder: Path) -> _Staged:
    """Extract ``pack`` into ``folder`` and check it all; nothing outside ``folder`` is written.

    Raises:
        PackError: anything the module refuses.
    """
    root = folder / "pack"
    root.mkdir()
    extracted = extract(pack, root)
    header_bytes = _member(root, extracted, layout.HEADER)
    header = load_json(header_bytes, layout.HEADER)
    if header.get("tool") != layout.TOOL:
        from dlmstore.pack.dlm_layout import build_store, is_dlm_layout, read_dlm_pack

        if not is_dlm_layout(header):
            raise PackError(
                f"{pack} is not a .dlm.pack (its {layout.HEADER} is neither dlmstore's nor DLM's)"
            )
        check_format(header)
        dlm_pack = read_dlm_pack(root, extracted.checksums)
        store = folder / "store"
        store.mkdir()
        notes = build_store(dlm_pack, store, dlm_pack.document)  # the runs' path: rewritten once placed
        return _Staged(
            root, store, dlm_pack.dlm_id, "dlm", dlm_pack.document, ".", list(dlm_pack.adapter_versions), [],
            None, notes, None, len(extracted.sizes), extracted.bytes,
        )  # fmt: skip
    parse_header(header_bytes)
    listed = checksums.parse(_member(root, extracted, layout.CHECKSUMS))
    checksums.check(listed, extracted.checksums, unlisted=frozenset({layout.CHECKSUMS, layout.SIGNATURE}))
    if layout.SIGNATURE in extracted.checksums:
        from dlmstore.pack.signing import parse

        parse((root / layout.SIGNATURE).read_bytes())
    manifest = parse_manifest((root / layout.MANIFEST).read_bytes())
    _check_manifest(manifest, root, extracted)
    return _Staged(
        root=root,
        store=root / layout.STORE_DIR,
        dlm_id=manifest.dlm_id,
        format="dlmstore",
        document=root / manifest.document,
        document_dir=manifest.document_dir,
        adapters=manifest.adapters,
        user_files=_tree_members(manifest, extracted),
        builtin=(manifest.base.member, manifest.base.name)
        if manifest.base and manifest.base.kind == "builtin"
        else None,
        notes=[],
        manifest=manifest,
        members=len(extracted.sizes),
        bytes=extracted.bytes,
    )


def _member(root: Path, extracted: Extracted, name: str) -> bytes:
    if name not in extracted.checksums:
        raise PackError(f"the pack has no {name}: it is not a .dlm.pack, or it is damaged")
    return (root / name).read_bytes()


def _check_manifest(manifest: PackManifest, root: Path, extracted: Extracted) -> None:
    """The manifest agrees with the members and with the document it names."""
    unsafe = [
        value
        for value in [manifest.document_dir]
        if value != "." and (os.path.isabs(value) or ".." in Path(value).parts)
    ]
    if unsafe:
        raise PackError(f"pack member {layout.MANIFEST}: document_dir {unsafe[0]!r} is refused")
    document = manifest.document
    if (
        not document.startswith(f"{layout.DOCUMENT_DIR}/")
        or document.count("/") != 1
        or document not in extracted.sizes
    ):
        raise PackError(
            f"pack member {layout.MANIFEST} names document {document!r}, which the pack does not hold"
        )
    declared = declared_id((root / document).read_bytes())
    if declared != manifest.dlm_id:
        raise PackError(
            f"pack member {layout.MANIFEST} says dlm_id {manifest.dlm_id}, but the packed document declares "
            f"{declared}: refused (the manifest was swapped)"
        )
    for name, size in manifest.entries.items():
        if extracted.sizes.get(name) != size:
            raise PackError(
                f"pack member {layout.MANIFEST} disagrees with member {name}: the pack is damaged"
            )
    unlisted = {layout.HEADER, layout.MANIFEST, layout.CHECKSUMS, layout.SIGNATURE}
    content = {name: digest for name, digest in extracted.checksums.items() if name not in unlisted}
    if set(content) != set(manifest.entries) or rollup(content) != manifest.content_sha256:
        raise PackError(
            f"pack member {layout.MANIFEST} disagrees with the members' content_sha256: the pack is damaged"
        )
    if f"{layout.STORE_DIR}/{DB_NAME}" not in extracted.sizes:
        raise PackError(f"the pack holds no {layout.STORE_DIR}/{DB_NAME}: it is damaged")


def _tree_members(manifest: PackManifest, extracted: Extracted) -> list[tuple[str, str]]:
    """(member, path relative to --to) of every source file and local-base file."""
    prefixes = [(f"{layout.SOURCES_DIR}/", layout.SOURCES_DIR)]
    if manifest.base is not None and manifest.base.kind == "local":
        prefixes.append((f"{manifest.base.member}/", manifest.base.member))
    files: list[tuple[str, str]] = []
    local = f"{layout.BASE_DIR}/local/"
    for name in extracted.checksums:
        if name.startswith(f"{layout.SOURCES_DIR}/"):
            files.append((name, name[len(layout.SOURCES_DIR) + 1 :]))
        elif name.startswith(local):
            files.append((name, name[len(local) :]))
    return files


def _plan(staged: _Staged, to: Path) -> tuple[list[tuple[Path, Path]], int]:
    """(source in staging, destination) of each user file to write, and how many are there already."""
    wanted = [(staged.document, to / staged.document_dir / staged.document.name)]
    wanted += [(staged.root / member, to / relative) for member, relative in staged.user_files]
    plan: list[tuple[Path, Path]] = []
    kept = 0
    for source, target in wanted:
        for folder in reversed(target.parents):
            if folder.is_relative_to(to) and os.path.lexists(folder) and not folder.is_dir():
                raise PackError(
                    f"{folder} is already there and is not a folder: refused (a file of yours is never "
                    "overwritten)",
                    hint="move it away, or unpack with --to another folder",
                )
        if os.path.lexists(target):
            if not target.is_file() or target.is_symlink() or not _same_bytes(source, target):
                raise PackError(
                    f"{target} is already there and is not the packed file: refused (a file of yours is never "
                    "overwritten)",
                    hint="move it away, or unpack with --to another folder",
                )
            kept += 1
            continue
        plan.append((source, target))
    return plan, kept


def _same_bytes(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as left, open(b, "rb") as right:
        while True:
            one, two = left.read(1 << 20), right.read(1 << 20)
            if one != two:
                return False
            if not one:
                return True


def _prepare_store(staged: _Staged, target: Path, document: Path, to: Path) -> None:
    """Rewrite the staged store.db's paths, open it once as a store, record the document's new path."""
    from dlmstore.store.database import open_store_at
    from dlmstore.store.runs import record_document_path

    manifest = staged.manifest
    if manifest is None:  # a store built from DLM's pack: its runs name the staged document
        _rewrite(staged.store, [(str(staged.document), str(document))])
    else:
        old_doc_dir = os.path.dirname(manifest.document_path)
        old_tree = os.path.normpath(os.path.join(old_doc_dir, os.path.relpath(".", manifest.document_dir)))
        moves = [(manifest.document_path, str(document)), (manifest.store_path, str(target))]
        if manifest.sources or (manifest.base is not None and manifest.base.kind == "local"):
            moves.append((old_tree, str(to)))
        _rewrite(staged.store, moves)
    try:
        with open_store_at(staged.store, staged.dlm_id, create=False) as store:
            record_document_path(store, document)
    except StoreError as exc:
        raise PackError(f"the pack's store cannot be opened: {exc}") from None


def _rewrite(store: Path, moves: list[tuple[str, str]]) -> None:
    """Rewrite the paths of ``moves`` in the staged store.db and forget the document's old paths."""
    try:
        conn = sqlite3.connect(store / DB_NAME, isolation_level=None)
        try:
            conn.execute("BEGIN")
            rewrite(conn, moves)
            conn.execute("DELETE FROM document_paths")
            conn.execute("COMMIT")
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise PackError(f"the pack's store.db cannot be read: {exc}") from None


def _refuse_existing(target: Path, staged: _Staged, force: bool) -> None:
    if not (target / DB_NAME).exists() and not target.exists():
        return
    if not force:
        raise PackError(
            f"a store for {staged.dlm_id} is already at {target}",
            hint="pass --force to replace it with the pack's, or unpack with --home into another home",
        )
    with FileLock(target / STORE_LOCK_NAME) as lock:
        if not lock.try_exclusive():  # asked again when it is renamed aside: this refuses before any write
            raise PackError(
                f"the store at {target} is in use by another dlm process: not replaced; try again"
            )
    have, packed = read_mark(target), read_mark(staged.store)
    if have is not None and packed is not None:
        newer = [
            kind
            for kind in ("runs", "lock_records", "adapter_version")
            if getattr(have.expected, kind) > getattr(packed.expected, kind)
        ]
        if newer:
            raise PackError(
                f"the store at {target} holds a newer history than the pack ({', '.join(newer)} beyond the "
                "pack's): it is not replaced, even with --force",
                hint="pack that store instead, or remove it first with `dlm stores gc` or by hand",
            )


def _write_user_files(plan: list[tuple[Path, Path]], written: list[Path]) -> None:
    """Write each file of ``plan``, appending to ``written`` each file and folder made, in order."""
    for source, target in plan:
        try:
            written += [folder for folder in reversed(target.parents) if not os.path.lexists(folder)]
            target.parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(target, source.read_bytes(), overwrite=False)
            written.append(target)
        except FileExistsError:
            raise PackError(
                f"{target} appeared while unpacking: refused (a file of yours is never overwritten)"
            ) from None
        except OSError as exc:
            raise PackError(f"cannot write {target}: {exc.strerror or exc}") from None


def _remove(written: list[Path]) -> None:
    """Remove what :func:`_write_user_files` made, newest first (a folder only if still empty)."""
    for path in reversed(written):
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink(missing_ok=True)
        except OSError:
            pass  # a folder something else wrote into meanwhile: kept


def _install_builtin(staged: _Staged) -> str | None:
    if staged.builtin is None:
        return None
    member, name = staged.builtin
    target = bases_dir() / name
    source = staged.root / member
    installed: str | None = None
    for part in sorted(entry.name for entry in source.iterdir()):
        if (target / part).exists():
            continue  # the home converted its own: kept
        target.mkdir(parents=True, exist_ok=True)
        if (source / part).is_dir():
            with publish_dir(target / part, existing="keep") as folder:
                shutil.copytree(source / part, folder, dirs_exist_ok=True)
        else:
            try:
                write_bytes_atomic(target / part, (source / part).read_bytes(), overwrite=False)
            except FileExistsError:
                continue  # written meanwhile by a conversion in another process
        installed = str(target)
    return installed


def _publish(store: Path, target: Path, force: bool) -> bool:
    """Rename the staged store into place (see step 4); return whether a store was replaced."""
    if not target.exists():
        try:
            os.rename(store, target)
        except OSError as exc:
            raise PackError(f"cannot install the store at {target}: {exc.strerror or exc}") from None
        return False
    assert force
    aside = target.with_name(f"{REPLACED_PREFIX}{target.name}-{os.getpid()}")
    with FileLock(target / STORE_LOCK_NAME) as lock:
        if not lock.try_exclusive():
            raise PackError(
                f"the store at {target} is in use by another dlm process: not replaced; try again"
            )
        os.rename(target, aside)  # the lock's file goes along, held until the new store is in place
        try:
            os.rename(store, target)
        except OSError as exc:
            os.rename(aside, target)
            raise PackError(f"cannot install the store at {target}: {exc.strerror or exc}") from None
    shutil.rmtree(aside, ignore_errors=True)
    return True


def _restore_replaced(stores: Path) -> None:
    """Finish what a killed ``unpack --force`` left in ``stores``: the store it renamed aside goes back
    when no store took its place (killed between the two renames), and is removed when one did. One
    whose lock is held is being replaced now, and is left."""
    for aside in sorted(stores.glob(f"{REPLACED_PREFIX}*")):
        target = stores / aside.name.removeprefix(REPLACED_PREFIX).rpartition("-")[0]
        if aside.is_symlink() or not aside.is_dir() or target.parent != stores:
            continue
        with FileLock(aside / STORE_LOCK_NAME) as lock:
            if not lock.try_exclusive():
                continue
            if os.path.lexists(target):
                shutil.rmtree(aside, ignore_errors=True)
            elif (aside / DB_NAME).is_file():
                os.rename(aside, target)

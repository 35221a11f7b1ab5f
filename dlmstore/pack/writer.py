"""``dlm pack DOC``: a document and its store in one ``.dlm.pack`` file.

The store is opened as any command opens it (its lock held shared, so
``dlm stores gc`` leaves it alone) and never written. Its database is
copied consistently (:mod:`~dlmstore.pack.store_copy`); the adapter
versions chosen are read once, straight into the stream, and their
weights' sha256 compared with the one recorded when they were trained, so
a damaged adapter never travels. Members go into the stream header first,
then sorted by name, then ``manifest.json`` and ``CHECKSUMS.sha256``
(which hash what was streamed), then the signature. The pack is written
beside its output and renamed onto it when complete.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dlmstore import __version__
from dlmstore.document.parser import Document, document_bytes, parse_document
from dlmstore.errors import PackError
from dlmstore.pack import checksums, layout
from dlmstore.pack.archive import PackWriter
from dlmstore.pack.carried import Carried, TreeFile, carried
from dlmstore.pack.manifest import PackHeader, PackManifest, render, rollup
from dlmstore.pack.signing import sign
from dlmstore.pack.store_copy import PackedAdapter, StoreCopy, copy_database
from dlmstore.store.database import Store, open_store


@dataclass(frozen=True)
class PackOptions:
    """What ``dlm pack`` carries besides the document, its store.db and the adapters chosen.

    Attributes:
        adapters: ``newest``, ``all`` or a comma list of versions (``v1,v3`` or ``1,3``).
        sources: The ``training.sources`` files (so the pack alone can retrain).
        base: The base model's weights and tokenizer.
        exports: The exports kept in the store's ``exports/``.
        cache: The token cache.
        sign: A private key to sign the pack with.
    """

    adapters: str = "newest"
    sources: bool = False
    base: bool = False
    exports: bool = False
    cache: bool = False
    sign: Path | None = None


@dataclass(frozen=True)
class PackResult:
    """What ``dlm pack`` wrote (``--json``).

    Attributes:
        path: The pack.
        bytes: Its size.
        sha256: Its sha256: the same for every pack of an unchanged store.
        dlm_id: The document's id.
        content_type: ``minimal``, ``no-base``, ``no-exports`` or ``full`` (DLM's labels).
        adapters: The adapter versions carried.
        members: How many members it holds.
        unpacked_bytes: The members' sizes together.
        sources: ``training.sources`` files carried.
        base: The base carried (its ``base_model``), or null.
        signed: Whether it carries a signature.
    """

    path: str
    bytes: int
    sha256: str
    dlm_id: str
    content_type: str
    adapters: list[int]
    members: int
    unpacked_bytes: int
    sources: int
    base: str | None
    signed: bool


def default_output(document: Path) -> Path:
    """``<document>.pack`` beside it (``notes.dlm`` -> ``notes.dlm.pack``)."""
    return document.with_name(document.name + layout.PACK_SUFFIX)


def pack_document(
    path: Path, *, out: Path | None = None, options: PackOptions = PackOptions(), force: bool = False
) -> PackResult:
    """Write the pack of the document at ``path`` and its store.

    Raises:
        DocumentError: the document cannot be read.
        PackError: no store, no adapter to carry, an adapter damaged, a
            file at the output without ``force``, or anything carried
            cannot be read.
    """
    document = parse_document(path)
    out = default_output(document.path) if out is None else out.absolute()
    if out.exists() and not force:
        raise PackError(f"{out} already exists", hint="pass --force to replace it, or choose another -o")
    if not out.parent.is_dir():
        raise PackError(f"cannot write {out}: its folder does not exist")
    with _open(document) as store, tempfile.TemporaryDirectory(prefix="dlm-pack-") as scratch:
        copy = copy_database(store, Path(scratch), keep_cache=options.cache)
        chosen = choose_adapters(copy.adapters, options.adapters)
        extra = carried(document, sources=options.sources, base=options.base)
        return _write(document, store, copy, chosen, extra, out, options, force)


def _open(document: Document) -> Store:
    from dlmstore.store.database import store_exists

    if not store_exists(document.dlm_id):
        raise PackError(
            f"{document.path} has no store yet (dlm_id {document.dlm_id})",
            hint="train it first: `dlm train` makes the store a pack carries",
        )
    return open_store(document.dlm_id, create=False)


def choose_adapters(adapters: list[PackedAdapter], spec: str) -> list[PackedAdapter]:
    """The versions ``--adapters`` names among those registered.

    Raises:
        PackError: none is registered, or one named is not.
    """
    if not adapters:
        raise PackError("the store has no adapter yet", hint="train the document first (dlm train)")
    if spec == "newest":  # the newest of each named adapter (training.adapters), or of the one adapter
        newest = {adapter.name: adapter for adapter in adapters}
        return sorted(newest.values(), key=lambda adapter: adapter.version)
    if spec == "all":
        return list(adapters)
    by_version = {adapter.version: adapter for adapter in adapters}
    chosen: list[PackedAdapter] = []
    for item in spec.split(","):
        text = item.strip().lower().removeprefix("v")
        if not text.isdigit():
            raise PackError(f"--adapters: {item.strip()!r} is not newest, all or a version such as v3")
        if int(text) not in by_version:
            known = ", ".join(f"v{v:04d}" for v in by_version)
            raise PackError(f"--adapters: the store has no adapter v{int(text):04d} (it has {known})")
        if by_version[int(text)] not in chosen:
            chosen.append(by_version[int(text)])
    return sorted(chosen, key=lambda adapter: adapter.version)


def _content_type(options: PackOptions) -> str:
    if options.base:
        return "full" if options.exports else "no-exports"
    return "no-base" if options.exports else "minimal"


def _store_files(
    store: Store, copy: StoreCopy, chosen: list[PackedAdapter], options: PackOptions
) -> list[TreeFile]:
    """The store's files the pack carries besides store.db and high-water.json, by member name."""
    files: list[TreeFile] = []
    lock = store.path / "dlm.lock"
    if lock.is_file():
        files.append(TreeFile(f"{layout.STORE_DIR}/dlm.lock", lock))
    for adapter in chosen:
        files += _folder_files(
            store,
            adapter.path,
            f"adapter v{adapter.version:04d}",
            "pack other versions with --adapters, or train again",
        )
    if copy.gate is not None:  # the newest learned gate: what dlm prompt routes by
        files += _folder_files(
            store,
            copy.gate[0],
            f"the learned gate {copy.gate[0]}",
            "train again (dlm train) to fit a new gate",
        )
    if options.cache:
        files.extend(
            TreeFile(f"{layout.STORE_DIR}/{relpath}", store.path / relpath) for relpath in copy.segments
        )
    if options.exports:
        files.extend(_export_files(store, copy))
    return files


def _folder_files(store: Store, relpath: str, what: str, hint: str) -> list[TreeFile]:
    """The regular files of the store folder ``relpath`` (an adapter version's, the gate's), by member name.

    Raises:
        PackError: the folder cannot be read (``what`` names it).
    """
    folder = store.path / relpath
    try:
        names = sorted(entry.name for entry in os.scandir(folder) if entry.is_file(follow_symlinks=False))
    except OSError as exc:
        raise PackError(f"{what}: cannot read {folder}: {exc.strerror or exc}", hint=hint) from None
    return [TreeFile(f"{layout.STORE_DIR}/{relpath}/{name}", folder / name) for name in names]


def _export_files(store: Store, copy: StoreCopy) -> list[TreeFile]:
    files: list[TreeFile] = []
    root = os.path.realpath(store.path)
    for recorded in copy.exports:
        folder = os.path.realpath(recorded)
        if not folder.startswith(root + os.sep) or not os.path.isdir(folder):
            continue  # written outside the store (-o): the user's folder, not the store's
        for current, dirs, names in os.walk(folder):
            dirs[:] = sorted(name for name in dirs if not name.startswith("."))
            for name in sorted(names):
                path = Path(current) / name
                if not path.is_symlink() and path.is_file():
                    files.append(TreeFile(f"{layout.STORE_DIR}/{path.relative_to(root).as_posix()}", path))
    return files


def _write(
    document: Document,
    store: Store,
    copy: StoreCopy,
    chosen: list[PackedAdapter],
    extra: Carried,
    out: Path,
    options: PackOptions,
    force: bool,
) -> PackResult:
    doc_member = f"{layout.DOCUMENT_DIR}/{document.path.name}"
    header = PackHeader(
        pack_format_version=layout.PACK_FORMAT_VERSION,
        tool=layout.TOOL,
        tool_version=__version__,
        content_type=_content_type(options),
        platform_hint=f"{sys.platform}-{platform.machine() or 'unknown'}",
        created_at=copy.created_at,
    )
    files = _store_files(store, copy, chosen, options) + extra.files
    weights = {f"{layout.STORE_DIR}/{adapter.path}/adapter_model.safetensors": adapter for adapter in chosen}
    with PackWriter(out, overwrite=force) as writer:
        writer.add_bytes(layout.HEADER, render(header))
        members: list[tuple[str, Path | bytes]] = [
            (doc_member, document_bytes(document.path)),
            (f"{layout.STORE_DIR}/store.db", copy.db),
            (f"{layout.STORE_DIR}/high-water.json", copy.high_water),
            *((file.member, file.path) for file in files),
        ]
        for name, source in sorted(members, key=lambda item: item[0].encode()):
            digest = (
                writer.add_bytes(name, source) if isinstance(source, bytes) else writer.add_file(name, source)
            )
            if copy.gate is not None and name == f"{layout.STORE_DIR}/{copy.gate[0]}/gate.safetensors":
                if f"sha256:{digest}" != copy.gate[1]:
                    raise PackError(
                        f"the learned gate {copy.gate[0]} is damaged: its weights' sha256 is sha256:{digest[:16]}…, "
                        f"not the one recorded when it was fitted; nothing damaged is packed",
                        hint="train again (dlm train) to fit a new gate",
                    )
            adapter = weights.get(name)
            if adapter is not None and f"sha256:{digest}" != adapter.sha256:
                raise PackError(
                    f"adapter v{adapter.version:04d} is damaged: its weights' sha256 is sha256:{digest[:16]}…, "
                    f"not the {adapter.sha256[:23]}… recorded when it was trained; nothing damaged is packed",
                    hint="pack other versions with --adapters, or train again",
                )
        content = dict(writer.checksums)
        del content[layout.HEADER]
        manifest = PackManifest(
            dlm_id=document.dlm_id,
            document=doc_member,
            document_dir=Path(extra.document_dir).as_posix(),
            base_model=document.base_model,
            base_model_revision=_base_revision(store),
            adapter_version=chosen[-1].version,
            adapters=[adapter.version for adapter in chosen],
            store_path=str(store.path),
            document_path=str(document.path),
            sources=extra.sources,
            base=extra.base,
            cache=options.cache,
            exports=options.exports,
            entries={name: writer.sizes[name] for name in content},
            content_sha256=rollup(content),
        )
        writer.add_bytes(layout.MANIFEST, render(manifest))
        listing = checksums.render(writer.checksums)
        writer.add_bytes(layout.CHECKSUMS, listing)
        if options.sign is not None:
            writer.add_bytes(layout.SIGNATURE, sign(listing, options.sign))
        unpacked = sum(writer.sizes.values())
        count = len(writer.sizes)
        size = writer.commit()
    return PackResult(
        path=str(out),
        bytes=size,
        sha256=f"sha256:{writer.sha256}",
        dlm_id=document.dlm_id,
        content_type=header.content_type,
        adapters=manifest.adapters,
        members=count,
        unpacked_bytes=unpacked,
        sources=sum(source.files for source in extra.sources),
        base=extra.base.name if extra.base else None,
        signed=options.sign is not None,
    )


def _base_revision(store: Store) -> str | None:
    from dlmstore.lock.model import LOCK_NAME, read_lock

    try:
        lock = read_lock(store.path / LOCK_NAME)
    except Exception:  # a lock that cannot be read says nothing about the base here
        return None
    return None if lock is None else lock.base_model_revision

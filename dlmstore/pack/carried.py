"""What travels beside the store: the ``training.sources`` files and the base model.

Both are laid out in the pack the way they lie around the document, from
one folder (the *tree*): the deepest folder holding the document's folder,
every source directive's path and a local base. On unpack the document
goes to ``<to>/<document_dir>/`` and each tree member to the same place
under ``<to>``, so the document's relative paths (``./notes``,
``../data``, ``./models/tiny``) lead where they led, and the document
trains unchanged. Paths are taken as the document writes them, not with
symlinks resolved, since that is how the document will resolve them again.

* Sources (``--include-sources``): each directive is walked exactly as
  ``dlm train`` walks it, and the files it chose are carried (a symlinked
  file as the bytes it leads to), with every ``.dlm/training.yaml`` and
  ``.dlm/ignore`` under the directive's folder, which shape the walk. A
  directive with an absolute path cannot travel and is refused by name.
* The base (``--include-base``): a built-in base travels as its converted
  folder (``<home>/bases/<name>/``, made now if it is not yet) and installs
  into the new home's ``bases/``; a local folder travels whole and
  installs where the document names it. A hub model travels through the
  Hugging Face cache, not a pack, and is refused by name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dlmstore.bases import model_source, resolve_base, tokenizer_source
from dlmstore.document.parser import Document
from dlmstore.errors import PackError
from dlmstore.home import bases_dir
from dlmstore.pack import layout
from dlmstore.pack.manifest import PackedBase, SourceRoot
from dlmstore.sources.roots import DLM_FOLDER, anchor_dir
from dlmstore.sources.walk import walk_directive

#: The folders of a converted built-in base (``dlmstore.bases``).
_CONVERTED = ("tokenizer", "model")

#: The files of a ``.dlm/`` folder that shape a walk.
_WALK_CONFIG = ("training.yaml", "ignore")


@dataclass(frozen=True)
class TreeFile:
    """A file to carry: its member name and where to read it."""

    member: str
    path: Path


@dataclass(frozen=True)
class Carried:
    """The sources and base a pack carries, and where the document sits among them.

    Attributes:
        document_dir: The document's folder relative to the tree's folder.
        sources: The directives carried.
        base: The base carried, or ``None``.
        files: Every file to carry, sorted by member name.
    """

    document_dir: str
    sources: list[SourceRoot]
    base: PackedBase | None
    files: list[TreeFile]


def carried(document: Document, *, sources: bool, base: bool) -> Carried:
    """The files ``--include-sources`` and ``--include-base`` add for ``document``.

    Raises:
        PackError: a directive's path is absolute, the base is a hub model.
        SourceError: a directive cannot be walked (as ``dlm train`` says it).
        BaseModelError: the base cannot be resolved or converted.
    """
    doc_dir = anchor_dir(document.directory)
    logical_doc = os.path.abspath(document.directory)
    roots: list[tuple[str, str, list[tuple[str, Path]]]] = []  # directive, logical root, (relpath, path)
    if sources:
        for directive in document.frontmatter.training.sources:
            roots.append((directive.path, *_walk(document, directive, doc_dir)))
    local_base: tuple[str, list[tuple[str, Path]]] | None = None
    builtin: list[TreeFile] = []
    packed_base: PackedBase | None = None
    if base:
        ref = resolve_base(document.base_model, relative_to=document.directory)
        if ref.kind == "local":
            logical = os.path.abspath(
                os.path.join(document.directory, os.path.expanduser(document.base_model))
            )
            local_base = (logical, _folder_files(Path(logical)))
        elif ref.kind == "builtin":
            folder = Path(model_source(ref)).parent
            tokenizer_source(ref)
            prefix = f"{layout.BASE_DIR}/builtin/{ref.name}"
            builtin = [
                TreeFile(f"{prefix}/{rel}", path)
                for rel, path in _folder_files(folder)
                if rel.split("/")[0] in _CONVERTED  # not identity.json: this machine's stat of its GGUF
            ]
            packed_base = PackedBase("builtin", ref.name, prefix)
        else:
            raise PackError(
                f"base_model {document.base_model!r} is a Hugging Face hub model: --include-base carries "
                "built-in and local-folder bases",
                hint="pack without --include-base; the other machine loads it from its Hugging Face cache",
            )
    places = [logical_doc, *(root for _, root, _ in roots)] + ([local_base[0]] if local_base else [])
    tree = os.path.commonpath(places)
    files = list(builtin)
    carried_sources: list[SourceRoot] = []
    for written, root, chosen in roots:
        member = _member(layout.SOURCES_DIR, os.path.relpath(root, tree))
        files.extend(TreeFile(f"{member}/{rel}" if rel else member, path) for rel, path in chosen)
        carried_sources.append(SourceRoot(written, member, len(chosen)))
    if local_base is not None:
        member = _member(f"{layout.BASE_DIR}/local", os.path.relpath(local_base[0], tree))
        files.extend(TreeFile(f"{member}/{rel}", path) for rel, path in local_base[1])
        packed_base = PackedBase("local", document.base_model, member)
    unique = {file.member: file for file in files}
    return Carried(
        os.path.relpath(logical_doc, tree),
        carried_sources,
        packed_base,
        sorted(unique.values(), key=lambda file: file.member.encode()),
    )


def _member(prefix: str, relative: str) -> str:
    return prefix if relative == "." else f"{prefix}/{Path(relative).as_posix()}"


def _walk(document: Document, directive: object, doc_dir: Path) -> tuple[str, list[tuple[str, Path]]]:
    from dlmstore.document.frontmatter import SourceDirective

    assert isinstance(directive, SourceDirective)
    label = f"training.sources '{directive.path}'"
    if os.path.isabs(os.path.expanduser(directive.path)):
        raise PackError(
            f"{label}: an absolute path cannot travel in a pack",
            hint="make the path relative to the document's folder, or pack without --include-sources",
        )
    walked = walk_directive(
        directive,
        label=label,
        doc_dir=doc_dir,
        doc_root=os.path.realpath(doc_dir),
        policy=document.frontmatter.training.sources_policy,
        document=os.path.realpath(document.path),
    )
    logical = os.path.abspath(os.path.join(doc_dir, os.path.expanduser(directive.path)))
    if os.path.isfile(walked.root):
        return logical, [("", Path(path)) for _, path in walked.files]
    chosen = [(rel, Path(path)) for rel, path in walked.files]
    for folder, dirs, names in os.walk(walked.root):
        dirs.sort()
        if os.path.basename(folder) != DLM_FOLDER:
            continue
        for name in _WALK_CONFIG:
            if name in names:
                path = os.path.join(folder, name)
                chosen.append((os.path.relpath(path, walked.root).replace(os.sep, "/"), Path(path)))
    return logical, chosen


def _folder_files(folder: Path) -> list[tuple[str, Path]]:
    """Every file under ``folder`` (relative name, path), dot-names (locks, staging) left out."""
    found: list[tuple[str, Path]] = []
    for current, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = sorted(name for name in dirs if not name.startswith("."))
        for name in sorted(names):
            if name.startswith("."):
                continue
            path = Path(current) / name
            found.append((path.relative_to(folder).as_posix(), path))
    if not found:
        raise PackError(f"base folder {folder} holds no file to carry")
    return found


def builtin_home(name: str) -> Path:
    """Where a built-in base's converted folder installs: ``<home>/bases/<name>``."""
    return bases_dir() / name

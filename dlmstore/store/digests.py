"""Content digests of files, with the ``sha256:`` scheme prefix stored everywhere."""

from __future__ import annotations

import hashlib
import os


def file_sha256(path: str | os.PathLike[str]) -> str:
    """``sha256:<hex>`` of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()

"""Content digests of files, with the ``sha256:`` scheme prefix stored everywhere."""

from __future__ import annotations

import hashlib
import os


def file_sha256(path: str | os.PathLike[str]) -> str:
    """``sha256:<hex>`` of a file's bytes, read in chunks (never whole into memory)."""
    with open(path, "rb") as f:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()

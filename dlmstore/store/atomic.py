"""Atomic file writes: temp file in the same directory, fsync, rename.

A reader (or a crash) sees either the old file or the whole new one, never
a partial write. Callers that record a file in store.db commit the row only
after these functions return, so no row ever points at a partial blob.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_bytes_atomic(path: Path, data: bytes, *, overwrite: bool = True) -> None:
    """Write ``data`` to ``path`` atomically.

    Args:
        path: destination; its directory must exist.
        data: the full contents.
        overwrite: when false, raise ``FileExistsError`` if ``path`` exists
            (checked atomically with a hard link, not a racy ``exists()``).
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails with FileExistsError instead of clobbering
            os.unlink(tmp)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it survives a power cut (POSIX only)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename still happened
    finally:
        os.close(fd)

"""Token segments: append-only files of concatenated token arrays.

The tokenized cache stores tokens in a few large files rather than one file
per entry: on a 13K-file corpus, 13K small files cost a directory scan, an
``open`` and an inode each, while one segment per pass is a single sequential
write and a single ``mmap`` to read back. A cache entry is a byte range of a
segment, recorded in ``store.db`` with its dtype, token count and checksum; the
file itself is raw little-endian ``uint16`` (vocabulary up to 65,536) or
``uint32`` with no header, so the dtype is never guessed from a size.

Writes are atomic: a segment is written to a temp file, fsynced and renamed
into ``<store>/tokens/`` before any row pointing into it is committed, so a
crash leaves at worst an unreferenced segment (removed by ``dlm cache prune``)
and never a row pointing at a partial file. Each worker writes its own segment
(ULID names never collide), so parallel writers need no coordination.

Checksums are CRC-32 over the entry's bytes (``crc32:`` prefix): they catch
truncation and bit rot at a few GB/s, which is what a local cache needs; the
row key, not the checksum, is the content address.
"""

from __future__ import annotations

import mmap
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

from dlmstore.store.atomic import atomic_file
from dlmstore.store.regular_files import open_regular
from dlmstore.ulid import new_ulid

SEGMENT_DIR = "tokens"
SEGMENT_SUFFIX = ".bin"
#: How a segment's file name begins; files written before migration 0018 (when
#: segments were called packs) begin with :data:`LEGACY_PREFIX` and keep it:
#: each row records its file's path, so both are read, shared and swept alike.
SEGMENT_PREFIX = "segment-"
LEGACY_PREFIX = "pack-"


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits, else ``uint32``."""
    import numpy as np

    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


def dtype_name(dtype: np.dtype) -> str:
    """``uint16`` / ``uint32``: the name stored in the database."""
    import numpy as np

    return {2: "uint16", 4: "uint32"}[np.dtype(dtype).itemsize]


def checksum(data: memoryview | bytes) -> str:
    """The stored checksum of an entry's bytes."""
    return f"crc32:{zlib.crc32(data):08x}"


@dataclass(frozen=True)
class SegmentEntry:
    """Where one array landed in a segment."""

    byte_offset: int
    token_count: int
    bytes: int
    checksum: str


@dataclass(frozen=True)
class WrittenSegment:
    """A segment file on disk (durable), not yet registered in the database."""

    relpath: str
    dtype: str
    bytes: int
    entries: tuple[SegmentEntry, ...]


def write_segment(store_path: Path, arrays: Sequence[np.ndarray], dtype: np.dtype) -> WrittenSegment:
    """Write ``arrays`` (cast to ``dtype``) into a new segment under ``store_path``.

    Returns only after the file is fsynced and renamed into place.

    Raises:
        OSError: the segment cannot be written (read-only store, disk full);
            no partial file is left behind.
    """
    import numpy as np

    directory = store_path / SEGMENT_DIR
    directory.mkdir(exist_ok=True)
    name = f"{SEGMENT_PREFIX}{new_ulid()}{SEGMENT_SUFFIX}"
    entries: list[SegmentEntry] = []
    offset = 0
    with atomic_file(directory / name) as f:
        for array in arrays:
            data = np.ascontiguousarray(array, dtype=dtype)
            view = memoryview(data.data).cast("B")
            f.write(view)
            entries.append(SegmentEntry(offset, len(data), view.nbytes, checksum(view)))
            offset += view.nbytes
    return WrittenSegment(f"{SEGMENT_DIR}/{name}", dtype_name(dtype), offset, tuple(entries))


class SegmentReader:
    """Read-only, memory-mapped access to the segments of one store.

    Each segment is mapped once, on first use, with the standard ``mmap``
    module: a warm pass that only verifies and counts tokens never imports
    numpy. A missing or short segment, or a segment path that is not a regular
    file (a FIFO is never opened for a blocking read), is not an error here:
    :meth:`read` returns ``None`` and the caller treats the entry as a miss
    (``dlm cache verify`` reports it as damaged).
    """

    def __init__(self, store_path: Path) -> None:
        self.store_path = store_path
        self._maps: dict[str, memoryview | None] = {}
        self._sizes: dict[str, int | None] = {}

    def _map(self, relpath: str) -> memoryview | None:
        if relpath not in self._maps:
            try:
                # Non-blocking and fstat-checked: a segment path that is a FIFO or
                # a device is damage (every entry in it a miss), never a hang.
                fd, _ = open_regular(self.store_path / relpath)
            except OSError:  # missing, unreadable, or not a regular file
                self._maps[relpath] = None
                return None
            try:
                self._maps[relpath] = memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
            except (OSError, ValueError):  # empty (mmap refuses 0 bytes)
                self._maps[relpath] = None
            finally:
                os.close(fd)
        return self._maps[relpath]

    def size(self, relpath: str) -> int | None:
        """The segment's length in bytes, or ``None`` if it is missing or not a regular file.

        One ``open`` and ``fstat`` per segment (non-blocking, as for mapping), no
        mapping and no read: what a lookup that only counts needs.
        """
        if relpath not in self._sizes:
            if relpath in self._maps:
                mapped = self._maps[relpath]
                self._sizes[relpath] = None if mapped is None else len(mapped)
            else:
                try:
                    fd, st = open_regular(self.store_path / relpath)
                except OSError:  # missing, unreadable, or not a regular file
                    self._sizes[relpath] = None
                else:
                    os.close(fd)
                    self._sizes[relpath] = st.st_size
        return self._sizes[relpath]

    def read(self, relpath: str, byte_offset: int, nbytes: int, expected_checksum: str) -> memoryview | None:
        """The entry's bytes (a view of the mapping), or ``None`` if missing or damaged."""
        mapped = self._map(relpath)
        if mapped is None or byte_offset + nbytes > len(mapped):
            return None
        chunk = mapped[byte_offset : byte_offset + nbytes]
        if checksum(chunk) != expected_checksum:
            return None
        return chunk

    def close(self) -> None:
        # Views handed out keep their mapping alive; dropping ours is enough.
        self._maps.clear()
        self._sizes.clear()


def as_array(data: memoryview | bytes, dtype: str) -> np.ndarray:
    """Zero-copy little-endian token array over an entry's bytes."""
    import numpy as np

    return np.frombuffer(data, dtype=np.dtype("<u2") if dtype == "uint16" else np.dtype("<u4"))

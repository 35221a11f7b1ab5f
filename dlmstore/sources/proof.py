"""Prove with one ``stat`` per folder and per file that source trees are as a run saw them.

A warm run over an unchanged tree used to redo everything a cold one does
short of reading the files: walk every folder, load one stat record per
file, build a section and a row per file. A :class:`SourceProof` is what
that work depended on, kept as flat arrays:

* every folder the walk listed, with the stat fields taken *before* the
  listing (``dlmstore.sources.walk.ListedDirs``): adding, removing or
  renaming an entry moves a folder's mtime and ctime, so equal stamps mean
  equal listings, and with the same globs and rules the walk chooses the
  same files in the same order;
* every file the read examined, with the stat fields its stat record holds
  (``dlmstore.sources.statcache``): equal stamps mean the same bytes, as
  the stat cache already trusts for each file.

:meth:`SourceProof.holds` stats them all again and compares. git does the
same for its index and its untracked cache; a tree that moved in any way
fails the proof and the caller does the full walk, which is always correct.

What a stamp cannot vouch for is never proven: a walk that met a symlink
(its target lies outside the folder stamped) or a ``.dlm/`` folder (its
files' text shapes the walk) gives no proof, nor does one whose reads
warned. Racy stamps are refused as the stat cache refuses them: a folder
listed, or a file read, within :data:`~dlmstore.sources.statcache.RACY_NS`
of its mtime may change again without its mtime moving, so a proof with
one is not taken at all (the next full pass, once those mtimes are in the
past, takes it).

Speed: ``holds`` on 100,000 files is one ``stat`` each (about 3 us of
kernel time apiece on a 2-core machine) and a comparison of two integer
arrays; paths are stored NUL-separated and split in one call.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import gt, itemgetter, sub
from typing import TYPE_CHECKING, cast

from dlmstore.id_arrays import pack_ids, unpack_ids
from dlmstore.sources.statcache import RACY_NS, Stamp

if TYPE_CHECKING:
    from dlmstore.sources.walk import ListedDirs

#: Stat fields kept per folder and per file.
DIR_FIELDS = ("st_mtime_ns", "st_ctime_ns", "st_ino")
FILE_FIELDS = ("st_size", "st_mtime_ns", "st_ctime_ns", "st_ino")


@dataclass(frozen=True)
class SourceProof:
    """The folders and files a pass depended on, with the stat fields it saw.

    Attributes:
        dirs: folder paths, in walk order.
        dir_stamps: ``mtime_ns, ctime_ns, inode`` per folder, flat.
        files: file paths, in read order.
        file_stamps: ``size, mtime_ns, ctime_ns, inode`` per file, flat.
    """

    dirs: Sequence[str]
    dir_stamps: array[int]
    files: Sequence[str]
    file_stamps: array[int]

    def holds(self) -> bool:
        """Whether every folder and file still has the stat fields recorded.

        A path that is gone, or cannot be stat-ed, fails the proof.
        """
        return _same(self.dirs, self.dir_stamps, sized=False) and _same(
            self.files, self.file_stamps, sized=True
        )

    def to_blobs(self) -> tuple[bytes, bytes, bytes, bytes]:
        """``(dir_paths, dir_stamps, file_paths, file_stamps)`` as stored (``pass_snapshots``)."""
        return _join(self.dirs), pack_ids(self.dir_stamps), _join(self.files), pack_ids(self.file_stamps)

    @classmethod
    def from_blobs(
        cls, dir_paths: bytes, dir_stamps: bytes, file_paths: bytes, file_stamps: bytes
    ) -> SourceProof:
        return cls(_split(dir_paths), unpack_ids(dir_stamps), _split(file_paths), unpack_ids(file_stamps))


class ProofBuilder:
    """Collects a proof directive by directive; gives ``None`` once anything cannot be proven."""

    def __init__(self) -> None:
        self.dirs: list[str] = []
        self.dir_stamps: array[int] = array("q")
        self.files: list[str] = []
        self.file_stamps: array[int] = array("q")
        self.provable = True

    def add(self, listed: ListedDirs | None, stamps: list[Stamp | None]) -> None:
        """Add one directive: its walk's folders and the stat records of the files it examined.

        The files are taken in C-level passes (``map``/``itemgetter``): this
        runs on every full pass, once per file.
        """
        if listed is None:
            self.provable = False
            return
        newest = listed.listed_ns - RACY_NS
        for path, st in listed.dirs:
            if st.st_mtime_ns > newest:  # listed within RACY_NS of its last change
                self.provable = False
                return
            self.dirs.append(path)
            self.dir_stamps.extend((st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
        if None in stamps:  # a file examined but not recorded (it grew while read, or was too large)
            self.provable = False
            return
        recorded = cast("list[Stamp]", stamps)
        # Racily clean: read (checked_ns, field 8) within RACY_NS of its mtime (field 3).
        trusted_until = map(sub, map(itemgetter(8), recorded), repeat(RACY_NS))
        if any(map(gt, map(itemgetter(3), recorded), trusted_until)):
            self.provable = False
            return
        self.files.extend(map(itemgetter(0), recorded))
        self.file_stamps.extend(chain.from_iterable(map(itemgetter(2, 3, 4, 5), recorded)))

    def proof(self) -> SourceProof | None:
        if not self.provable:
            return None
        return SourceProof(tuple(self.dirs), self.dir_stamps, tuple(self.files), self.file_stamps)


#: Paths stat-ed between two comparisons: a tree that moved fails within a chunk.
CHUNK = 4096


def _same(paths: Sequence[str], recorded: array[int], *, sized: bool) -> bool:
    """Stat every path and compare its fields (``FILE_FIELDS`` when ``sized``, else
    ``DIR_FIELDS``) with ``recorded``, one comparison per :data:`CHUNK` paths."""
    width = 4 if sized else 3
    if len(recorded) != width * len(paths):
        return False
    stat = os.stat
    for start in range(0, len(paths), CHUNK):
        fresh: array[int] = array("q")
        extend = fresh.extend
        try:
            if sized:
                for path in paths[start : start + CHUNK]:
                    st = stat(path)
                    extend((st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
            else:
                for path in paths[start : start + CHUNK]:
                    st = stat(path)
                    extend((st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
        except (OSError, ValueError):  # gone, unreadable, or a path the OS refuses
            return False
        if fresh != recorded[width * start : width * (start + CHUNK)]:
            return False
    return True


def _join(paths: Sequence[str]) -> bytes:
    # surrogateescape: a file name that is not UTF-8 round-trips as the walk saw it.
    return "\0".join(paths).encode("utf-8", "surrogateescape")


def _split(blob: bytes) -> tuple[str, ...]:
    return tuple(blob.decode("utf-8", "surrogateescape").split("\0")) if blob else ()


__all__ = ["DIR_FIELDS", "FILE_FIELDS", "ProofBuilder", "SourceProof"]

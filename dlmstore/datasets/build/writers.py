"""Streaming, atomic writers for token files.

:class:`StreamingFile` writes a file of any size in pieces: into a temp
file in the destination directory (an :class:`~dlmstore.store.atomic.AtomicFile`),
hashing as it goes, then fsync and rename, so a reader or a crash sees
either no file or the whole one and the sha256 costs no second read.
Each worker of a parallel build writes its own files this way; nothing is
shared until registration.

:class:`ShardedSplitWriter` is the pretrain layout on top of it: fixed-size
shards of ``shard_tokens`` tokens (the last one shorter), each with a
sidecar ``.docs.npy`` holding the positions, within the shard, where a
document starts. Shards are cut at a fixed token count rather than at
document boundaries so every shard but the last has the same size (simple
to budget, and window sampling needs no per-shard padding); a document may
therefore continue into the next shard, which the index records by not
listing a start at position 0. Readers take document boundaries from the
index, so packing never scans for EOS.

A finished shard's sha256 is known as soon as its last byte is written;
only its fsync and rename go to :class:`BackgroundCommits`, one worker
thread, so a slow disk never stalls tokenization. The builder waits for
that thread before writing ``meta.json``.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from dlmstore.datasets.formats import OFFSET_DTYPE, doc_index_name, shard_name
from dlmstore.datasets.meta import FileEntry
from dlmstore.store.atomic import AtomicFile, write_bytes_atomic


class StreamingFile:
    """A file written in pieces and renamed into place on :meth:`commit`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = AtomicFile(path, buffering=1 << 20)
        self._digest = hashlib.sha256()
        self.bytes = 0

    def write(self, array: np.ndarray[Any, Any]) -> None:
        """Append a contiguous array's bytes."""
        view = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
        self._file.file.write(view)
        self._digest.update(view)
        self.bytes += len(view)

    def finish(self) -> str:
        """Stop writing; returns ``sha256:<hex>`` of the contents (known before any fsync)."""
        self._file.file.flush()
        return "sha256:" + self._digest.hexdigest()

    def publish(self) -> None:
        """fsync, close and rename into place (may run on another thread)."""
        self._file.commit()

    def commit(self) -> str:
        """:meth:`finish` then :meth:`publish`; returns the sha256."""
        sha = self.finish()
        self.publish()
        return sha

    def abort(self) -> None:
        """Close and delete the temp file; the destination is untouched."""
        self._file.abort()

    def __enter__(self) -> StreamingFile:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is not None:
            self.abort()


def npy_bytes(array: np.ndarray[Any, Any]) -> bytes:
    """A ``.npy`` file's bytes (the header is deterministic for a given array)."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def write_npy(path: Path, array: np.ndarray[Any, Any]) -> tuple[int, str]:
    """Write ``array`` as ``.npy`` atomically; returns ``(bytes, sha256)``."""
    data = npy_bytes(array)
    write_bytes_atomic(path, data)
    return len(data), "sha256:" + hashlib.sha256(data).hexdigest()


class BackgroundCommits:
    """Publishes finished files (fsync + rename) on one worker thread.

    An fsync can stall for a long time when other processes are writing to
    the same disk (the journal commit waits for their data too). Doing it
    off the tokenizing thread keeps writing from becoming the bottleneck;
    :meth:`wait` is called before ``meta.json`` is written, so the order
    "every file durable, then meta.json" still holds.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlm-commit")
        self._pending: list[Future[None]] = []

    def submit(self, publish: Callable[[], None]) -> None:
        self._pending.append(self._pool.submit(publish))

    def wait(self) -> None:
        """Block until every file is published; re-raise the first failure."""
        failure = self.drain()
        if failure is not None:
            raise failure

    def drain(self) -> BaseException | None:
        """Block until the worker is idle and stopped; return (not raise) the first failure.

        For a build that is already failing: its own error is the one to report.
        """
        pending, self._pending = self._pending, []
        self._pool.shutdown(wait=True)
        failures = [f.exception() for f in pending]
        return next((f for f in failures if f is not None), None)


class ShardedSplitWriter:
    """The shards and document indexes of one pretrain split.

    Args:
        directory: the split directory (created if missing).
        split: ``train`` or ``val`` (recorded in the file entries).
        dtype: the token dtype (little-endian).
        shard_tokens: tokens per shard.
        prefix: path of the split directory relative to the dataset
            directory, for the file entries.
        commits: publish finished files there (default: synchronously).
    """

    def __init__(
        self,
        directory: Path,
        split: str,
        dtype: np.dtype[Any],
        shard_tokens: int,
        prefix: str,
        commits: BackgroundCommits | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.split = split
        self.dtype = dtype
        self.shard_tokens = shard_tokens
        self.prefix = prefix
        self.entries: list[FileEntry] = []
        self.tokens = 0  # appended so far, the open shard included
        self.docs = 0
        self._committed = 0
        self._commits = commits
        self._shard: StreamingFile | None = None
        self._shard_fill = 0
        self._starts: list[np.ndarray[Any, Any]] = []

    def add(self, tokens: np.ndarray[Any, Any], starts: np.ndarray[Any, Any]) -> None:
        """Append tokens (whole documents, EOS included) and their document starts.

        ``starts`` are positions within ``tokens``, increasing.
        """
        self.docs += len(starts)
        self.tokens += len(tokens)
        position = 0
        while position < len(tokens):
            if self._shard is None:
                index = len(self.entries) // 2
                self._shard = StreamingFile(self.directory / shard_name(index))
                self._shard_fill = 0
            take = min(self.shard_tokens - self._shard_fill, len(tokens) - position)
            self._shard.write(tokens[position : position + take])
            lo, hi = np.searchsorted(starts, [position, position + take])
            if hi > lo:
                self._starts.append(starts[lo:hi] - position + self._shard_fill)
            self._shard_fill += take
            position += take
            if self._shard_fill == self.shard_tokens:
                self._finish_shard()

    def _finish_shard(self) -> None:
        assert self._shard is not None
        shard, self._shard = self._shard, None
        index = len(self.entries) // 2
        starts = (
            np.concatenate(self._starts).astype(OFFSET_DTYPE)
            if self._starts
            else np.zeros(0, dtype=OFFSET_DTYPE)
        )
        index_data = npy_bytes(starts)
        index_path = self.directory / doc_index_name(index)
        self.entries.append(
            FileEntry(
                self.split,
                "tokens",
                f"{self.prefix}/{shard.path.name}",
                index,
                self._committed,
                self._shard_fill,
                len(starts),
                shard.bytes,
                shard.finish(),
            )
        )
        self.entries.append(
            FileEntry(
                self.split,
                "doc_index",
                f"{self.prefix}/{index_path.name}",
                index,
                self._committed,
                0,
                len(starts),
                len(index_data),
                "sha256:" + hashlib.sha256(index_data).hexdigest(),
            )
        )

        def publish() -> None:
            shard.publish()
            write_bytes_atomic(index_path, index_data)

        if self._commits is None:
            publish()
        else:
            self._commits.submit(publish)
        self._committed += self._shard_fill
        self._starts = []

    def close(self) -> list[FileEntry]:
        """Commit the last (partial) shard; returns every file entry of the split."""
        if self._shard is not None:
            if self._shard_fill:
                self._finish_shard()
            else:
                self._shard.abort()
                self._shard = None
        return self.entries

    def abort(self) -> None:
        """Discard the shard being written (committed shards stay, without a meta.json)."""
        if self._shard is not None:
            self._shard.abort()
            self._shard = None

"""What the builders share: results, progress, seeded draws, the output directory.

Randomness goes through a seeded ``torch.Generator`` only (the spec forbids
``random`` and numpy's RNG). The train/val draw is per position
(:mod:`.routing`); :class:`UniformDraws`, one seeded stream drawn in fixed
chunks of :data:`DRAW_CHUNK` values, drives the shuffle buffer, which
reads the input in order on one process whatever the engine.

A build first deletes the directory's ``meta.json`` (so a half-rebuilt
directory never passes for a complete one), writes every file atomically,
deletes files of an earlier build that this one did not write, writes
``meta.json`` last, then deletes the working files of a parallel build
(``.build/``, see :mod:`.blocks`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, TypeVar

from dlmstore.datasets.meta import META_NAME, FileEntry
from dlmstore.errors import DatasetError

DRAW_CHUNK = 4096
#: A parallel build's working files, inside the output directory.
BUILD_DIR = ".build"
T = TypeVar("T")


@dataclass(frozen=True)
class BuildProgress:
    """Where a running build is, for a progress bar (stderr); ``finished`` on its last report."""

    name: str
    docs: int
    tokens: int
    seconds: float
    finished: bool = False


@dataclass(frozen=True)
class SplitTotals:
    """Tokens, documents (or examples) and files of one split.

    Attributes:
        tokens: Tokens in the split.
        docs: Documents (pretrain) or examples (SFT).
        files: Token files.
        bytes: Bytes of those files.
    """

    tokens: int
    docs: int
    files: int
    bytes: int


@dataclass(frozen=True)
class BuildResult:
    """What a builder wrote (the JSON shape of ``dlm data build ... --json``).

    Attributes:
        path: The dataset folder.
        kind: ``pretrain`` or ``sft``.
        name: The dataset's name.
        token_dtype: ``uint16`` when the vocabulary fits, else ``uint32``.
        vocab_size: Vocabulary size of the tokenizer.
        tokenizer_sha256: Fingerprint of the tokenizer.
        seed: Seed of the split and shuffle.
        splits: Each split's totals, by split name.
        skipped: Documents or examples left out, by reason.
        seconds: Time the build took.
    """

    path: str
    kind: str
    name: str
    token_dtype: str
    vocab_size: int
    tokenizer_sha256: str
    seed: int
    splits: dict[str, SplitTotals]
    skipped: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


ProgressFn = Callable[[BuildProgress], None]


class UniformDraws:
    """Uniform floats in [0, 1) from a seeded torch generator, one at a time."""

    def __init__(self, seed: int) -> None:
        import torch

        self._torch = torch
        self._generator = torch.Generator().manual_seed(seed)
        self._buffer: list[float] = []
        self._position = 0

    def next(self) -> float:
        if self._position == len(self._buffer):
            chunk = self._torch.rand(DRAW_CHUNK, generator=self._generator, dtype=self._torch.float64)
            self._buffer = chunk.tolist()
            self._position = 0
        value = self._buffer[self._position]
        self._position += 1
        return value


def buffer_shuffle(items: Iterable[T], buffer_size: int, seed: int) -> Iterator[T]:
    """Approximately shuffle a stream with a buffer of ``buffer_size`` items (seeded).

    Each incoming item replaces a randomly chosen buffered item, which is
    emitted; memory stays at ``buffer_size`` items however long the stream.
    """
    draws = UniformDraws(seed)
    buffer: list[T] = []
    for item in items:
        if len(buffer) < buffer_size:
            buffer.append(item)
            continue
        slot = int(draws.next() * buffer_size)
        yield buffer[slot]
        buffer[slot] = item
    while buffer:
        slot = int(draws.next() * len(buffer))
        buffer[slot], buffer[-1] = buffer[-1], buffer[slot]
        yield buffer.pop()


def batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Lists of up to ``size`` consecutive items."""
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch


def prepare_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """Create the dataset directory and mark it incomplete (no meta.json)."""
    path = Path(out_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / META_NAME).unlink(missing_ok=True)
    except OSError as exc:
        raise DatasetError(
            f"cannot write the dataset directory {path}: {exc.strerror or exc}",
            hint="choose a writable --out / --cache-dir",
        ) from None
    return path


def remove_build_dir(out: Path) -> None:
    """Delete a parallel build's working files (``<out>/.build``), once meta.json is written."""
    import shutil

    shutil.rmtree(out / BUILD_DIR, ignore_errors=True)


def split_totals(entries: list[FileEntry], split: str) -> SplitTotals:
    """Totals of one split from its file entries."""
    tokens = [e for e in entries if e.split == split and e.role == "tokens"]
    mine = [e for e in entries if e.split == split]
    return SplitTotals(
        tokens=sum(e.token_count for e in tokens),
        docs=sum(e.doc_count for e in tokens),
        files=len(mine),
        bytes=sum(e.bytes for e in mine),
    )


class Clock:
    """Seconds since a build started, and a throttled progress callback."""

    def __init__(self, name: str, progress: ProgressFn | None, every_s: float = 0.25) -> None:
        self.name = name
        self.start = time.perf_counter()
        self._progress = progress
        self._every = every_s
        self._last = 0.0

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def tick(self, docs: int, tokens: int, *, final: bool = False) -> None:
        if self._progress is None:
            return
        now = self.seconds
        if final or now - self._last >= self._every:
            self._last = now
            self._progress(BuildProgress(self.name, docs, tokens, now, finished=final))


def text_of(item: Any, index: int) -> str:
    """A document's text; an error naming the position of anything else."""
    if isinstance(item, str):
        return item
    raise DatasetError(
        f"document {index} is a {type(item).__name__}, not text",
        hint="pass an iterable of str (one string per document)",
    )

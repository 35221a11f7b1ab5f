"""What the builders share: results, progress, seeded draws, the output directory.

Randomness goes through a seeded ``torch.Generator`` only (the spec forbids
``random`` and numpy's own streams), drawn without loading torch
(:class:`.routing.TorchGenerator`: the same MT19937 outputs, bit for bit). The train/val draw is per position
(:mod:`.routing`); :class:`UniformDraws`, one seeded stream drawn in fixed
chunks of :data:`DRAW_CHUNK` values, drives the shuffle buffer, which
reads the input in order on one process whatever the engine.

The output folder is the user's until dlm has shown it is not: before
anything is written, connected or deleted, :func:`claim_out_dir` decides
whether a build may write there. It may when the folder is absent, empty,
or a dataset dlm wrote: a ``meta.json`` carrying dlm's format tag
(:data:`~dlmstore.datasets.meta.FORMAT`), or the marker a build leaves in
``.build/`` (:data:`BUILD_MARKER`) from its first write until it completes,
so an interrupted build is dlm's to resume. Any other folder is refused,
naming it, unless the caller consents (``--force``); even then a build
removes only the names it writes itself (``meta.json``, ``train/`` and
``val/`` shards and indexes, a ``.build/`` holding its marker). A
``.build/`` folder without the marker is never removed: it is refused even
with consent. An output folder that is, holds or sits inside one of its
inputs is refused too.

A build then marks the folder and deletes its ``meta.json`` (so a
half-rebuilt directory never passes for a complete one), writes every file
atomically, deletes shards of an earlier build that this one did not write,
writes ``meta.json`` last, then deletes the working files (``.build/``:
the marker, and a parallel build's spill files, see :mod:`.blocks`).
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, TypeVar

from dlmstore.datasets.meta import FORMAT, MAX_META_BYTES, META_NAME, FileEntry
from dlmstore.errors import DatasetError
from dlmstore.store.atomic import write_bytes_atomic
from dlmstore.store.regular_files import load_json, read_regular

DRAW_CHUNK = 4096
#: A build's working files, inside the output directory.
BUILD_DIR = ".build"
#: Written in ``.build/`` when a build starts: the folder is a dataset dlm is building.
BUILD_MARKER = "dlm-build"
#: The lock files a store keeps beside its database: a folder holding only these is empty.
_LOCK_FILES = frozenset({".store.lock", ".migrate.lock"})
#: A pretrain shard or its document index (``shard_00003.bin``, ``shard_00003.docs.npy``).
_SHARD_FILE = re.compile(r"shard_[0-9]{5,}\.(?:bin|docs\.npy)")
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
class DriverBytes:
    """What passed through the process that ran ``dlm`` (the Ray driver) during a Ray build.

    Attributes:
        reader: ``workers`` when each task read its own range of the input (the driver
            only planned and committed), ``driver`` when the driver read the input in
            order and sent its text to the workers (a stream, a shuffle buffer, a
            source's own splits).
        input: Size of the input in bytes: its files (``workers``), or the UTF-8 text
            of the documents the driver read (``driver``).
        read: Input bytes the driver read itself.
        sent: Bytes the driver put into Ray's object store: task arguments (each
            task's range of the input, or the documents' text) and the tokenizer.
        received: Bytes the driver got back from tasks: document counts, token counts
            per document, the written files' sizes and sha256.
        tokenizer: Of ``sent``, the tokenizer, sent once per build whatever the input's size.
    """

    reader: str
    input: int
    read: int
    sent: int
    received: int
    tokenizer: int

    @property
    def total(self) -> int:
        """Every byte counted: read, sent and received."""
        return self.read + self.sent + self.received


@dataclass
class Traffic:
    """Counts what passes through a Ray build's driver: the payload of every task argument and result.

    Ray's own messages (task specifications, object references, heartbeats)
    are not counted: a few hundred bytes per task whatever its payload.
    """

    reader: str
    input: int = 0
    read: int = 0
    sent: int = 0
    received: int = 0
    tokenizer: int = 0
    _seen: set[int] = field(default_factory=set)

    def put(self, ray: Any, value: Any, *, tokenizer: bool = False) -> Any:
        """``ray.put(value)``, its size counted as sent."""
        size = _size(value)
        self.sent += size
        if tokenizer:
            self.tokenizer += size
        return ray.put(value)

    def relayed(self, documents: list[Any]) -> None:
        """Documents the driver read and sent on to a task: input, read and sent alike."""
        size = _text_size(documents)
        self.input += size
        self.read += size
        self.sent += size

    def send(self, *values: Any) -> None:
        """Task arguments sent by value (object references are counted where they were put)."""
        self.sent += sum(_size(v) for v in values)

    def got(self, value: Any) -> Any:
        self.received += _size(value)
        return value

    def result(self) -> DriverBytes:
        return DriverBytes(self.reader, self.input, self.read, self.sent, self.received, self.tokenizer)


def _size(value: Any) -> int:
    """The payload of ``value`` as Ray serialises it (pickle protocol 5; arrays by their buffer)."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, tuple) and all(isinstance(v, np.ndarray) for v in value):
        return sum(int(v.nbytes) for v in value)
    return len(pickle.dumps(value, protocol=5))


def _text_size(texts: list[Any]) -> int:
    """The UTF-8 bytes of documents (a conversation: its pickle's)."""
    return sum(len(t.encode("utf-8")) if isinstance(t, str) else _size(t) for t in texts)


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
        driver_bytes: What passed through this process during a Ray build; ``null``
            for the local engine, which reads and writes everything itself.
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
    driver_bytes: DriverBytes | None = None


ProgressFn = Callable[[BuildProgress], None]


class UniformDraws:
    """Uniform floats in [0, 1) from a seeded torch generator, one at a time (drawn without torch)."""

    def __init__(self, seed: int) -> None:
        from dlmstore.datasets.build.routing import TorchGenerator

        self._generator = TorchGenerator(seed)
        self._buffer: list[float] = []
        self._position = 0

    def next(self) -> float:
        if self._position == len(self._buffer):
            self._buffer = self._generator.rand(DRAW_CHUNK).tolist()
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


def claim_out_dir(
    out_dir: str | os.PathLike[str],
    *,
    force: bool = False,
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> Path:
    """Check that a build may write into ``out_dir``; touches nothing.

    Args:
        out_dir: the dataset folder.
        force: the user's consent to replace the dataset files in a folder
            dlm did not write (only the names a build writes are replaced).
        inputs: the files or folders the build reads.

    Raises:
        DatasetError: ``out_dir`` is, holds or sits inside an input; is not
            a folder; holds a ``.build/`` dlm did not make; or (without
            ``force``) holds files and is not a dataset dlm wrote.
    """
    path = Path(out_dir)
    _refuse_overlap(path, inputs)
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        return path
    except NotADirectoryError:
        raise DatasetError(
            f"the dataset folder {path} is a file", hint="choose a new folder for the dataset"
        ) from None
    except OSError as exc:
        raise DatasetError(
            f"cannot read the dataset folder {path}: {exc.strerror or exc}",
            hint="choose a folder you can read and write",
        ) from None
    build = path / BUILD_DIR
    if BUILD_DIR in names and not _marked(build):
        raise DatasetError(
            f"{build} is not a folder a dlm build made, and a build keeps its working files there",
            hint=f"move {build} elsewhere, or choose a new folder for the dataset",
        )
    if force or BUILD_DIR in names or _is_dataset(path):
        return path
    theirs = [name for name in names if name not in _LOCK_FILES]
    if not theirs:
        return path
    raise DatasetError(
        f"{path} is not a folder dlm wrote: it holds {listing(path, theirs)}, and no {META_NAME} of a dlm dataset",
        hint="choose a new or empty folder, or pass --force to let dlm replace the dataset files there "
        f"({META_NAME}, train/ and val/ shards; nothing else is removed)",
    )


def listing(folder: Path, names: list[str]) -> str:
    """``notes.txt, train/ and 2 more``: the first names in a folder, folders marked with ``/``."""
    shown = [name + "/" if (folder / name).is_dir() else name for name in sorted(names)[:3]]
    more = len(names) - len(shown)
    if more:
        return ", ".join(shown) + f" and {more} more"
    return " and ".join([", ".join(shown[:-1]), shown[-1]]) if len(shown) > 1 else shown[0]


def prepare_out_dir(out_dir: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Claim the dataset directory (:func:`claim_out_dir`), mark it dlm's and incomplete (no meta.json)."""
    path = claim_out_dir(out_dir, force=force)
    build = path / BUILD_DIR
    try:
        build.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(build / BUILD_MARKER, FORMAT.encode())
        (path / META_NAME).unlink(missing_ok=True)
    except OSError as exc:
        raise DatasetError(
            f"cannot write the dataset directory {path}: {exc.strerror or exc}",
            hint="choose a writable --out / --cache-dir",
        ) from None
    return path


def remove_build_dir(out: Path) -> None:
    """Delete the build's working files (``<out>/.build``, with its marker), once meta.json is written."""
    if _marked(out / BUILD_DIR):
        shutil.rmtree(out / BUILD_DIR, ignore_errors=True)


def remove_stale(directory: Path, keep: set[str]) -> None:
    """Delete the shards and indexes in ``directory`` that a new build did not write (nothing else)."""
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        if _SHARD_FILE.fullmatch(path.name) and path.name not in keep:
            path.unlink()


def _refuse_overlap(out: Path, inputs: Iterable[str | os.PathLike[str]]) -> None:
    here = Path(os.path.realpath(out))
    for given in inputs:
        source = Path(os.path.realpath(given))
        if here == source:
            where = "is"
        elif here.is_relative_to(source):
            where = "is inside"
        elif source.is_relative_to(here):
            where = "holds"
        else:
            continue
        raise DatasetError(
            f"the dataset folder {out} {where} the input {os.fspath(given)}",
            hint="write the dataset to a folder apart from what it is built from",
        )


def _marked(build: Path) -> bool:
    """Whether ``build`` is a ``.build`` folder a dlm build made (it holds the marker)."""
    try:
        return read_regular(build / BUILD_MARKER, limit=len(FORMAT)) == FORMAT.encode()
    except OSError:
        return False


def _is_dataset(path: Path) -> bool:
    """Whether ``path`` holds a ``meta.json`` carrying dlm's dataset format tag."""
    try:
        meta = load_json(read_regular(path / META_NAME, limit=MAX_META_BYTES))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


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

"""Inputs: text files, JSONL and Parquet as streams of texts or records, whole or by range.

``dlm data build --from PATH`` and ``build-all --local NAME=PATH`` read
local data through this module, always as iterators (never a whole corpus
in memory):

* a ``.jsonl`` / ``.json`` file: one JSON object per line (a ``.json``
  file may also hold one list of objects);
* a ``.parquet`` file: read a row group at a time with pyarrow, which is
  what a downloaded Hugging Face dataset snapshot contains;
* any other file: its whole UTF-8 text is one document;
* a directory: its data files (``.parquet``/``.jsonl``/``.json``) when it
  has any, else every other file as a text document; found recursively,
  sorted by relative path, hidden files and directories skipped.

An ``s3://bucket/prefix`` is read the same way (:func:`object_files`
lists it as a folder; :mod:`dlmstore.objstore.reading` reads each object).
Records become texts through a field (``text`` by default). Undecodable
text files are an error naming the file, not a silent skip: a corpus
that quietly loses files is worse than a build that stops.

**By range.** A Ray build does not read its input on the driver: it cuts
it into :class:`Piece`\\ s knowing only each file's size (a ``stat``):
byte ranges of a JSONL file, a whole ``.json`` file, a Parquet file, runs
of text files. A first round of tasks counts the documents of each piece
(:func:`count_piece`: JSONL lines, a Parquet footer's row-group sizes),
the driver takes prefix sums (:func:`ranges_of`), and each :class:`Range`
then knows the position of its first document in the whole input, and
its first record's number and line in its file, so a task reading it
(:func:`range_texts`, :func:`range_records`) yields the documents, and
raises the errors, that reading the whole input in order does. A byte
range ``[start, end)`` of a JSONL file owns the lines that *start* inside
it (a line starts at byte 0 or after ``\\n``), so neighbouring ranges
never share or lose a line, whatever the size they were cut at; its bytes
are decoded as ``open(path, encoding="utf-8")`` decodes them (universal
newlines), so line numbers match too.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from dlmstore.errors import DatasetError
from dlmstore.objstore.uri import ObjectURI, is_object_uri

RECORD_SUFFIXES = (".parquet", ".jsonl", ".json")
#: Bytes of a JSONL file, or of a run of text files, one task reads; the output does not depend on it.
DEFAULT_RANGE_BYTES = 1 << 20
_SCAN = 1 << 16


def data_files(path: str | os.PathLike[str]) -> list[Path]:
    """The files a local input stands for, in a stable order."""
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise DatasetError(f"{root} does not exist", hint="pass an existing file or directory")
    found = sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    records = [p for p in found if p.suffix in RECORD_SUFFIXES]
    files = records or found
    if not files:
        raise DatasetError(f"{root} holds no files", hint="point at a folder of text, JSONL or Parquet files")
    return files


def iter_records(path: Path) -> Iterator[dict[str, Any]]:
    """The records of one ``.jsonl``, ``.json`` or ``.parquet`` file."""
    if path.suffix == ".parquet":
        yield from _parquet_records(path, str(path))
        return
    with open(path, encoding="utf-8") as handle:
        yield from _text_records(handle, str(path), path.suffix, 1)


def _text_records(handle: IO[str], where: str, suffix: str, first_line: int) -> Iterator[dict[str, Any]]:
    """The records of JSON text: a list (a ``.json`` file starting ``[``), else one per non-blank line."""
    if suffix == ".json":
        head = handle.read(1)
        handle.seek(0)
        if head == "[":
            for record in json.load(handle):
                yield _checked_record(record, where, None)
            return
    for number, line in enumerate(handle, start=first_line):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}:{number}: not JSON: {exc.msg}") from None
            yield _checked_record(record, where, number)


def _checked_record(record: Any, where: str, line: int | None) -> dict[str, Any]:
    if not isinstance(record, dict):
        at = f"{where}:{line}" if line else where
        raise DatasetError(f"{at}: expected a JSON object, found {type(record).__name__}")
    return record


def _parquet_file(source: Any, where: str) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(
            f"reading {where} needs pyarrow, which is not installed", hint="pip install pyarrow"
        ) from None
    return pq.ParquetFile(source)


def _parquet_records(source: Any, where: str, groups: range | None = None) -> Iterator[dict[str, Any]]:
    parquet = _parquet_file(source, where)
    chosen = None if groups is None else list(groups)
    for batch in parquet.iter_batches(batch_size=1024, row_groups=chosen):
        yield from batch.to_pylist()


def iter_local_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every record of a local input (files in :func:`data_files` order)."""
    files = data_files(path)
    for file in files:
        _check_record_file(file)
        yield from iter_records(file)


def _check_record_file(file: Path | str) -> None:
    if Path(file).suffix not in RECORD_SUFFIXES:
        raise DatasetError(
            f"{file} is not a JSONL, JSON or Parquet file",
            hint="conversations are read from .jsonl/.json/.parquet records",
        )


def iter_local_texts(path: str | os.PathLike[str], *, text_field: str = "text") -> Iterator[str]:
    """Every document of a local input: record fields, or whole text files."""
    for file in data_files(path):
        if file.suffix in RECORD_SUFFIXES:
            yield from _texts_of(iter_records(file), str(file), text_field, 1)
        else:
            yield read_text_file(file)


def _texts_of(records: Iterator[dict[str, Any]], where: str, text_field: str, first: int) -> Iterator[str]:
    for number, record in enumerate(records, start=first):
        value = record.get(text_field)
        if not isinstance(value, str):
            raise DatasetError(
                f"{where}: record {number} has no string field {text_field!r}",
                hint="name the field holding the text with --text-field",
            )
        yield value


def read_text_file(path: Path) -> str:
    """A text file's contents; an error naming it when it is not UTF-8 text."""
    with open(path, "rb") as handle:
        return _decoded(handle, str(path))


def _decoded(handle: IO[bytes], where: str) -> str:
    """The file's text as ``Path.read_text(encoding="utf-8")`` reads it (universal newlines)."""
    try:
        return io.TextIOWrapper(handle, encoding="utf-8").read()
    except UnicodeDecodeError:
        raise DatasetError(
            f"{where} is not UTF-8 text",
            hint="remove binary files from the input folder or convert them to UTF-8",
        ) from None


# --- by range: what a worker reads of a local input by itself ----------------------------------


@dataclass(frozen=True)
class LocatedInput:
    """Files (a local path, or an ``s3://`` prefix) a Ray build's workers read by range; iterated, read here.

    Iterated (the local engine), it is :func:`iter_local_texts` of ``path``
    (``text_field`` set: a pretrain build) or the conversations of
    :func:`iter_local_records` (``text_field`` ``None``: an SFT build, each
    record through ``catalog.dolly_messages``).
    """

    path: str
    text_field: str | None = "text"

    def __iter__(self) -> Iterator[Any]:
        if self.text_field is not None:
            if not is_object_uri(self.path):
                return iter_local_texts(self.path, text_field=self.text_field)
            return (text for file in self.files() for text in _file_texts(file, self.text_field))
        from dlmstore.datasets.build.catalog import dolly_messages

        records = (
            iter_local_records(self.path)
            if not is_object_uri(self.path)
            else (record for file in self.files() for record in _file_records(file))
        )
        return (dolly_messages(record) for record in records)

    def files(self) -> list[InputFile]:
        """Its files as :func:`data_files` finds them (under an ``s3://`` prefix: as it would in a copy)."""
        if is_object_uri(self.path):
            files = object_files(self.path)
        else:
            files = [InputFile.of(file) for file in data_files(self.path)]
        if self.text_field is None:
            for file in files:
                _check_record_file(file.name)
        return files

    def pieces(self, range_bytes: int = DEFAULT_RANGE_BYTES) -> list[Piece]:
        """The input cut into pieces from each file's size alone (no byte of it is read)."""
        pieces: list[Piece] = []
        texts: list[InputFile] = []
        for ref in self.files():
            suffix = ref.suffix
            if suffix not in RECORD_SUFFIXES:
                texts.append(ref)
                if sum(t.size for t in texts) >= range_bytes:
                    pieces.append(Piece("text", tuple(texts), 0, 0))
                    texts = []
            elif suffix == ".jsonl":
                starts = range(0, max(ref.size, 1), range_bytes)
                pieces.extend(Piece("lines", (ref,), a, min(a + range_bytes, ref.size)) for a in starts)
            else:
                pieces.append(Piece(suffix.lstrip("."), (ref,), 0, ref.size))
        if texts:
            pieces.append(Piece("text", tuple(texts), 0, 0))
        return pieces


@dataclass(frozen=True)
class InputFile:
    """One input file as a task finds it: its name in messages, where it is, and what it was.

    Attributes:
        name: the path as the input named it (what error messages say), or its ``s3://`` URL.
        path: its absolute path (a task may run in another folder, on another node), or its URL.
        size: its size in bytes when the build was planned.
        stamp: its ``st_mtime_ns`` then (an object's ETag): with ``size``, what tells a changed file.
    """

    name: str
    path: str
    size: int
    stamp: str

    @classmethod
    def of(cls, file: Path) -> InputFile:
        info = file.stat()
        return cls(str(file), str(file.resolve()), info.st_size, str(info.st_mtime_ns))

    @property
    def suffix(self) -> str:
        return Path(self.name).suffix

    def open_checked(self, *, streamed: bool = False) -> IO[bytes]:
        """The file, opened for reading, as it was when the build was planned (else an error naming it).

        ``streamed``: it will be read whole, in order (an object: in GETs of 8 MiB, not 64 KiB).
        """
        if is_object_uri(self.path):
            from dlmstore.objstore.reading import READ_BYTES, STREAM_BYTES, open_object

            bucket, _, key = self.path.removeprefix("s3://").partition("/")
            buffer = STREAM_BYTES if streamed else READ_BYTES
            return open_object(ObjectURI(bucket, ""), key, self.size, self.stamp, buffer=buffer)
        handle = open(self.path, "rb")  # the caller closes it
        info = os.fstat(handle.fileno())
        if (info.st_size, str(info.st_mtime_ns)) != (self.size, self.stamp):
            handle.close()
            raise DatasetError(
                f"{self.name} changed while the build read it (size or modification time)",
                hint="rerun the build once the input no longer changes",
            )
        return handle


def object_files(url: str) -> list[InputFile]:
    """The objects under an ``s3://`` prefix that :func:`data_files` would find in a copy of it.

    Raises:
        DatasetError: nothing there.
        ObjectStoreError: the bucket cannot be listed (one line naming it).
    """
    from dlmstore.objstore.reading import listed_objects

    uri = ObjectURI.parse(url)
    found = []
    for key, size, etag in listed_objects(uri):
        relative = PurePosixPath(key[len(uri.prefix) :].lstrip("/") or Path(key).name)
        if not any(part.startswith(".") for part in relative.parts):
            found.append(
                (relative, InputFile(f"s3://{uri.bucket}/{key}", f"s3://{uri.bucket}/{key}", size, etag))
            )
    found.sort(key=lambda item: item[0])
    records = [file for relative, file in found if relative.suffix in RECORD_SUFFIXES]
    files = records or [file for _, file in found]
    if not files:
        raise DatasetError(
            f"{url} holds no objects", hint="point at a prefix of text, JSONL or Parquet files"
        )
    return files


def _file_texts(file: InputFile, text_field: str) -> Iterator[str]:
    """The documents of one whole file, as :func:`iter_local_texts` reads a local one."""
    if file.suffix not in RECORD_SUFFIXES:
        with file.open_checked(streamed=True) as handle:
            yield _decoded(handle, file.name)
        return
    yield from _texts_of(_file_records(file), file.name, text_field, 1)


def _file_records(file: InputFile) -> Iterator[dict[str, Any]]:
    with file.open_checked(streamed=True) as handle:
        if file.suffix == ".parquet":
            yield from _parquet_records(handle, file.name)
        else:
            yield from _text_records(io.TextIOWrapper(handle, encoding="utf-8"), file.name, file.suffix, 1)


@dataclass(frozen=True)
class Piece:
    """A part of the input one counting task reads.

    Attributes:
        kind: ``lines`` (bytes ``start .. end - 1`` of a JSONL file: the lines
            that start there), ``json`` (a whole ``.json`` file), ``parquet``
            (a whole Parquet file: its row groups are counted, then cut) or
            ``text`` (whole text files, one document each).
        files: its file (several for ``text``).
        start, end: the byte range (``lines``).
    """

    kind: str
    files: tuple[InputFile, ...]
    start: int
    end: int


@dataclass(frozen=True)
class Range:
    """A part of the input one tokenizing task reads, and where its documents are in the whole.

    Attributes:
        piece: what it reads (for ``parquet``: ``start .. end - 1`` are row groups).
        position: the position in the input of its first document.
        record: the number (from 1) in its file of its first record.
        line: the line (from 1) of its file its bytes start at (``lines``).
        count: documents it holds.
    """

    piece: Piece
    position: int
    record: int
    line: int
    count: int


def count_piece(piece: Piece) -> list[int]:
    """What a counting task returns: ``[records, lines]``, or a Parquet file's rows per row group."""
    if piece.kind == "text":
        return [len(piece.files)]
    (file,) = piece.files
    if piece.kind == "parquet":
        with file.open_checked() as handle:
            meta = _parquet_file(handle, file.name).metadata
            return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    if piece.kind == "json":
        with file.open_checked(streamed=True) as handle:
            text = io.TextIOWrapper(handle, encoding="utf-8")
            if text.read(1) == "[":
                text.seek(0)
                return [len(json.load(text)), 0]
            text.seek(0)
            return _count_lines(text)
    with file.open_checked() as handle:
        return _count_lines(_owned_lines(handle, piece))


def _count_lines(text: IO[str]) -> list[int]:
    records = lines = 0
    for line in text:
        lines += 1
        records += bool(line.strip())
    return [records, lines]


def _owned_lines(handle: IO[bytes], piece: Piece) -> IO[str]:
    """The lines a byte range owns, decoded as ``open(path, encoding="utf-8")`` decodes them.

    A range inside one long line owns none and reads only its own bytes
    looking for a line start, so a file of a few huge lines is still read
    about once in all, not once per range.
    """
    start = _line_start(handle, piece.start, piece.end)
    if start >= piece.end:
        return io.StringIO("")
    end = _line_start(handle, piece.end, None)
    handle.seek(start)
    return io.TextIOWrapper(io.BytesIO(handle.read(end - start)), encoding="utf-8")


def _line_start(handle: IO[bytes], offset: int, limit: int | None) -> int:
    """The first byte at or after ``offset`` that starts a line (byte 0, or one after ``\\n``).

    Looks no further than ``limit`` (then answers ``limit``) when given, else to the end of the file.
    """
    if offset <= 0:
        return 0
    handle.seek(offset - 1)
    at = offset - 1
    while chunk := handle.read(_SCAN if limit is None else max(1, min(_SCAN, limit - at))):
        found = chunk.find(b"\n")
        if found >= 0:
            return at + found + 1
        at += len(chunk)
        if limit is not None and at >= limit:
            return limit
    return at


def ranges_of(pieces: list[Piece], counts: list[list[int]], range_rows: int) -> list[Range]:
    """Each piece's range(s), positions from prefix sums of the counts; a Parquet file is cut
    into runs of whole row groups of about ``range_rows`` rows."""
    ranges: list[Range] = []
    position = 0
    seen: dict[str, tuple[int, int]] = {}  # file -> (records, lines) of the ranges before
    for piece, count in zip(pieces, counts, strict=True):
        records, lines = seen.get(piece.files[0].path, (0, 0))
        if piece.kind == "parquet":
            first, rows = 0, 0
            for group, size in enumerate(count):
                rows += size
                if rows >= range_rows or group == len(count) - 1:
                    cut = Piece("parquet", piece.files, first, group + 1)
                    ranges.append(Range(cut, position, records + 1, 0, rows))
                    position, records, first, rows = position + rows, records + rows, group + 1, 0
        else:
            held = count[0]
            ranges.append(Range(piece, position, records + 1, lines + 1, held))
            position += held
            records += held
            lines += count[1] if piece.kind != "text" else 0
        seen[piece.files[0].path] = (records, lines)
    return ranges


def range_records(part: Range) -> list[dict[str, Any]]:
    """The records of a range, with the errors reading its whole file would raise at them."""
    (file,) = part.piece.files
    with file.open_checked(streamed=part.piece.kind == "json") as handle:
        if part.piece.kind == "parquet":
            found = list(_parquet_records(handle, file.name, range(part.piece.start, part.piece.end)))
        elif part.piece.kind == "json":
            text = io.TextIOWrapper(handle, encoding="utf-8")
            found = list(_text_records(text, file.name, ".json", 1))
        else:
            found = list(_text_records(_owned_lines(handle, part.piece), file.name, ".jsonl", part.line))
    _check_count(part, len(found))
    return found


def range_texts(part: Range, text_field: str) -> list[str]:
    """The documents of a range: its records' ``text_field``, or its whole text files."""
    if part.piece.kind != "text":
        (file,) = part.piece.files
        return list(_texts_of(iter(range_records(part)), file.name, text_field, part.record))
    texts = []
    for file in part.piece.files:
        with file.open_checked(streamed=True) as handle:
            texts.append(_decoded(handle, file.name))
    return texts


def _check_count(part: Range, found: int) -> None:
    if found != part.count:
        raise DatasetError(
            f"{part.piece.files[0].name} changed while the build read it: "
            f"{found} records where {part.count} were counted",
            hint="rerun the build once the input no longer changes",
        )

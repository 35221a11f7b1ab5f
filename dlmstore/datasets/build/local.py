"""Local inputs: text files, JSONL and Parquet as streams of texts or records.

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

Records become texts through a field (``text`` by default). Undecodable
text files are an error naming the file, not a silent skip: a corpus
that quietly loses files is worse than a build that stops.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dlmstore.errors import DatasetError

RECORD_SUFFIXES = (".parquet", ".jsonl", ".json")


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
        yield from _parquet_records(path)
        return
    with open(path, encoding="utf-8") as handle:
        if path.suffix == ".json":
            head = handle.read(1)
            handle.seek(0)
            if head == "[":
                for record in json.load(handle):
                    yield _checked_record(record, path, None)
                return
        for number, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{path}:{number}: not JSON: {exc.msg}") from None
                yield _checked_record(record, path, number)


def _checked_record(record: Any, path: Path, line: int | None) -> dict[str, Any]:
    if not isinstance(record, dict):
        where = f"{path}:{line}" if line else str(path)
        raise DatasetError(f"{where}: expected a JSON object, found {type(record).__name__}")
    return record


def _parquet_records(path: Path) -> Iterator[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(
            f"reading {path} needs pyarrow, which is not installed", hint="pip install pyarrow"
        ) from None
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        yield from batch.to_pylist()


def iter_local_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every record of a local input (files in :func:`data_files` order)."""
    files = data_files(path)
    for file in files:
        if file.suffix not in RECORD_SUFFIXES:
            raise DatasetError(
                f"{file} is not a JSONL, JSON or Parquet file",
                hint="conversations are read from .jsonl/.json/.parquet records",
            )
        yield from iter_records(file)


def iter_local_texts(path: str | os.PathLike[str], *, text_field: str = "text") -> Iterator[str]:
    """Every document of a local input: record fields, or whole text files."""
    for file in data_files(path):
        if file.suffix in RECORD_SUFFIXES:
            for number, record in enumerate(iter_records(file), start=1):
                value = record.get(text_field)
                if not isinstance(value, str):
                    raise DatasetError(
                        f"{file}: record {number} has no string field {text_field!r}",
                        hint="name the field holding the text with --text-field",
                    )
                yield value
        else:
            yield read_text_file(file)


def read_text_file(path: Path) -> str:
    """A text file's contents; an error naming it when it is not UTF-8 text."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DatasetError(
            f"{path} is not UTF-8 text",
            hint="remove binary files from the input folder or convert them to UTF-8",
        ) from None

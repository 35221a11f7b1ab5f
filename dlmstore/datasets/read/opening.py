"""Opening token files for reading: the dtype from meta.json, the sizes checked.

The pretrain readers find their files with :func:`glob_token_files`, and
every reader opens them through :func:`open_token_files`, so they all
refuse the same bad inputs with the same messages: a token file that is not a regular file (a FIFO,
by its kind, never skipped), a raw file whose dtype
is not recorded (no meta.json and no ``dtype=``), a file whose size
disagrees with meta.json (truncated, padded, cut mid-token), a dataset
built by another tokenizer than the caller's, a recorded vocabulary that
does not fit the recorded dtype. The checks read sizes and headers only;
opening a dataset costs no pass over its tokens.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlmstore.datasets.formats import TokenFile, token_dtype
from dlmstore.datasets.meta import META_NAME, DatasetMeta, check_tokenizer, find_meta_dir, load_meta
from dlmstore.errors import DatasetError, DatasetFileError
from dlmstore.store.regular_files import file_kind


@dataclass(frozen=True)
class OpenedFiles:
    """Token files opened for reading, and the meta.json they came with (if any)."""

    files: tuple[TokenFile, ...]
    meta: DatasetMeta | None
    dtype_name: str | None


def dataset_meta(directory: str | os.PathLike[str], tokenizer_sha256: str | None) -> DatasetMeta | None:
    """The meta.json of ``directory`` (or its parent), checked against the tokenizer in use."""
    meta_dir = find_meta_dir(directory)
    if meta_dir is None:
        if tokenizer_sha256 is not None:
            raise DatasetFileError(
                f"no {META_NAME} in {directory} or its parent: cannot check which tokenizer built it",
                hint="keep the dataset's meta.json with its files, or drop tokenizer_sha256",
            )
        return None
    meta = load_meta(meta_dir)
    if not meta.built:
        raise DatasetError(
            f"{meta_dir / META_NAME} marks {meta.name} as not built",
            hint="build it first (`dlm data build-all` or `dlm data build`)",
        )
    check_tokenizer(meta, tokenizer_sha256)
    return meta


def open_token_files(
    paths: Sequence[Path],
    *,
    directory: str | os.PathLike[str],
    dtype: str | None = None,
    tokenizer_sha256: str | None = None,
) -> OpenedFiles:
    """Open ``paths`` (found in ``directory``) with the recorded dtype and sizes.

    Args:
        paths: the token files.
        directory: where they were found; meta.json is looked up there and
            in its parent.
        dtype: the dtype of raw files when there is no meta.json; when
            there is one, it must agree.
        tokenizer_sha256: the tokenizer in use; a dataset built by another
            one is refused.
    """
    meta = dataset_meta(directory, tokenizer_sha256)
    recorded: dict[Path, int] = {}
    dtype_name = dtype
    if meta is not None:
        if dtype is not None and dtype != meta.token_dtype:
            raise DatasetFileError(
                f"{Path(meta.path) / META_NAME} records {meta.token_dtype} tokens, not {dtype}",
                hint="drop dtype=; the recorded dtype is used",
            )
        dtype_name = meta.token_dtype
        root = Path(meta.path)
        recorded = {(root / f.path).resolve(): f.token_count for f in meta.files if f.role == "tokens"}
    np_dtype: np.dtype[Any] | None = None
    if dtype_name is not None:
        np_dtype = token_dtype(dtype_name, where="dtype")
    files = []
    for path in paths:
        expected = recorded.get(path.resolve()) if meta is not None else None
        if meta is not None and expected is None and path.suffix != ".npy":
            raise DatasetFileError(
                f"{path} is not listed in {Path(meta.path) / META_NAME}",
                hint="remove stray files from the dataset directory or rebuild it",
            )
        files.append(TokenFile(path, None if path.suffix == ".npy" else np_dtype, expected_count=expected))
    return OpenedFiles(files=tuple(files), meta=meta, dtype_name=dtype_name)


def glob_token_files(directory: str | os.PathLike[str], pattern: str) -> list[Path]:
    """Sorted token files matching ``pattern`` (document-index sidecars excluded).

    A match that is not a regular file (a FIFO, a device, a folder) is
    refused by its kind rather than skipped, so a reader never trains on
    the shards around it as if they were all.
    """
    from dlmstore.datasets.formats import is_doc_index

    root = Path(directory)
    if not root.is_dir():
        raise DatasetFileError(
            f"{root} is not a directory",
            hint="point the reader at a split directory such as <dataset>/train",
        )
    found = sorted(p for p in root.glob(pattern) if not is_doc_index(p))
    for path in found:
        try:
            mode = path.stat().st_mode
        except OSError as exc:  # a dangling symlink, no permission
            raise DatasetFileError(
                f"cannot read {path}: {exc.strerror}", hint=f"run `dlm data validate {root.parent}`"
            ) from None
        if not stat.S_ISREG(mode):  # skipping it would train on the other shards only
            raise DatasetFileError(
                f"{path} is {file_kind(mode)}, not a regular file",
                hint=f"a token file is a regular file; run `dlm data validate {root.parent}` or rebuild the dataset",
            )
    if not found:
        raise DatasetFileError(
            f"no file in {root} matches {pattern!r}",
            hint="pretrain shards are <dataset>/train/shard_*.bin; run `dlm data validate <dataset>`",
        )
    return found

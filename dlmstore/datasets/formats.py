"""On-disk formats of token datasets: dtypes, file names, memory-mapped token files.

Token files are flat little-endian arrays with no header (``.bin``), or
``.npy`` files whose header carries the dtype. A ``.bin`` file's dtype is
*recorded* (in ``meta.json`` and the store database) and never inferred
from its size: a uint16 file of an even number of tokens is also a valid
uint32 file, and guessing wrong silently yields garbage ids.

The dtype is uint16 when every id fits (vocabulary of at most 65 536
entries), else uint32. uint16 halves the disk footprint and the page-cache
working set; Llama-3-class vocabularies (~128k) need uint32.

:class:`TokenFile` maps a file read-only with :mod:`mmap` instead of
``np.memmap`` for one reason: resident memory. Pages of a file mapping that
a process has touched count towards its RSS until they are unmapped, so
iterating a 10 GiB dataset through ``np.memmap`` ends with a 10 GiB RSS
(the pages are reclaimable, but schedulers and OOM killers look at RSS).
Keeping the ``mmap`` object lets a reader call ``madvise(MADV_DONTNEED)``
after it has read a configurable number of bytes (:class:`ResidencyBudget`):
the pages drop out of this process, stay in the page cache, and the next
touch is a cheap minor fault. Mappings are opened lazily and dropped when
pickled, so a dataset can be sent to DataLoader worker processes.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from dlmstore.errors import DatasetError, DatasetFileError

#: Token dtypes a dataset may record, as little-endian numpy dtypes.
TOKEN_DTYPES: dict[str, np.dtype[Any]] = {
    "uint16": np.dtype("<u2"),
    "uint32": np.dtype("<u4"),
}
#: Dtypes accepted in ``.npy`` token files (their header says which).
NPY_TOKEN_DTYPES = ("uint16", "uint32", "int32", "int64")

OFFSET_DTYPE = np.dtype("<i8")
MASK_DTYPE = np.dtype("u1")

SPLITS = ("train", "val")
MIB = 1 << 20
#: Readers release mapped pages after reading this much: small next to the
#: resident size of a process that has imported torch, large enough that the
#: madvise calls are rare (``bench/bench_datasets.py --only rss`` prints the
#: resulting peak RSS).
RELEASE_BYTES = 64 * MIB


def shard_name(index: int) -> str:
    """``shard_00003.bin``: the token file of shard ``index`` of a pretrain split."""
    return f"shard_{index:05d}.bin"


def doc_index_name(index: int) -> str:
    """``shard_00003.docs.npy``: the document-start index beside shard ``index``."""
    return f"shard_{index:05d}.docs.npy"


def doc_index_for(token_file: Path) -> Path:
    """The document index that belongs to a token file (it may not exist)."""
    stem = token_file.name.removesuffix(".bin").removesuffix(".npy")
    return token_file.with_name(f"{stem}.docs.npy")


def is_doc_index(path: Path) -> bool:
    """True for a document-index sidecar, which a token-file glob must skip."""
    return path.name.endswith(".docs.npy")


def sft_names(split: str) -> dict[str, str]:
    """The three files of one SFT split, by role."""
    return {
        "tokens": f"{split}_tokens.bin",
        "offsets": f"{split}_idx.npy",
        "loss_mask": f"{split}_mask.bin",
    }


def choose_token_dtype(vocab_size: int) -> str:
    """uint16 when every id of a ``vocab_size`` vocabulary fits, else uint32."""
    if vocab_size <= 0:
        raise DatasetError(f"vocabulary size must be positive, not {vocab_size}")
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def token_dtype(name: str, *, where: object = "meta.json") -> np.dtype[Any]:
    """The numpy dtype for a recorded dtype name; an unknown name is an error."""
    try:
        return TOKEN_DTYPES[name]
    except KeyError:
        raise DatasetFileError(
            f"{where}: unknown token dtype {name!r}",
            hint="token files are uint16 or uint32; rebuild the dataset with `dlm data build`",
        ) from None


def check_dtype_fits(name: str, vocab_size: int, *, where: object = "meta.json") -> None:
    """Raise when ids of a ``vocab_size`` vocabulary do not fit dtype ``name``."""
    limit = int(np.iinfo(token_dtype(name, where=where)).max) + 1
    if vocab_size > limit:
        raise DatasetFileError(
            f"{where}: a vocabulary of {vocab_size} tokens does not fit {name} (ids up to {limit - 1})",
            hint="rebuild with token dtype uint32 (the default picks it for vocabularies over 65536)",
        )


def read_npy_header(path: Path) -> tuple[np.dtype[Any], tuple[int, ...], int]:
    """``(dtype, shape, data offset)`` of a ``.npy`` file, read from its header only."""
    try:
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
            offset = handle.tell()
    except FileNotFoundError:
        raise DatasetFileError(f"{path} does not exist") from None
    except (ValueError, OSError) as exc:
        raise DatasetFileError(
            f"{path} is not a readable .npy file: {exc}",
            hint="rebuild the dataset; .npy token files must be written by numpy.save",
        ) from None
    if fortran and len(shape) > 1:
        raise DatasetFileError(f"{path} holds a Fortran-ordered array; token files are flat")
    return dtype, tuple(shape), offset


class ResidencyBudget:
    """Counts bytes read through a set of mappings and releases them past a limit.

    ``limit_bytes=None`` never releases (plain mmap behaviour).
    """

    def __init__(self, limit_bytes: int | None = RELEASE_BYTES) -> None:
        self.limit_bytes = limit_bytes
        self.read_since_release = 0
        self.files: list[TokenFile] = []

    def note(self, nbytes: int) -> None:
        """Record ``nbytes`` read; release every mapping when over the limit."""
        if self.limit_bytes is None:
            return
        self.read_since_release += nbytes
        if self.read_since_release >= self.limit_bytes:
            for token_file in self.files:
                token_file.release()
            self.read_since_release = 0


class TokenFile:
    """A flat array of tokens (or offsets, or mask bytes) in one file, memory-mapped.

    Args:
        path: a ``.npy`` file (dtype from its header) or a raw file.
        dtype: the dtype of a raw file, as recorded; ignored for ``.npy``
            except that a mismatch with the header is an error.
        expected_count: the element count recorded in meta.json, checked
            against the file size (a truncated or padded file is an error).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        dtype: np.dtype[Any] | None = None,
        *,
        expected_count: int | None = None,
    ) -> None:
        self.path = Path(path)
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            raise DatasetFileError(
                f"{self.path} does not exist",
                hint="rebuild the dataset, or point the reader at the directory that holds it",
            ) from None
        if self.path.suffix == ".npy":
            header_dtype, shape, offset = read_npy_header(self.path)
            if len(shape) != 1:
                raise DatasetFileError(f"{self.path} holds an array of shape {shape}; token files are 1-D")
            if dtype is not None and np.dtype(dtype) != header_dtype:
                raise DatasetFileError(f"{self.path} holds {header_dtype} but {np.dtype(dtype)} was expected")
            self.dtype: np.dtype[Any] = header_dtype
            self.offset = offset
            self.count = int(shape[0])
            if size - offset != self.count * self.dtype.itemsize:
                raise DatasetFileError(
                    f"{self.path} is truncated: its header promises {self.count} items "
                    f"but the file has {size - offset} data bytes",
                    hint="rebuild the dataset; the file was cut short while being copied or written",
                )
        else:
            if dtype is None:
                raise DatasetFileError(
                    f"{self.path}: the dtype of a raw token file must be given, not guessed from its size",
                    hint="keep the dataset's meta.json beside it, or pass dtype='uint16' / 'uint32'",
                )
            self.dtype = np.dtype(dtype)
            self.offset = 0
            itemsize = self.dtype.itemsize
            if size % itemsize:
                raise DatasetFileError(
                    f"{self.path} has {size} bytes, not a multiple of {itemsize} ({self.dtype.name}): "
                    "the file is cut mid-token",
                    hint="rebuild the dataset; a raw token file holds whole tokens only",
                )
            self.count = size // itemsize
        if expected_count is not None and expected_count != self.count:
            raise DatasetFileError(
                f"{self.path} holds {self.count} items but meta.json records {expected_count}"
                + (" (truncated)" if self.count < expected_count else ""),
                hint="rebuild the dataset; the file does not belong to this meta.json or was cut short",
            )
        self._mmap: mmap.mmap | None = None
        self._array: np.ndarray[Any, Any] | None = None

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize

    @property
    def array(self) -> np.ndarray[Any, Any]:
        """The read-only 1-D array (mapped on first use)."""
        if self._array is None:
            if self.count == 0:
                self._array = np.empty(0, dtype=self.dtype)
            else:
                with open(self.path, "rb") as handle:
                    self._mmap = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
                self._array = np.frombuffer(
                    self._mmap, dtype=self.dtype, count=self.count, offset=self.offset
                )
        return self._array

    def release(self) -> None:
        """Drop this file's pages from the process (they stay in the page cache)."""
        if self._mmap is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._mmap.madvise(mmap.MADV_DONTNEED)

    def __len__(self) -> int:
        return self.count

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_mmap"] = None
        state["_array"] = None
        return state

    def __repr__(self) -> str:
        return f"TokenFile({str(self.path)!r}, {self.dtype.name}, count={self.count})"

"""``meta.json``: what a built dataset is, recorded once, beside its files.

Every dataset directory has one ``meta.json`` written *last* by its
builder (and deleted first when a build starts), so its presence means the
files it lists are complete. It records everything a reader would
otherwise have to guess: the token dtype, the tokenizer's identity and
vocabulary size, the special-token ids, the split rule and seed, totals,
and one entry per file with its size and sha256. The store database's
``datasets`` / ``dataset_files`` rows are made from it (:mod:`.registry`),
so the two cannot disagree.

The file is deterministic: keys sorted, no timestamps, no absolute paths,
so two builds of the same input with the same seed are byte-identical
down to ``meta.json``. (The database row carries ``registered_at``.)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmstore.datasets.formats import check_dtype_fits, token_dtype
from dlmstore.document.frontmatter import short_repr
from dlmstore.errors import DatasetError, DatasetFileError
from dlmstore.store.atomic import write_bytes_atomic
from dlmstore.store.digests import file_sha256
from dlmstore.store.regular_files import load_json, read_regular

META_NAME = "meta.json"
FORMAT = "dlm-token-dataset/1"

#: Fields every meta.json has, whatever its kind.
REQUIRED = (
    "format",
    "kind",
    "built",
    "dataset_name",
    "dataset_config",
    "split_rule",
    "seed",
    "token_dtype",
    "byte_order",
    "tokenizer_name",
    "tokenizer_sha256",
    "vocab_size",
    "special_token_ids",
    "totals",
    "files",
    "streaming",
)
#: Fields code reads, with the JSON types they must have: ``(key, types, words)``.
_FIELD_TYPES: tuple[tuple[str, tuple[type, ...], str], ...] = (
    ("format", (str,), "a string"),
    ("kind", (str,), "a string"),
    ("built", (bool,), "true or false"),
    ("dataset_name", (str,), "a string"),
    ("token_dtype", (str, type(None)), "a string or null"),
    ("tokenizer_sha256", (str,), "a string"),
    ("vocab_size", (int,), "a whole number"),
    ("seed", (int, type(None)), "a whole number or null"),
    ("files", (list,), "a list"),
)

#: The largest meta.json read (one entry per file: about 300 bytes each).
MAX_META_BYTES = 256 << 20

_REBUILD = "rebuild the dataset; meta.json is written by the builder, never by hand"

REQUIRED_BY_KIND = {
    "pretrain": ("shard_bytes", "shard_tokens", "eos_token_id", "budgets"),
    "sft": ("val_frac", "eot_id", "chat_format"),
}


@dataclass(frozen=True)
class FileEntry:
    """One file of a dataset, as meta.json lists it and ``dataset_files`` stores it."""

    split: str
    role: str
    path: str
    shard_index: int
    token_offset: int
    token_count: int
    doc_count: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class DatasetMeta:
    """The fields of a meta.json that code reads, plus the whole document."""

    path: str
    kind: str
    name: str
    built: bool
    token_dtype: str
    vocab_size: int
    tokenizer_sha256: str
    seed: int | None
    files: tuple[FileEntry, ...]
    raw: dict[str, Any]

    def files_of(self, split: str, role: str) -> list[FileEntry]:
        """The files of one split and role, in shard order."""
        return sorted(
            (f for f in self.files if f.split == split and f.role == role),
            key=lambda f: f.shard_index,
        )


#: ``sha256:<hex>`` of a file: :func:`dlmstore.store.digests.file_sha256` under the name
#: ``dlmstore.datasets`` exports (public API; the library itself calls ``file_sha256``).
sha256_file = file_sha256


def meta_bytes(meta: dict[str, Any]) -> bytes:
    """The canonical serialisation: sorted keys, two-space indent, trailing newline."""
    return (json.dumps(meta, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def write_meta(directory: str | os.PathLike[str], meta: dict[str, Any]) -> Path:
    """Write ``directory/meta.json`` atomically; returns its path."""
    path = Path(directory) / META_NAME
    write_bytes_atomic(path, meta_bytes(meta))
    return path


def read_meta(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed meta.json of a dataset directory.

    Raises:
        DatasetFileError: the file is missing, not JSON, or lacks a field.
    """
    path = Path(directory) / META_NAME
    try:
        data = load_json(read_regular(path, limit=MAX_META_BYTES))
    except FileNotFoundError:
        raise DatasetFileError(
            f"{path} is missing: {directory} is not a built dataset (or its build did not finish)",
            hint="build it with `dlm data build pretrain|sft`, or point at the directory that holds meta.json",
        ) from None
    except OSError as exc:  # a FIFO or device (read non-blocking: never a hang), no permission, too large
        raise DatasetFileError(f"cannot read {path}: {exc.strerror}", hint=_REBUILD) from None
    except ValueError as exc:  # not UTF-8, not JSON, too deep, an integer of more than 4300 digits
        raise DatasetFileError(f"{path} is not valid JSON: {exc}", hint=_REBUILD) from None
    return _checked(data, path)


def _checked(data: Any, path: str | os.PathLike[str]) -> dict[str, Any]:
    """``data`` (meta.json at ``path``, parsed) when it has every field with its type; else the error."""
    if not isinstance(data, dict):
        raise DatasetFileError(f"{path} must hold a JSON object")
    missing = [key for key in REQUIRED if key not in data]
    if not missing and data.get("built") and isinstance(data["kind"], str):
        missing = [key for key in REQUIRED_BY_KIND.get(data["kind"], ()) if key not in data]
    if missing:
        raise DatasetFileError(
            f"{path} lacks {', '.join(missing)}",
            hint="rebuild the dataset with this version of dlm (`dlm data build ...`)",
        )
    for key, kinds, noun in _FIELD_TYPES:
        value = data[key]
        if isinstance(value, bool) is not (kinds == (bool,)) or not isinstance(value, kinds):
            raise DatasetFileError(
                f"{path}: field {key!r} must be {noun}, not {short_repr(value)}", hint=_REBUILD
            )
    if data["format"] != FORMAT:
        raise DatasetFileError(
            f"{path} has format {short_repr(data['format'])}; this dlmstore reads {FORMAT!r}",
            hint="rebuild the dataset with this version of dlm",
        )
    return data


def load_meta(directory: str | os.PathLike[str]) -> DatasetMeta:
    """Read and check a dataset's meta.json (dtype known, vocabulary fits it)."""
    return _loaded(read_meta(directory), Path(directory) / META_NAME, str(Path(directory).resolve()))


def meta_from_bytes(data: bytes, url: str) -> DatasetMeta:
    """Check the meta.json of the dataset at ``url`` (a bucket's) from its bytes, as :func:`load_meta` does.

    Raises:
        DatasetFileError: not JSON, a field missing or of another type, an unknown kind or dtype.
    """
    where = f"{url.rstrip('/')}/{META_NAME}"
    try:
        parsed = load_json(data)
    except ValueError as exc:
        raise DatasetFileError(f"{where} is not valid JSON: {exc}", hint=_REBUILD) from None
    return _loaded(_checked(parsed, where), where, url)


def _loaded(raw: dict[str, Any], where: str | os.PathLike[str], path: str) -> DatasetMeta:
    """The :class:`DatasetMeta` of a checked meta.json ``raw`` (found at ``where``) of the dataset at ``path``."""
    if raw["kind"] not in REQUIRED_BY_KIND:
        raise DatasetFileError(f"{where}: unknown dataset kind {short_repr(raw['kind'])} (pretrain or sft)")
    if raw["built"]:
        token_dtype(raw["token_dtype"], where=where)
        check_dtype_fits(raw["token_dtype"], int(raw["vocab_size"]), where=where)
    try:
        files = tuple(FileEntry(**entry) for entry in raw["files"])
    except TypeError as exc:
        raise DatasetFileError(f"{where}: a files entry is malformed: {exc}") from None
    return DatasetMeta(
        path=path,
        kind=raw["kind"],
        name=raw["dataset_name"],
        built=bool(raw["built"]),
        token_dtype=raw["token_dtype"],
        vocab_size=int(raw["vocab_size"]),
        tokenizer_sha256=raw["tokenizer_sha256"],
        seed=raw["seed"],
        files=files,
        raw=raw,
    )


def check_tokenizer(meta: DatasetMeta, expected_sha256: str | None) -> None:
    """Raise when the dataset was built by another tokenizer than the one in use."""
    if expected_sha256 is None or expected_sha256 == meta.tokenizer_sha256:
        return
    raise DatasetError(
        f"{Path(meta.path) / META_NAME}: built with tokenizer {meta.tokenizer_sha256} "
        f"({meta.raw.get('tokenizer_name')}), but the tokenizer in use is {expected_sha256}",
        hint="rebuild the dataset with the tokenizer you train with (token ids differ between tokenizers)",
    )


def find_meta_dir(path: str | os.PathLike[str]) -> Path | None:
    """The directory holding the meta.json for ``path``: itself or its parent (a split dir)."""
    here = Path(path)
    for candidate in (here, here.parent):
        if (candidate / META_NAME).is_file():
            return candidate
    return None

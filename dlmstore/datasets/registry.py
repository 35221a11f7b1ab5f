"""Registering built datasets in a store database, so ``sqlite3`` can answer questions.

Registration is separate from building: workers write files (and the
builder writes ``meta.json``) without touching the database, then one
call records the dataset. It is idempotent: the dataset is keyed by its
absolute directory (or, for one in object storage, its ``s3://bucket/prefix``
URL, registered from the local copy it was uploaded from), and re-registering deletes its old rows (the files
cascade) and inserts the new ones in one ``BEGIN IMMEDIATE`` transaction,
so a reader of the database sees the old registration or the new one,
never a mix. Rows are made from ``meta.json`` alone, after checking that
every file it lists exists with the recorded size; hashing every byte is
the validator's job (:func:`dlmstore.datasets.validate.check_dataset`).

A cache directory built by ``dlm data build-all`` is its own store
(``<cache-dir>/store.db``), e.g.::

    sqlite3 cache/store.db "select name, split, token_files, tokens from dataset_split_totals"
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from dlmstore.clock import utc_now
from dlmstore.datasets.meta import META_NAME, load_meta, meta_bytes
from dlmstore.errors import DatasetError, DatasetFileError

if TYPE_CHECKING:
    from dlmstore.store.database import Store


@dataclass(frozen=True)
class RegisteredDataset:
    """A dataset as recorded in a store database.

    Attributes:
        dataset_id: Its row id in the ``datasets`` table.
        name: The dataset's name.
        kind: ``pretrain`` or ``sft``.
        path: The dataset folder, or its s3://bucket/prefix URL for one in object storage.
        db_path: The store.db it is registered in.
        files: Files registered.
        tokens: Tokens per split.
    """

    dataset_id: int
    name: str
    kind: str
    path: str
    db_path: str
    files: int
    tokens: dict[str, int]


def register_dataset(
    store: Store,
    dataset_dir: str | os.PathLike[str],
    *,
    location: str | None = None,
    sizes: Mapping[str, int] | None = None,
) -> RegisteredDataset:
    """Record (or re-record) the dataset in ``dataset_dir`` in ``store``'s database.

    ``location``: where the dataset lives when that is not ``dataset_dir``
    (the ``s3://`` URL a local copy was uploaded to); it is the path recorded.
    ``sizes``: the files' sizes at ``location``, by name, when ``dataset_dir``
    holds only ``meta.json`` (a Ray build's tasks uploaded the files); they
    are checked instead of the local files'.

    Raises:
        DatasetError: the directory is a stub that was never built.
        DatasetFileError: meta.json is missing or malformed, or a file it
            lists is missing or has another size.
    """
    directory = Path(dataset_dir).resolve()
    meta = load_meta(directory)
    if not meta.built:
        raise DatasetError(
            f"{directory / META_NAME} marks {meta.name} as not built; there is nothing to register",
            hint="build it first (see `dlm data build-all --help`)",
        )
    for entry in meta.files:
        path = directory / entry.path
        try:
            size = path.stat().st_size if sizes is None else sizes[entry.path]
        except (FileNotFoundError, KeyError):
            raise DatasetFileError(
                f"{path} is listed in {META_NAME} but missing",
                hint="rebuild the dataset; its files must stay together with meta.json",
            ) from None
        if size != entry.bytes:
            raise DatasetFileError(
                f"{path} has {size} bytes but {META_NAME} records {entry.bytes}",
                hint="rebuild the dataset; the file was cut short or replaced",
            )
    recorded = location or str(directory)
    with store.write() as conn:
        conn.execute("DELETE FROM datasets WHERE path = ?", (recorded,))
        cursor = conn.execute(
            "INSERT INTO datasets (name, kind, path, tokenizer_sha256, token_dtype, vocab_size, seed, "
            "meta_json, registered_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                meta.name,
                meta.kind,
                recorded,
                meta.tokenizer_sha256,
                meta.token_dtype,
                meta.vocab_size,
                meta.seed,
                meta_bytes(meta.raw).decode("utf-8"),
                utc_now(),
            ),
        )
        # sqlite always reports the AUTOINCREMENT id of a single-row insert
        dataset_id = cast(int, cursor.lastrowid)
        conn.executemany(
            "INSERT INTO dataset_files (dataset_id, split, role, path, shard_index, token_offset, "
            "token_count, doc_count, bytes, sha256) "
            "VALUES (:dataset_id, :split, :role, :path, :shard_index, :token_offset, "
            ":token_count, :doc_count, :bytes, :sha256)",
            [{"dataset_id": dataset_id, **dataclasses.asdict(entry)} for entry in meta.files],
        )
    tokens: dict[str, int] = {}
    for entry in meta.files:
        if entry.role == "tokens":
            tokens[entry.split] = tokens.get(entry.split, 0) + entry.token_count
    return RegisteredDataset(
        dataset_id=dataset_id,
        name=meta.name,
        kind=meta.kind,
        path=recorded,
        db_path=str(store.db_path),
        files=len(meta.files),
        tokens=tokens,
    )


def register_in(
    store_dir: str | os.PathLike[str],
    dataset_dir: str | os.PathLike[str],
    *,
    location: str | None = None,
    sizes: Mapping[str, int] | None = None,
) -> RegisteredDataset:
    """Open (creating and migrating) the store at ``store_dir`` and register the dataset there."""
    from dlmstore.store.database import open_store_at

    with open_store_at(Path(store_dir)) as store:
        return register_dataset(store, dataset_dir, location=location, sizes=sizes)


def registered_meta(store: Store, dataset_dir: str | os.PathLike[str]) -> dict[str, object] | None:
    """The meta.json a store recorded for ``dataset_dir``; ``None`` when it is not registered."""
    from dlmstore.store.connection import first_value

    with store.read() as conn:
        value = first_value(
            conn, "SELECT meta_json FROM datasets WHERE path = ?", (str(Path(dataset_dir).resolve()),)
        )
    return None if value is None else dict(json.loads(value))

"""``dlm data show``: what a dataset directory (or a whole cache directory) holds.

Read-only and cheap: it reads ``meta.json`` files and nothing else, so it
answers instantly for datasets of any size (``dlm data validate`` is the
one that reads the bytes). A dataset in a bucket (``s3://bucket/prefix``)
is shown from its meta.json, fetched alone: no shard is downloaded. Given a dataset directory it describes that
dataset; given a cache directory built by ``dlm data build-all`` it
describes every dataset below it (``pretrain/*`` and ``sft/*``), stubs
included.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlmstore.datasets.formats import SPLITS
from dlmstore.datasets.meta import META_NAME, DatasetMeta, load_meta
from dlmstore.errors import DatasetError
from dlmstore.objstore.uri import is_object_uri


@dataclass(frozen=True)
class SplitSummary:
    """One split: tokens, documents (pretrain) or examples (SFT), files and bytes.

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
class DatasetSummary:
    """One dataset as ``dlm data show --json`` describes it (a documented contract).

    Attributes:
        path: The dataset folder.
        name: Its name.
        kind: ``pretrain`` or ``sft``.
        built: False for a stub a build left unbuilt (its source absent).
        token_dtype: ``uint16`` or ``uint32``; null when not built.
        vocab_size: Vocabulary size of its tokenizer; null when not built.
        tokenizer_sha256: Fingerprint of that tokenizer; null when not built.
        tokenizer_name: The base model whose tokenizer built it; null when not built.
        seed: Seed of its splits and shuffles; null when not built.
        streaming: Whether it was read from the hub with streaming (determinism then follows the
            upstream stream).
        split_rule: How documents or examples were split between train and val, in words.
        special_token_ids: Special token ids used (``bos``, ``eos``, ...; SFT adds the turn
            openers).
        splits: Each split's totals, by split name.
        source: Where the data came from: hub id, config and split, or the local path.
        skipped: Documents or examples left out, by reason.
    """

    path: str
    name: str
    kind: str
    built: bool
    token_dtype: str | None
    vocab_size: int | None
    tokenizer_sha256: str | None
    tokenizer_name: str | None
    seed: int | None
    streaming: bool
    split_rule: str | None
    special_token_ids: dict[str, Any]
    splits: dict[str, SplitSummary]
    source: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DataShow:
    """The JSON shape of ``dlm data show``: the path asked about and its datasets.

    Attributes:
        path: The folder asked about.
        datasets: The dataset there, or every dataset of a build-all cache.
    """

    path: str
    datasets: list[DatasetSummary]


def show_datasets(path: str | os.PathLike[str]) -> DataShow:
    """Summaries of the dataset in ``path``, or of every dataset of the cache in ``path``.

    ``path`` may be ``s3://bucket/prefix``: the one dataset there, from its meta.json.

    Raises:
        DatasetError: ``path`` holds neither a meta.json nor datasets below it.
        ObjectStoreError: the meta.json of an ``s3://`` dataset cannot be fetched.
    """
    if isinstance(path, str) and is_object_uri(path):
        return DataShow(path, [summarize_remote(path)])
    root = Path(path).resolve()
    if (root / META_NAME).is_file():
        return DataShow(str(root), [summarize_dataset(root)])
    found = sorted(p.parent for p in root.glob(f"*/*/{META_NAME}"))
    if not found:
        raise DatasetError(
            f"{root} holds no dataset: no {META_NAME} in it or in <kind>/<name>/ below it",
            hint="build one with `dlm data build-all --cache-dir DIR` or `dlm data build pretrain|sft`",
        )
    return DataShow(str(root), [summarize_dataset(p) for p in found])


def summarize_remote(url: str) -> DatasetSummary:
    """The summary of the dataset at ``url`` (``s3://bucket/prefix``), from its meta.json alone.

    Only meta.json is fetched: no shard is downloaded (``dlm data validate``
    downloads the dataset through the node cache and checks every byte).

    Raises:
        ObjectStoreError: meta.json cannot be fetched (no dataset there, refused, unreachable).
        DatasetFileError: it is not a dlm dataset's meta.json.
    """
    from dlmstore.datasets.meta import meta_from_bytes
    from dlmstore.objstore.node_cache import fetch_meta
    from dlmstore.objstore.uri import ObjectURI

    uri = ObjectURI.parse(url)
    return _summary(meta_from_bytes(fetch_meta(uri), str(uri)))


def summarize_dataset(directory: Path) -> DatasetSummary:
    """One dataset's summary, from its meta.json."""
    return _summary(load_meta(directory))


def _summary(meta: DatasetMeta) -> DatasetSummary:
    raw = meta.raw
    totals = raw.get("totals") or {}
    splits = {}
    for split in SPLITS:
        mine = [f for f in meta.files if f.split == split]
        tokens = [f for f in mine if f.role == "tokens"]
        splits[split] = SplitSummary(
            tokens=sum(f.token_count for f in tokens),
            docs=sum(f.doc_count for f in tokens),
            files=len(mine),
            bytes=sum(f.bytes for f in mine),
        )
    return DatasetSummary(
        path=meta.path,
        name=meta.name,
        kind=meta.kind,
        built=meta.built,
        token_dtype=meta.token_dtype if meta.built else None,
        vocab_size=meta.vocab_size if meta.built else None,
        tokenizer_sha256=meta.tokenizer_sha256 if meta.built else None,
        tokenizer_name=raw.get("tokenizer_name"),
        seed=meta.seed,
        streaming=bool(raw.get("streaming")),
        split_rule=raw.get("split_rule"),
        special_token_ids=dict(raw.get("special_token_ids") or {}),
        splits=splits,
        source=dict(raw.get("source") or {}),
        skipped={k: v for k, v in totals.items() if k.startswith(("skipped", "over_budget"))},
    )

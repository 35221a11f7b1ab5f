"""Token datasets: pretrain shards, SFT example caches, memory-mapped readers.

Writers turn a stream of texts or conversations into flat token files
plus a ``meta.json`` (:mod:`.pretrain`, :mod:`.sft`), registration records
them in a store database (:mod:`.registry`), :mod:`.validate` checks them,
and the readers serve them to training without loading them into memory
(:mod:`.mmap_dataset`, :mod:`.pretrain_dataset`, :mod:`.sft_dataset`, with
:mod:`.sampler`, :mod:`.loader` and :mod:`.mixture`). ``dlm data``
(:mod:`dlmstore.cli.data`) is the command line over the same functions.
Builders run in this process or, with ``engine=RayEngine(...)``
(:mod:`.engines`), on Ray (:mod:`.ray_build`, :mod:`.blocks`); the split
and budget rules both follow are in :mod:`.routing`.

Importing this package is cheap: the names below are loaded from their
modules on first use, so ``import dlmstore.datasets`` does not import
torch until a reader is asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_pretrain_cache": "pretrain",
    "build_sft_cache": "sft",
    "BuildResult": "build",
    "ChatFormat": "chat",
    "Message": "chat",
    "chat_format_for": "chat",
    "read_meta": "meta",
    "write_meta": "meta",
    "load_meta": "meta",
    "sha256_file": "meta",
    "register_dataset": "registry",
    "register_in": "registry",
    "check_dataset": "validate",
    "MemoryMappedDataset": "mmap_dataset",
    "PretrainTokenStreamDataset": "pretrain_dataset",
    "SFTExampleDataset": "sft_dataset",
    "RankPartitionSampler": "sampler",
    "ResumableLoader": "loader",
    "MixtureDataset": "mixture",
    "DatasetError": "dlmstore.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dlmstore.datasets' has no attribute {name!r}")
    path = module if module.startswith("dlmstore.") else f"dlmstore.datasets.{module}"
    return getattr(importlib.import_module(path), name)

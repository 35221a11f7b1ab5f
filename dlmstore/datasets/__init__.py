"""Token datasets: pretrain shards, SFT example caches, memory-mapped readers.

Two folders over a shared bottom. At the bottom, the file formats
(:mod:`.formats`) and ``meta.json`` (:mod:`.meta`); beside them,
:mod:`.validate` checks a dataset, :mod:`.show` summarizes one and
:mod:`.registry` records them in a store database.

:mod:`.build` writes: the builders turn a stream of texts or conversations
into flat token files plus a ``meta.json`` (:mod:`.build.pretrain`,
:mod:`.build.sft`). They receive the engine they run on
(:mod:`.build.engines`): ``None`` for this process, or
``RayEngine(...)`` for Ray (:mod:`.build.ray_build`, :mod:`.build.blocks`),
which imports them and not the other way round. The split and budget
rules both engines follow are in :mod:`.build.routing`;
:mod:`.build.recipes` composes sources, builders and engines for
``dlm data build``.

:mod:`.read` serves the datasets to training without loading them into
memory (:mod:`.read.mmap_dataset`, :mod:`.read.pretrain_dataset`,
:mod:`.read.sft_dataset`, with :mod:`.read.sampler`, :mod:`.read.loader`
and :mod:`.read.mixture`); it never imports :mod:`.build`. ``dlm data``
(:mod:`dlmstore.cli.data`) is the command line over the same functions.

Importing this package is cheap: the names below are loaded from their
modules on first use, so ``import dlmstore.datasets`` does not import
torch until a reader is asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_pretrain_cache": "build.pretrain",
    "build_sft_cache": "build.sft",
    "BuildResult": "build.output",
    "ChatFormat": "build.chat",
    "Message": "build.chat",
    "chat_format_for": "build.chat",
    "read_meta": "meta",
    "write_meta": "meta",
    "load_meta": "meta",
    "sha256_file": "meta",
    "register_dataset": "registry",
    "register_in": "registry",
    "check_dataset": "validate",
    "MemoryMappedDataset": "read.mmap_dataset",
    "PretrainTokenStreamDataset": "read.pretrain_dataset",
    "SFTExampleDataset": "read.sft_dataset",
    "RankPartitionSampler": "read.sampler",
    "ResumableLoader": "read.loader",
    "MixtureDataset": "read.mixture",
    "DatasetError": "dlmstore.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dlmstore.datasets' has no attribute {name!r}")
    path = module if module.startswith("dlmstore.") else f"dlmstore.datasets.{module}"
    return getattr(importlib.import_module(path), name)

"""Which engine builds a dataset: this process, or a Ray cluster.

``dlm data build ... --engine local|ray`` picks one. This module only
describes the choice; it never imports Ray (:mod:`.ray_build` does, when a
build runs on it), so ``dlm --help`` and local builds stay free of it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

ENGINES = ("local", "ray")
DEFAULT_BLOCK_DOCS = 1024


@dataclass(frozen=True)
class RayEngine:
    """Build on Ray.

    Args:
        address: the cluster (``host:port`` of its head, ``ray://...`` or
            ``auto``); ``None``: the ``RAY_ADDRESS`` environment variable,
            else a local Ray started for the build and stopped after.
        workers: the CPUs of the local Ray started for the build, so
            at most that many tasks run at once; on a Ray already
            running (a cluster), the build keeps ``2 * workers`` tasks in
            flight and Ray runs as many as it has CPUs for (default: the
            CPUs of the cluster).
        block_docs: documents per tokenizing task; the output does not
            depend on it.
    """

    address: str | None = None
    workers: int | None = None
    block_docs: int = DEFAULT_BLOCK_DOCS

    def resolved_address(self) -> str | None:
        return self.address or os.environ.get("RAY_ADDRESS") or None


def engine_for(
    engine: str, *, ray_address: str | None = None, workers: int | None = None
) -> RayEngine | None:
    """The engine object for a ``--engine`` value (``None`` for local).

    Raises:
        DatasetError: ``ray`` without Ray installed (checked here, before
            anything is loaded or written).
    """
    if engine == "local":
        return None
    from dlmstore.datasets.build.ray_build import import_ray

    import_ray()
    return RayEngine(address=ray_address, workers=workers)


def engine_session(engine: RayEngine | None) -> contextlib.AbstractContextManager[Any]:
    """Ray connected for the builds inside (they reuse it); nothing for the local engine.

    A build connects before it touches its output directory, so an
    unreachable cluster leaves an existing dataset as it was.
    """
    if engine is None:
        return contextlib.nullcontext()
    from dlmstore.datasets.build.ray_build import ray_session

    return ray_session(engine)

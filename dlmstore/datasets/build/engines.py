"""Which engine builds a dataset: this process, or a Ray cluster.

``dlm data build ... --engine local|ray`` picks one
(:func:`~.recipes.engine_for`). The builders (:mod:`.pretrain`,
:mod:`.sft`) receive an :class:`Engine`, ``None`` meaning this process,
and call it; they never import one. The Ray engine
(:class:`~.ray_build.RayEngine`) lives with the code that runs it. This
module is the seam only: it imports no builder and no engine, and never
Ray, so ``dlm --help`` and local builds stay free of it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dlmstore.datasets.build.chat import ChatEncoding
    from dlmstore.datasets.build.encoding import TextEncoder
    from dlmstore.datasets.build.local import LocatedInput
    from dlmstore.datasets.build.output import Clock, DriverBytes
    from dlmstore.datasets.build.routing import PretrainRouter
    from dlmstore.datasets.meta import FileEntry

ENGINES = ("local", "ray")
DEFAULT_BLOCK_DOCS = 1024


class Engine(Protocol):
    """Somewhere other than this process that builds a dataset's files.

    A builder resolves and checks its settings, enters :meth:`session`
    before it touches the output directory, and hands the engine the
    input and the output directory; it writes ``meta.json`` itself from
    what the engine returns.
    """

    def session(self) -> contextlib.AbstractContextManager[Any]:
        """Connected for the builds inside (they reuse it); a failure to connect raises here."""
        ...

    def build_pretrain(
        self,
        spec: Any,
        labelled: Iterator[tuple[str, str | None]],
        stop: dict[str, bool],
        out: Path,
        clock: Clock,
        located: LocatedInput | None = None,
    ) -> tuple[list[FileEntry], PretrainRouter, DriverBytes]:
        """Tokenize and write a pretrain dataset; returns its files, routing and driver traffic.

        ``spec`` is the builder's resolved settings
        (:class:`~.pretrain.PretrainSpec`), ``labelled`` its documents
        with their fixed split (``None``: drawn), ``stop`` the splits that
        are full, kept up to date for the reader of ``labelled``.
        ``located``: the same documents as files the engine's workers may
        read by range themselves (``labelled`` is then not read).
        """
        ...

    def build_sft(
        self,
        examples: Iterable[Any],
        out: Path,
        chat: ChatEncoding,
        encoder: TextEncoder,
        dtype_name: str,
        val_frac: float,
        seed: int,
        clock: Clock,
        name: str,
        located: LocatedInput | None = None,
    ) -> tuple[list[FileEntry], dict[str, int], dict[str, int], dict[str, int], int, DriverBytes]:
        """Tokenize and write an SFT dataset (``located``: as for :meth:`build_pretrain`).

        Returns:
            ``(files, skip counts, examples per split, tokens per split, examples read, driver traffic)``.
        """
        ...


def engine_session(engine: Engine | None) -> contextlib.AbstractContextManager[Any]:
    """``engine`` connected for the builds inside (they reuse it); nothing for this process.

    A build connects before it touches its output directory, so an
    unreachable cluster leaves an existing dataset as it was.
    """
    if engine is None:
        return contextlib.nullcontext()
    return engine.session()

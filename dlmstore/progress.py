"""Progress of long work, reported by the library and drawn by whoever listens.

Every long step (converting a built-in base from GGUF, walking source
directories, tokenizing, building a dataset, loading a model, training
steps) opens a :class:`Task` and updates it with counts. Each update is a
frozen :class:`ProgressUpdate` handed to the *sink* installed for the
current context with :func:`reporting`; with none installed (a library
caller, a test) a task costs one context-variable lookup and draws nothing.

The CLI installs one sink per command (``dlmstore/cli/progress.py``): tqdm
bars on a terminal, a plain status line at most every 10 s on a pipe. The
library never writes to a stream and never imports tqdm.

Why a context variable rather than a ``progress=`` argument on every
function: the steps that talk sit deep under many callers (the GGUF
conversion runs inside whichever command first needs the base's tokenizer;
the source walk inside corpus loading; the tokenize pass inside
``dlm train``), and threading a callback through every layer between them
and the CLI would add a parameter to a dozen signatures for no gain. Library
callers that want progress wrap their call in :func:`reporting`, exactly as
the CLI does. Dataset builders keep their own ``progress=`` callback (they
are also called from worker processes, where a context does not travel);
the CLI feeds what they report to the same sink.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import TracebackType


@dataclass(frozen=True)
class ProgressUpdate:
    """Where one task is.

    ``task`` names it for people (``tokenizing``, ``sft``, ``converting
    smollm2-135m``) and identifies it while it runs; ``total`` is ``None``
    when the amount of work is unknown, and ``unit`` is empty for work that
    is not counted at all (loading a model): only its time is shown. ``details`` are extra figures worth
    showing (``loss``, ``tokens``, ``tokens/s``). The last update of a task
    has ``finished`` set.
    """

    task: str
    done: int
    total: int | None
    unit: str
    details: Mapping[str, float] = field(default_factory=dict)
    finished: bool = False


#: Receives every update of every task in the current context.
ProgressSink = Callable[[ProgressUpdate], None]

_SINK: ContextVar[ProgressSink | None] = ContextVar("dlmstore_progress_sink", default=None)


@contextmanager
def reporting(sink: ProgressSink | None) -> Iterator[None]:
    """Send the progress of the work done inside the block to ``sink`` (``None``: to nobody)."""
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)


class Task:
    """One long step: ``update`` it with counts, ``finish`` it (or use it as a context manager).

    The sink is the one installed when the task starts. Updates after
    ``finish`` are ignored, so a step that finishes early and is then closed
    by a ``with`` reports its end once.
    """

    def __init__(self, name: str, *, total: int | None = None, unit: str = "") -> None:
        self.name = name
        self.total = total
        self.unit = unit
        self.done = 0
        self.details: dict[str, float] = {}
        self.finished = False
        self._sink = _SINK.get()
        self._send()

    @property
    def reporting(self) -> bool:
        """Whether anyone listens (skip computing details nobody will see)."""
        return self._sink is not None

    def update(self, done: int, *, total: int | None = None, **details: float | None) -> None:
        """The task has done ``done`` units (absolute, not an increment) of ``total``."""
        if self.finished:
            return
        self.done = done
        if total is not None:
            self.total = total
        self.details.update({k: v for k, v in details.items() if v is not None})
        self._send()

    def advance(self, by: int = 1) -> None:
        """The task has done ``by`` more units."""
        self.update(self.done + by)

    def finish(self, done: int | None = None, **details: float | None) -> None:
        """The task is over (``done`` defaults to the last count)."""
        if self.finished:
            return
        if done is not None:
            self.done = done
        self.details.update({k: v for k, v in details.items() if v is not None})
        self.finished = True
        self._send()

    def _send(self) -> None:
        if self._sink is not None:
            self._sink(
                ProgressUpdate(self.name, self.done, self.total, self.unit, dict(self.details), self.finished)
            )

    def __enter__(self) -> Task:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # A failed step reports no end: the error that follows says what happened.
        if kind is None:
            self.finish()

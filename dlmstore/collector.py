"""Python's cyclic garbage collector, paused while a pass builds one object per source file.

A pass over a corpus builds, for every source file, a stat record, a
section, its lazy loader and a row: several hundred thousand small objects
on a tree of 100,000 files, all alive until the pass ends, none in a
reference cycle (they are freed by reference counting, collector or not).
The collector does not know that: every 700 allocations it runs, and as
the heap of survivors grows its older generations are traversed again and
again. On a warm `dlm tokenize` of 100,000 files that was about 0.6 s of
2.4 s (reading the records and building the sections and rows with it
paused: 0.6 s instead of 1.2 s, ``bench/bench_tokenize.py``).

:func:`paused` turns it off for a block and back on after (if it was on),
so a long command (``dlm train``) is collected normally once its corpus is
built; nothing is collected at the end of the block, since what the block
built is either still in use or already freed, and what it built is moved
to the collector's oldest generation so the next collection does not walk
it (see :func:`paused`).

:func:`frozen` keeps a run's full collections (accelerate runs one as
training starts) from traversing what was alive before it.

:func:`no_collection_at_exit` spares a finished command the collection the
interpreter runs as it shuts down: that collection traverses every object
still alive (modules, the store, what the command built), about 30 ms of a
0.6 s warm `dlm tokenize` of the standard library, to find cycles whose
memory the exiting process gives back anyway.
"""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache


@contextmanager
def paused() -> Iterator[None]:
    """Run the block with the cyclic collector off; restore its state after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        # Everything the block allocated is still in the youngest generation,
        # which the collector empties on its next run: turned back on as is,
        # it would traverse all of it at the next allocation (0.1-0.2 s on a
        # 100,000-file corpus). Freezing and unfreezing moves every tracked
        # object to the oldest generation at once (a list splice, no
        # traversal), where only a full collection looks at it again.
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()


@contextmanager
def frozen() -> Iterator[None]:
    """Run the block with every object alive at its start out of the collector's sight; restore after.

    Training starts with a full collection (accelerate's ``free_memory``,
    at the top of transformers' training loop), which traverses every
    object alive: after a corpus of 13,000 source files, 0.2 s before the
    first step, on every run and every ``dlm train --watch`` cycle. Frozen,
    those objects are not traversed (they are in use until the run ends
    anyway); what the block allocates is collected as usual, and on the
    way out everything goes back to the oldest generation.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@cache  # registered once per process
def no_collection_at_exit() -> None:
    """Freeze every object at interpreter exit, so the shutdown collection traverses none.

    Registered by the ``dlm`` command group; the ``atexit`` handlers run
    before the interpreter's last collection. Nothing is skipped that
    matters: objects are still finalized and freed as their modules are
    torn down, and files, the store and output streams are closed as
    before.
    """
    atexit.register(gc.freeze)

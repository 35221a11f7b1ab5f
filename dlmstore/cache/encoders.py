"""Encoding the tokenize pass's batches on threads: how many, in what order, and how much text at once.

The pass stores its misses in batches (one segment each, in corpus order).
How a batch is encoded is this module's business:

* **One thread** (:func:`tokenizer_threads` is 1): the batch goes to the
  Rust tokenizer whole, on a thread, while the previous batch is stored;
  the tokenizer spreads it over its own pool (rayon) as configured.
* **Several threads**: the batch is cut into chunks of a few dozen rows and
  each thread encodes whole chunks, one at a time, with the tokenizer's own
  pool switched off (``TOKENIZERS_PARALLELISM=false``, so a call encodes on
  the thread that makes it). The tokenizer's pool waits at the end of every
  call for its slowest row, and the ids of a finished call are turned into
  arrays on one thread while the pool sits idle; with one chunk per thread
  there is no such barrier, and one thread's Python work overlaps another's
  encoding. The chunks of the next batch are taken up while this one's
  last chunks finish, and the results come back in batch order, so the
  segments are the same bytes whatever the thread count.

Text held by the tokenizer is bounded the same way for any thread count:
a thread starts a chunk only while all chunks being encoded hold at most
``budget`` bytes of text together (:class:`TextBudget`; a chunk larger than
that waits until it is alone). Several threads are used only where nothing
but the Rust backend is called (text rows, ``encode_texts``' fast path):
the chat template, the prefix cache and transformers' wrapper are not
shared across threads, so a pass with conversations or preference pairs to
encode takes the one-thread path.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: ``TOKENIZERS_PARALLELISM`` values the tokenizers package reads as off.
_OFF = {"", "0", "false", "f", "off", "no", "n"}


def tokenizer_threads() -> int:
    """How many threads encode: ``RAYON_NUM_THREADS`` where set, else the CPUs this process may use.

    ``TOKENIZERS_PARALLELISM`` set to an off value (``false``, ``0``, ...)
    means one thread, as it does for the tokenizer itself. A value of
    ``RAYON_NUM_THREADS`` that is not a positive integer is ignored, as
    rayon ignores it.
    """
    if os.environ.get("TOKENIZERS_PARALLELISM", "true").strip().lower() in _OFF:
        return 1
    try:
        threads = int(os.environ.get("RAYON_NUM_THREADS", ""))
    except ValueError:
        threads = 0
    if threads > 0:
        return threads
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


@contextmanager
def calling_thread_encoding() -> Iterator[None]:
    """Within the block, a Rust tokenizer call encodes on the calling thread (its pool is not used).

    The tokenizers package reads ``TOKENIZERS_PARALLELISM`` at every call;
    the value before the block is put back after it.
    """
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


class TextBudget:
    """At most ``capacity`` bytes of text being encoded at once, across threads.

    A chunk larger than the whole budget takes all of it (it waits until no
    other chunk is being encoded).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.peak = 0
        self._changed = threading.Condition()

    @contextmanager
    def holding(self, nbytes: int) -> Iterator[None]:
        share = min(nbytes, self.capacity)
        with self._changed:
            self._changed.wait_for(lambda: self.used + share <= self.capacity)
            self.used += share
            self.peak = max(self.peak, self.used)
        try:
            yield
        finally:
            with self._changed:
                self.used -= share
                self._changed.notify_all()


def pipelined(
    batches: Iterator[tuple[list[T], int]],
    encode: Callable[[list[T], int], dict[str, R]],
    *,
    threads: int,
    chunks: Callable[[list[T]], Iterator[tuple[list[T], int]]],
    budget: int,
) -> Iterator[tuple[list[T], dict[str, R]]]:
    """``(batch, encode(batch))`` in order, encoding ahead while the caller stores each batch.

    With one thread, ``encode`` takes the next whole batch while the caller
    stores this one (one batch ahead: the tokenizer's working memory is that
    of one batch, spread over the tokenizer's own pool). With more,
    ``encode`` takes the ``chunks`` of this batch and the next on
    ``threads`` threads, each chunk on one thread with the tokenizer's pool
    off. Either way at most ``budget`` bytes of text are being encoded at
    once (:class:`TextBudget`), and a batch's result is its chunks' results
    merged in order.
    """
    from concurrent.futures import Future, ThreadPoolExecutor

    text = TextBudget(budget)

    def within_budget(chunk: list[T], nbytes: int) -> dict[str, R]:
        with text.holding(nbytes):
            return encode(chunk, nbytes)

    def merged(jobs: list[Future[dict[str, R]]]) -> dict[str, R]:
        if len(jobs) == 1:
            return jobs[0].result()
        result: dict[str, R] = {}
        for job in jobs:
            result.update(job.result())
        return result

    threads = max(threads, 1)
    pool_off = calling_thread_encoding() if threads > 1 else nullcontext()
    with pool_off, ThreadPoolExecutor(threads, thread_name_prefix="dlm-encode") as pool:
        waiting: tuple[list[T], list[Future[dict[str, R]]]] | None = None
        for batch, nbytes in batches:
            parts = chunks(batch) if threads > 1 else iter([(batch, nbytes)])
            jobs = [pool.submit(within_budget, chunk, size) for chunk, size in parts]
            if waiting is not None:
                yield waiting[0], merged(waiting[1])
            waiting = (batch, jobs)
        if waiting is not None:
            yield waiting[0], merged(waiting[1])

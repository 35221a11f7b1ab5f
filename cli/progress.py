"""Drawing the library's progress (``dlmstore.progress``) on stderr.

On a terminal each task is a tqdm bar (tqdm arrives with transformers; it
is imported on the first bar, so ``dlm --help`` never loads it). On a pipe
or in CI, where a redrawn line would only fill a log, each task prints a
plain status line with counts, rate and ETA at most every 10 s, and one
final line when it ends::

    tokenizing: 12,400/50,000 rows (24.8%), 1,240 rows/s, ETA 30s
    tokenizing: 50,000 rows in 40s (1,241 rows/s)

A task that ends within its first 10 s prints its final line only. A task
that cannot count (loading a model, converting a tokenizer) gets a status
line with its elapsed time every 10 s from a background timer, so a log
never sits silent for long; on a terminal the same timer keeps each bar's
clock moving.

Commands show progress with :func:`progress_shown`; ``-q`` and ``--json``
turn it off.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

from dlmstore.progress import ProgressUpdate, Task, reporting

from .render import is_quiet, plural

#: Seconds between two status lines of one task on a pipe.
PIPE_EVERY_S = 10.0


@dataclass
class _State:
    started: float
    last_line: float
    last: ProgressUpdate
    counted_at: float  # when the count last moved: the rate is the work done by then
    bar: Any = None  # a tqdm bar on a terminal


class ProgressRenderer:
    """A ``ProgressSink`` that draws every task on ``stream`` (stderr by default).

    Args:
        stream: where to draw; the current ``sys.stderr`` when ``None``.
        tty: draw tqdm bars (``True``) or status lines (``False``); by
            default, bars when the stream is a terminal.
        clock: seconds, monotonic (tests pass a fake one).
        every_s: the least time between two status lines of one task.
        heartbeat: run a timer thread that calls :meth:`tick` every second
            (tests call it themselves).
    """

    def __init__(
        self,
        *,
        stream: IO[str] | None = None,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = PIPE_EVERY_S,
        heartbeat: bool = False,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream) if tty is None else tty
        self.clock = clock
        self.every_s = every_s
        self.tasks: dict[str, _State] = {}
        self._lock = threading.Lock()  # updates come from the main thread, ticks from the timer
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        if heartbeat:
            self._timer = threading.Thread(target=self._beat, name="dlm-progress", daemon=True)
            self._timer.start()

    def __call__(self, update: ProgressUpdate) -> None:
        with self._lock:
            now = self.clock()
            state = self.tasks.get(update.task)
            if state is None:
                state = self.tasks[update.task] = _State(
                    started=now, last_line=now, last=update, counted_at=now
                )
            if update.done != state.last.done:
                state.counted_at = now
            state.last = update
            if self.tty:
                self._draw_bar(state, update)
            elif update.finished:
                self._line(final_line(update, now - state.started))
            elif now - state.last_line >= self.every_s:
                state.last_line = now
                self._line(status_line(update, now - state.started, now - state.counted_at))
            if update.finished:
                del self.tasks[update.task]

    def tick(self) -> None:
        """Redraw each bar (its elapsed time moves on); on a pipe, a line for each task silent for ``every_s``."""
        with self._lock:
            now = self.clock()
            for state in self.tasks.values():
                if state.bar is not None:
                    state.bar.refresh()
                elif not self.tty and now - state.last_line >= self.every_s:
                    state.last_line = now
                    self._line(status_line(state.last, now - state.started, now - state.counted_at))

    def close(self) -> None:
        """Stop the timer; close the bars of tasks that never finished (a step that failed)."""
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
        with self._lock:
            for state in self.tasks.values():
                if state.bar is not None:
                    state.bar.close()
            self.tasks.clear()

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            self.tick()

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def _draw_bar(self, state: _State, update: ProgressUpdate) -> None:
        if state.bar is None:
            from tqdm import tqdm

            # " files": tqdm writes the unit straight after the count ("12 files", "3.1 files/s").

            # Work that is not counted shows its time only.
            plain = {} if update.unit else {"bar_format": "{desc}: {elapsed}{postfix}"}
            state.bar = tqdm(
                total=update.total, desc=update.task, unit=f" {update.unit}", file=self.stream,
                dynamic_ncols=True, leave=True, **plain,
            )  # fmt: skip
        bar = state.bar
        if update.total is not None and bar.total != update.total:
            bar.total = update.total
        if update.details:
            bar.set_postfix_str(_details(update.details), refresh=False)
        bar.update(update.done - bar.n)
        if update.finished:
            bar.close()


def status_line(update: ProgressUpdate, elapsed: float, since_count: float = 0.0) -> str:
    """``tokenizing: 120/500 rows (24.0%), 12 rows/s, ETA 32s, loss 2.1``.

    ``since_count`` is how long ago the count last moved. The rate is the
    work done over the time it took (up to that moment), not over the time
    so far: during one slow unit the rate stays what it was, and the ETA
    counts down by the time spent on the unit, never below the time the
    units after it will take. (Dividing by the time so far made the ETA
    climb every 10 s while a slow step ran.)
    """
    counted_in = elapsed - since_count
    rate = update.done / counted_in if counted_in > 0 and update.done else None
    if update.total is None and update.done == 0:
        return f"{update.task}: {_duration(elapsed)} so far"
    if update.total is not None:
        share = f" ({update.done / update.total:.1%})" if update.total else ""
        parts = [f"{update.done:,}/{update.total:,} {update.unit}{share}"]
    else:
        parts = [plural(update.done, _singular(update.unit), update.unit)]
    if rate is None:
        parts.append(f"{_duration(elapsed)} so far")
    else:
        parts.append(_speed(rate, update.unit))
        if update.total is not None and update.done < update.total:
            left = update.total - update.done
            parts.append(f"ETA {_duration(max(left / rate - since_count, (left - 1) / rate))}")
    if update.details:
        parts.append(_details(update.details))
    return f"{update.task}: {', '.join(parts)}"


def final_line(update: ProgressUpdate, elapsed: float) -> str:
    """``tokenizing: 500 rows in 41s (12 rows/s)``; ``loading smollm2-135m: done in 2.1s`` without counts."""
    if update.total is None and update.done == 0:
        return f"{update.task}: done in {_duration(elapsed)}"
    counted = plural(update.done, _singular(update.unit), update.unit)
    # A rate over less than a second says more about the clock than about the work.
    rate = f" ({_speed(update.done / elapsed, update.unit)})" if elapsed >= 1 and update.done else ""
    details = f", {_details(update.details)}" if update.details else ""
    return f"{update.task}: {counted} in {_duration(elapsed)}{rate}{details}"


@contextmanager
def progress_shown(*, as_json: bool = False) -> Iterator[None]:
    """Draw the progress of the work inside the block, unless ``-q`` or ``--json``."""
    if as_json or is_quiet():
        with reporting(None):
            yield
        return
    renderer = ProgressRenderer(heartbeat=True)
    try:
        with reporting(renderer):
            yield
    finally:
        renderer.close()


class BuildTasks:
    """The dataset builders' ``progress=`` callback, as one progress task per source built.

    Builders report :class:`dlmstore.datasets.build.output.BuildProgress` (they
    can run where no sink is installed); create this inside
    :func:`progress_shown` so its tasks reach the renderer. The task counts
    documents (so the line shows docs/s) and carries the tokens and tokens
    per second since the build started; with ``--engine ray`` both are
    totals across every worker of the cluster.
    """

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}

    def __call__(self, progress: Any) -> None:
        task = self.tasks.get(progress.name)
        if task is None:
            task = self.tasks[progress.name] = Task(f"building {progress.name}", unit="docs")
        rate = progress.tokens / progress.seconds if progress.seconds > 0 else None
        details = {"tokens": progress.tokens, "tokens/s": rate}
        if progress.finished:  # straight to the final line: a status line just before it says the same
            task.finish(progress.docs, **details)
        else:
            task.update(progress.docs, **details)


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False


def _singular(unit: str) -> str:
    return unit[:-1] if unit.endswith("s") else unit


def _speed(rate: float, unit: str) -> str:
    """``1,240 rows/s``, ``2.5 steps/s``; below one a second, the time each takes: ``1m37s/step``."""
    if rate >= 1:
        return f"{_rate(rate)} {unit}/s"
    return f"{_duration(1 / rate)}/{_singular(unit)}"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def _duration(seconds: float) -> str:
    """``8.2s``, ``42s``, ``3m05s``, ``1h02m``."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _details(details: dict[str, float] | Any) -> str:
    shown = []
    for name, value in details.items():
        number = f"{value:.4f}" if name == "loss" else _rate(value) if value >= 10 else f"{value:.3g}"
        shown.append(f"{name} {number}")
    return ", ".join(shown)

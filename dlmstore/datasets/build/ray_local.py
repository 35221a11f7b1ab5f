"""A Ray the build starts in this process: it neither keeps the process's signals nor outlives it.

``ray.init`` takes over SIGTERM: a Python handler of its own (``sys.exit``)
and, once its C++ core is up, one that prints a stack dump instead of
letting the process end with a line a person can read. :func:`signals_kept`
puts back the SIGTERM and SIGINT handlers that were there before (the
CLI's: SIGTERM raises ``dlmstore.errors.Terminated``, as Ctrl-C raises
KeyboardInterrupt), so a build ends on SIGTERM exactly as on Ctrl-C.

A driver killed with SIGKILL cannot shut Ray down. Ray's head processes
share its fate (Ray starts them with ``PR_SET_PDEATHSIG``), but the
dashboard and runtime-env agents the raylet starts notice the raylet is
gone and then wait on the dead GCS for 60 to 75 s before they exit. So a
local Ray gets a reaper (:func:`start_reaper`): a small process, started
once Ray is up, that is handed the pid and start time of every process
``ray.init`` started under this one, and blocks reading a pipe from the
driver. The pipe closes when the driver ends, however it ends (a normal
exit after ``ray.shutdown()`` included: :func:`release`); the reaper then
kills each listed process still running (its start time tells a pid
reused since from the one listed) and ends. It ignores SIGINT, SIGTERM and
SIGHUP, which a terminal or a service manager sends the driver's whole
group. Without ``/proc`` (not Linux) there is no reaper.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: How long the driver waits for the reaper it released (it only kills and exits).
REAPER_WAIT_S = 10.0

#: The reaper: waits for its stdin to close (the driver ended), then kills each listed
#: process (``pid start-time`` lines) still running as the process that was listed.
_REAPER = """
import os, signal, sys
for which in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(which, signal.SIG_IGN)
listed = [line.split() for line in sys.stdin]
for pid, start in listed:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            now = stat.read().rsplit(")", 1)[1].split()[19]
        if now == start:
            os.kill(int(pid), signal.SIGKILL)
    except (OSError, IndexError):
        pass
"""


@contextmanager
def signals_kept() -> Iterator[None]:
    """Put back the SIGTERM and SIGINT handlers Ray replaces inside the block (only the main thread has any)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {which: signal.getsignal(which) for which in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for which, handler in kept.items():
            if handler is not None:  # None: a handler not set from Python; nothing to put back
                signal.signal(which, handler)


@contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Within the block Ctrl-C (SIGINT) is held: recorded, and raised as KeyboardInterrupt once the block is done.

    ``ray.init`` stopped halfway by a KeyboardInterrupt leaves Ray's C++ core
    half started, and the process then crashed on its way out (exit status
    -11, after its ``error: interrupted`` line); held, the Ctrl-C stops the
    build a few seconds later, once Ray is up and can be shut down. (SIGTERM
    cannot be held the same way: ``ray.init`` puts its own handler in first.)
    Only the main thread has signal handlers; elsewhere nothing is held.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt


def start_reaper(before: set[tuple[int, str]]) -> subprocess.Popen[bytes] | None:
    """Start the reaper of the processes under this one that are not in ``before`` (what ``ray.init`` started).

    ``None`` when there are none, or no ``/proc`` to find them in.
    """
    processes = descendants(os.getpid()) - before
    if not processes:
        return None
    reaper = subprocess.Popen(
        [sys.executable, "-c", _REAPER], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    if reaper.stdin is not None:
        reaper.stdin.write("".join(f"{pid} {start}\n" for pid, start in sorted(processes)).encode())
        reaper.stdin.flush()
    return reaper


def release(reaper: subprocess.Popen[bytes]) -> None:
    """Let the reaper go once Ray has shut down: it kills what is left and ends."""
    if reaper.stdin is not None:
        reaper.stdin.close()
    try:
        reaper.wait(timeout=REAPER_WAIT_S)
    except subprocess.TimeoutExpired:
        reaper.kill()
        reaper.wait()


def descendants(root: int) -> set[tuple[int, str]]:
    """``(pid, start time)`` of every process under ``root``, from ``/proc`` (empty without it)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return set()
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        children.setdefault(int(fields[1]), []).append(int(name))
        starts[int(name)] = fields[19]
    found: set[tuple[int, str]] = set()
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.add((pid, starts[pid]))
        stack.extend(children.get(pid, []))
    return found

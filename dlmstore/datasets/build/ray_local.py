"""Ray for a build: a cluster connected, or a local Ray that neither keeps the process's signals nor outlives it.

:func:`ray_session` connects to a cluster (bounded in time: :func:`connect_timeout`)
or starts a local Ray, and shuts it down after; :func:`import_ray` is the
one import of Ray, with the error saying how to install it.

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

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dlmstore.errors import DatasetError, Terminated

INSTALL_HINT = "pip install 'dlmstore[ray]'"
#: How long connecting to a cluster may take before it is reported as unreachable, unless
#: :data:`CONNECT_TIMEOUT_ENV` says otherwise.
CONNECT_TIMEOUT_S = 25.0
#: The environment variable that sets the connect timeout in seconds (a slow cluster, a quick test).
CONNECT_TIMEOUT_ENV = "DLM_RAY_CONNECT_TIMEOUT"
PROBE_TIMEOUT_S = 5.0

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


def connect_timeout() -> float:
    """Seconds connecting may take: :data:`CONNECT_TIMEOUT_ENV` when set, else :data:`CONNECT_TIMEOUT_S`.

    Raises:
        DatasetError: the variable is not a positive number of seconds.
    """
    value = os.environ.get(CONNECT_TIMEOUT_ENV, "").strip()
    if not value:
        return CONNECT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise DatasetError(
            f"{CONNECT_TIMEOUT_ENV}={value!r} is not a number of seconds above 0",
            hint=f"set it to e.g. 60, or unset it for {CONNECT_TIMEOUT_S:.0f} s",
        )
    return seconds


def import_ray() -> Any:
    """The ``ray`` module, or the error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise DatasetError(
            "--engine ray needs Ray, which is not installed", hint=f"install it: {INSTALL_HINT}"
        ) from None
    return ray


@contextmanager
def ray_session(address: str | None, workers: int | None) -> Iterator[tuple[Any, int]]:
    """Ray, connected, and how many tasks to run at once.

    Connects to ``address`` (a cluster's), else starts a local Ray with
    ``workers`` CPUs and stops it afterwards. A Ray already
    initialised in this process (a test, a notebook) is used as it is.

    Ray does not keep the process's signals, nor outlive it
    (:mod:`.ray_local`): the SIGTERM and SIGINT handlers ``ray.init``
    replaces are put back, so SIGTERM ends a build as Ctrl-C does (the
    build stops, Ray is shut down, the CLI prints one ``error:`` line), and
    a local Ray's processes are handed to a reaper that kills any still
    running once this process ends, however it ends.

    Raises:
        DatasetError: Ray is not installed, or the cluster cannot be
            reached within :func:`connect_timeout` seconds, or that is not a number.
        Terminated: SIGTERM came while ``ray.init`` had Ray's own handler in place.
    """
    ray = import_ray()
    if ray.is_initialized():
        yield ray, workers or _cluster_cpus(ray)
        return
    before = descendants(os.getpid()) if address is None else set()
    reaper = None
    # Ray is shut down however this ends, from the moment ray.init starts, and what a local
    # ray.init started is reaped even when it was stopped before the reaper was handed it (a
    # SIGTERM while it starts: its dashboard and runtime-env agents outlived the build by a minute).
    try:
        try:
            with signals_kept(), ctrl_c_held():
                if address is None:
                    ray.init(
                        address="local",
                        num_cpus=workers or os.cpu_count() or 1,
                        include_dashboard=False,
                        logging_level=logging.WARNING,
                    )
                else:
                    _connect(ray, address)
        except SystemExit as exc:  # what Ray's own SIGTERM handler raises, in place while ray.init runs
            if exc.code != signal.SIGTERM:
                raise
            raise Terminated(signal.SIGTERM) from None
        if address is None:
            reaper = start_reaper(before)
        yield ray, workers or _cluster_cpus(ray)
    finally:
        with signals_kept():
            ray.shutdown()
        if reaper is None and address is None:
            reaper = start_reaper(before)
        if reaper is not None:
            release(reaper)


def _cluster_cpus(ray: Any) -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _connect(ray: Any, address: str) -> None:
    """``ray.init(address)``, bounded in time: a cluster that does not answer is an error, not a hang."""
    timeout = connect_timeout()
    hint = (
        "check --ray-address / RAY_ADDRESS (the head node's host:port, e.g. 10.0.0.5:6379), "
        "or leave both unset to run a local Ray"
    )
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if host and port.isdigit():
        try:
            socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
        except OSError as exc:
            raise DatasetError(
                f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}", hint=hint
            ) from None
    outcome: dict[str, BaseException | None] = {}

    def init() -> None:
        try:
            ray.init(address=address, logging_level=logging.WARNING)
            outcome["error"] = None
        except BaseException as exc:  # reported by the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=init, name="dlm-ray-connect", daemon=True)
    thread.start()
    thread.join(timeout)
    if "error" not in outcome:
        raise DatasetError(f"the Ray cluster at {address} did not answer within {timeout:g} s", hint=hint)
    if outcome["error"] is not None:
        raise DatasetError(f"cannot connect to the Ray cluster at {address}: {outcome['error']}", hint=hint)

"""Data-parallel ranks: who this process is, and the few messages ranks exchange.

``dlm train --nproc N`` starts N processes (:mod:`dlmstore.train.launch`);
``torchrun`` and ``accelerate launch`` start them the same way. Each learns
its place from the environment those launchers set (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``). Rank 0 is the only one that touches the
store: it tokenizes through the cache, records the run, and afterwards
stages and registers the adapter and the lock. It hands the other ranks
what they need in one broadcast (:func:`share`), or the error that stopped
it, so every rank fails with the same one-line message instead of waiting
for a peer that is gone. Gradients are averaged by DDP (gloo on CPU, NCCL
on CUDA) inside the trainer; each rank reads its own share of every epoch
through :class:`~dlmstore.datasets.RankPartitionSampler`.

A rank that ``dlm train --nproc`` started (:mod:`.launch`) is told so in
its environment (:data:`LAUNCHER_ENV`, :data:`REPORT_FD_ENV`). It dies
with the launcher: :func:`join` asks Linux to send it SIGTERM when the
launcher ends (``prctl(PR_SET_PDEATHSIG)``), then checks that the launcher
is still its parent, in case it ended before that took effect. It
reports its own failure to the launcher rather than to a terminal
(:func:`report_fd`): the launcher alone sees how every rank ended, and
prints one ``error:`` line for the run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from dlmstore.errors import DlmError, Terminated, TrainingError

#: How long a rank waits for its peers (model load included) before giving up.
TIMEOUT = timedelta(minutes=30)

#: Set by ``dlm train --nproc`` in each rank's environment: the launcher's pid.
LAUNCHER_ENV = "DLM_NPROC_LAUNCHER"

#: Set with it: the descriptor (a file the launcher reads) a rank writes its failure report to.
REPORT_FD_ENV = "DLM_NPROC_REPORT_FD"

#: How every other rank repeats the error rank 0 stopped with.
RANK_0_STOPPED = "rank 0 stopped: "

#: ``prctl`` option: the signal the kernel sends this process when its parent ends (linux/prctl.h).
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class World:
    """This process's rank among ``size`` ranks (size 1: a plain single-process run)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def current_world() -> World:
    """The rank and world size the launcher set in the environment (a single process without one).

    Raises:
        TrainingError: the variables are set but not whole numbers, or the rank is outside the world.
    """
    try:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise TrainingError(
            "RANK, WORLD_SIZE and LOCAL_RANK must be whole numbers",
            hint="launch with `dlm train --nproc N`, torchrun or accelerate launch",
        ) from None
    if size < 1 or not 0 <= rank < size:
        raise TrainingError(
            f"RANK {rank} is outside WORLD_SIZE {size}",
            hint="launch with `dlm train --nproc N`, torchrun or accelerate launch",
        )
    return World(rank=rank, size=size, local_rank=local_rank)


def join(world: World) -> None:
    """Join the process group (gloo on CPU, NCCL with CUDA), once, before the ranks exchange anything.

    A rank ``dlm train --nproc`` started is first bound to the launcher
    (:func:`bind_to_launcher`).

    Raises:
        Terminated: the launcher already ended.
    """
    if not world.distributed:
        return
    bind_to_launcher()
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, rank=world.rank, world_size=world.size, timeout=TIMEOUT)


def share(world: World, payload: Any = None, error: DlmError | None = None) -> Any:
    """Rank 0's ``payload`` on every rank; rank 0's ``error`` raised on every rank instead.

    Rank 0 passes what it prepared, or the error that stopped it (and then
    re-raises it itself); the others pass nothing.
    """
    if not world.distributed:
        return payload
    import torch.distributed as dist

    box = [("error", (type(error).__name__, error.message, error.hint)) if error else ("ok", payload)]
    dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if status == "error" and not world.is_main:
        _, message, hint = value
        raise TrainingError(f"{RANK_0_STOPPED}{message}", hint=hint)
    return value


def gather(world: World, value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order, on every rank."""
    if not world.distributed:
        return [value]
    import torch.distributed as dist

    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, value)
    return out


def gather_to_main(world: World, value: Any) -> list[Any] | None:
    """Every rank's ``value``, in rank order, on rank 0 alone (``None`` on the others)."""
    if not world.distributed:
        return [value]
    import torch.distributed as dist

    out: list[Any] | None = [None] * world.size if world.is_main else None
    dist.gather_object(value, out, dst=0)
    return out


def mirror(world: World, root: Path, folders: Sequence[Path], into: Path) -> None:
    """Rank 0's ``folders`` (under ``root``, its store) written under ``into`` on every other rank.

    No rank but 0 reads the store, which may be on another machine: what a
    rank needs of it (the checkpoint it resumes, the adapter a phase starts
    from) comes in one broadcast, each file at its path relative to the
    store, so ``into`` stands for the store on that rank. Every rank calls
    it with the same ``folders``.
    """
    if not world.distributed or not folders:
        return
    files: dict[str, bytes] | None = None
    if world.is_main:
        files = {
            path.relative_to(root).as_posix(): path.read_bytes()
            for folder in folders
            for path in sorted(folder.rglob("*"))
            if path.is_file()
        }
    files = share(world, files)
    if world.is_main or files is None:
        return
    for name, data in files.items():
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def barrier(world: World) -> None:
    """Wait until every rank is here."""
    if world.distributed:
        import torch.distributed as dist

        dist.barrier()


def leave(world: World, *, failed: bool = False) -> None:
    """Leave the process group at the end of a run, all ranks together.

    The barrier keeps a rank from tearing down its connections while a peer
    still reads from them (rank 0 finishes last: it writes the adapter); the
    collection afterwards frees the group the trainer still referenced while
    its threads can still be joined.

    A rank whose run ``failed`` (its own error, or SIGTERM/SIGINT from the
    launcher) leaves without either: a peer may be inside a collective (a
    gradient all-reduce in its backward pass) that this rank will never
    join, so a barrier here would wait for it forever while it waits for
    this rank, and a signal sent to the peer cannot run its handler until
    the collective returns. The failing rank's process ends next
    (``exit_rank``), which closes its connections: the peer's collective
    fails at once and the peer ends in turn.
    """
    if world.distributed and not failed:
        import gc

        import torch.distributed as dist

        if dist.is_initialized():
            try:
                dist.barrier()
            finally:
                dist.destroy_process_group()
                gc.collect()


#: What a rank says when a collective failed because a peer is gone (its process, launcher or machine).
PEER_LOST = "a training rank stopped answering (its process, its launcher or its machine ended)"

#: How a failed collective reads when the peer's end closed or reset the connection, or never answered.
_PEER_FAILURES = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Timed out",
    "timed out",
)


@contextmanager
def peers_answering(world: World) -> Iterator[None]:
    """Turn a collective that failed because a peer is gone into one :class:`TrainingError`.

    gloo and NCCL raise a ``RuntimeError`` (``DistBackendError``) quoting
    their source file when a peer's connection closes mid-collective: a
    node lost mid-run reads as that on every surviving rank. The run is
    recorded failed with this line, and ``--resume`` continues it from its
    last checkpoint.
    """
    try:
        yield
    except RuntimeError as exc:
        if not world.distributed or not any(mark in str(exc) for mark in _PEER_FAILURES):
            raise
        raise TrainingError(
            PEER_LOST,
            hint="run the same `dlm train` with --resume (on every node) to continue from the last checkpoint",
        ) from exc


def exit_rank(code: int = 0) -> NoReturn:
    """End a rank's process once its run is over: flush, then exit without interpreter teardown.

    Torch's gloo and store objects that outlive the process group (held by
    DDP, accelerate's state) are destroyed during interpreter teardown, and a
    C++ thread still joinable there aborts the process (``terminate called
    without an active exception``, SIGABRT) after a run that succeeded: it
    happened once in CI under ``torchrun``. Everything a rank writes is
    committed and closed by then, so skipping the teardown loses nothing.
    """
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def bind_to_launcher() -> None:
    """Make this rank end (SIGTERM) when the ``dlm train --nproc`` that started it ends, however it ends.

    Does nothing in a process no launcher of ours started (torchrun's ranks
    are torchrun's to stop). Elsewhere than Linux only the launcher's
    forwarding of SIGTERM and SIGINT stops the ranks.

    Raises:
        Terminated: the launcher ended before the binding took effect.
    """
    launcher = os.environ.get(LAUNCHER_ENV)
    if not launcher:
        return
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if launcher_gone():
        raise Terminated(signal.SIGTERM, LAUNCHER_GONE)


#: What a rank says when the launcher that started it is gone.
LAUNCHER_GONE = "the `dlm train --nproc` launcher ended"


def launcher_gone() -> bool:
    """Whether this is a rank ``dlm train --nproc`` started whose launcher has ended (it has another parent)."""
    launcher = os.environ.get(LAUNCHER_ENV)
    return bool(launcher) and str(os.getppid()) != launcher


def report_fd() -> int | None:
    """The descriptor a rank ``dlm train --nproc`` started writes its failure report to; ``None`` in any other process."""
    value = os.environ.get(REPORT_FD_ENV)
    return int(value) if value and value.isdigit() and os.environ.get(LAUNCHER_ENV) else None


@dataclass(frozen=True)
class RankReport:
    """How a rank ``dlm train --nproc`` started failed, as it tells the launcher (one JSON object).

    ``errors`` holds the ``(message, hint)`` pairs of a DlmError (what the
    rank would have printed as ``error:``/``hint:`` lines); ``signal`` the
    signal that stopped it (it exited 128 + signal); ``crash`` the first
    line of any other exception (``RuntimeError: ...``).
    """

    errors: tuple[tuple[str, str | None], ...] = ()
    signal: int | None = None
    crash: str | None = None

    def send(self) -> None:
        """Write the report where the launcher reads it (nothing outside a launched rank)."""
        fd = report_fd()
        if fd is None:
            return
        payload = {"errors": [list(pair) for pair in self.errors], "signal": self.signal, "crash": self.crash}
        try:
            os.write(fd, json.dumps(payload).encode("utf-8", "backslashreplace"))
        except OSError:  # the launcher's file is gone: it ended, and nobody reads the report
            pass

    @staticmethod
    def read(data: bytes) -> RankReport | None:
        """The report a rank wrote (``None`` when it wrote none, or not a whole one: it was killed)."""
        try:
            payload = json.loads(data.decode("utf-8"))
            errors = tuple(
                (str(message), None if hint is None else str(hint)) for message, hint in payload["errors"]
            )
            return RankReport(errors, payload["signal"], payload["crash"])
        except (ValueError, KeyError, TypeError):
            return None

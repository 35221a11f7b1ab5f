"""``dlm train --nproc N``: start N ranks of the same ``dlm train`` on this machine, and stop them together.

Each rank is a child process running ``python -m dlmstore.cli.main train
...`` (the same arguments, without ``--nproc``) with the environment
torchrun would give it: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``
(a free local port).

**Several machines** (``--nnodes N --node-rank I --master-addr A
--master-port P``): the same launcher runs on every node, as torchrun's
static rendezvous does (``torchrun --nnodes N --node-rank I
--master-addr A --master-port P``): node ``I`` starts its ``K`` ranks as
global ranks ``I*K .. I*K+K-1`` of ``N*K``, and every rank meets the
others at ``A:P``, where global rank 0 (on node 0) listens. Only node 0's
launcher records a failed run in the store; the other nodes never open it.

Each rank divides this machine's cores by ``LOCAL_WORLD_SIZE`` for
its torch threads, so N ranks do not oversubscribe the CPU, and lets an
idle one spin only briefly (:mod:`dlmstore.train.threads`); a user's
``OMP_NUM_THREADS`` reaches every rank as it is. Rank 0 prints what a
single-process run prints; the others are quiet.

**The ranks live and die with the launcher.** Each rank runs in a process
group of its own, so a signal meant for the launcher (Ctrl-C at the
terminal, SIGTERM from ``timeout``, systemd, CI or a scheduler) reaches
the launcher alone, which forwards it to every rank's group and waits up
to :data:`STOP_GRACE_S` seconds for them to record the run as failed and
end, then kills what is left (SIGKILL). A launcher killed with SIGKILL
cannot forward anything: each rank asked Linux to send it SIGTERM when
the launcher ends (``dlmstore.train.distributed.bind_to_launcher``), so
no rank trains on, publishes an adapter or writes ``dlm.lock`` after the
command ended.

**One rank's end is the run's end, told once.** When a rank fails, the
others are stopped the same way, so a failed run never leaves ranks
waiting for a peer. Ranks do not print their failure: each writes a
:class:`~dlmstore.train.distributed.RankReport` to a file only the
launcher reads, and the launcher, once every rank has ended, raises one
error for the run (:func:`_verdict`), most telling first: a rank killed
by a signal (``train rank 1 was killed by SIGKILL``), one stopped by a
signal it was sent directly, a rank's own DlmError (printed as that rank
printed it: rank 0's bad input reads as it does without ``--nproc``),
then any other exception, then a bare exit status. The same one line is
recorded as the run's error in the store (rank 0's pid finds the run),
replacing what rank 0 saw (a peer that stopped answering).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

from dlmstore.clock import utc_now
from dlmstore.errors import DlmError, RankError, Terminated, TrainingError
from dlmstore.train.distributed import LAUNCHER_ENV, PEER_LOST, RANK_0_STOPPED, REPORT_FD_ENV, RankReport

#: How long stopped ranks get to record the run as failed and end before they are killed.
STOP_GRACE_S = 30.0

#: How often the launcher looks at its ranks.
POLL_S = 0.1


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class _Rank:
    """One started rank: its process, the file it reports to, and how the launcher saw it end."""

    rank: int
    process: subprocess.Popen[bytes]
    report: IO[bytes]
    seen_at: int | None = None  # the launcher's look (0, 1, ...) that first saw it ended
    stopped: bool = False  # the launcher signalled it (after another rank's end, or forwarding)
    detail: RankReport | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Nodes:
    """Where this launcher's ranks sit among several machines (torchrun's static rendezvous).

    ``count`` 1 (the default) is one machine: the ranks meet at a free port of 127.0.0.1.
    """

    count: int = 1
    rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None


def launch(
    arguments: Sequence[str], nproc: int, *, document: str | None = None, nodes: Nodes = Nodes()
) -> int:
    """Run ``dlm`` with ``arguments`` as ``nproc`` ranks of this node; 0 once every rank succeeded.

    Args:
        document: the document the ranks train, whose store's run records
            why it failed (``None``: the run is left to the ranks). Only
            node 0 records it: the store is rank 0's.
        nodes: this node among ``nodes.count`` (each starts ``nproc`` ranks).

    Raises:
        TrainingError: ``nproc`` is below 1, the command already runs as a
            rank, or a rank failed (the one error of :func:`_verdict`; the
            same line is the run's error).
        DlmError: rank 0's own error (or another rank's), as it reported it.
        KeyboardInterrupt: Ctrl-C or SIGTERM (``Terminated``) reached the
            launcher; every rank was stopped with it first.
    """
    if nproc < 1:
        raise TrainingError(f"--nproc must be at least 1, not {nproc}")
    if "WORLD_SIZE" in os.environ and os.environ["WORLD_SIZE"] != "1":
        raise TrainingError(
            "--nproc inside a launched rank (WORLD_SIZE is set)",
            hint="use either --nproc or torchrun/accelerate launch, not both",
        )
    if nodes.rank != 0:
        document = None  # the store is rank 0's, on node 0
    started = utc_now()
    ranks = _start(arguments, nproc, nodes)
    try:
        try:
            ok = _wait(ranks)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated): for the launcher, so for all
            _stop(ranks, exc.signum if isinstance(exc, Terminated) else signal.SIGINT)
            _record(document, ranks[0], started, str(exc) or "interrupted")
            raise
        if ok:
            return 0
        _stop(ranks, signal.SIGTERM)
        error = _verdict(ranks)
        _record(document, ranks[0], started, error.message)
        raise error
    finally:
        for rank in ranks:
            rank.report.close()


def _start(arguments: Sequence[str], nproc: int, nodes: Nodes) -> list[_Rank]:
    port = free_port() if nodes.master_port is None else nodes.master_port
    ranks: list[_Rank] = []
    for local in range(nproc):
        rank = nodes.rank * nproc + local
        report = tempfile.TemporaryFile()  # already unlinked: nothing is left behind, however this ends
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": str(nodes.count * nproc),
            "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": str(nodes.rank),
            "GROUP_WORLD_SIZE": str(nodes.count),
            "MASTER_ADDR": nodes.master_addr or "127.0.0.1",
            "MASTER_PORT": str(port),
            LAUNCHER_ENV: str(os.getpid()),
            REPORT_FD_ENV: str(report.fileno()),
        }
        output = (
            None if local == 0 else subprocess.DEVNULL
        )  # rank 0 prints the run; another node's first rank, its errors
        process = subprocess.Popen(
            [sys.executable, "-m", "dlmstore.cli.main", *arguments], env=env, stdout=output, stderr=output,
            pass_fds=(report.fileno(),), process_group=0,
        )  # fmt: skip
        ranks.append(_Rank(rank, process, report))
    return ranks


def _wait(ranks: list[_Rank]) -> bool:
    """Wait until every rank succeeded (True) or one failed (False, the others still running)."""
    look = 0
    while True:
        for rank in ranks:
            if rank.seen_at is None and rank.process.poll() is not None:
                rank.seen_at = look
        codes = [rank.process.returncode for rank in ranks]
        if any(code not in (None, 0) for code in codes):
            return False
        if all(code == 0 for code in codes):
            return True
        look += 1
        time.sleep(POLL_S)


def _stop(ranks: list[_Rank], sig: int) -> None:
    """Send ``sig`` to every rank still running (its whole group), wait up to STOP_GRACE_S, then SIGKILL.

    A second Ctrl-C or SIGTERM meanwhile does not cut this short into
    leaving ranks behind: it only stops the waiting (what is left is killed).
    """
    hurry: list[int] = []
    previous = {
        which: signal.signal(which, lambda signum, _frame: hurry.append(signum))
        for which in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        for rank in ranks:
            if rank.process.poll() is None:
                rank.stopped = True
                _signal_group(rank, sig)
        deadline = time.monotonic() + STOP_GRACE_S
        while running := [rank for rank in ranks if rank.process.poll() is None]:
            if hurry or time.monotonic() > deadline:
                for rank in running:
                    _signal_group(rank, signal.SIGKILL)
            time.sleep(POLL_S)
    finally:
        for which, handler in previous.items():
            signal.signal(which, handler)


def _signal_group(rank: _Rank, sig: int) -> None:
    """``sig`` to the rank's process group; only while the rank is not reaped, so its id is still its group's."""
    try:
        os.killpg(rank.process.pid, sig)
    except (ProcessLookupError, PermissionError):  # the group is gone (or a pid now someone else's)
        pass


def _verdict(ranks: list[_Rank]) -> DlmError:
    """The one error that says why the run failed, from how the ranks that failed on their own ended.

    Kinds are tried in the module's order. Within a kind the rank seen
    ending first comes first (the others were likely stopped by its end),
    except a rank's own DlmError: there the lowest rank's comes first, as
    rank 0's error is what every other rank repeats (``rank 0 stopped: ...``).
    """
    for rank in ranks:
        rank.report.seek(0)
        rank.detail = RankReport.read(rank.report.read())
    failed = [rank for rank in ranks if rank.process.returncode not in (None, 0) and not rank.stopped]
    by_end = sorted(
        failed, key=lambda rank: (rank.seen_at if rank.seen_at is not None else len(ranks), rank.rank)
    )
    for kind in (_killed, _signalled):
        for rank in by_end:
            if (error := kind(rank)) is not None:
                return error
    # A report of errors is the rank's own DlmError, even from a rank stopped after it failed: rank 0
    # may still be on its way out when another rank repeating its error has ended and had it stopped.
    # A peer lost (PEER_LOST) is what the others see of a rank that ended: the last word, not the first.
    reported = [rank for rank in ranks if rank.detail is not None and rank.detail.errors]
    for rank in reported:
        if rank.detail is not None and not _lost_a_peer(rank):
            return RankError([_as_rank_0s(message, hint) for message, hint in rank.detail.errors])
    for kind in (_crashed, _exited):
        for rank in by_end:
            if (error := kind(rank)) is not None and not (rank in reported and kind is _exited):
                return error
    for rank in reported:  # only ranks that lost a peer said why: on this node, the run ended elsewhere
        assert rank.detail is not None
        return RankError(list(rank.detail.errors))
    return TrainingError("the ranks ended without saying why")


def _lost_a_peer(rank: _Rank) -> bool:
    """Whether the rank's own error is only that a peer stopped answering (another node's rank ended)."""
    return rank.detail is not None and all(message == PEER_LOST for message, _ in rank.detail.errors)


def _as_rank_0s(message: str, hint: str | None) -> tuple[str, str | None]:
    """Rank 0's own error where another rank repeats it (rank 0 was stopped before it reported it)."""
    return message.removeprefix(RANK_0_STOPPED), hint


def _killed(rank: _Rank) -> DlmError | None:
    code = rank.process.returncode
    if code is not None and code < 0:
        return TrainingError(f"train rank {rank.rank} was killed by {_name(-code)}")
    return None


def _signalled(rank: _Rank) -> DlmError | None:
    if rank.detail is not None and rank.detail.signal is not None:
        return TrainingError(f"train rank {rank.rank} was stopped by {_name(rank.detail.signal)}")
    return None


def _crashed(rank: _Rank) -> DlmError | None:
    if rank.detail is None or rank.detail.crash is None:
        return None
    return TrainingError(
        f"train rank {rank.rank} failed: {rank.detail.crash}",
        hint="DLM_DEBUG=1 prints its traceback (rank 0's on this terminal)",
    )


def _exited(rank: _Rank) -> DlmError | None:
    return TrainingError(f"train rank {rank.rank} ended with exit status {rank.process.returncode}")


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _record(document: str | None, rank0: _Rank, since: str, reason: str) -> None:
    """Record ``reason`` as the error of the run rank 0 started (best effort: the next command marks a dead one)."""
    if document is None:
        return
    from dlmstore.document.parser import parse_document
    from dlmstore.store.database import open_store, store_exists
    from dlmstore.store.runs import fail_run_of

    try:
        dlm_id = parse_document(document).dlm_id
        if not store_exists(dlm_id):
            return
        with open_store(dlm_id, create=False) as store:
            fail_run_of(store, rank0.process.pid, reason, since=since)
    except DlmError:
        pass

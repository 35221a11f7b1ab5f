"""``dlm train --nproc N``: start N ranks of the same ``dlm train`` on this machine.

Each rank is a child process running ``python -m dlmstore.cli.main train
...`` (the same arguments, without ``--nproc``) with the environment
torchrun would give it: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` (a free local
port), and ``OMP_NUM_THREADS`` set to this machine's cores divided among
the ranks, so N ranks do not oversubscribe the CPU. Rank 0 prints what a
single-process run prints; the others are quiet. When one rank fails, the
others are stopped and the launcher exits with the failing rank's status,
so a failed run never leaves ranks waiting for a peer.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from dlmstore.errors import TrainingError


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def launch(arguments: Sequence[str], nproc: int) -> int:
    """Run ``dlm`` with ``arguments`` as ``nproc`` ranks; the exit status of the run.

    Raises:
        TrainingError: ``nproc`` is below 1, or the command already runs as a rank.
    """
    if nproc < 1:
        raise TrainingError(f"--nproc must be at least 1, not {nproc}")
    if "WORLD_SIZE" in os.environ and os.environ["WORLD_SIZE"] != "1":
        raise TrainingError(
            "--nproc inside a launched rank (WORLD_SIZE is set)",
            hint="use either --nproc or torchrun/accelerate launch, not both",
        )
    port = free_port()
    threads = max(1, (os.cpu_count() or 1) // nproc)
    children: list[subprocess.Popen[bytes]] = []
    for rank in range(nproc):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads)),
        }
        output = None if rank == 0 else subprocess.DEVNULL
        children.append(
            subprocess.Popen(
                [sys.executable, "-m", "dlmstore.cli.main", *arguments], env=env, stdout=output, stderr=output
            )
        )
    return _wait(children)


def _wait(children: list[subprocess.Popen[bytes]]) -> int:
    """Wait for every rank; on the first failure stop the rest. Rank 0's status, or the failing one's."""
    try:
        while True:
            codes = [child.poll() for child in children]
            failed = [code for code in codes if code not in (None, 0)]
            if failed:
                _stop(children)
                return codes[0] if codes[0] not in (None, 0) else failed[0] or 1
            if all(code == 0 for code in codes):
                return 0
            time.sleep(0.1)
    except KeyboardInterrupt:
        _stop(children, sig=signal.SIGINT)
        raise


def _stop(children: list[subprocess.Popen[bytes]], *, sig: int = signal.SIGTERM) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(sig)
    deadline = time.monotonic() + 30
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()

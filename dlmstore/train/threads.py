"""How many threads torch runs on in ``dlm train`` and ``dlm eval``, and how they wait: chosen before torch starts.

torch's CPU kernels run on an OpenMP pool (libgomp in the PyPI wheels,
Intel's libiomp in some builds), and a training step of a small model is
thousands of short parallel regions. Between two regions a thread that
finished its share waits for the next one, and how it waits decides what a
shared machine does to training. libgomp's default spins up to 300,000
times (milliseconds) before it sleeps: on a quiet machine that bridges the
gap to the next region, on a busy one a thread spins on a core another job
needs while the thread it waits for cannot run, and every region pays for
it. Measured on the 2-core machine (docs/training.md, "Threads and speed"):
beside other jobs a step took from several to 47 times as long as on the
quiet machine. Sleeping at once (``OMP_WAIT_POLICY=PASSIVE``) removes that
collapse, but a sleeping thread takes a wake-up for every region, and a
quiet step was 3-10% slower (up to 1.8x beside other jobs, where wake-ups
wait for a core); a long spin (10,000) was slower still beside other work.
A short spin, ``GOMP_SPINCOUNT=1000`` (tens of microseconds), bridges the
gaps between a step's regions and gives a core back soon: it was as fast as
the default on the quiet machine and the fastest of the four beside other
jobs.

So ``dlm train`` decides, before torch is imported (:func:`configure`,
called by ``cli/train.py`` in every process, ranks included), and ``dlm
eval`` and ``dlm prompt`` decide the same (``cli/eval.py``,
``cli/prompt.py``): their forward passes and greedy generation are the
same short parallel regions, and without the short
spin a ``dlm eval`` of the demo document took 50 s per model beside other
jobs (load average 7 on the 2 cores) against 8 s with it:

* **threads**: the cores this process may run on - the physical cores of
  its affinity mask (``taskset``, a container's cpuset; torch's own
  default counts physical cores of the whole machine), fewer when a cgroup
  CPU quota (``docker --cpus``) allows fewer - divided among the ranks of this
  machine (``LOCAL_WORLD_SIZE``, which ``dlm train --nproc`` and torchrun
  set). It is set as ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``. The count
  does not follow the machine's load, though idle cores come and go: the
  thread count decides how reductions are split, so it is part of what
  makes an adapter byte-identical on the same machine (the golden's tuple
  records it), and a count that followed the load would give a busy run
  different bytes from a quiet one;
* **waiting**: a short spin, ``GOMP_SPINCOUNT=1000`` for libgomp and
  ``KMP_BLOCKTIME=1`` (one millisecond, its smallest spin short of none)
  for libiomp. How threads wait changes no result, only who gets the cores.

A setting the user made wins: ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` in
the environment fixes the count (each one is kept as written, and a missing
one follows it), any of ``OMP_WAIT_POLICY``, ``KMP_BLOCKTIME`` or
``GOMP_SPINCOUNT`` fixes the waiting, and in a process that imported torch
before (a library caller, a test) nothing is changed: the caller chose
torch's settings. What was chosen and why goes to the debug log
(``dlm -v train``), with the load average the run started beside.

:func:`choose` is pure (CPUs, environment, ranks -> :class:`ThreadPlan`);
:func:`usable_cpus` reads the affinity mask, the cores' topology and the
cgroup quota.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

_log = logging.getLogger(__name__)

#: The variables that fix the thread count; the first one set wins for both.
COUNT_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

#: The variables that say how idle threads wait; any one set means the user chose.
WAIT_VARS = ("OMP_WAIT_POLICY", "KMP_BLOCKTIME", "GOMP_SPINCOUNT")

#: What dlm sets when the user chose nothing: a short spin before an idle thread sleeps
#: (libgomp counts spins, libiomp milliseconds).
SHORT_SPIN = {"GOMP_SPINCOUNT": "1000", "KMP_BLOCKTIME": "1"}


@dataclass(frozen=True)
class ThreadPlan:
    """The thread settings of one training process, and why.

    Attributes:
        threads: torch's intra-op thread count (``None``: the user's
            ``OMP_NUM_THREADS`` is not a plain count, torch reads it itself).
        env: the variables to set, those the user did not set.
        reasons: one phrase per decision, for the debug log.
    """

    threads: int | None
    env: dict[str, str] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()


def choose(cpus: int, env: Mapping[str, str], *, ranks: int = 1) -> ThreadPlan:
    """The thread settings for a process that may run on ``cpus`` CPUs, one of ``ranks`` on this machine.

    Args:
        cpus: the CPUs this process may use (:func:`usable_cpus`).
        env: the environment as the user set it.
        ranks: training processes sharing these CPUs (``LOCAL_WORLD_SIZE``).
    """
    cpus, ranks = max(1, cpus), max(1, ranks)
    settings: dict[str, str] = {}
    reasons: list[str] = []
    given = [name for name in COUNT_VARS if env.get(name, "").strip()]
    threads: int | None
    if given:
        value = env[given[0]].strip()
        threads = int(value) if value.isdigit() and int(value) > 0 else None
        reasons.append(f"{given[0]}={value} from the environment")
        if threads is not None:  # the other one follows; a value torch cannot read is not copied
            settings.update({name: str(threads) for name in COUNT_VARS if name not in given})
    else:
        threads = max(1, cpus // ranks)
        share = f", shared by {ranks} ranks" if ranks > 1 else ""
        reasons.append(
            f"{threads} thread{'s' if threads != 1 else ''}: {cpus} usable CPU{'s' if cpus != 1 else ''}{share}"
        )
        settings.update({name: str(threads) for name in COUNT_VARS})
    chosen = [name for name in WAIT_VARS if env.get(name, "").strip()]
    if chosen:
        reasons.append(", ".join(f"{name}={env[name].strip()}" for name in chosen) + " from the environment")
    else:
        settings.update(SHORT_SPIN)
        reasons.append(
            "an idle thread spins briefly, then sleeps (GOMP_SPINCOUNT=1000, KMP_BLOCKTIME=1): "
            "no core held long from other work"
        )
    return ThreadPlan(threads, settings, tuple(reasons))


def usable_cpus(
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    sys_cpu: Path = Path("/sys/devices/system/cpu"),
) -> int:
    """The cores this process may run on: the physical cores of its affinity mask, lowered to a cgroup quota.

    Physical cores, as torch's own default counts: a second hardware thread
    of a core shares its vector units, which a matrix product already fills.
    A quota of 1.5 CPUs allows 2 threads (rounded up).
    """
    try:
        mask = os.sched_getaffinity(0)
    except (AttributeError, OSError):  # not Linux
        mask = set(range(os.cpu_count() or 1))
    cpus = physical_cores(mask, sys_cpu)
    quota = cgroup_cpu_quota(cgroup_root, proc_cgroup)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def physical_cores(mask: set[int], sys_cpu: Path) -> int:
    """How many cores the logical CPUs of ``mask`` sit on (each CPU its own core where the topology is unreadable)."""
    cores: set[tuple[str, str] | int] = set()
    for cpu in mask:
        topology = sys_cpu / f"cpu{cpu}" / "topology"
        try:
            package = (topology / "physical_package_id").read_text(encoding="utf-8").strip()
            core = (topology / "core_id").read_text(encoding="utf-8").strip()
            cores.add((package, core))
        except OSError:
            cores.add(cpu)
    return max(1, len(cores))


def cgroup_cpu_quota(cgroup_root: Path, proc_cgroup: Path) -> float | None:
    """The CPUs' worth of time the cgroups of this process allow (the tightest on its path), or ``None``.

    cgroup v2: ``cpu.max`` (``max 100000`` is no limit) in this process's
    group and each group above it; v1: ``cpu.cfs_quota_us`` (-1 is no
    limit) over ``cpu.cfs_period_us`` in the ``cpu`` controller's group.
    A file that cannot be read or parsed limits nothing.
    """
    try:
        lines = proc_cgroup.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        relative = path.strip("/")
        if controllers == "":  # v2's unified hierarchy
            for folder in _up(cgroup_root, relative):
                limits += _v2_limit(folder / "cpu.max")
        elif "cpu" in controllers.split(","):
            mount = next(
                (
                    cgroup_root / name
                    for name in (controllers, "cpu", "cpu,cpuacct")
                    if (cgroup_root / name).is_dir()
                ),
                None,
            )
            if mount is not None:
                for folder in _up(mount, relative):
                    limits += _v1_limit(folder)
    return min(limits) if limits else None


def _up(root: Path, relative: str) -> list[Path]:
    """``root/relative`` and each folder above it up to ``root``."""
    parts = [part for part in relative.split("/") if part]
    return [root.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _v2_limit(path: Path) -> list[float]:
    try:
        quota, period = path.read_text(encoding="utf-8").split()[:2]
        return [] if quota == "max" else [int(quota) / int(period)]
    except (OSError, ValueError, ZeroDivisionError):
        return []


def _v1_limit(folder: Path) -> list[float]:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text(encoding="utf-8"))
        period = int((folder / "cpu.cfs_period_us").read_text(encoding="utf-8"))
        return [quota / period] if quota > 0 and period > 0 else []
    except (OSError, ValueError):
        return []


def local_ranks(env: Mapping[str, str]) -> int:
    """How many training processes share this machine: ``LOCAL_WORLD_SIZE``, else 1."""
    value = env.get("LOCAL_WORLD_SIZE", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else 1


def configure(environ: MutableMapping[str, str] | None = None) -> ThreadPlan | None:
    """Choose and set this process's thread settings (a training or evaluating one), before torch is imported.

    Returns the plan, or ``None`` when torch was imported already (its pool
    read the environment then, and the caller chose its settings).
    """
    environ = os.environ if environ is None else environ
    if "torch" in sys.modules:
        _log.debug(
            "threads: torch was imported before this command; its thread settings are left as they are"
        )
        return None
    plan = choose(usable_cpus(), environ, ranks=local_ranks(environ))
    for name, value in plan.env.items():
        environ[name] = value
    _log.debug("threads: %s (%s)", "; ".join(plan.reasons), _load_note())
    return plan


def _load_note() -> str:
    """The 1-minute load average against the CPUs, for the debug log: what else was running at the start."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return "load average unknown"
    return f"load average {load:.2f} on {os.cpu_count() or 1} CPUs at the start"

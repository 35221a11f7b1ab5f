"""`dlm train` (and `dlm eval`) picks torch's thread count and how idle threads wait, before torch starts (#31 item 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlmstore.train.threads import (
    SHORT_SPIN,
    choose,
    configure,
    local_ranks,
    physical_cores,
    usable_cpus,
)
from tests.helpers import write_doc


def test_a_process_gets_a_thread_per_usable_core_and_threads_that_spin_only_briefly_when_idle() -> None:
    plan = choose(4, {})
    assert plan.threads == 4
    assert plan.env == {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4", **SHORT_SPIN}
    assert plan.env["GOMP_SPINCOUNT"] == "1000" and plan.env["KMP_BLOCKTIME"] == "1"
    assert "OMP_WAIT_POLICY" not in plan.env


def test_the_ranks_of_one_machine_share_its_cores_and_each_gets_at_least_one() -> None:
    assert choose(8, {}, ranks=3).threads == 2
    assert choose(2, {}, ranks=4).threads == 1
    assert choose(2, {}, ranks=4).env["OMP_NUM_THREADS"] == "1"
    assert "shared by 4 ranks" in choose(2, {}, ranks=4).reasons[0]


def test_the_users_omp_num_threads_wins_and_mkl_num_threads_follows_it() -> None:
    plan = choose(8, {"OMP_NUM_THREADS": "3"})
    assert plan.threads == 3
    assert plan.env == {"MKL_NUM_THREADS": "3", **SHORT_SPIN}
    assert plan.reasons[0] == "OMP_NUM_THREADS=3 from the environment"


def test_the_users_mkl_num_threads_alone_fixes_the_count_too() -> None:
    plan = choose(8, {"MKL_NUM_THREADS": "2"})
    assert plan.threads == 2
    assert plan.env["OMP_NUM_THREADS"] == "2" and "MKL_NUM_THREADS" not in plan.env


def test_an_omp_num_threads_that_is_not_a_plain_count_is_left_to_torch_and_not_copied() -> None:
    plan = choose(8, {"OMP_NUM_THREADS": "4,2"})
    assert plan.threads is None
    assert plan.env == SHORT_SPIN


@pytest.mark.parametrize(
    ("name", "value"),
    [("OMP_WAIT_POLICY", "active"), ("OMP_WAIT_POLICY", "PASSIVE"), ("KMP_BLOCKTIME", "200"),
     ("GOMP_SPINCOUNT", "300000")],
)  # fmt: skip
def test_a_wait_setting_the_user_made_wins_and_dlm_sets_none(name: str, value: str) -> None:
    plan = choose(2, {name: value})
    assert plan.env == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    assert plan.reasons[1] == f"{name}={value} from the environment"


def test_the_local_world_size_counts_the_ranks_and_anything_else_is_one_process() -> None:
    assert local_ranks({"LOCAL_WORLD_SIZE": "4"}) == 4
    assert (
        local_ranks({})
        == local_ranks({"LOCAL_WORLD_SIZE": "x"})
        == local_ranks({"LOCAL_WORLD_SIZE": "0"})
        == 1
    )


def _topology(root: Path, cores: list[tuple[int, int]]) -> Path:
    """A /sys/devices/system/cpu with one (package, core) per logical CPU."""
    for cpu, (package, core) in enumerate(cores):
        folder = root / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "physical_package_id").write_text(f"{package}\n")
        (folder / "core_id").write_text(f"{core}\n")
    return root


def test_two_hardware_threads_of_one_core_count_as_one_core(tmp_path: Path) -> None:
    sys_cpu = _topology(tmp_path, [(0, 0), (0, 1), (0, 0), (0, 1), (1, 0), (1, 0)])
    assert physical_cores({0, 1, 2, 3}, sys_cpu) == 2
    assert physical_cores({0, 2}, sys_cpu) == 1
    assert physical_cores({0, 4}, sys_cpu) == 2  # core 0 of two packages
    assert physical_cores({0, 9}, sys_cpu) == 2  # a CPU without a readable topology counts alone


def _cgroup_v2(root: Path, limits: dict[str, str]) -> Path:
    for group, limit in limits.items():
        folder = root / group
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cpu.max").write_text(limit + "\n")
    return root


def test_a_cgroup_cpu_quota_lowers_the_count_rounded_up(tmp_path: Path) -> None:
    root = _cgroup_v2(tmp_path / "fs", {"": "max 100000", "jobs": "150000 100000", "jobs/one": "max 100000"})
    proc = tmp_path / "cgroup"
    proc.write_text("0::/jobs/one\n")
    sys_cpu = _topology(tmp_path / "cpu", [(0, core) for core in range(64)])
    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(root, proc, sys_cpu) == min(affinity, 2)
    _cgroup_v2(root, {"jobs/one": "50000 100000"})  # the tightest group on the path counts
    assert usable_cpus(root, proc, sys_cpu) == 1


def test_a_cgroup_v1_quota_counts_and_no_limit_leaves_the_affinity(tmp_path: Path) -> None:
    group = tmp_path / "fs" / "cpu,cpuacct" / "job"
    group.mkdir(parents=True)
    (group / "cpu.cfs_quota_us").write_text("100000\n")
    (group / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/job\n2:cpu,cpuacct:/job\n")
    sys_cpu = _topology(tmp_path / "cpu", [(0, core) for core in range(64)])
    assert usable_cpus(tmp_path / "fs", proc, sys_cpu) == 1
    (group / "cpu.cfs_quota_us").write_text("-1\n")
    assert usable_cpus(tmp_path / "fs", proc, sys_cpu) == len(os.sched_getaffinity(0))
    assert usable_cpus(tmp_path / "fs", tmp_path / "no-such-file", sys_cpu) == len(os.sched_getaffinity(0))


def test_a_process_that_imported_torch_first_keeps_its_settings() -> None:
    import torch

    environ: dict[str, str] = {}
    before = torch.get_num_threads()
    assert configure(environ) is None
    assert environ == {} and torch.get_num_threads() == before


CHILD = """
import json, os, sys
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
from dlmstore.train.threads import configure
plan = configure()
import torch
print(json.dumps({"threads": torch.get_num_threads(), "plan": plan.threads,
                  "spin": os.environ.get("GOMP_SPINCOUNT"), "blocktime": os.environ.get("KMP_BLOCKTIME")}))
"""


def _child_env(**extra: str) -> dict[str, str]:
    ours = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "KMP_BLOCKTIME", "GOMP_SPINCOUNT")
    env = {k: v for k, v in os.environ.items() if k not in ours}
    return {**env, **extra}


def test_torch_started_after_configure_runs_the_chosen_threads() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], env=_child_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"threads": 1, "plan": 1, "spin": "1000", "blocktime": "1"}


def _train_log(doc: Path, *command: str, **extra: str) -> list[str]:
    """The thread lines of a `dlm -v train` (or ``command``) of ``doc`` on one CPU, in a process of its own."""
    command = command or ("train", str(doc), "--max-steps", "1")
    done = subprocess.run(
        [sys.executable, "-m", "dlmstore.cli.main", "-v", *command],
        env=_child_env(**extra), capture_output=True, text=True, timeout=600,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [line for line in done.stderr.splitlines() if line.startswith("debug: threads: ")]


def test_dlm_train_sets_the_threads_before_torch_and_a_users_count_wins(
    tmp_path: Path, tiny_base: Path
) -> None:
    doc = write_doc(
        tmp_path / "doc.dlm",
        "Prose about light.\n",
        f"base_model: {tiny_base}\ntraining:\n  sequence_len: 64\n  micro_batch_size: 1\n  grad_accum: 1\n",
    )
    (line,) = _train_log(doc)
    assert line.startswith(
        "debug: threads: 1 thread: 1 usable CPU; an idle thread spins briefly, then sleeps "
        "(GOMP_SPINCOUNT=1000, KMP_BLOCKTIME=1)"
    ), line
    (line,) = _train_log(doc, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="ACTIVE")
    assert line.startswith(
        "debug: threads: OMP_NUM_THREADS=1 from the environment; OMP_WAIT_POLICY=ACTIVE from the environment"
    ), line


def test_dlm_eval_sets_the_threads_before_torch_as_dlm_train_does(tmp_path: Path, tiny_base: Path) -> None:
    doc = write_doc(
        tmp_path / "doc.dlm",
        "Prose about light.\n\n::instruction::\n### Q\nWhat is light?\n### A\nLight.\n",
        f"base_model: {tiny_base}\ntraining:\n  sequence_len: 64\n",
    )
    (line,) = _train_log(doc, "eval", str(doc), "--base")  # the base: nothing to train first
    assert line.startswith(
        "debug: threads: 1 thread: 1 usable CPU; an idle thread spins briefly, then sleeps "
        "(GOMP_SPINCOUNT=1000, KMP_BLOCKTIME=1)"
    ), line


def test_dlm_prompt_sets_the_threads_before_torch_as_dlm_train_does(tmp_path: Path, tiny_base: Path) -> None:
    doc = write_doc(
        tmp_path / "doc.dlm",
        "Prose about light.\n",
        f"base_model: {tiny_base}\ntraining:\n  sequence_len: 64\n  micro_batch_size: 1\n  grad_accum: 1\n",
    )
    _train_log(doc)  # an adapter to ask
    (line,) = _train_log(doc, "prompt", str(doc), "What is light?", "--max-new-tokens", "2")
    assert line.startswith(
        "debug: threads: 1 thread: 1 usable CPU; an idle thread spins briefly, then sleeps "
        "(GOMP_SPINCOUNT=1000, KMP_BLOCKTIME=1)"
    ), line

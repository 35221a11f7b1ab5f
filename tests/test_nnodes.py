"""`dlm train --nnodes 2`: two launchers on localhost as two nodes; a node lost mid-run; resuming elastically."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.datasets.read.sampler import RankPartitionSampler
from dlmstore.errors import TrainingError
from dlmstore.train.checkpoints import Layout
from dlmstore.train.distributed import PEER_LOST
from dlmstore.train.launch import free_port
from dlmstore.train.trainer import train_document
from tests.helpers import write_doc
from tests.s3_server import S3Bucket
from tests.test_train_datasets import build_pretrain
from tests.test_train_s3 import upload

#: Gloo on the loopback interface, one torch thread per rank (two ranks share this machine's cores).
RANK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def nodes_doc(tmp_path: Path, base: Path, *, steps: int, every: int = 0) -> Path:
    dataset = build_pretrain(tmp_path, base, notes_count=40)  # an epoch of a few steps: several epochs a run
    checkpoints = f"  checkpoint_steps: {every}\n" if every else ""
    return write_doc(
        tmp_path / "doc.dlm",
        "Prose about light.\n\nA second paragraph of prose.\n",
        f"base_model: {base}\ntraining:\n  sequence_len: 64\n  max_steps: {steps}\n  micro_batch_size: 2\n"
        f"  grad_accum: 1\n  seed: 5\n{checkpoints}  datasets:\n    - path: {dataset}\n",
    )


def start_nodes(doc: Path, homes: tuple[Path, Path], logs: Path, *args: str) -> list[subprocess.Popen[bytes]]:
    """Two `dlm train --nnodes 2` launchers, node 0 and node 1, each with its home, meeting at 127.0.0.1."""
    port = free_port()
    logs.mkdir(exist_ok=True)
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dlmstore.cli.main",
                "-q",
                "train",
                str(doc),
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                *args,
            ],
            env={**os.environ, "DLM_HOME": str(homes[node]), **RANK_ENV},
            stdout=(logs / f"node{node}.out").open("wb"),
            stderr=(logs / f"node{node}.err").open("wb"),
        )  # fmt: skip
        for node in (0, 1)
    ]


def second_home(tmp_path: Path) -> Path:
    """Node 1's own home, as on another machine: the store is node 0's, and node 1 must never open it."""
    home = tmp_path / "node1-home"
    home.mkdir()
    return home


def store_of(home: Path) -> Path:
    (db,) = home.glob("store/*/store.db")
    return db.parent


def rank_samples(store: Path, run_id: int) -> list[list[int]]:
    """Each rank's trained positions, in order, as the run registered them."""
    conn = sqlite3.connect(store / "store.db")
    rows = conn.execute("SELECT samples_path FROM run_ranks WHERE run_id = ? ORDER BY rank", (run_id,))
    return [np.load(store / path).tolist() for (path,) in rows]


def step_sizes(items: int, batch: int, steps: int) -> list[int]:
    """Items per optimizer step, all ranks together: ``batch`` each, an epoch's last step what is left of ``items``."""
    sizes: list[int] = []
    while len(sizes) < steps:
        sizes += [min(batch, items - start) for start in range(0, items, batch)]
    return sizes[:steps]


def per_step(ranks: list[list[int]], sizes: list[int]) -> list[list[int]]:
    """The items of each step, all ranks together: each rank trains its share of the step's size."""
    steps, position = [], 0
    for size in sizes:
        share = size // len(ranks)
        steps.append(sorted(item for rank in ranks for item in rank[position : position + share]))
        position += share
    assert position == len(ranks[0])
    return steps


def reference(tmp_path: Path, doc: Path, steps: int) -> tuple[str, list[int], list[list[int]]]:
    """The adapter sha256, the items per step and the items of each step of the same run on `--nproc 2`
    (micro-batch 2), in a home of its own."""
    home = tmp_path / "nproc-home"
    home.mkdir()
    (home / "bases").symlink_to(Path(os.environ["DLM_HOME"]) / "bases")
    result = CliRunner().invoke(
        cli, ["-q", "train", str(doc), "--nproc", "2"], env={"DLM_HOME": str(home), **RANK_ENV}
    )
    assert result.exit_code == 0, result.output
    (sha256,) = sqlite3.connect(store_of(home) / "store.db").execute("SELECT sha256 FROM adapters").fetchone()
    ranks = rank_samples(store_of(home), 1)
    padded = -(-len({item for rank in ranks for item in rank}) // 2) * 2  # every item is trained each epoch
    sizes = step_sizes(padded, 4, steps)
    return sha256, sizes, per_step(ranks, sizes)


@pytest.mark.slow
def test_two_nodes_of_one_process_train_the_same_samples_to_the_same_adapter_as_one_node_of_two(
    tmp_path: Path, tiny_base: Path, s3: S3Bucket
) -> None:
    doc = nodes_doc(tmp_path, tiny_base, steps=4)
    expected_sha, sizes, expected_steps = reference(tmp_path, doc, 4)
    # the two nodes read the dataset from a bucket, each through its own node's cache
    dataset = tmp_path / "notes-ds"
    url = upload(dataset, s3, "tokens/notes")
    remote = tmp_path / "remote.dlm"
    remote.write_text(doc.read_text().replace(str(dataset), url))
    home, other = Path(os.environ["DLM_HOME"]), second_home(tmp_path)
    nodes = start_nodes(remote, (home, other), tmp_path / "logs", "--json")
    codes = [node.wait(timeout=600) for node in nodes]
    errors = [(tmp_path / "logs" / f"node{n}.err").read_text()[-3000:] for n in (0, 1)]
    assert codes == [0, 0], errors
    summary = json.loads((tmp_path / "logs" / "node0.out").read_text())
    assert (tmp_path / "logs" / "node1.out").read_bytes() == b""  # rank 0 alone reports the run
    assert (summary["world_size"], summary["adapter_sha256"]) == (2, expected_sha)
    assert per_step(rank_samples(store_of(home), 1), sizes) == expected_steps
    conn = sqlite3.connect(store_of(home) / "store.db")
    assert conn.execute("SELECT id, status, world_size FROM runs").fetchall() == [(1, "completed", 2)]
    assert not (other / "store").exists()
    for node_home in (home, other):  # each node downloaded its own copy, verified against meta.json
        (entry,) = [path for path in (node_home / "cache" / "objects").iterdir() if path.is_dir()]
        assert (entry / "meta.json").read_bytes() == (dataset / "meta.json").read_bytes()

    # torchrun's own multi-node launch (static rendezvous), one launcher per node, is accepted as it is
    port, torchrun_home = free_port(), tmp_path / "torchrun-home"
    (tmp_path / "t").mkdir()
    launchers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--nproc-per-node",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "-m",
                "dlmstore.cli.main",
                "-q",
                "train",
                str(doc),
            ],
            env={
                **os.environ,
                "DLM_HOME": str(torchrun_home if node == 0 else second_home(tmp_path / "t")),
                **RANK_ENV,
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for node in (0, 1)
    ]
    outcomes = [launcher.communicate(timeout=600) for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [0, 0], [err[-3000:] for _, err in outcomes]
    query = "SELECT sha256 FROM adapters"
    assert sqlite3.connect(store_of(torchrun_home) / "store.db").execute(query).fetchall() == [
        (expected_sha,)
    ]
    assert not (tmp_path / "t" / "node1-home" / "store").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_a_node_lost_mid_run_fails_it_in_one_line_and_resume_on_one_process_trains_the_samples_left(
    tmp_path: Path, tiny_base: Path
) -> None:
    doc = nodes_doc(tmp_path, tiny_base, steps=24, every=3)
    _, sizes, expected_steps = reference(tmp_path, doc, 24)
    home, other = Path(os.environ["DLM_HOME"]), second_home(tmp_path)
    node0, node1 = start_nodes(doc, (home, other), tmp_path / "logs")
    deadline = time.monotonic() + 300
    while not _checkpoints(home):
        assert time.monotonic() < deadline and node0.poll() is None, "no checkpoint before the run ended"
        time.sleep(0.05)
    ranks = [*psutil.Process(node0.pid).children(), *psutil.Process(node1.pid).children()]
    assert len(ranks) == 2
    node1.send_signal(signal.SIGKILL)  # node 1's launcher: its rank ends with it
    assert node0.wait(timeout=300) == 1
    node1.wait()
    _, alive = psutil.wait_procs(ranks, timeout=60)  # nothing left running on either node
    assert all(rank.status() == psutil.STATUS_ZOMBIE for rank in alive)
    assert (tmp_path / "logs" / "node0.err").read_text().splitlines() == [
        f"error: {PEER_LOST}",
        "hint: run the same `dlm train` with --resume (on every node) to continue from the last checkpoint",
    ]
    conn = sqlite3.connect(store_of(home) / "store.db")
    assert conn.execute("SELECT status, error FROM runs").fetchall() == [("failed", PEER_LOST)]
    assert not (other / "store").exists()  # node 1's rank sent its checkpoint files to rank 0

    resumed = train_document(
        str(doc), resume=True
    )  # one process: two micro-batches a step instead of two ranks
    stopped = resumed.resumed_at_step
    assert stopped is not None and stopped % 3 == 0 and (resumed.world_size, resumed.steps) == (1, 24)
    (merged,) = rank_samples(store_of(home), 2)  # the interrupted run's ranks first, then this run's steps
    each = sum(sizes[:stopped]) // 2  # what each of the two ranks trained before the checkpoint
    before = per_step([merged[:each], merged[each : 2 * each]], sizes[:stopped])
    assert before + per_step([merged[2 * each :]], sizes[stopped:]) == expected_steps


def _checkpoints(home: Path) -> int:
    try:
        return int(
            sqlite3.connect(store_of(home) / "store.db")
            .execute("SELECT COUNT(*) FROM checkpoints")
            .fetchone()[0]
        )
    except (ValueError, sqlite3.OperationalError):  # no store yet, or not migrated yet
        return 0


@pytest.mark.parametrize(
    ("total", "first", "then"), [(13, 2, 1), (12, 1, 2), (12, 1, 4), (13, 4, 2), (20, 2, 4)]
)
def test_an_epochs_items_per_step_are_the_same_on_any_world_size_that_keeps_the_global_batch(
    total: int, first: int, then: int
) -> None:
    batch = 4  # items per optimizer step, all ranks together

    def steps(world: int) -> list[list[int]]:
        shares = [
            RankPartitionSampler(total, num_replicas=world, rank=rank, seed=7, pad_to=first)
            .indices()
            .tolist()
            for rank in range(world)
        ]
        each = batch // world
        count = -(-len(shares[0]) // each)  # the last step of an epoch may be short
        return [sorted(i for share in shares for i in share[s * each : (s + 1) * each]) for s in range(count)]

    assert steps(then) == steps(first)


def test_an_epoch_padded_for_one_world_size_that_another_cannot_split_is_refused_in_one_line() -> None:
    layout = Layout(world_size=1, order_world_size=1, global_batch=4)
    with pytest.raises(TrainingError) as caught:
        layout.grad_accum_for(2, 2, samples=13)
    assert caught.value.message == (
        "cannot resume on 2 processes: an epoch of 13 items, padded to 13 for the 1 the run started on, "
        "cannot be split evenly over 2"
    )
    with pytest.raises(TrainingError) as caught:
        Layout(world_size=2, order_world_size=2, global_batch=4).grad_accum_for(3, 2, samples=12)
    assert caught.value.message == (
        "cannot resume on 3 processes: the run trains 4 items per step, which 3 processes of micro-batch 2 "
        "cannot split evenly"
    )
    assert Layout(world_size=2, order_world_size=2, global_batch=4).grad_accum_for(1, 2, samples=13) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "--master-port", "29500"],
      "--node-rank 2 is outside --nnodes 2 (0 to 1)"),
     (["--nnodes", "2", "--master-port", "29500"],
      "--nnodes 2 needs --master-addr, the address of node 0 (the same on every node)"),
     (["--nnodes", "2", "--master-addr", "h"],
      "--nnodes 2 needs --master-port, a free TCP port of node 0 (the same on every node)"),
     (["--master-addr", "h"], "--master-addr only applies with --nnodes 2 or more; leave it out"),
     (["--nnodes", "2", "--master-addr", "h", "--master-port", "1", "--watch"],
      "--watch trains in this process; leave out --nproc and --nnodes")],
)  # fmt: skip
def test_nodes_that_cannot_meet_are_a_usage_error_in_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    result = CliRunner().invoke(cli, ["train", str(doc), *args])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == f"Error: {message}"


@pytest.mark.slow
def test_a_rank_other_than_0_converts_a_built_in_base_into_its_own_home_in_a_child_outside_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # transformers' save_pretrained writes nothing on a rank other than 0 of a process group: a rank on
    # another machine, with a home of its own, converted the base to an empty folder before
    from dlmstore import bases

    monkeypatch.setenv("DLM_HOME", str(second_home(tmp_path)))
    monkeypatch.setattr(bases, "_rank_other_than_0", lambda: True)
    folder = Path(bases.model_source(bases.resolve_base("smollm2-135m")))
    assert folder == tmp_path / "node1-home" / "bases" / "smollm2-135m" / "model"
    assert {"config.json", "model.safetensors"} <= {path.name for path in folder.iterdir()}

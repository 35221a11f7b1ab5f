"""`dlm train --nproc 2`: two gloo ranks on this CPU, one run, one adapter, disjoint shares."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.errors import TrainingError
from dlmstore.train.distributed import current_world
from tests.helpers import write_doc
from tests.test_train_datasets import build_pretrain


@pytest.mark.slow
def test_two_ranks_train_one_run_save_the_adapter_once_see_disjoint_samples_and_launchers_agree(
    tmp_path: Path, tiny_base: Path
) -> None:
    dataset = build_pretrain(tmp_path, tiny_base, notes_count=80)  # ~30 windows: one epoch outlasts the run
    doc = write_doc(
        tmp_path / "doc.dlm",
        "Prose about light.\n\nA second paragraph of prose.\n",
        f"base_model: {tiny_base}\ntraining:\n  sequence_len: 64\n  max_steps: 3\n  micro_batch_size: 2\n"
        f"  grad_accum: 1\n  checkpoint_steps: 2\n  datasets:\n    - path: {dataset}\n",
    )
    result = CliRunner().invoke(
        cli, ["train", str(doc), "--nproc", "2", "--json"], env={"OMP_NUM_THREADS": "1"}
    )
    assert result.exit_code == 0, result.output
    (db,) = Path(os.environ["DLM_HOME"]).glob("store/*/store.db")
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT id, status, world_size FROM runs").fetchall() == [(1, "completed", 2)]
    assert conn.execute("SELECT version, run_id FROM adapters").fetchall() == [(1, 1)]
    assert sorted((db.parent / "adapter" / "versions").iterdir()) == [db.parent / "adapter/versions/v0001"]
    ranks = conn.execute("SELECT rank, samples, samples_path FROM run_ranks ORDER BY rank").fetchall()
    assert [(rank, samples) for rank, samples, _ in ranks] == [(0, 6), (1, 6)]  # 3 steps of 2 on each rank
    first, second = (np.load(db.parent / path).tolist() for _, _, path in ranks)
    assert len(set(first)) == len(set(second)) == 6
    assert not set(first) & set(second)
    assert conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone() == (0,)

    # torchrun and accelerate start the same ranks: the same run, to the same adapter bytes
    # (accelerate's --cpu starts one process; --multi_gpu goes through torchrun, gloo on a CPU)
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                  "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]  # fmt: skip
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    query = "SELECT sha256 FROM adapters"
    for name, launcher in (("torchrun", torchrun), ("accelerate", accelerate)):
        home = tmp_path / f"{name}-home"
        env = {**os.environ, "DLM_HOME": str(home), "OMP_NUM_THREADS": "1"}
        done = subprocess.run([*launcher, "-m", "dlmstore.cli.main", "-q", "train", str(doc)], env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, (name, done.stderr[-3000:])
        (other,) = home.glob("store/*/store.db")
        assert sqlite3.connect(other).execute(query).fetchall() == conn.execute(query).fetchall(), name
        assert sqlite3.connect(other).execute("SELECT world_size FROM runs").fetchall() == [(2,)], name


def test_a_rank_outside_the_world_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(TrainingError, match="RANK 2 is outside WORLD_SIZE 2"):
        current_world()


def test_without_a_launcher_the_world_is_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    world = current_world()
    assert (world.rank, world.size, world.is_main, world.distributed) == (0, 1, True, False)

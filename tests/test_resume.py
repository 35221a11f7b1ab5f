"""`dlm train --resume`: an interrupted run continues from its checkpoint to the uninterrupted adapter."""

from __future__ import annotations

import errno
import importlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.errors import TrainingError
from dlmstore.train.checkpoints import Checkpoint, CheckpointIdentity, check_identity
from dlmstore.train.trainer import train_document
from tests.helpers import ctrl_c_after, write_doc
from tests.test_train_datasets import build_pretrain

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def resume_doc(tmp_path: Path, base: Path, dataset: Path, *, steps: int = 6, every: int = 2) -> Path:
    frontmatter = (
        f"base_model: {base}\ntraining:\n  sequence_len: 64\n  max_steps: {steps}\n  micro_batch_size: 2\n"
        f"  grad_accum: 1\n  seed: 5\n  lora_dropout: 0.1\n  checkpoint_steps: {every}\n"
        f"  datasets:\n    - path: {dataset}\n"
    )
    return write_doc(
        tmp_path / "doc.dlm", "Prose about light and leaves.\n\nMore prose, second row.\n", frontmatter
    )


def store_db() -> Path:
    (db,) = Path(os.environ["DLM_HOME"]).glob("store/*/store.db")
    return db


def uninterrupted(tmp_path: Path, doc: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The adapter sha256 of the same run, uninterrupted, in a home of its own."""
    home = os.environ["DLM_HOME"]
    monkeypatch.setenv("DLM_HOME", str(tmp_path / "reference-home"))
    try:
        return train_document(str(doc)).adapter_sha256
    finally:
        monkeypatch.setenv("DLM_HOME", home)


def test_a_run_interrupted_at_a_step_and_resumed_ends_with_the_uninterrupted_adapter(
    tmp_path: Path, tiny_base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 5 items an epoch (2 rows, 3 windows), 3 batches: step 7 is the middle of the third epoch
    doc = resume_doc(tmp_path, tiny_base, build_pretrain(tmp_path, tiny_base), steps=9, every=3)
    expected = uninterrupted(tmp_path, doc, monkeypatch)
    with pytest.raises(KeyboardInterrupt), ctrl_c_after(8):  # the last checkpoint is step 6
        train_document(str(doc))
    conn = sqlite3.connect(store_db())
    assert conn.execute("SELECT status, error FROM runs").fetchall() == [("failed", "interrupted")]
    assert conn.execute("SELECT run_id, step FROM checkpoints ORDER BY step").fetchall() == [(1, 3), (1, 6)]
    resumed = train_document(str(doc), resume=True)
    assert (resumed.resumed_from, resumed.resumed_at_step, resumed.steps) == (1, 6, 9)
    assert resumed.adapter_sha256 == expected
    assert conn.execute("SELECT step FROM train_steps WHERE run_id = 2").fetchall() == [(7,), (8,), (9,)]
    assert conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone() == (0,)
    assert not any((store_db().parent / "checkpoints").glob("run*"))


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_to_the_same_adapter(
    tmp_path: Path, tiny_base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = resume_doc(tmp_path, tiny_base, build_pretrain(tmp_path, tiny_base), steps=40, every=3)
    expected = uninterrupted(tmp_path, doc, monkeypatch)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-m", "dlmstore.cli.main", "train", str(doc)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if _checkpoints_registered():
            break
        assert child.poll() is None, "the run finished before a checkpoint was seen"
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    result = CliRunner().invoke(cli, ["train", str(doc), "--resume", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["resumed_from"] == 1 and summary["resumed_at_step"] % 3 == 0
    assert summary["adapter_sha256"] == expected


def _checkpoints_registered() -> int:
    dbs = list(Path(os.environ["DLM_HOME"]).glob("store/*/store.db"))
    try:
        return int(sqlite3.connect(dbs[0]).execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0])
    except (IndexError, sqlite3.OperationalError):  # not created, or not migrated yet
        return 0


def _full_disk_at_step_4(target: str) -> Callable[..., Any]:
    """``target`` (``torch.save`` or our atomic writer), failing as a full disk does for checkpoint-4."""
    module, name = target.rsplit(".", 1)
    original = getattr(importlib.import_module(module), name)

    def write(path: Any, *args: Any, **kwargs: Any) -> Any:
        if "checkpoint-4" not in str(args[0] if name == "save" else path):
            return original(path, *args, **kwargs)
        if name == "save":  # what torch's stream writer raises
            raise RuntimeError(
                "[enforce fail at inline_container.cc:664] . unexpected pos: file write failed"
            )
        raise OSError(errno.ENOSPC, "No space left on device")

    return write


@pytest.mark.parametrize(
    ("target", "reason", "action"),
    [("dlmstore.train.checkpoints.write_bytes_atomic", "No space left on device", "free some disk space"),
     # torch's writer does not say why it failed, so the hint names both causes
     ("torch.save", "[enforce fail at inline_container.cc:664] . unexpected pos: file write failed",
      "check that the disk has free space and the store is writable")],
)  # fmt: skip
def test_a_full_disk_at_a_checkpoint_stops_the_run_in_one_line_and_resume_ends_with_the_uninterrupted_adapter(
    tmp_path: Path, tiny_base: Path, monkeypatch: pytest.MonkeyPatch, target: str, reason: str, action: str
) -> None:
    doc = resume_doc(tmp_path, tiny_base, build_pretrain(tmp_path, tiny_base))
    expected = uninterrupted(tmp_path, doc, monkeypatch)
    with monkeypatch.context() as patch:
        patch.setattr(target, _full_disk_at_step_4(target))
        result = CliRunner().invoke(cli, ["-q", "train", str(doc)])
    assert result.exit_code == 1
    half = store_db().parent / "checkpoints" / "run1" / "checkpoint-4"
    assert result.stderr.splitlines() == [
        f"error: cannot write the checkpoint of step 4 under {half}: {reason}",
        f"hint: {action}, then run the same `dlm train` with --resume to continue from the last checkpoint",
    ]
    conn = sqlite3.connect(store_db())
    assert conn.execute("SELECT status FROM runs").fetchall() == [("failed",)]
    assert conn.execute("SELECT run_id, step FROM checkpoints").fetchall() == [(1, 2)]
    resumed = CliRunner().invoke(cli, ["train", str(doc), "--resume", "--json"])
    assert resumed.exit_code == 0, resumed.output
    summary = json.loads(resumed.stdout)
    assert (summary["resumed_from"], summary["resumed_at_step"]) == (1, 2)
    assert summary["adapter_sha256"] == expected
    assert not half.exists()


def test_resume_with_nothing_to_resume_says_so_in_one_line(tmp_path: Path, tiny_base: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm", "Prose.\n", f"base_model: {tiny_base}\n")
    result = CliRunner().invoke(cli, ["-q", "train", str(doc), "--resume"])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == "error: nothing to resume: this store has no train run"


def test_a_checkpoint_of_another_document_version_seed_or_dataset_is_refused_with_the_reason(
    tmp_path: Path, tiny_base: Path
) -> None:
    doc = resume_doc(tmp_path, tiny_base, build_pretrain(tmp_path, tiny_base))
    with pytest.raises(KeyboardInterrupt), ctrl_c_after(3):
        train_document(str(doc))
    with pytest.raises(
        TrainingError,
        match=r"cannot resume run 1 from step 2: the seed differs from the checkpoint \(5 then, 6 now\)",
    ):
        train_document(str(doc), resume=True, seed=6)
    other = build_pretrain(tmp_path, tiny_base, name="other-ds")
    with pytest.raises(TrainingError, match="from step 2: the token datasets or their weights changed since"):
        train_document(str(doc), resume=True, datasets=[str(other)])
    doc.write_text(doc.read_text() + "\nAn edit.\n")
    result = CliRunner().invoke(cli, ["-q", "train", str(doc), "--resume"])
    assert result.exit_code == 1
    assert "cannot resume run 1 from step 2: the document changed since the checkpoint" in result.stderr


def test_a_checkpoint_of_a_base_whose_files_changed_under_the_same_name_is_refused(
    tmp_path: Path, tiny_base: Path
) -> None:
    base = tmp_path / "base"
    shutil.copytree(tiny_base, base)
    doc = resume_doc(tmp_path, base, build_pretrain(tmp_path, base))
    with pytest.raises(KeyboardInterrupt), ctrl_c_after(3):
        train_document(str(doc))
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-6}))
    result = CliRunner().invoke(cli, ["-q", "train", str(doc), "--resume"])
    assert result.exit_code == 1
    first = result.stderr.splitlines()[0]
    assert first.startswith(
        f"error: cannot resume run 1 from step 2: base_model differs from the checkpoint ({base}@sha256:"
    )
    assert f" then, {base}@sha256:" in first and first.endswith(" now)")


@pytest.mark.parametrize(
    ("field", "words"),
    [("base_model", "base_model differs from the checkpoint (base@r1 then, base@r2 now)"),
     ("world_size", "the number of processes differs from the checkpoint (2 then, 1 now)"),
     ("micro_batch_size", "the micro-batch size differs from the checkpoint (2 then, 1 now)"),
     ("inputs_sha256", "the token datasets or their weights changed since the checkpoint")],
)  # fmt: skip
def test_a_checkpoint_of_another_base_world_size_batch_size_or_dataset_is_refused(
    field: str, words: str
) -> None:
    taken = CheckpointIdentity("sha256:d", "base@r1", "sha256:i", 2, 2, 1, 5)
    now = {"base_model": "base@r2", "world_size": 1, "micro_batch_size": 1, "inputs_sha256": "sha256:j"}
    current = CheckpointIdentity(**{**taken.__dict__, field: now[field]})
    checkpoint = Checkpoint(run_id=3, phase="sft", step=8, path=Path("/x"), identity=taken)
    with pytest.raises(TrainingError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_identity(checkpoint, current, fields=(field,))


def test_an_unregistered_checkpoint_folder_of_a_stopped_run_is_swept_by_the_next_run(
    tmp_path: Path, tiny_base: Path
) -> None:
    doc = write_doc(
        tmp_path / "doc.dlm", "Prose.\n",
        f"base_model: {tiny_base}\ntraining:\n  sequence_len: 64\n  max_steps: 1\n  micro_batch_size: 1\n",
    )  # fmt: skip
    train_document(str(doc))
    half = store_db().parent / "checkpoints" / "run1" / "checkpoint-7"
    half.mkdir(parents=True)
    (half / "adapter_model.safetensors").write_bytes(b"cut off")
    train_document(str(doc))
    assert not half.exists()

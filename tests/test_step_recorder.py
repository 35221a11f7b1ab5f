"""The step recorder: each logged step lands in train_steps with its phase, the other numbers in train_step_metrics."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dlmstore.home import store_dir
from dlmstore.progress import ProgressUpdate, reporting
from dlmstore.store.database import Store, open_store
from dlmstore.store.runs import start_run
from dlmstore.train.loops.callbacks import FLUSH_EVERY, StepRecorder

from .helpers import VALID_ID

# What TRL 1.16's DPOTrainer logs at a logging step (the keys are TRL's, the values made up).
DPO_LOG = {
    "loss": 0.6931, "grad_norm": 1.25, "learning_rate": 5e-06, "num_tokens": 512.0, "entropy": 2.5,
    "logits/chosen": -1.5, "logits/rejected": -1.75, "mean_token_accuracy": 0.25,
    "rewards/chosen": 0.125, "rewards/rejected": -0.25, "rewards/accuracies": 0.75, "rewards/margins": 0.375,
    "logps/chosen": -50.5, "logps/rejected": -55.25, "epoch": 0.5,
}  # fmt: skip


def _db() -> sqlite3.Connection:
    return sqlite3.connect(store_dir(VALID_ID) / "store.db")


def _log(recorder: StepRecorder, step: int, logs: dict[str, Any]) -> None:
    recorder.on_log(None, SimpleNamespace(global_step=step, max_steps=10), None, logs=dict(logs))


def _run(store: Store) -> int:
    return start_run(store, command="train", dlm_path=Path("/tmp/doc.dlm"), dlm_sha256="ab")


def test_a_preference_step_lands_with_its_phase_and_every_other_number_under_trls_name() -> None:
    with open_store(VALID_ID) as store:
        run_id = _run(store)
        recorder = StepRecorder(store, run_id, phase="preference")
        _log(recorder, 1, {**DPO_LOG, "note": "not a number", "flag": True})
        recorder.flush()
    db = _db()
    assert db.execute(
        "SELECT run_id, phase, step, epoch, loss, learning_rate FROM train_steps"
    ).fetchall() == [(run_id, "preference", 1, 0.5, 0.6931, 5e-06)]
    metrics = dict(
        db.execute("SELECT name, value FROM train_step_metrics WHERE phase = 'preference' AND step = 1")
    )
    skipped = {"loss", "learning_rate", "epoch", "num_tokens"}
    assert metrics == {name: value for name, value in DPO_LOG.items() if name not in skipped}


def test_sft_and_preference_steps_of_one_run_keep_their_own_step_numbers() -> None:
    with open_store(VALID_ID) as store:
        run_id = _run(store)
        for phase in ("sft", "preference"):
            recorder = StepRecorder(store, run_id, phase=phase)
            _log(recorder, 1, {"loss": 2.0, "grad_norm": 0.5, "learning_rate": 1e-4})
            _log(recorder, 2, {"loss": 1.0, "grad_norm": 0.25, "learning_rate": 1e-4})
            _log(recorder, 2, {"train_loss": 1.5, "train_runtime": 3.0})  # the end-of-training summary
            recorder.flush()
    db = _db()
    assert db.execute("SELECT phase, step, loss FROM train_steps ORDER BY phase DESC, step").fetchall() == [
        ("sft", 1, 2.0), ("sft", 2, 1.0), ("preference", 1, 2.0), ("preference", 2, 1.0),
    ]  # fmt: skip
    assert db.execute("SELECT DISTINCT name FROM train_step_metrics").fetchall() == [("grad_norm",)]
    assert db.execute("SELECT COUNT(*) FROM train_step_metrics").fetchone() == (4,)


def test_steps_and_their_metrics_are_written_together_in_batches_and_reported_as_progress() -> None:
    seen: list[ProgressUpdate] = []
    with open_store(VALID_ID) as store, reporting(seen.append):
        run_id = _run(store)
        recorder = StepRecorder(store, run_id, phase="preference")
        recorder.on_train_begin(SimpleNamespace(learning_rate=5e-06), SimpleNamespace(max_steps=10), None)
        for step in range(1, FLUSH_EVERY):
            _log(recorder, step, DPO_LOG)
        assert _db().execute("SELECT COUNT(*) FROM train_steps").fetchone() == (0,)
        _log(recorder, FLUSH_EVERY, DPO_LOG)
        db = _db()
        assert db.execute("SELECT COUNT(*) FROM train_steps").fetchone() == (FLUSH_EVERY,)
        assert db.execute("SELECT COUNT(DISTINCT step) FROM train_step_metrics").fetchone() == (FLUSH_EVERY,)
        assert recorder.pending == [] and recorder.pending_metrics == []
    assert [(u.done, u.total, u.details["loss"]) for u in seen[1:]] == [
        (step, 10, 0.6931) for step in range(1, FLUSH_EVERY + 1)
    ]
    assert {u.task for u in seen} == {"training preference"}
    assert recorder.last_loss == 0.6931

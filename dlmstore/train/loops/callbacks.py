"""The trainer callback that records each training step in store.db.

Each logged step becomes a ``train_steps`` row of its phase (``sft`` or
``preference``: each phase's trainer counts steps from 1). The loss,
learning rate and epoch have columns there, and ``num_tokens`` becomes
``tokens_per_second``; every other number in the log goes to
``train_step_metrics`` under the name the trainer logged it with (TRL's
DPO/ORPO ``rewards/chosen``, ``rewards/margins``, ``rewards/accuracies``,
``logps/...``; SFT's ``grad_norm``, ``mean_token_accuracy``, ...), so a new
TRL metric is stored without a schema change.

A logged loss or gradient norm that is NaN or infinite stops the run at
that step (``dlmstore.train.loops.integrity.check_logged``): the step is recorded,
so ``dlm metrics --run-id`` shows where it diverged, and the
:class:`TrainingError` fails the run before anything is registered.

This module subclasses ``transformers.TrainerCallback`` at import time, so
only the trainer imports it, once training starts (``trainer._fit``):
``dlm show``, ``dlm cache`` and ``dlm metrics`` never import transformers.
"""

from __future__ import annotations

import numbers
import time
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from dlmstore.clock import utc_now
from dlmstore.progress import Task
from dlmstore.train.loops.integrity import check_logged

if TYPE_CHECKING:
    from dlmstore.store.database import Store
    from dlmstore.train.adapters import Phase

#: Logged keys with a home in ``train_steps``; the other numbers go to ``train_step_metrics``.
STEP_COLUMNS = frozenset({"loss", "learning_rate", "epoch", "num_tokens"})
#: Logged steps kept in memory before they are written in one transaction.
FLUSH_EVERY = 20


class StepRecorder(TrainerCallback):
    """Records each logged step of one phase, in batches, and reports progress.

    Also times the first step (``first_step_s``), which ``dlm train --json``
    reports as the start-up cost before training proper.
    """

    def __init__(self, store: Store | None, run_id: int, phase: Phase = "sft") -> None:
        self.store = store
        self.run_id = run_id
        self.phase = phase
        self.task: Task | None = None  # the phase's progress (dlmstore.progress), from its first step
        self.pending: list[tuple[Any, ...]] = []
        self.pending_metrics: list[tuple[str | int | float, ...]] = []
        self.last_loss: float | None = None
        self.started = time.perf_counter()
        self.first_step_s: float | None = None
        self.last_tokens = 0.0
        self.last_time = self.started
        self.learning_rate: float | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = self.last_time = time.perf_counter()
        self.learning_rate = float(args.learning_rate)
        self.task = Task(f"training {self.phase}", total=int(state.max_steps), unit="steps")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.task is not None:
            self.task.finish(int(state.global_step))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.first_step_s is None:
            self.first_step_s = time.perf_counter() - self.started

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        logs = logs or {}
        if "loss" not in logs:
            return
        now = time.perf_counter()
        tokens = float(logs.get("num_tokens", 0.0))
        rate = (
            (tokens - self.last_tokens) / (now - self.last_time) if now > self.last_time and tokens else None
        )
        self.last_tokens, self.last_time = tokens, now
        self.last_loss = float(logs["loss"])
        step = int(state.global_step)
        self.pending.append(
            (self.run_id, self.phase, step, logs.get("epoch"), self.last_loss, logs.get("learning_rate"),
             rate, utc_now())
        )  # fmt: skip
        self.pending_metrics.extend(
            (self.run_id, self.phase, step, name, float(value))
            for name, value in logs.items()
            if name not in STEP_COLUMNS and isinstance(value, numbers.Real) and not isinstance(value, bool)
        )
        if self.task is not None:
            self.task.update(step, total=int(state.max_steps), loss=self.last_loss, **{"tokens/s": rate})
        if len(self.pending) >= FLUSH_EVERY:
            self.flush()
        check_logged(logs, phase=self.phase, step=step, learning_rate=self.learning_rate)

    def flush(self) -> None:
        """Write the pending steps and their metrics in one transaction."""
        if not self.pending:
            return
        if self.store is None:  # a rank other than 0 records nothing
            self.pending.clear()
            self.pending_metrics.clear()
            return
        with self.store.write() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO train_steps (run_id, phase, step, epoch, loss, learning_rate, "
                "tokens_per_second, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                self.pending,
            )
            conn.executemany(
                "INSERT OR REPLACE INTO train_step_metrics (run_id, phase, step, name, value) "
                "VALUES (?, ?, ?, ?, ?)",
                self.pending_metrics,
            )
        self.pending.clear()
        self.pending_metrics.clear()

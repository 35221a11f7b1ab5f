"""The trainer callback that records each training step in store.db.

This module subclasses ``transformers.TrainerCallback`` at import time, so
only the trainer imports it, once training starts (``trainer._fit``):
``dlm show``, ``dlm cache`` and ``dlm metrics`` never import transformers.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from dlmstore.clock import utc_now

if TYPE_CHECKING:
    from dlmstore.store.database import Store
    from dlmstore.train.trainer import TrainProgress


class StepRecorder(TrainerCallback):
    """Records each logged step in ``train_steps``, in batches, and reports progress.

    Also times the first step (``first_step_s``), which ``dlm train --json``
    reports as the start-up cost before training proper.
    """

    def __init__(self, store: Store, run_id: int, progress: TrainProgress | None) -> None:
        self.store = store
        self.run_id = run_id
        self.progress = progress
        self.pending: list[tuple[Any, ...]] = []
        self.last_loss: float | None = None
        self.started = time.perf_counter()
        self.first_step_s: float | None = None
        self.last_tokens = 0.0
        self.last_time = self.started

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = self.last_time = time.perf_counter()

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
        self.pending.append(
            (self.run_id, int(state.global_step), logs.get("epoch"), self.last_loss,
             logs.get("learning_rate"), rate, utc_now())
        )  # fmt: skip
        if self.progress:
            self.progress(int(state.global_step), int(state.max_steps), self.last_loss, rate)
        if len(self.pending) >= 20:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        with self.store.write() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO train_steps (run_id, step, epoch, loss, learning_rate, "
                "tokens_per_second, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                self.pending,
            )
        self.pending.clear()

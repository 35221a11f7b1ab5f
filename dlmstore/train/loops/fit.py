"""A phase's fit: run a constructed TRL/transformers trainer to the end and keep what it gave.

Both loops (:mod:`.supervised` for SFT, :mod:`.preference` for DPO/ORPO)
build their trainer and hand it to :func:`run_trainer`, which trains, reads
the numbers the run logged and returns a :class:`PhaseFit`: the steps, the
final loss, the plan with the modules peft actually adapted, the timings
and a ``save`` that writes the adapter and checks it is finite
(:mod:`.integrity`). The pipeline (:mod:`dlmstore.train.trainer`) stages and
publishes what the fits save; it is the only caller of the loops, and
nothing here imports it back.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmstore.collector import frozen
from dlmstore.train.adapters import Phase, PreferenceMethod
from dlmstore.train.plan import TrainingPlan


@dataclass
class PhaseFit:
    """What training one phase gave: its numbers, the trained model and how to save its adapter."""

    phase: Phase
    method: PreferenceMethod | None
    steps: int
    final_loss: float | None
    metrics: dict[str, float]
    plan: TrainingPlan
    trainer_setup: float
    first_step: float
    train: float
    model: Any
    save: Callable[[Path], None]
    save_seconds: float = 0.0
    dataset_seconds: float = 0.0
    restore_seconds: float = 0.0
    accounting: dict[str, Any] | None = None
    validation: Any = None  # the SFT phase's Validation callback (dlmstore.train.loops.validation)
    eval_seconds: float = 0.0  # validating during training (taken out of ``train``) and evaluating after


def run_trainer(
    trainer: Any,
    recorder: Any,
    tokenizer: Any,
    plan: TrainingPlan,
    setup: float,
    *,
    adapter_names: list[str] | None,
    method: PreferenceMethod | None = None,
    resume_from: str | None = None,
) -> PhaseFit:
    """Run a constructed TRL trainer to the end; the fit saves ``adapter_names`` (None: all).

    The plan's ``target_modules`` is replaced by the modules peft adapted,
    so the summary says what ``auto`` picked. The trainer is dropped before
    returning (its optimizer state with it); the model is kept for a next phase.
    """
    phase = recorder.phase
    try:
        t0 = time.perf_counter()
        with frozen():  # the collection training starts with walks none of what was alive before
            outcome = trainer.train(resume_from_checkpoint=resume_from)
        train_s = time.perf_counter() - t0
    finally:
        recorder.flush()
    trained: Any = trainer.model  # the peft model TRL wrapped
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    last = logged[-1] if logged else {}
    metrics = {
        key: float(value)
        for key, value in last.items()
        if key not in ("loss", "learning_rate", "epoch", "step", "num_tokens")
        and isinstance(value, int | float)
    }

    def save(folder: Path) -> None:
        from dlmstore.train.adapters import WEIGHTS
        from dlmstore.train.loops.integrity import check_adapter_weights

        trained.save_pretrained(folder, selected_adapters=adapter_names)
        check_adapter_weights(folder / WEIGHTS, phase=phase, learning_rate=recorder.learning_rate)
        tokenizer.save_pretrained(folder)

    adapted = sorted(trained.peft_config["default"].target_modules)
    fit = PhaseFit(
        phase=phase,
        method=method,
        steps=int(outcome.global_step),
        final_loss=recorder.last_loss,
        metrics=metrics,
        plan=dataclasses.replace(plan, target_modules=adapted),
        trainer_setup=setup,
        first_step=recorder.first_step_s or 0.0,
        train=train_s,
        model=trained,
        save=save,
    )
    del trainer, outcome
    gc.collect()
    return fit

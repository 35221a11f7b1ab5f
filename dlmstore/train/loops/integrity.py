"""Training refuses numbers that are not finite: a diverged run stops, and NaN weights are never published.

A learning rate far too high (``1e308`` is finite, so the frontmatter
accepts it: DLM bounds ``learning_rate`` below only) turns the loss and
the gradients into inf or NaN within a step or two, and from then on every
adapter weight is NaN. Before these checks such a run ended with exit 0
and a registered adapter that ``dlm prompt`` would load. Two gates, as in
DLM (``dlm/train/loops/integrity.py``):

* :func:`check_logged`, on every logged step (the step recorder calls it):
  a loss or gradient norm that is not finite stops the run at that step;
* :func:`check_adapter_weights`, on the saved adapter before it is staged:
  every tensor of ``adapter_model.safetensors`` must be finite, which also
  catches a divergence in a step after the last one logged.

Either raises :class:`TrainingError`, so the run is marked failed and the
publish unit (``dlmstore.train.adapters``) registers nothing: no adapter
row, no version folder, ``dlm.lock`` untouched. The hint names the learning
rate key of the phase that diverged.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlmstore.errors import TrainingError

#: The logged values a diverged step shows in.
CHECKED_LOGS = ("loss", "grad_norm")

#: The frontmatter key of each phase's learning rate, for the hint.
LEARNING_RATE_KEYS = {
    "sft": "training.learning_rate",
    "preference": "training.preference.hyperparams.learning_rate",
}


def check_logged(logs: Mapping[str, Any], *, phase: str, step: int, learning_rate: float | None) -> None:
    """Raise TrainingError when a logged loss or gradient norm is NaN or infinite.

    Args:
        logs: what the trainer logged at ``step``.
        phase: ``sft`` or ``preference``.
        step: the phase's step number.
        learning_rate: the phase's configured learning rate (for the hint).
    """
    bad = [
        f"{name} is {float(value)}"
        for name in CHECKED_LOGS
        if isinstance(value := logs.get(name), numbers.Real) and not math.isfinite(float(value))
    ]
    if bad:
        raise TrainingError(
            f"the {phase} phase diverged at step {step}: {' and '.join(bad)}; training stopped "
            "and nothing was registered",
            hint=_hint(phase, learning_rate),
        )


def check_adapter_weights(weights: Path, *, phase: str, learning_rate: float | None) -> None:
    """Raise TrainingError when a tensor of the saved adapter ``weights`` holds NaN or inf."""
    import torch
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as tensors:
        names = list(tensors.keys())
        bad = [name for name in names if not bool(torch.isfinite(tensors.get_tensor(name)).all())]
    if bad:
        raise TrainingError(
            f"the {phase} adapter has {len(bad)} of {len(names)} tensors holding NaN or inf "
            f"(first: {bad[0]}); nothing was registered",
            hint=_hint(phase, learning_rate),
        )


def _hint(phase: str, learning_rate: float | None) -> str:
    key = LEARNING_RATE_KEYS.get(phase, "the learning rate")
    now = "" if learning_rate is None else f" (it is {learning_rate:g})"
    return f"lower {key}{now} and train again; a warmup (training.warmup_ratio) also steadies the first steps"

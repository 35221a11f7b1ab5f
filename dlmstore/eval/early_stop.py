"""When the val split is evaluated during training, and when it stops training: DLM's rules.

DLM evaluates every ``max_steps // 4`` optimizer steps (at least 1) when
the run has a step cap, else every 50 (``dlm.train.trainer._default_eval_steps``),
at each step that is a multiple of that interval, as transformers'
``eval_strategy="steps"`` does. Early stopping is transformers'
``EarlyStoppingCallback`` with DLM's settings (``dlm.eval.early_stop``):
patience 3, threshold 0. An evaluation improves when its loss is below the
best so far by more than the threshold; after ``patience`` evaluations in a
row that do not, training stops at that step (unless it is the last step
anyway). DLM keeps the last step's
weights, not the best step's (it saves no checkpoints to reload one), and
so does dlmstore: the step chosen is the step training stopped at, and the
best step is recorded beside it. A step cap that is a multiple of 4 gives
four evaluations, the last at the last step, so patience 3 never ends such
a run early; another cap evaluates more often (10 steps: every 2, five
times) or last before the end (30 steps: at 7, 14, 21 and 28), and there
early stopping can end it, as it can a run without a cap.

:class:`EarlyStopping` is the rule alone, with no trainer: the SFT loop's
callback feeds it each val loss (``dlmstore.train.loops.validation``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlmstore.plural import plural

#: DLM's ``EarlyStopConfig`` defaults; its v15 frontmatter has no key for either.
PATIENCE = 3
THRESHOLD = 0.0
#: DLM's cadence without a step cap.
EPOCH_RUN_INTERVAL = 50


def eval_interval(max_steps: int | None) -> int:
    """Steps between two evaluations of the val split (DLM's ``_default_eval_steps``)."""
    if max_steps is not None and max_steps > 0:
        return max(1, max_steps // 4)
    return EPOCH_RUN_INTERVAL


@dataclass
class EarlyStopping:
    """The best val loss so far, and whether it is time to stop (see the module docstring)."""

    patience: int = PATIENCE
    threshold: float = THRESHOLD
    best_loss: float | None = None
    best_step: int | None = None
    misses: int = 0
    stopped_at: int | None = None

    def update(self, step: int, loss: float | None, *, last: bool = False) -> bool:
        """Take the val loss after ``step``; True when training should stop there.

        A loss that is missing or not finite never improves. At the ``last``
        step training ends anyway: running out of patience there is not an
        early stop (DLM's ``was_early_stopped`` says the same).
        """
        if loss is not None and math.isfinite(loss) and self._improves(loss):
            self.best_loss, self.best_step, self.misses = loss, step, 0
        else:
            self.misses += 1
        if self.misses >= self.patience and not last:
            self.stopped_at = step
            return True
        return False

    def _improves(self, loss: float) -> bool:
        best = self.best_loss
        return best is None or (loss < best and abs(loss - best) > self.threshold)

    def reason(self, last_step: int) -> str:
        """Why the phase ended at ``last_step``, in one line."""
        if self.stopped_at is not None:
            return (
                f"early stopping at step {self.stopped_at}: the val loss did not improve on "
                f"{_loss(self.best_loss)} (step {self.best_step}) in {self.patience} evaluations"
            )
        if self.best_step is None:
            return f"trained all {last_step} steps; no val loss was finite"
        since = f", not improved on in {plural(self.misses, 'evaluation')} after it" if self.misses else ""
        return f"trained all {last_step} steps; best val loss {_loss(self.best_loss)} at step {self.best_step}{since}"


def _loss(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"

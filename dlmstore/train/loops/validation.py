"""The SFT phase's validation: the val loss every few steps, recorded, and early stopping.

:class:`Validation` is a trainer callback. After each optimizer step that
is a multiple of the interval (``dlmstore.eval.early_stop.eval_interval``:
DLM's ``max_steps // 4``, or 50 without a step cap) it evaluates the val
split (``dlmstore.eval.inference.val_loss``: no gradients, no dropout, the
random state put back, so the training that follows is the one that would
have run without it), records the loss in ``val_steps`` and feeds it to
:class:`~dlmstore.eval.early_stop.EarlyStopping`, which may end the phase
at that step. Every rank evaluates its share and gets the same loss, so
every rank stops at the same step.

A resumed run replays the val losses its interrupted run recorded up to the
checkpoint's step into the early-stopping state, so it stops where the
uninterrupted run would have.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from dlmstore.eval.early_stop import EarlyStopping
from dlmstore.eval.inference import evaluating, val_loss
from dlmstore.eval.results import EarlyStop, ModelEval, PhaseEval, record_val_step

if TYPE_CHECKING:
    from dlmstore.eval.probes import Probe
    from dlmstore.store.database import Store
    from dlmstore.train.distributed import World


class Validation(TrainerCallback):
    """Evaluates the val split every ``interval`` steps; records it; stops early (see the module docstring)."""

    def __init__(
        self,
        store: Store | None,
        run_id: int,
        dataset: Any,
        collate: Any,
        batch_size: int,
        world: World,
        interval: int,
        stopping: EarlyStopping,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.dataset = dataset
        self.collate = collate
        self.batch_size = batch_size
        self.world = world
        self.interval = interval
        self.stopping = stopping
        self.seconds = 0.0  # time spent evaluating, inside the trainer's train()
        self.last: tuple[int, float | None, int, int] | None = None  # step, loss, items, tokens

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        step = int(state.global_step)
        if step % self.interval:
            return
        t0 = time.perf_counter()
        with evaluating(model):
            loss, items, tokens = val_loss(
                model,
                self.dataset,
                self.collate,
                self.batch_size,
                rank=self.world.rank,
                world_size=self.world.size,
            )
        self.last = (step, loss, items, tokens)
        if self.store is not None:
            with self.store.write() as conn:
                record_val_step(conn, self.run_id, "sft", step, loss, items, tokens)
        if self.stopping.update(step, loss, last=step >= int(state.max_steps)):
            control.should_training_stop = True
        self.seconds += time.perf_counter() - t0

    def early_stop(self, last_step: int) -> EarlyStop:
        """How the phase used its val split, once it has ended at ``last_step``."""
        stopping = self.stopping
        return EarlyStop(
            interval=self.interval,
            patience=stopping.patience,
            best_step=stopping.best_step,
            best_val_loss=None if stopping.best_loss is None else round(stopping.best_loss, 6),
            stopped_early=stopping.stopped_at is not None,
            stopped_at=stopping.stopped_at,
            reason=stopping.reason(last_step),
        )


def val_history(store: Store, run_id: int | None, up_to: int | None) -> tuple[tuple[int, float | None], ...]:
    """The ``(step, val loss)`` pairs run ``run_id`` recorded up to step ``up_to`` (none without a run)."""
    if run_id is None or up_to is None:
        return ()
    with store.read() as conn:
        rows = conn.execute(
            "SELECT step, loss FROM val_steps WHERE run_id = ? AND phase = 'sft' AND step <= ? ORDER BY step",
            (run_id, up_to),
        ).fetchall()
    return tuple((int(row["step"]), row["loss"]) for row in rows)


def replayed(history: tuple[tuple[int, float | None], ...]) -> EarlyStopping:
    """The early-stopping state after the val losses of ``history`` (what a resumed run continues from)."""
    stopping = EarlyStopping()
    for step, loss in history:
        stopping.update(step, loss)
    return stopping


def after_phase(
    fit: Any,
    tokenizer: Any,
    val: tuple[Any, int] | None,
    probes: Any,
    system_prompt: str | None,
    world: World,
    batch_size: int,
    base: ModelEval | None,
    answered: dict[str, list[list[int]]],
    *,
    retained: Sequence[Probe] = (),
    retention: tuple[Any, int] | None = None,
    previous: Path | None = None,
) -> PhaseEval:
    """The base (``base`` when a phase before measured it) and the phase's adapter, side by side.

    The adapter's val loss is the training's last evaluation when that was
    the phase's last step; rank 0 asks the probes. ``answered`` holds the
    probes' answers (token ids) of the models the run asked before (the
    base's, an earlier phase's adapter's), checked as drafts
    (``dlmstore.eval.inference.ask``); this phase's are added to it.

    ``retained`` are the probes of earlier versions of the document and
    ``retention`` the retention slice's rows it no longer holds (the replay
    history's), asked and measured beside the current ones; ``previous`` is
    the folder of the newest adapter of the same phase trained before this
    run, whose loss on those rows is measured too (loaded beside the new
    adapter and removed again), so the adapter's ``retention_delta`` says
    what it forgot of them.
    """
    from dlmstore.eval.inference import as_base, evaluate_model
    from dlmstore.eval.results import with_previous
    from dlmstore.train.data.examples import Collator, pad_token_id

    model = fit.model
    t0 = time.perf_counter()
    pad = pad_token_id(tokenizer)
    args = None if val is None else (val[0], Collator(pad, val[1]), batch_size)
    kept = None if retention is None else (retention[0], Collator(pad, retention[1]), batch_size)
    common: dict[str, Any] = {
        "val": args,
        "probes": probes,
        "system_prompt": system_prompt,
        "rank": world.rank,
        "world_size": world.size,
        "answered": answered,
        "retained": retained,
        "retention": kept,
    }
    if base is None:
        with as_base(model):
            base = evaluate_model(model, tokenizer, adapter_version=None, **common)
    validation: Validation | None = fit.validation
    last = None if validation is None else validation.last
    known = last[1:] if last is not None and last[0] == fit.steps else None
    adapter = evaluate_model(
        model, tokenizer, adapter_version=None, label="adapter", known_val=known, **common
    )
    if kept is not None and previous is not None and adapter.retention_loss is not None:
        kept = (retention[0], Collator(pad, retention[1]), batch_size)  # type: ignore[index]
        adapter = with_previous(adapter, previous_loss(model, previous, kept, world))
    fit.eval_seconds += time.perf_counter() - t0
    early = None if validation is None else validation.early_stop(fit.steps)
    return PhaseEval(phase=fit.phase, base=base, adapter=adapter, early_stop=early)


#: The name the previous adapter is loaded under, beside the one being trained.
_PREVIOUS = "dlm_previous"


def previous_loss(model: Any, folder: Path, kept: tuple[Any, Any, int], world: World) -> float | None:
    """The loss on ``kept`` of the adapter in ``folder``, loaded beside ``model``'s own and removed
    again (``model``'s active adapter, its trainable state and the random state are as they were)."""
    from dlmstore.eval.inference import evaluating, val_loss

    if not hasattr(model, "load_adapter") or not hasattr(model, "peft_config"):
        return None
    active = model.active_adapter
    trainable = {name: param.requires_grad for name, param in model.named_parameters()}
    model.load_adapter(str(folder), adapter_name=_PREVIOUS, is_trainable=False)
    try:
        model.set_adapter(_PREVIOUS)
        dataset, collate, batch_size = kept
        with evaluating(model):
            loss, _, _ = val_loss(model, dataset, collate, batch_size, rank=world.rank, world_size=world.size)
    finally:
        model.set_adapter(active)
        model.delete_adapter(_PREVIOUS)
        for name, param in model.named_parameters():
            if name in trainable:
                param.requires_grad_(trainable[name])
    return loss

"""The base model one ``dlm train`` invocation loads once and lends to each named adapter's run.

A named adapter's run trains LoRA layers that peft injects into the base
model; the base's own weights are frozen and never change. When the run
ends, :meth:`BaseLoan.give_back` removes those layers again
(``PeftModel.unload``: the modules peft replaced are put back, nothing is
merged), and the next adapter's run borrows the same model instead of
reading it from disk: the base loads once per invocation, not once per
adapter. Each borrow seeds and sets the deterministic flags exactly as a
fresh load does, so an adapter's bytes depend only on the invocation's
inputs (two fresh homes train the same bytes for every adapter).

A run that fails returns nothing: the model may hold half-injected layers,
so the loan is emptied and the next borrower loads afresh.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class BaseLoan:
    """The lent base model and the load settings it was loaded with (empty until the first give-back)."""

    key: tuple[str, str, str] | None = None
    model: Any = None
    loads: int = 0  # how many times the base was read from disk in this invocation

    def borrow(self, key: tuple[str, str, str], load: Callable[[], Any], *, seed: int) -> Any:
        """The base model for a run whose load settings are ``key`` (base, adapter kind, precision):
        the lent one when it was loaded with the same settings, else ``load()``."""
        from dlmstore.determinism import apply_determinism, seed_everything

        model, self.model = self.model, None
        if model is not None and self.key == key:
            seed_everything(seed)
            apply_determinism()
            return model
        self.key = key
        self.loads += 1
        return load()

    def give_back(self, model: Any) -> None:
        """Take the base back from a trained run's model, its adapter layers removed."""
        from peft import PeftModel

        if isinstance(model, PeftModel):
            model = model.unload()
        self.model = model

    def empty(self) -> None:
        """Drop the lent model (a run failed while it held it)."""
        self.model = None

"""A gate's folder: ``<store>/gate/run<N>/`` with ``gate.safetensors`` and ``gate.json``.

``gate.safetensors`` holds the fitted MLP's four tensors (a uniform gate
has none, and no such file); ``gate.json`` says what the gate is: the
adapters in output order, its sizes and mode, the settings and seed it was
fitted with, and its mean output over the training prompts. The folder is
named after the train run of the invocation that fitted it, staged beside
its final name and renamed into place whole (``dlmstore.store.atomic``);
store.db's ``gates`` row (:mod:`.gates`) is committed after, with the
weights' sha256 and size.

The same gate gives the same bytes: the tensors go in sorted by name with
no free-form header metadata, and ``gate.json`` is written with sorted keys.

:func:`load_gate` is how anything uses a stored gate: the weights are read
once, hashed and compared with the sha256 store.db recorded before torch
sees them, as ``dlmstore.train.adapters.checked_folder`` does for adapters,
so a damaged or missing file is refused by name instead of routing prompts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlmstore.errors import BaseModelError
from dlmstore.store.atomic import publish_dir

if TYPE_CHECKING:
    import torch

    from dlmstore.document.frontmatter import GateSettings
    from dlmstore.gate.fitting import FittedGate, GateMode

#: The gates' folder in a store; each gate is ``gate/run<N>``.
GATES_DIR = "gate"
WEIGHTS_NAME = "gate.safetensors"
META_NAME = "gate.json"
#: What to do about a damaged or missing gate.
DAMAGED_HINT = "train again (dlm train) to fit a new gate, or prompt with --adapter NAME or --gate off"


def gate_folder(run_id: int) -> str:
    """The folder of the gate fitted by train run ``run_id``, relative to the store (``gate/run7``)."""
    return f"{GATES_DIR}/run{run_id}"


def write_gate(
    folder: Path, fitted: FittedGate, *, seed: int, settings: GateSettings
) -> tuple[str | None, int | None]:
    """Write ``fitted`` as the folder ``folder`` (staged beside it, renamed into place whole).

    A leftover folder of that name (a run killed before its row was
    committed; run ids are never reused) is replaced.

    Returns:
        The ``sha256:`` digest and size of ``gate.safetensors``, or
        ``(None, None)`` for a uniform gate, which has no weights.
    """
    weights = None if fitted.state is None else safetensors_bytes(fitted.state)
    meta = {
        "format": "dlmstore-gate/1",
        "mode": fitted.mode,
        "names": list(fitted.names),
        "input_dim": fitted.input_dim,
        "hidden_proj_dim": fitted.hidden_proj_dim,
        "steps": fitted.steps,
        "lr": settings.lr,
        "entropy_lambda": settings.entropy_lambda,
        "cold_start_floor": settings.cold_start_floor,
        "seed": seed,
        "prompts": fitted.prompts,
        "final_loss": fitted.final_loss,
        "mean_weights": fitted.mean_weights,
        "note": fitted.note,
        "weights": None if weights is None else {"file": WEIGHTS_NAME, "sha256": sha256_of(weights)},
    }
    folder.parent.mkdir(parents=True, exist_ok=True)
    with publish_dir(folder, existing="replace") as staging:
        if weights is not None:
            (staging / WEIGHTS_NAME).write_bytes(weights)
        (staging / META_NAME).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if weights is None:
        return None, None
    return sha256_of(weights), len(weights)


def safetensors_bytes(state: dict[str, torch.Tensor]) -> bytes:
    """The safetensors serialisation of ``state``, tensors in name order, no header metadata."""
    from safetensors.torch import save

    return save({key: state[key].detach().cpu().contiguous() for key in sorted(state)})


@dataclass(frozen=True)
class LoadedGate:
    """A stored gate, ready to route prompt embeddings.

    Attributes:
        names: the adapters it routes between, in output order.
        mode: ``trained`` or ``uniform``.
        input_dim: the embedding size it takes.
        module: the MLP (logits out), in eval mode; None when uniform.
    """

    names: tuple[str, ...]
    mode: GateMode
    input_dim: int
    module: Any

    def route(self, embedding: torch.Tensor) -> dict[str, float]:
        """The weight of each adapter for one prompt's embedding (``[input_dim]`` or ``[1, input_dim]``).

        A uniform gate gives ``1/n`` each without looking at the embedding.

        Raises:
            BaseModelError: the embedding is not of the size the gate was
                fitted on (the base changed since).
        """
        if self.module is None:
            return {name: 1.0 / len(self.names) for name in self.names}
        import torch

        row = embedding.detach().to(device="cpu", dtype=torch.float32).reshape(1, -1)
        if row.shape[1] != self.input_dim:
            raise BaseModelError(
                f"the gate was fitted on embeddings of size {self.input_dim}, and this base gives "
                f"{row.shape[1]}: the base model changed since it was trained",
                hint="train again (dlm train) to fit a gate for this base",
            )
        with torch.no_grad():
            weights = torch.softmax(self.module(row), dim=-1)[0]
        return {name: float(weights[i]) for i, name in enumerate(self.names)}


def sha256_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()

"""The ``gates`` table: one row per gate a train invocation fitted, committed after its folder.

A row names the folder (``gate/run<N>``), the weights' sha256 and size (NULL
for a uniform gate, which has no weights: a CHECK constraint holds the two
together), the adapters it routes between with the version of each it was
fitted beside, the settings and seed it was fitted with, and its mean
output over the training prompts, the static mix ``dlm export`` uses for a
gated document. JSON columns are written with sorted keys and decoded on
the way out, so a :class:`GateRecord` holds Python values.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dlmstore.clock import utc_now
from dlmstore.errors import StoreError
from dlmstore.gate.files import DAMAGED_HINT, GATES_DIR, WEIGHTS_NAME, LoadedGate, sha256_of
from dlmstore.store.database import Store
from dlmstore.store.regular_files import read_regular
from dlmstore.torch_loader import require_torch

if TYPE_CHECKING:
    from dlmstore.document.frontmatter import GateSettings
    from dlmstore.gate.fitting import FittedGate

#: A gate folder (``run7``) or its staging folder (``.run7-xxxx``, ``dlmstore.store.atomic.publish_dir``).
_GATE_ENTRY = re.compile(r"(\.)?run([0-9]+)(?(1)-.+|)")
_COLUMNS = (
    "id, run_id, path, mode, sha256, bytes, adapters, input_dim, hidden_proj_dim, steps, lr, "
    "entropy_lambda, seed, prompts, final_loss, mean_weights, note, created_at"
)


@dataclass(frozen=True)
class GateRecord:
    """One row of ``gates``.

    Attributes:
        id: the gate's id (never reused).
        run_id: the train run of the invocation that fitted it.
        path: its folder, relative to the store (``gate/run7``).
        mode: ``trained``, or ``uniform`` below the cold-start floor.
        sha256: ``sha256:`` digest of ``gate.safetensors``; None when uniform.
        bytes: size of ``gate.safetensors``; None when uniform.
        adapters: the adapters it routes between, in output order, each
            ``{"name": ..., "version": ...}`` (the version fitted beside it).
        input_dim: the embedding size (the base's hidden size).
        hidden_proj_dim: the MLP's hidden size.
        steps: optimizer steps taken (0 when uniform).
        lr: ``training.gate.lr``.
        entropy_lambda: ``training.gate.entropy_lambda``.
        seed: the seed of its initial weights and batch order.
        prompts: the tagged prompts it was given.
        final_loss: its loss at the last step; None when uniform.
        mean_weights: its mean output over the training prompts, by adapter.
        note: why it is uniform; None when trained.
        created_at: when it was registered.
    """

    id: int
    run_id: int
    path: str
    mode: Literal["trained", "uniform"]
    sha256: str | None
    bytes: int | None
    adapters: list[dict[str, Any]]
    input_dim: int
    hidden_proj_dim: int
    steps: int
    lr: float
    entropy_lambda: float
    seed: int
    prompts: int
    final_loss: float | None
    mean_weights: dict[str, float]
    note: str | None
    created_at: str

    @property
    def names(self) -> tuple[str, ...]:
        """The adapter names in output order."""
        return tuple(str(entry["name"]) for entry in self.adapters)


def record_gate(
    conn: sqlite3.Connection,
    *,
    run_id: int,
    path: str,
    fitted: FittedGate,
    sha256: str | None,
    bytes: int | None,
    adapters: Sequence[dict[str, Any]],
    seed: int,
    settings: GateSettings,
) -> int:
    """Insert the row of a gate whose folder ``path`` is written, in the caller's transaction; its id.

    Args:
        adapters: ``{"name", "version"}`` of each adapter, in the gate's
            output order (``fitted.names``).

    Raises:
        ValueError: ``adapters`` does not name ``fitted.names`` in order.
    """
    if tuple(str(entry["name"]) for entry in adapters) != fitted.names:
        raise ValueError(
            f"adapters {[entry['name'] for entry in adapters]} are not the gate's {list(fitted.names)}"
        )
    cursor = conn.execute(
        "INSERT INTO gates (run_id, path, mode, sha256, bytes, adapters, input_dim, hidden_proj_dim, steps, "
        "lr, entropy_lambda, seed, prompts, final_loss, mean_weights, note, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run_id, path, fitted.mode, sha256, bytes, _json([dict(entry) for entry in adapters]),
            fitted.input_dim, fitted.hidden_proj_dim, fitted.steps, settings.lr, settings.entropy_lambda,
            seed, fitted.prompts, fitted.final_loss, _json(fitted.mean_weights), fitted.note, utc_now(),
        ),
    )  # fmt: skip
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def latest_gate(store: Store) -> GateRecord | None:
    """The newest gate of the store, or ``None`` when it has none."""
    with store.read() as conn:
        row = conn.execute(f"SELECT {_COLUMNS} FROM gates ORDER BY id DESC LIMIT 1").fetchone()
    return _record(row) if row else None


def gate_of_run(store: Store, run_id: int) -> GateRecord | None:
    """The gate fitted with train run ``run_id``, or ``None``."""
    with store.read() as conn:
        row = conn.execute(
            f"SELECT {_COLUMNS} FROM gates WHERE run_id = ? ORDER BY id DESC LIMIT 1", (run_id,)
        ).fetchone()
    return _record(row) if row else None


def gate_debris(conn: sqlite3.Connection, store_path: Path, *, running: Set[int]) -> list[Path]:
    """What train runs that are no longer running left in ``<store>/gate``: for ``dlm train``'s sweep.

    A run killed while writing its gate leaves its staging folder
    (``gate/.run<N>-xxxx``); one killed after the rename but before its row
    committed leaves ``gate/run<N>`` with no ``gates`` row. Either belongs to
    run ``N``, and is debris once ``N`` is not in ``running``. Called in the
    sweep's transaction (``conn``), so no run can register a gate meanwhile;
    nothing is removed here.

    Returns:
        The leftover paths, sorted.
    """
    folder = store_path / GATES_DIR
    if not folder.is_dir():
        return []
    registered = {row["path"] for row in conn.execute("SELECT path FROM gates")}
    found: list[Path] = []
    for entry in sorted(folder.iterdir()):
        match = _GATE_ENTRY.fullmatch(entry.name)
        if match is None or int(match.group(2)) in running:
            continue  # not a gate's (someone else's file), or its run is still writing it
        if match.group(1) or f"{GATES_DIR}/{entry.name}" not in registered:
            found.append(entry)
    return found


def _record(row: sqlite3.Row) -> GateRecord:
    values = dict(row)
    values["adapters"] = json.loads(values["adapters"])
    values["mean_weights"] = json.loads(values["mean_weights"])
    return GateRecord(**values)


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def load_gate(store_path: Path, record: GateRecord) -> LoadedGate:
    """The gate ``record`` describes, once its weights match the sha256 store.db recorded.

    Raises:
        StoreError: the folder or ``gate.safetensors`` is missing or
            unreadable, its bytes changed, or its tensors are not the shapes
            the record names.
    """
    if record.mode == "uniform":
        return LoadedGate(record.names, "uniform", record.input_dim, None)
    weights = store_path / record.path / WEIGHTS_NAME
    shown = f"gate run{record.run_id}"
    if not os.path.lexists(store_path / record.path):
        raise StoreError(f"{shown}: its folder {store_path / record.path} is not there", hint=DAMAGED_HINT)
    try:
        data = read_regular(weights, limit=record.bytes)
    except OSError as exc:
        raise StoreError(
            f"{shown}: cannot read {weights}: {exc.strerror or exc}", hint=DAMAGED_HINT
        ) from None
    found = sha256_of(data)
    if found != record.sha256:
        raise StoreError(
            f"{shown}: {weights} is damaged (its sha256 is {found}, not the {record.sha256} recorded "
            "when it was trained)",
            hint=DAMAGED_HINT,
        )
    require_torch("the learned gate routes prompts in torch")
    from safetensors.torch import load

    from dlmstore.gate.fitting import gate_mlp

    module = gate_mlp(record.input_dim, record.hidden_proj_dim, len(record.names))
    try:
        module.load_state_dict(load(data))
    except RuntimeError as exc:  # a checksum that matches a file of other shapes: store.db itself was edited
        first = (str(exc).strip().splitlines() or ["wrong tensors"])[0]
        raise StoreError(
            f"{shown}: {weights} does not hold the gate its record describes: {first}", hint=DAMAGED_HINT
        ) from None
    module.eval()
    return LoadedGate(record.names, "trained", record.input_dim, module)

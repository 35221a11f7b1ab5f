"""Checkpoints of a train run, kept in the store so ``dlm train --resume`` can continue it.

Every ``training.checkpoint_steps`` optimizer steps the trainer writes
``<store>/checkpoints/run<N>/checkpoint-<step>/``: the adapter, optimizer
and scheduler state, each rank's RNG state and the trainer state
(transformers' own checkpoint), plus what dlmstore adds: each rank's
trained positions and per-source counts (``dlm-rank<r>.npy`` /
``dlm-rank<r>.json``) and the settings the run trains with
(``dlm-plan.json``). Once every rank has written its part, rank 0 fsyncs
the folder, takes the sha256 of every file in it and inserts its
``checkpoints`` row with them: the row is the commit point, so a folder
without a row (the process died while writing it) is never resumed from
and is swept by the next run. The two newest checkpoints of a run are kept
(the older one still counts while the newer one is written).

**Identity is content, checked where it is used.** Before a run resumes,
every file of the checkpoint is hashed again and compared with the row: a
file that differs, is missing or was not there when the checkpoint was
written makes the checkpoint damaged, and the previous registered
checkpoint of the run that verifies is resumed instead (with a warning);
none: one error naming the checkpoint and the file. A checkpoint written
before the checksums existed (migration 0011) cannot be verified and is
refused. A file that verifies but still cannot be loaded (it was written
damaged) is one error naming it
(:func:`dlmstore.train.loops.supervised.loading`), never a traceback.

A checkpoint records what it is only valid for: the document's sha256, its
base model (by name and by what the name resolved to), the identity of the
token datasets and their weights, the rows the run trains on (their keys,
so a file under ``training.sources`` edited after the interrupt counts),
the micro-batch size, the seed and every other setting that changes the
adapter, the command line's overrides included (:func:`plan_settings`).
Resuming under any other value is refused with the reason, since "step
120" would then name other samples or another model. The world size is
not among them: each checkpoint records its :class:`Layout`
(``dlm-layout.json``), and a run resumes on another number of processes at
the same global batch, its gradient accumulation following, from the same
position of the same epoch order (elastic resume).

An interrupted run stays resumable until it is resumed to completion or
the user starts over explicitly: ``--resume`` continues the newest train
run that stopped with checkpoints (a later run that failed before its
first checkpoint, a typo'd ``--dataset``, does not hide it), and a run that
completes removes its own checkpoints and those of the runs it continued,
but an interrupted run's only when it was started with ``--fresh``
(:func:`remove_finished`).

What a resume restores is exactly the interrupted run's state, so it ends
with the adapter the uninterrupted run would have produced, byte for byte
(``tests/test_resume.py`` kills a run at a step and compares). Checkpoints
cover the SFT phase; a run interrupted in its preference phase resumes from
its last SFT checkpoint and trains the preference phase again from the
start (the same result, more work).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dlmstore.clock import utc_now
from dlmstore.datasets.build.writers import npy_bytes
from dlmstore.errors import StoreError, TrainingError
from dlmstore.store.atomic import fsync_tree, write_bytes_atomic
from dlmstore.store.digests import file_sha256
from dlmstore.store.path_text import path_text

if TYPE_CHECKING:
    import sqlite3

    from dlmstore.store.database import Store

CHECKPOINTS_DIR = "checkpoints"
KEEP = 2  # checkpoints kept per run
#: The settings a run trains with (:func:`plan_settings`), written into each checkpoint.
PLAN_FILE = "dlm-plan.json"
#: How the run's samples are laid out over its ranks (:class:`Layout`), written into each checkpoint.
LAYOUT_FILE = "dlm-layout.json"
FRESH_HINT = (
    "start over with `dlm train DOC --fresh` (the interrupted run's checkpoints go once it completes)"
)


@dataclass(frozen=True)
class CheckpointIdentity:
    """What a checkpoint is valid for; a resume must match every field.

    ``rows_sha256`` is None until the tokenize pass has run and
    ``plan_sha256`` until the plan is resolved (as the batch fields are 0).
    """

    dlm_sha256: str
    base_model: str
    inputs_sha256: str
    world_size: int
    micro_batch_size: int
    grad_accum: int
    seed: int
    rows_sha256: str | None = None
    plan_sha256: str | None = None


def run_identity(
    document: Any,
    ref: Any,
    inputs: Sequence[Any],
    world_size: int,
    seed: int,
    plan: Any,
    *,
    rows_sha256: str | None = None,
) -> CheckpointIdentity:
    """What a run's checkpoints are valid for; the plan's fields are 0/None until ``plan`` is known.

    The base is ``<base>@<identity>``: the base's name (a local base's
    resolved folder, so ``./m`` and ``./m/`` are one base, as store.db records
    a path: :func:`~dlmstore.store.path_text.path_text`) and what it
    resolved to (the lock's revision or sha256,
    :func:`~dlmstore.lock.identity.base_model_identity`), so a base whose
    files changed under the same name is another base.
    """
    from dlmstore.lock.identity import base_model_identity
    from dlmstore.train.data.inputs import inputs_sha256

    revision, sha256 = base_model_identity(ref)
    return CheckpointIdentity(
        dlm_sha256=document.sha256,
        base_model=f"{path_text(ref.location) if ref.kind == 'local' else ref.name}@{sha256 or revision or 'unknown'}",
        inputs_sha256=inputs_sha256(inputs),
        world_size=world_size,
        micro_batch_size=0 if plan is None else plan.micro_batch_size,
        grad_accum=0 if plan is None else plan.grad_accum,
        seed=seed,
        rows_sha256=rows_sha256,
        plan_sha256=None if plan is None else _digest(json.dumps(plan_settings(plan), sort_keys=True)),
    )


def plan_settings(plan: Any) -> dict[str, Any]:
    """The settings of a ``TrainingPlan`` that change the adapter, besides the identity's own columns.

    The micro-batch size, gradient accumulation and seed have columns of
    their own; ``report_to`` and the derived effective batch change nothing
    trained. ``num_epochs`` counts only when ``max_steps`` is unset (the
    trainer ignores it otherwise). The device and precision are here as
    resolved, so a checkpoint written on a GPU is not resumed on a CPU.
    """
    return {
        "device": plan.device,
        "adapter": plan.adapter,
        "precision": plan.precision,
        "lora_r": plan.lora_r,
        "lora_alpha": plan.lora_alpha,
        "lora_dropout": plan.lora_dropout,
        "target_modules": plan.target_modules,
        "learning_rate": plan.learning_rate,
        "lr_scheduler": plan.lr_scheduler,
        "warmup_ratio": plan.warmup_ratio,
        "optimizer": plan.optimizer,
        "sequence_len": plan.sequence_len,
        "max_steps": plan.max_steps,
        "num_epochs": plan.num_epochs if plan.max_steps is None else None,
    }


def rows_sha256(row_keys: Sequence[str], preference_keys: Sequence[str]) -> str:
    """One digest over the keys of the rows a run trains on, in order (a row key names its content)."""
    return _digest("\n".join(row_keys) + "\n\0preferences\n" + "\n".join(preference_keys))


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Checkpoint:
    """A registered checkpoint (a ``checkpoints`` row whose files verify)."""

    run_id: int
    phase: str
    step: int
    path: Path
    identity: CheckpointIdentity


@dataclass(frozen=True)
class Resumption:
    """What ``--resume`` continues: the stopped run, its checkpoint and what was skipped on the way.

    Attributes:
        run_id: the run whose checkpoint is resumed (``runs.resumed_from`` of the new run).
        checkpoint: its newest checkpoint whose files verify.
        warnings: one line per newer checkpoint skipped because it is damaged.
    """

    run_id: int
    checkpoint: Checkpoint
    warnings: tuple[str, ...]


def run_folder(store_path: Path, run_id: int) -> Path:
    """Where run ``run_id`` writes its checkpoints (the trainer's ``output_dir``)."""
    return store_path / CHECKPOINTS_DIR / f"run{run_id}"


@dataclass(frozen=True)
class Layout:
    """How a run lays its samples over its ranks, so ``--resume`` continues it on another number of them.

    Every epoch has one sample order, the same for any world size: its
    permutation (seeded by the seed and the epoch) padded with its own
    first items to a multiple of ``order_world_size``, the world size the
    run started with. Optimizer step ``s`` of an epoch trains the items at
    positions ``[s * global_batch, (s + 1) * global_batch)`` of it, however
    many ranks share them (rank ``r`` of ``W`` takes every ``W``-th from
    ``r``), so the position reached is ``step * global_batch`` whatever
    the world size; a resumed run keeps ``global_batch`` and
    ``micro_batch_size`` and trains with the gradient accumulation that
    makes them meet on its own world size.

    Attributes:
        world_size: the ranks that wrote the checkpoint.
        order_world_size: the world size the epochs' order was padded for.
        global_batch: items per optimizer step, all ranks together
            (micro-batch x gradient accumulation x world size).
    """

    world_size: int
    order_world_size: int
    global_batch: int

    def grad_accum_for(self, world_size: int, micro_batch_size: int, samples: int) -> int:
        """The gradient accumulation that trains ``global_batch`` a step on ``world_size`` ranks.

        Raises:
            TrainingError: it does not divide, or an epoch's padded order
                (``samples`` items) cannot be split evenly over the ranks.
        """
        per_step = micro_batch_size * world_size
        if self.global_batch % per_step:
            raise TrainingError(
                f"cannot resume on {world_size} processes: the run trains {self.global_batch} items per step, "
                f"which {world_size} processes of micro-batch {micro_batch_size} cannot split evenly",
                hint=f"resume on a number of processes whose product with micro_batch_size divides "
                f"{self.global_batch} (the run started on {self.order_world_size})",
            )
        padded = -(-samples // self.order_world_size) * self.order_world_size
        if padded % world_size:
            raise TrainingError(
                f"cannot resume on {world_size} processes: an epoch of {samples} items, padded to "
                f"{padded} for the {self.order_world_size} the run started on, cannot be split evenly over "
                f"{world_size}",
                hint=f"resume on {self.order_world_size} processes, or on a number that divides {padded}",
            )
        return self.global_batch // per_step

    def as_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()


def laid_out(checkpoint: Checkpoint | None, plan: Any, world_size: int, samples: int) -> tuple[Layout, int]:
    """The layout a run's checkpoints record and the gradient accumulation it trains with.

    A fresh run lays its ``samples`` out for its own world size at its
    plan's batch; a resumed one keeps the layout of ``checkpoint`` (its
    order, its global batch) and accumulates as many micro-batches as
    ``world_size`` ranks need to reach that batch.

    Raises:
        TrainingError: the run's global batch or its padded epoch cannot be split over ``world_size``.
    """
    if checkpoint is None:
        batch = plan.micro_batch_size * plan.grad_accum * world_size
        return Layout(world_size, world_size, batch), int(plan.grad_accum)
    old = read_layout(checkpoint)
    grad_accum = old.grad_accum_for(world_size, plan.micro_batch_size, samples)
    return Layout(world_size, old.order_world_size, old.global_batch), grad_accum


def read_layout(checkpoint: Checkpoint) -> Layout:
    """The layout checkpoint ``checkpoint`` was written under (its file; else, for a checkpoint written before
    there was one, its identity's world size and batch: the order was padded for that world size).
    """
    identity = checkpoint.identity
    try:
        data = json.loads((checkpoint.path / LAYOUT_FILE).read_bytes())
        return Layout(int(data["world_size"]), int(data["order_world_size"]), int(data["global_batch"]))
    except FileNotFoundError:
        batch = identity.micro_batch_size * identity.grad_accum * identity.world_size
        return Layout(identity.world_size, identity.world_size, batch)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TrainingError(
            f"cannot resume from checkpoint {checkpoint.path}: {LAYOUT_FILE} cannot be loaded ({exc})",
            hint=FRESH_HINT,
        ) from None


def restored_rank_state(folder: Path, layout: Layout, rank: int, world_size: int) -> dict[str, Any] | None:
    """What rank ``rank`` of ``world_size`` restores of the trained positions and counts in ``folder``.

    On the world size that wrote it, each rank its own; on another, rank 0
    takes every rank's (positions in rank order, counts summed) and the
    others start from nothing, so the run's totals stay whole.
    """
    if layout.world_size == world_size:
        return read_rank_state(folder, rank)
    if rank != 0:
        return None
    merged: dict[str, Any] = {}
    for old in range(layout.world_size):
        state = read_rank_state(folder, old)
        if not merged:
            merged = state
            continue
        merged["samples"] = merged["samples"] + state["samples"]
        for key, value in state.items():
            if key != "samples" and isinstance(value, list):
                merged[key] = [a + b for a, b in zip(merged[key], value, strict=True)]
    return merged


def rank_files(folder: Path, rank: int) -> dict[str, bytes]:
    """The files of checkpoint ``folder`` that are rank ``rank``'s own: its positions and counts, its RNG state."""
    names = (f"dlm-rank{rank}.npy", f"dlm-rank{rank}.json", f"rng_state_{rank}.pth")
    return {name: (folder / name).read_bytes() for name in names if (folder / name).is_file()}


def write_rank_state(folder: Path, rank: int, state: dict[str, Any]) -> None:
    """This rank's trained positions and per-source counts, into checkpoint ``folder``."""
    samples = np.asarray(state["samples"], dtype=np.int64)
    buffer = npy_bytes(samples)
    write_bytes_atomic(folder / f"dlm-rank{rank}.npy", buffer)
    counts = {key: value for key, value in state.items() if key != "samples"}
    write_bytes_atomic(folder / f"dlm-rank{rank}.json", json.dumps(counts, sort_keys=True).encode())


def read_rank_state(folder: Path, rank: int) -> dict[str, Any]:
    """What :func:`write_rank_state` wrote for ``rank`` (the caller turns a damaged file into an error:
    :func:`dlmstore.train.loops.supervised.loading`).
    """
    samples = np.load(folder / f"dlm-rank{rank}.npy", allow_pickle=False)
    counts = json.loads((folder / f"dlm-rank{rank}.json").read_text())
    if not isinstance(counts, dict):
        raise ValueError("not a JSON object")
    return {"samples": samples.tolist(), **counts}


@contextmanager
def checkpoint_writes(folder: Path, step: int) -> Iterator[None]:
    """Turn a failed write of checkpoint ``folder`` (a full disk) into one error that says how to go on.

    The run stops there; the folder has no row, so ``--resume`` continues
    from the checkpoint before it and the next run sweeps the folder.

    Raises:
        StoreError: a write failed (:func:`~dlmstore.train.adapters.is_write_failure`);
            any other exception propagates as it is.
    """
    from dlmstore.train.adapters import is_write_failure, write_failure_hint, write_failure_reason

    try:
        yield
    except Exception as exc:
        if not is_write_failure(exc):
            raise
        raise StoreError(
            f"cannot write the checkpoint of step {step} under {folder}: {write_failure_reason(exc)}",
            hint=write_failure_hint(
                exc,
                writable="the store",
                then=", then run the same `dlm train` with --resume to continue from the last checkpoint",
            ),
        ) from None


def folder_sha256(folder: Path) -> dict[str, str]:
    """Each file under ``folder`` (path relative to it, ``/``-separated) -> its ``sha256:`` digest."""
    files: dict[str, str] = {}
    for directory, subfolders, names in os.walk(folder):
        subfolders.sort()
        for name in sorted(names):
            path = Path(directory) / name
            files[path.relative_to(folder).as_posix()] = file_sha256(path)
    return files


def register(
    store: Store,
    run_id: int,
    phase: str,
    step: int,
    folder: Path,
    identity: CheckpointIdentity,
    settings: dict[str, Any],
    layout: Layout | None = None,
) -> None:
    """Write the run's ``settings`` (:data:`PLAN_FILE`) and ``layout`` (:data:`LAYOUT_FILE`) into ``folder``,
    make it durable, take the sha256 of every file in it and record it; forget rows whose folders the
    trainer rotated away.
    """
    write_bytes_atomic(folder / PLAN_FILE, json.dumps(settings, sort_keys=True, indent=1).encode())
    if layout is not None:
        write_bytes_atomic(folder / LAYOUT_FILE, layout.as_json())
    fsync_tree(folder)
    files = json.dumps(folder_sha256(folder), sort_keys=True)
    relative = str(folder.relative_to(store.path))
    with store.write() as conn:
        conn.execute(
            "INSERT OR REPLACE INTO checkpoints (run_id, phase, step, path, dlm_sha256, base_model, "
            "inputs_sha256, world_size, micro_batch_size, grad_accum, seed, created_at, files, rows_sha256, "
            "plan_sha256) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, phase, step, relative, identity.dlm_sha256, identity.base_model, identity.inputs_sha256,
             identity.world_size, identity.micro_batch_size, identity.grad_accum, identity.seed, utc_now(),
             files, identity.rows_sha256, identity.plan_sha256),
        )  # fmt: skip
        rows = conn.execute("SELECT id, path FROM checkpoints WHERE run_id = ?", (run_id,)).fetchall()
        gone = [(row["id"],) for row in rows if not (store.path / row["path"]).is_dir()]
        conn.executemany("DELETE FROM checkpoints WHERE id = ?", gone)


def resumable(store: Store, *, before: int, adapter: str | None = None) -> Resumption:
    """The newest train run older than run ``before`` (the resuming one) that stopped with checkpoints,
    and its newest checkpoint whose files verify. Only the runs of the named adapter ``adapter``
    (``training.adapters``) count when it is given, only the runs of no named adapter when not.

    Checkpoints of the runs it resumed count too (a resumed run killed
    before its first checkpoint still continues from its parent's). Runs
    that failed before their first checkpoint, and completed runs, are
    passed over: they leave nothing to continue, and an older interrupted
    run stays resumable behind them.

    Raises:
        TrainingError: there is no train run, the newest one is still
            running, no stopped run has checkpoints, their folders are gone,
            or no checkpoint of the run verifies.
    """
    hint = "start a new run with `dlm train DOC` (without --resume)"
    with store.read() as conn:
        runs = conn.execute(
            "SELECT id, status FROM runs WHERE command = 'train' AND id < ? AND adapter IS ? ORDER BY id DESC",
            (before, adapter),
        ).fetchall()
        if not runs:
            whose = (
                "this store has no train run" if adapter is None else f"adapter {adapter} has no train run"
            )
            raise TrainingError(f"nothing to resume: {whose}", hint=hint)
        if runs[0]["status"] == "running":
            raise TrainingError(
                f"train run {runs[0]['id']} is still running",
                hint="wait for it to finish, or stop it and then resume",
            )
        for run in runs:
            if run["status"] != "failed":
                continue
            chain = _chain(conn, run["id"])
            marks = ",".join("?" * len(chain))
            rows = conn.execute(
                f"SELECT * FROM checkpoints WHERE run_id IN ({marks}) ORDER BY step DESC, id DESC", chain
            ).fetchall()
            if rows:
                break
        else:
            newest = runs[0]
            if newest["status"] == "completed":
                raise TrainingError(
                    f"nothing to resume: the newest train run ({newest['id']}) completed", hint=hint
                )
            raise TrainingError(
                f"nothing to resume: train run {newest['id']} stopped before its first checkpoint "
                "(one is written every training.checkpoint_steps steps)",
                hint=hint,
            )
    checkpoint, warnings = _verified(store, rows)
    return Resumption(checkpoint.run_id, checkpoint, warnings)


def _chain(conn: sqlite3.Connection, run_id: int) -> list[int]:
    """Run ``run_id`` and the runs it resumed, newest first."""
    chain = [run_id]
    while True:
        parent = conn.execute("SELECT resumed_from FROM runs WHERE id = ?", (chain[-1],)).fetchone()
        if parent is None or parent["resumed_from"] is None or parent["resumed_from"] in chain:
            return chain
        chain.append(parent["resumed_from"])


def _verified(store: Store, rows: Sequence[Any]) -> tuple[Checkpoint, tuple[str, ...]]:
    """The newest of ``rows`` (newest first) whose files verify, and a warning per newer one skipped.

    Raises:
        TrainingError: every folder is gone, or no checkpoint verifies.
    """
    folders = [store.path / row["path"] for row in rows]
    if not any(folder.is_dir() for folder in folders):
        raise TrainingError(
            f"nothing to resume: the checkpoints of train run {rows[0]['run_id']} are gone from "
            f"{run_folder(store.path, rows[0]['run_id'])}",
            hint=FRESH_HINT,
        )
    damaged: list[tuple[Path, str]] = []
    for row, folder in zip(rows, folders, strict=True):
        problem = _damage(folder, row["files"])
        if problem is None:
            identity = CheckpointIdentity(
                dlm_sha256=row["dlm_sha256"], base_model=row["base_model"], inputs_sha256=row["inputs_sha256"],
                world_size=row["world_size"], micro_batch_size=row["micro_batch_size"],
                grad_accum=row["grad_accum"], seed=row["seed"], rows_sha256=row["rows_sha256"],
                plan_sha256=row["plan_sha256"],
            )  # fmt: skip
            checkpoint = Checkpoint(row["run_id"], row["phase"], row["step"], folder, identity)
            warnings = tuple(
                f"checkpoint {bad} {why}: resuming from {folder} (step {row['step']}) instead"
                for bad, why in damaged
            )
            return checkpoint, warnings
        damaged.append((folder, problem))
    (newest, why), older = damaged[0], len(damaged) > 1
    also = ", and no older checkpoint of the run verifies" if older else ""
    raise TrainingError(
        f"cannot resume run {rows[0]['run_id']}: checkpoint {newest} {why}{also}", hint=FRESH_HINT
    )


def _damage(folder: Path, recorded: str | None) -> str | None:
    """What is wrong with checkpoint ``folder`` against the sha256s ``recorded`` when it was registered,
    as the rest of a sentence about it (``is damaged (optimizer.pt is missing)``); None: it verifies.
    """
    try:
        expected = None if recorded is None else json.loads(recorded)
    except ValueError:
        expected = None
    if not isinstance(expected, dict) or not expected:
        return (
            "cannot be verified (it was registered before dlmstore recorded the sha256 of checkpoint files, "
            "store revision 0011)"
            if recorded is None
            else "cannot be verified (its recorded sha256s cannot be read)"
        )
    if not folder.is_dir():
        return "is damaged (its folder is gone)"
    problem = _file_damage(folder, expected)
    return None if problem is None else f"is damaged ({problem})"


def _file_damage(folder: Path, expected: dict[str, str]) -> str | None:
    """The first file of ``folder`` that is missing, extra or differs from its sha256 in ``expected``."""
    present = {
        (Path(directory) / name).relative_to(folder).as_posix()
        for directory, _, names in os.walk(folder)
        for name in names
    }
    for name in sorted(expected):
        if name not in present:
            return f"{name} is missing"
    for name in sorted(present - expected.keys()):
        return f"{name} was not in it when it was written"
    for name, sha256 in sorted(expected.items()):
        try:
            actual = file_sha256(folder / name)
        except OSError as exc:
            return f"{name} cannot be read: {exc.strerror or exc}"
        if actual != sha256:
            return f"{name} differs from the sha256 taken when it was written"
    return None


#: Field -> words for the refusal message.
_FIELDS = {
    "dlm_sha256": ("the document", "changed since"),
    "base_model": ("base_model", "differs from"),
    "inputs_sha256": ("the token datasets or their weights", "changed since"),
    "rows_sha256": (
        "the rows the run trains on (a file under training.sources was added, removed or edited, or the "
        "rows drawn from the replay history)",
        "changed since",
    ),
    "world_size": ("the number of processes", "differs from"),
    "micro_batch_size": ("the micro-batch size", "differs from"),
    "grad_accum": ("gradient accumulation", "differs from"),
    "seed": ("the seed", "differs from"),
    "plan_sha256": ("the training settings", "differ from"),
}
_HIDDEN = ("dlm_sha256", "inputs_sha256", "rows_sha256", "plan_sha256")


def check_identity(
    checkpoint: Checkpoint,
    current: CheckpointIdentity,
    *,
    fields: tuple[str, ...],
    settings: dict[str, Any] | None = None,
) -> None:
    """Refuse to resume ``checkpoint`` when one of ``fields`` differs from ``current``.

    ``settings`` (:func:`plan_settings` of the current plan) lets a
    ``plan_sha256`` refusal name the settings that differ, read from the
    checkpoint's verified :data:`PLAN_FILE`.

    Raises:
        TrainingError: naming the first field that differs, with both values.
    """
    for name in fields:
        old, new = getattr(checkpoint.identity, name), getattr(current, name)
        if old != new:
            what, verb = _FIELDS[name]
            shown = "" if name in _HIDDEN else f" ({old} then, {new} now)"
            if name == "plan_sha256" and settings is not None:
                shown = _settings_changed(checkpoint.path / PLAN_FILE, settings)
            raise TrainingError(
                f"cannot resume run {checkpoint.run_id} from step {checkpoint.step}: {what} {verb} "
                f"the checkpoint{shown}",
                hint="resume with what the run had (its command-line options and environment included), "
                "or start over with --fresh",
            )


def _settings_changed(path: Path, settings: dict[str, Any]) -> str:
    """`` (max_steps 6 then, 8 now)``: each setting that differs from the checkpoint's; empty when unknown."""
    try:
        then = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return ""
    if not isinstance(then, dict):
        return ""

    def shown(value: Any) -> str:
        if value is None:
            return "unset"
        return ",".join(map(str, value)) if isinstance(value, list) else str(value)

    changed = [
        f"{key} {shown(then.get(key))} then, {shown(settings.get(key))} now"
        for key in sorted(settings.keys() | then.keys())
        if then.get(key) != settings.get(key)
    ]
    return f" ({'; '.join(changed)})" if changed else ""


def remove_finished(store: Store, *, run_id: int, fresh: bool = False) -> list[str]:
    """Remove the checkpoints that run ``run_id``, which completed, leaves nothing to resume from;
    return a warning for each interrupted run whose checkpoints are kept.

    Removed (rows and folders): this run's, those of the runs it resumed,
    registered ones whose folder is gone, folders of stopped runs that have
    no row (a checkpoint cut off while being written) and, when ``fresh``
    (``dlm train --fresh``: the user started over), those of every run that
    is not running. Without ``fresh`` an interrupted run's checkpoints stay,
    so ``--resume`` can still continue it.
    """
    root = store.path / CHECKPOINTS_DIR
    kept: dict[int, int] = {}  # stopped run -> its newest checkpoint's step
    with store.write() as conn:
        running = {row["id"] for row in conn.execute("SELECT id FROM runs WHERE status = 'running'")}
        running.discard(run_id)
        done = set(_chain(conn, run_id))
        rows = conn.execute("SELECT id, run_id, step, path FROM checkpoints ORDER BY step").fetchall()
        stale = []
        for row in rows:
            owner = row["run_id"]
            if owner in running:
                continue
            if fresh or owner in done or not (store.path / row["path"]).is_dir():
                stale.append((row["id"],))
            else:
                kept[owner] = row["step"]
        conn.executemany("DELETE FROM checkpoints WHERE id = ?", stale)
        for folder in sorted(root.glob("run*")) if root.is_dir() else []:
            owner = folder.name.removeprefix("run")
            if owner.isdigit() and (int(owner) in running or int(owner) in kept):
                continue
            shutil.rmtree(folder, ignore_errors=True)
    return [
        f"the checkpoints of interrupted train run {owner} are kept (the newest at step {step}): "
        "`dlm train --resume` continues it, `dlm train --fresh` starts over and removes them"
        for owner, step in sorted(kept.items())
    ]


def sweep_unregistered(store: Store) -> list[str]:
    """Remove checkpoint folders of stopped runs that were never registered (cut off mid-write)."""
    root = store.path / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    removed: list[str] = []
    with store.read() as conn:
        running = {row["id"] for row in conn.execute("SELECT id FROM runs WHERE status = 'running'")}
        registered = {row["path"] for row in conn.execute("SELECT path FROM checkpoints")}
    for folder in sorted(root.glob("run*/checkpoint-*")):
        owner = folder.parent.name.removeprefix("run")
        if owner.isdigit() and int(owner) in running:
            continue
        relative = str(folder.relative_to(store.path))
        if relative not in registered:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(relative)
    return removed

"""Checkpoints of a train run, kept in the store so ``dlm train --resume`` can continue it.

Every ``training.checkpoint_steps`` optimizer steps the trainer writes
``<store>/checkpoints/run<N>/checkpoint-<step>/``: the adapter, optimizer
and scheduler state, each rank's RNG state and the trainer state
(transformers' own checkpoint), plus what dlmstore adds for each rank: the
positions it has trained on and its per-source counts
(``dlm-rank<r>.npy`` / ``dlm-rank<r>.json``). Once every rank has written
its part, rank 0 fsyncs the folder and inserts its ``checkpoints`` row:
the row is the commit point, so a folder without a row (the process died
while writing it) is never resumed from and is swept by the next run. The
two newest checkpoints of a run are kept (the older one still counts while
the newer one is written).

A checkpoint records what it is only valid for: the document's sha256, its
base model (by name and by what the name resolved to), the identity of the
token datasets and their weights, the world size, the micro-batch size,
the gradient accumulation and the seed. Resuming
under any other value is refused with the reason, since "step 120" would
then name other samples or another model. A run that completes removes the
checkpoints of every run that is not running: ``--resume`` only ever
continues the newest train run, so nothing older can be resumed any more.

What a resume restores is exactly the interrupted run's state, so it ends
with the adapter the uninterrupted run would have produced, byte for byte
(``tests/test_resume.py`` kills a run at a step and compares). Checkpoints
cover the SFT phase; a run interrupted in its preference phase resumes from
its last SFT checkpoint and trains the preference phase again from the
start (the same result, more work).
"""

from __future__ import annotations

import json
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

if TYPE_CHECKING:
    from dlmstore.store.database import Store

CHECKPOINTS_DIR = "checkpoints"
KEEP = 2  # checkpoints kept per run


@dataclass(frozen=True)
class CheckpointIdentity:
    """What a checkpoint is valid for; a resume must match every field."""

    dlm_sha256: str
    base_model: str
    inputs_sha256: str
    world_size: int
    micro_batch_size: int
    grad_accum: int
    seed: int


def run_identity(
    document: Any, ref: Any, inputs: Sequence[Any], world_size: int, seed: int, plan: Any
) -> CheckpointIdentity:
    """What a run's checkpoints are valid for; the batch fields are 0 until ``plan`` is known.

    The base is ``<base>@<identity>``: the base's name (a local base's
    resolved folder, so ``./m`` and ``./m/`` are one base) and what it
    resolved to (the lock's revision or sha256,
    :func:`~dlmstore.lock.identity.base_model_identity`), so a base whose
    files changed under the same name is another base.
    """
    from dlmstore.lock.identity import base_model_identity
    from dlmstore.train.data.inputs import inputs_sha256

    revision, sha256 = base_model_identity(ref)
    return CheckpointIdentity(
        dlm_sha256=document.sha256,
        base_model=f"{ref.location if ref.kind == 'local' else ref.name}@{sha256 or revision or 'unknown'}",
        inputs_sha256=inputs_sha256(inputs),
        world_size=world_size,
        micro_batch_size=0 if plan is None else plan.micro_batch_size,
        grad_accum=0 if plan is None else plan.grad_accum,
        seed=seed,
    )


@dataclass(frozen=True)
class Checkpoint:
    """A registered checkpoint (a ``checkpoints`` row whose folder exists)."""

    run_id: int
    phase: str
    step: int
    path: Path
    identity: CheckpointIdentity


def run_folder(store_path: Path, run_id: int) -> Path:
    """Where run ``run_id`` writes its checkpoints (the trainer's ``output_dir``)."""
    return store_path / CHECKPOINTS_DIR / f"run{run_id}"


def write_rank_state(folder: Path, rank: int, state: dict[str, Any]) -> None:
    """This rank's trained positions and per-source counts, into checkpoint ``folder``."""
    samples = np.asarray(state["samples"], dtype=np.int64)
    buffer = npy_bytes(samples)
    write_bytes_atomic(folder / f"dlm-rank{rank}.npy", buffer)
    counts = {key: value for key, value in state.items() if key != "samples"}
    write_bytes_atomic(folder / f"dlm-rank{rank}.json", json.dumps(counts, sort_keys=True).encode())


def read_rank_state(folder: Path, rank: int) -> dict[str, Any]:
    """What :func:`write_rank_state` wrote for ``rank``.

    Raises:
        TrainingError: the files are missing or unreadable (the checkpoint is damaged).
    """
    try:
        samples = np.load(folder / f"dlm-rank{rank}.npy", allow_pickle=False)
        counts = json.loads((folder / f"dlm-rank{rank}.json").read_text())
    except (OSError, ValueError) as exc:
        raise TrainingError(
            f"{folder}: the checkpoint's state of rank {rank} cannot be read ({exc})",
            hint="start the run again without --resume",
        ) from None
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
    from dlmstore.train.adapters import is_write_failure, write_failure_reason

    try:
        yield
    except Exception as exc:
        if not is_write_failure(exc):
            raise
        raise StoreError(
            f"cannot write the checkpoint of step {step} under {folder}: {write_failure_reason(exc)}",
            hint="free some disk space, then run the same `dlm train` with --resume to continue "
            "from the last checkpoint",
        ) from None


def register(
    store: Store, run_id: int, phase: str, step: int, folder: Path, identity: CheckpointIdentity
) -> None:
    """Make ``folder`` durable, then record it; forget rows whose folders the trainer rotated away."""
    fsync_tree(folder)
    relative = str(folder.relative_to(store.path))
    with store.write() as conn:
        conn.execute(
            "INSERT OR REPLACE INTO checkpoints (run_id, phase, step, path, dlm_sha256, base_model, "
            "inputs_sha256, world_size, micro_batch_size, grad_accum, seed, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, phase, step, relative, identity.dlm_sha256, identity.base_model, identity.inputs_sha256,
             identity.world_size, identity.micro_batch_size, identity.grad_accum, identity.seed, utc_now()),
        )  # fmt: skip
        rows = conn.execute("SELECT id, path FROM checkpoints WHERE run_id = ?", (run_id,)).fetchall()
        gone = [(row["id"],) for row in rows if not (store.path / row["path"]).is_dir()]
        conn.executemany("DELETE FROM checkpoints WHERE id = ?", gone)


def resumable(store: Store, *, before: int) -> tuple[int, Checkpoint]:
    """The newest train run older than run ``before`` (the resuming one), which must have stopped,
    and its newest complete checkpoint.

    Checkpoints of the runs it resumed count too (a resumed run killed
    before its first checkpoint still continues from its parent's).

    Raises:
        TrainingError: there is no train run, the newest one completed or is
            still running, or it stopped before its first checkpoint.
    """
    hint = "start a new run with `dlm train DOC` (without --resume)"
    with store.read() as conn:
        run = conn.execute(
            "SELECT id, status FROM runs WHERE command = 'train' AND id < ? ORDER BY id DESC LIMIT 1",
            (before,),
        ).fetchone()
        if run is None:
            raise TrainingError("nothing to resume: this store has no train run", hint=hint)
        if run["status"] == "completed":
            raise TrainingError(f"nothing to resume: the newest train run ({run['id']}) completed", hint=hint)
        if run["status"] == "running":
            raise TrainingError(
                f"train run {run['id']} is still running",
                hint="wait for it to finish, or stop it and then resume",
            )
        chain = [run["id"]]
        while True:
            parent = conn.execute("SELECT resumed_from FROM runs WHERE id = ?", (chain[-1],)).fetchone()
            if parent is None or parent["resumed_from"] is None or parent["resumed_from"] in chain:
                break
            chain.append(parent["resumed_from"])
        marks = ",".join("?" * len(chain))
        rows = conn.execute(
            f"SELECT * FROM checkpoints WHERE run_id IN ({marks}) ORDER BY step DESC, id DESC", chain
        ).fetchall()
    for row in rows:
        folder = store.path / row["path"]
        if (folder / "trainer_state.json").is_file():
            identity = CheckpointIdentity(
                dlm_sha256=row["dlm_sha256"], base_model=row["base_model"], inputs_sha256=row["inputs_sha256"],
                world_size=row["world_size"], micro_batch_size=row["micro_batch_size"],
                grad_accum=row["grad_accum"], seed=row["seed"],
            )  # fmt: skip
            return run["id"], Checkpoint(row["run_id"], row["phase"], row["step"], folder, identity)
    raise TrainingError(
        f"nothing to resume: train run {run['id']} stopped before its first checkpoint "
        "(one is written every training.checkpoint_steps steps)",
        hint=hint,
    )


#: Field -> words for the refusal message.
_FIELDS = {
    "dlm_sha256": ("the document", "changed since"),
    "base_model": ("base_model", "differs from"),
    "inputs_sha256": ("the token datasets or their weights", "changed since"),
    "world_size": ("the number of processes", "differs from"),
    "micro_batch_size": ("the micro-batch size", "differs from"),
    "grad_accum": ("gradient accumulation", "differs from"),
    "seed": ("the seed", "differs from"),
}


def check_identity(checkpoint: Checkpoint, current: CheckpointIdentity, *, fields: tuple[str, ...]) -> None:
    """Refuse to resume ``checkpoint`` when one of ``fields`` differs from ``current``.

    Raises:
        TrainingError: naming the first field that differs, with both values.
    """
    for name in fields:
        old, new = getattr(checkpoint.identity, name), getattr(current, name)
        if old != new:
            what, verb = _FIELDS[name]
            shown = "" if name in ("dlm_sha256", "inputs_sha256") else f" ({old} then, {new} now)"
            raise TrainingError(
                f"cannot resume run {checkpoint.run_id} from step {checkpoint.step}: {what} {verb} "
                f"the checkpoint{shown}",
                hint="resume with what the run had, or start a new run without --resume",
            )


def remove_finished(store: Store, *, run_id: int) -> list[str]:
    """Remove the checkpoints (rows and folders) of run ``run_id``, which completed, and of every run
    that is not running; return the folders removed.

    Folders of finished runs that have no row (a checkpoint cut off while
    being written) go too.
    """
    root = store.path / CHECKPOINTS_DIR
    removed: list[str] = []
    with store.write() as conn:
        running = {row["id"] for row in conn.execute("SELECT id FROM runs WHERE status = 'running'")}
        running.discard(run_id)
        keep = sorted(running)
        conn.execute(f"DELETE FROM checkpoints WHERE run_id NOT IN ({','.join('?' * len(keep))})", keep)
        for folder in sorted(root.glob("run*")) if root.is_dir() else []:
            owner = folder.name.removeprefix("run")
            if owner.isdigit() and int(owner) in running:
                continue
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder.relative_to(store.path)))
    return removed


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

"""Adapter versions: ``<store>/adapter/versions/vNNNN/``, registered in ``adapters``.

A training run saves its LoRA adapter (``adapter_model.safetensors``, its
config and the tokenizer files) into a temporary folder beside the
versions, fsyncs it, and renames it to the next free ``vNNNN``. Only then is
the row with its sha256 inserted. A run interrupted at any point (Ctrl-C,
a full disk, a crash) leaves no registered version and never touches an
earlier one; its temporary folder is removed on the way out, or by
:func:`sweep_temporary` on a later run after a hard crash.

Each version belongs to a training phase. An ``sft`` adapter is trained on
the document's text and instruction rows; a ``preference`` adapter (DPO or
ORPO) continues from an SFT version, named as its ``parent_version``. A run
of both phases registers two versions, vN (sft) then vN+1 (preference);
``latest(store, phase="sft")`` is where a preference-only run starts.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dlmstore.clock import utc_now
from dlmstore.errors import StoreError
from dlmstore.store.atomic import StagingDir
from dlmstore.store.database import Store
from dlmstore.store.digests import file_sha256

VERSIONS_DIR = "adapter/versions"
WEIGHTS = "adapter_model.safetensors"
#: Staging folders are named after their run, so a sweep can tell a live one from a leftover.
STAGING_PREFIX = ".incoming-run"

Phase = Literal["sft", "preference"]
PreferenceMethod = Literal["dpo", "orpo"]
PHASES: tuple[Phase, ...] = ("sft", "preference")
PREFERENCE_METHODS: tuple[PreferenceMethod, ...] = ("dpo", "orpo")
_COLUMNS = (
    "version, run_id, phase, method, parent_version, path, sha256, bytes, base_model, steps, "
    "final_loss, created_at"
)


@dataclass(frozen=True)
class AdapterVersion:
    """One registered adapter."""

    version: int
    run_id: int
    phase: Phase
    method: PreferenceMethod | None
    parent_version: int | None
    path: str
    sha256: str
    bytes: int
    base_model: str
    steps: int
    final_loss: float | None
    created_at: str


def save_version(
    store: Store,
    *,
    run_id: int,
    write: Callable[[Path], None],
    base_model: str,
    steps: int,
    final_loss: float | None,
    phase: Phase = "sft",
    method: PreferenceMethod | None = None,
    parent_version: int | None = None,
) -> AdapterVersion:
    """Have ``write`` fill a temporary folder, then publish it as the next version.

    Args:
        phase: ``sft``, or ``preference`` for an adapter trained on
            preference pairs, which needs ``method`` (``dpo`` or ``orpo``)
            and ``parent_version``, the registered SFT version it started from.

    Raises:
        ValueError: ``method`` or ``parent_version`` do not fit ``phase``,
            or the run already has an adapter of ``phase`` (a caller's
            mistake, caught before anything is written).
        StoreError: the folder cannot be written (disk full, read-only
            store); nothing is registered and earlier versions are untouched.
    """
    _check_origin(store, run_id, phase, method, parent_version)
    versions = store.path / VERSIONS_DIR
    staging: StagingDir | None = None
    try:
        versions.mkdir(parents=True, exist_ok=True)
        staging = StagingDir(versions, name=f"{STAGING_PREFIX}{run_id}")
        write(staging.path)
        weights = staging.path / WEIGHTS
        sha256 = file_sha256(weights)
        size = weights.stat().st_size
        version = _publish(staging, versions)
    except OSError as exc:
        raise StoreError(
            f"cannot write the adapter under {versions}: {exc.strerror or exc}",
            hint="free some disk space (earlier adapter versions are untouched) and run again",
        ) from None
    finally:
        if staging is not None:
            staging.abort()  # nothing once published
    relpath = f"{VERSIONS_DIR}/v{version:04d}"
    now = utc_now()
    with store.write() as conn:
        conn.execute(
            f"INSERT INTO adapters ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (version, run_id, phase, method, parent_version, relpath, sha256, size, base_model, steps,
             final_loss, now),
        )  # fmt: skip
    return AdapterVersion(version, run_id, phase, method, parent_version, relpath, sha256, size,
                          base_model, steps, final_loss, now)  # fmt: skip


def _check_origin(
    store: Store, run_id: int, phase: str, method: str | None, parent_version: int | None
) -> None:
    """What the ``adapters`` constraints would refuse, refused before any file is written.

    Also refused: a preference adapter whose parent is not a registered SFT
    version.
    """
    fits = (phase == "sft" and method is None and parent_version is None) or (
        phase == "preference" and method in PREFERENCE_METHODS and parent_version is not None
    )
    if not fits:
        raise ValueError(
            f"an adapter of phase {phase!r} with method {method!r} and parent_version {parent_version!r}: "
            "sft adapters have neither, preference adapters need method dpo or orpo and an sft parent_version"
        )
    with store.read() as conn:
        if conn.execute("SELECT 1 FROM adapters WHERE run_id = ? AND phase = ?", (run_id, phase)).fetchone():
            raise ValueError(f"run {run_id} has already registered its {phase} adapter")
        if parent_version is not None:
            row = conn.execute("SELECT phase FROM adapters WHERE version = ?", (parent_version,)).fetchone()
            if row is None or row["phase"] != "sft":
                raise ValueError(f"parent_version {parent_version} is not a registered sft adapter version")


def _publish(staging: StagingDir, versions: Path) -> int:
    """Rename ``staging`` to the first free ``vNNNN`` (atomic; never over an existing one)."""
    taken = [int(p.name[1:]) for p in versions.glob("v[0-9][0-9][0-9][0-9]") if p.name[1:].isdigit()]
    version = max(taken, default=0) + 1
    while True:
        try:
            staging.publish(versions / f"v{version:04d}")
        except FileExistsError:  # another run took it first
            version += 1
            continue
        return version


def latest(store: Store, phase: Phase | None = None) -> AdapterVersion | None:
    """The newest registered adapter version (of ``phase``, when given), or ``None``."""
    where, params = ("WHERE phase = ?", (phase,)) if phase is not None else ("", ())
    with store.read() as conn:
        row = conn.execute(
            f"SELECT {_COLUMNS} FROM adapters {where} ORDER BY version DESC LIMIT 1", params
        ).fetchone()
    return AdapterVersion(**row) if row else None


def sweep_temporary(store: Store) -> int:
    """Remove staging folders of runs that are no longer running; return how many."""
    versions = store.path / VERSIONS_DIR
    if not versions.is_dir():
        return 0
    with store.read() as conn:
        running = {row["id"] for row in conn.execute("SELECT id FROM runs WHERE status = 'running'")}
    removed = 0
    for entry in versions.glob(f"{STAGING_PREFIX}*"):
        run_id = entry.name.removeprefix(STAGING_PREFIX)
        if not (run_id.isdigit() and int(run_id) in running):
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed

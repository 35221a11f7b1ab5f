"""Adapter versions: ``<store>/adapter/versions/vNNNN/``, registered in ``adapters``.

A training run saves its LoRA adapter (``adapter_model.safetensors``, its
config and the tokenizer files) into a temporary folder beside the
versions, fsyncs it, and renames it to the next free ``vNNNN``. Only then is
the row with its sha256 inserted. A run interrupted at any point (Ctrl-C,
a full disk, a crash) leaves no registered version and never touches an
earlier one; its temporary folder is removed on the way out, or by
:func:`sweep_temporary` on a later run after a hard crash.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dlmstore.clock import utc_now
from dlmstore.errors import StoreError
from dlmstore.store.atomic import StagingDir
from dlmstore.store.database import Store
from dlmstore.store.digests import file_sha256

VERSIONS_DIR = "adapter/versions"
WEIGHTS = "adapter_model.safetensors"
#: Staging folders are named after their run, so a sweep can tell a live one from a leftover.
STAGING_PREFIX = ".incoming-run"


@dataclass(frozen=True)
class AdapterVersion:
    """One registered adapter."""

    version: int
    run_id: int
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
) -> AdapterVersion:
    """Have ``write`` fill a temporary folder, then publish it as the next version.

    Raises:
        StoreError: the folder cannot be written (disk full, read-only
            store); nothing is registered and earlier versions are untouched.
    """
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
            "INSERT INTO adapters (version, run_id, path, sha256, bytes, base_model, steps, final_loss, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (version, run_id, relpath, sha256, size, base_model, steps, final_loss, now),
        )
    return AdapterVersion(version, run_id, relpath, sha256, size, base_model, steps, final_loss, now)


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


def latest(store: Store) -> AdapterVersion | None:
    """The newest registered adapter version, or ``None``."""
    with store.read() as conn:
        row = conn.execute(
            "SELECT version, run_id, path, sha256, bytes, base_model, steps, final_loss, created_at "
            "FROM adapters ORDER BY version DESC LIMIT 1"
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

"""Adapter versions: ``<store>/adapter/versions/vNNNN/``, registered in ``adapters``.

A run's adapters become versions in three steps, so that a run either
registers all of them, with its lock, or none:

1. :func:`stage_version`, after each training phase: the phase's adapter
   (``adapter_model.safetensors``, its config and the tokenizer files) is
   written into a staging folder named after the run and the phase
   (``.incoming-run7-sft``) beside the versions, and hashed. The preference
   phase trains the SFT adapter further in memory, so SFT's has to be on
   disk before it starts.
2. :func:`publish_versions`, when every phase has trained: each staging
   folder is fsynced and renamed to the next free ``vNNNN``.
3. :func:`register_versions`, inside a transaction that also records the
   run's lock (``dlmstore.lock.commit_lock``, which writes ``dlm.lock``
   before it commits): one row per version, a preference version naming the SFT
   version published with it (or the one it started from) as its
   ``parent_version``. If that transaction fails, :func:`withdraw_versions`
   removes the published folders; once it commits, :func:`settle_versions`
   removes the ``.pending-run<N>`` marker each folder carried since it was
   staged. :func:`commit_versions` is steps 2 and 3 with their cleanup.

A run interrupted at any point (Ctrl-C, a full disk, a NaN loss, a lock
that cannot be written) leaves no registered version and never touches an
earlier one; its folders are removed on the way out. A hard crash (kill -9,
power loss) can leave a staging folder, or a published folder that was
never registered (it still has its marker, which names the run);
:func:`sweep_debris` removes both when the next ``dlm train`` starts, with
the trainers' own ``.trainer-run*`` folders.

Each version belongs to a training phase. An ``sft`` adapter is trained on
the document's text and instruction rows; a ``preference`` adapter (DPO or
ORPO) continues from an SFT version, named as its ``parent_version``. A run
of both phases registers two versions, vN (sft) then vN+1 (preference);
``latest(store, phase="sft")`` is where a preference-only run starts.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dlmstore.clock import utc_now
from dlmstore.errors import StoreError
from dlmstore.store.atomic import StagingDir
from dlmstore.store.database import Store
from dlmstore.store.digests import file_sha256
from dlmstore.store.path_text import utf8_alias

VERSIONS_DIR = "adapter/versions"
WEIGHTS = "adapter_model.safetensors"
#: Staging folders are named after their run (``.incoming-run7-sft``), so a sweep can tell a
#: live one from a leftover; so are the trainers' output folders (``.trainer-run7-xxxx``, in the store).
STAGING_PREFIX = ".incoming-run"
TRAINER_PREFIX = ".trainer-run"
#: An empty file ``.pending-run<N>`` in a version folder until its row is committed.
PENDING_PREFIX = ".pending-run"

Phase = Literal["sft", "preference"]
PreferenceMethod = Literal["dpo", "orpo"]
PHASES: tuple[Phase, ...] = ("sft", "preference")
PREFERENCE_METHODS: tuple[PreferenceMethod, ...] = ("dpo", "orpo")
_COLUMNS = (
    "version, run_id, phase, method, parent_version, path, sha256, bytes, base_model, steps, "
    "final_loss, created_at, name"
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
    name: str | None = None  # the named adapter (training.adapters) it is a version of; None: the one adapter


@dataclass
class StagedVersion:
    """An adapter written and hashed in its staging folder, not yet a version.

    ``parent_version`` is None for a preference adapter whose parent is the
    SFT adapter staged with it in the same run (its number is settled when
    both are published).
    """

    run_id: int
    phase: Phase
    method: PreferenceMethod | None
    parent_version: int | None
    base_model: str
    steps: int
    final_loss: float | None
    sha256: str
    bytes: int
    staging: StagingDir

    def abort(self) -> None:
        """Remove the staging folder (nothing, once published)."""
        self.staging.abort()


@dataclass(frozen=True)
class PublishedVersion:
    """A staged adapter renamed to ``vNNNN``, waiting for its row."""

    staged: StagedVersion
    version: int
    folder: Path

    @property
    def path(self) -> str:
        """The folder relative to the store directory (the ``adapters.path`` column)."""
        return f"{VERSIONS_DIR}/{self.folder.name}"


def stage_version(
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
    parent_staged: bool = False,
) -> StagedVersion:
    """Have ``write`` fill the run's staging folder for ``phase`` and hash the weights.

    Args:
        phase: ``sft``, or ``preference`` for an adapter trained on
            preference pairs, which needs ``method`` (``dpo`` or ``orpo``)
            and a parent: ``parent_version``, a registered SFT version, or
            ``parent_staged`` when the parent is the SFT adapter this run
            staged before it.

    Raises:
        ValueError: ``method`` or the parent do not fit ``phase``, or the
            run already has an adapter of ``phase`` (a caller's mistake,
            caught before anything is written).
        StoreError: the folder cannot be written (disk full, read-only
            store), whatever the writing library raised; nothing is staged.
        DlmError: what ``write`` raised as one (a check of the weights);
            any other exception that is no write failure propagates as it is.
    """
    _check_origin(store, run_id, phase, method, parent_version, parent_staged)
    versions = store.path / VERSIONS_DIR
    staging: StagingDir | None = None
    try:
        try:
            versions.mkdir(parents=True, exist_ok=True)
            staging = StagingDir(versions, name=f"{STAGING_PREFIX}{run_id}-{phase}")
            with utf8_alias(staging.path) as folder:  # safetensors writes only through a UTF-8 path
                write(folder)
            (staging.path / f"{PENDING_PREFIX}{run_id}").touch()
            weights = staging.path / WEIGHTS
            sha256 = file_sha256(weights)
            size = weights.stat().st_size
        except Exception as exc:
            if not is_write_failure(exc):
                raise  # a DlmError (a check of the weights) or a bug: not the disk's fault
            raise _write_error(versions, exc) from None
    except BaseException:
        if staging is not None:
            staging.abort()
        raise
    return StagedVersion(run_id, phase, method, parent_version, base_model, steps, final_loss, sha256, size,
                         staging)  # fmt: skip


def publish_versions(store: Store, staged: list[StagedVersion]) -> list[PublishedVersion]:
    """Rename each staged folder, in order, to the next free ``vNNNN`` (none is registered yet).

    Raises:
        StoreError: a rename failed; the folders already renamed are
            removed again and every staging folder too.
    """
    versions = store.path / VERSIONS_DIR
    published: list[PublishedVersion] = []
    try:
        for item in staged:
            version = _publish(item.staging, versions)
            published.append(PublishedVersion(item, version, versions / f"v{version:04d}"))
    except BaseException as exc:
        withdraw_versions(published)
        for item in staged:
            item.abort()
        if isinstance(exc, OSError):
            raise _write_error(versions, exc) from None
        raise
    return published


def register_versions(conn: sqlite3.Connection, published: list[PublishedVersion]) -> list[AdapterVersion]:
    """Insert a row for each published version, in the caller's transaction.

    A preference version staged with ``parent_staged`` gets the SFT version
    published before it in ``published`` as its ``parent_version``.
    """
    now = utc_now()
    out: list[AdapterVersion] = []
    sft: int | None = None
    for item in published:
        staged = item.staged
        parent = staged.parent_version
        if staged.phase == "preference" and parent is None:
            parent = sft
        (name,) = conn.execute("SELECT adapter FROM runs WHERE id = ?", (staged.run_id,)).fetchone() or (
            None,
        )
        adapter = AdapterVersion(
            item.version, staged.run_id, staged.phase, staged.method, parent, item.path, staged.sha256,
            staged.bytes, staged.base_model, staged.steps, staged.final_loss, now, name,
        )  # fmt: skip
        conn.execute(
            f"INSERT INTO adapters ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            dataclasses.astuple(adapter),
        )
        if staged.phase == "sft":
            sft = item.version
        out.append(adapter)
    return out


def settle_versions(published: list[PublishedVersion]) -> None:
    """Remove the pending markers of versions whose rows are committed (best effort).

    A marker left by a crash here is removed by the next :func:`sweep_debris`.
    """
    for item in published:
        (item.folder / f"{PENDING_PREFIX}{item.staged.run_id}").unlink(missing_ok=True)


def withdraw_versions(published: list[PublishedVersion]) -> None:
    """Remove published folders whose rows were never committed."""
    for item in published:
        shutil.rmtree(item.folder, ignore_errors=True)


def commit_versions(
    store: Store,
    staged: list[StagedVersion],
    transaction: Callable[[], AbstractContextManager[sqlite3.Connection]],
) -> list[AdapterVersion]:
    """Publish ``staged`` and register the versions in ``transaction``: all of them, or none.

    Args:
        store: the store they were staged in.
        staged: the run's staged adapters, SFT first.
        transaction: opens the write transaction the rows go into, with
            whatever else it records (``dlm train`` passes
            ``dlmstore.lock.commit_lock``, which records the run's lock and
            writes ``dlm.lock`` before it commits; :func:`save_version`
            passes ``store.write``).

    Raises:
        StoreError: a folder cannot be renamed, or the transaction fails;
            the renamed folders are removed again and nothing is registered.
    """
    published = publish_versions(store, staged)  # on failure it removes what it renamed and staged
    try:
        with transaction() as conn:
            adapters = register_versions(conn, published)
    except BaseException:
        withdraw_versions(published)
        raise
    settle_versions(published)
    return adapters


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
    """Stage, publish and register one adapter in its own transaction (no lock is recorded).

    ``dlm train`` registers a run's adapters together with its lock
    (:func:`commit_versions`); this is the one-adapter form of the same
    steps. Raises what :func:`stage_version` raises.
    """
    staged = stage_version(
        store, run_id=run_id, write=write, base_model=base_model, steps=steps, final_loss=final_loss,
        phase=phase, method=method, parent_version=parent_version,
    )  # fmt: skip
    (adapter,) = commit_versions(store, [staged], store.write)
    return adapter


def is_write_failure(exc: Exception) -> bool:
    """Whether ``exc`` is how a library reports a failed write (disk full, read-only, missing folder).

    OSError from Python; the Rust and C++ libraries raise their own: the
    tokenizers library a bare ``Exception`` ("No space left on device (os
    error 28)"), safetensors a ``SafetensorError``, ``torch.save`` (the
    optimizer state of a checkpoint) a ``RuntimeError`` from its stream
    writer ("... file write failed").
    """
    from safetensors import SafetensorError

    if isinstance(exc, RuntimeError) and "file write failed" in str(exc):
        return True
    return isinstance(exc, OSError | SafetensorError) or type(exc) is Exception


def write_failure_reason(exc: BaseException) -> str:
    """What a failed write says, short: ``No space left on device`` rather than the errno and path."""
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or type(exc).__name__


#: How a failed write says the disk is full, or that it may not write: an errno (Python), or the
#: text the Rust libraries write (tokenizers: "No space left on device (os error 28)").
_FULL = ({errno.ENOSPC, errno.EDQUOT}, ("No space left on device", "Disk quota exceeded", "os error 28)"))
_REFUSED = (
    {errno.EROFS, errno.EACCES, errno.EPERM},
    ("Read-only file system", "Permission denied", "Operation not permitted", "os error 30)", "os error 13)"),
)


def write_failure_hint(exc: BaseException, *, writable: str, then: str) -> str:
    """What to do about the failed write ``exc``, as far as it tells why, followed by ``then``.

    Freeing disk space is said only when ``exc`` says the disk is full;
    making ``writable`` (a folder, or "the store") writable when it says the
    write was refused; when it does not say (torch's "file write failed",
    safetensors' "I/O error"), both are named as what to check.
    """

    def says(errnos: set[int], texts: tuple[str, ...]) -> bool:
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc.errno in errnos
        return any(text in str(exc) for text in texts)

    if says(*_FULL):
        return f"free some disk space{then}"
    if says(*_REFUSED):
        return f"make {writable} writable{then}"
    return f"check that the disk has free space and {writable} is writable{then}"


def _write_error(versions: Path, exc: BaseException) -> StoreError:
    reason = write_failure_reason(exc)
    return StoreError(
        f"cannot write the adapter under {versions}: {reason}",
        hint=write_failure_hint(
            exc, writable="the store", then=" (earlier adapter versions are untouched) and run again"
        ),
    )


def _check_origin(
    store: Store,
    run_id: int,
    phase: str,
    method: str | None,
    parent_version: int | None,
    parent_staged: bool = False,
) -> None:
    """What the ``adapters`` constraints would refuse, refused before any file is written.

    Also refused: a preference adapter whose parent is not a registered SFT
    version.
    """
    has_parent = parent_version is not None or parent_staged
    fits = (phase == "sft" and method is None and not has_parent) or (
        phase == "preference" and method in PREFERENCE_METHODS and has_parent
    )
    if not fits or (parent_staged and parent_version is not None):
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
    from dlmstore.store.highwater import adapter_floor

    taken = [int(p.name[1:]) for p in versions.glob("v[0-9][0-9][0-9][0-9]") if p.name[1:].isdigit()]
    # A version store.db lost (and `verify --repair` accepted losing) is never handed out again.
    version = max([*taken, adapter_floor(versions.parent.parent)], default=0) + 1
    while True:
        try:
            staging.publish(versions / f"v{version:04d}")
        except FileExistsError:  # another run took it first
            version += 1
            continue
        return version


def latest(store: Store, phase: Phase | None = None, *, name: str | None = None) -> AdapterVersion | None:
    """The newest registered version of the document's adapter, or of the named adapter ``name``
    (``training.adapters``), of ``phase`` when given; ``None`` when there is none."""
    where, params = "WHERE name IS ?", [name]
    if phase is not None:
        where, params = f"{where} AND phase = ?", [*params, phase]
    with store.read() as conn:
        row = conn.execute(
            f"SELECT {_COLUMNS} FROM adapters {where} ORDER BY version DESC LIMIT 1", params
        ).fetchone()
    return AdapterVersion(**row) if row else None


def comparable_adapters(
    store: Store, base_model: str, *, name: str | None = None
) -> dict[str, AdapterVersion]:
    """The newest adapter of each phase trained on ``base_model`` whose weights verify, by phase: what
    a train run compares its own with (the retention slice's loss). A damaged one is left out, never
    loaded."""
    found: dict[str, AdapterVersion] = {}
    for phase in ("sft", "preference"):
        adapter = latest(store, phase=phase, name=name)
        if adapter is None or adapter.base_model != base_model:
            continue
        try:
            checked_folder(store, adapter)
        except StoreError:
            continue
        found[phase] = adapter
    return found


def find_version(store: Store, version: int) -> AdapterVersion | None:
    """The registered adapter ``version``, or ``None``."""
    with store.read() as conn:
        row = conn.execute(f"SELECT {_COLUMNS} FROM adapters WHERE version = ?", (version,)).fetchone()
    return AdapterVersion(**row) if row else None


#: What to do about a damaged adapter, unless the command says more (export and eval: ``--adapter``).
DAMAGED_HINT = "train again (dlm train) to write a new adapter version"


def checked_folder(store: Store, adapter: AdapterVersion, *, hint: str = DAMAGED_HINT) -> Path:
    """The folder of ``adapter``, once its weights are found to match the sha256 recorded when it was trained.

    Every command that loads a stored adapter asks here first (``dlm eval``,
    ``dlm export``, ``dlm prompt``, the preference phase of
    ``dlm train --phase preference``), so a damaged adapter is refused the
    same way everywhere and never answers, is judged, exported or trained on.

    Raises:
        StoreError: the weights cannot be read, or their bytes changed.
    """
    folder = store.path / adapter.path
    weights = folder / WEIGHTS
    if not os.path.lexists(folder):
        raise StoreError(
            f"adapter v{adapter.version:04d}: its folder {folder} is not there (removed, or left out of the "
            "pack this store was unpacked from: `dlm pack --adapters` chooses the versions a pack carries)",
            hint=hint,
        )
    try:
        found = file_sha256(weights)
    except OSError as exc:
        raise StoreError(
            f"adapter v{adapter.version:04d}: cannot read {weights}: {exc.strerror or exc}", hint=hint
        ) from None
    if found != adapter.sha256:
        raise StoreError(
            f"adapter v{adapter.version:04d}: {weights} is damaged (its sha256 is {found}, not the "
            f"{adapter.sha256} recorded when it was trained)",
            hint=hint,
        )
    return folder


def sweep_debris(store: Store, *, run_id: int) -> list[str]:
    """Remove what train runs that are no longer running left behind; return the paths removed.

    Called by run ``run_id`` once it is recorded as running (which also
    marks runs whose process is gone as failed), inside a write
    transaction, so no other run can start while it looks. For every run
    ``<N>`` that is not running:

    * its staging folders (``adapter/versions/.incoming-run<N>-<phase>``)
      and trainer output folders (``.trainer-run<N>-*`` in the store);
    * its published ``vNNNN`` folders that have no ``adapters`` row (killed
      between the rename and the commit): they still hold the
      ``.pending-run<N>`` marker that is removed once the row is committed;
    * the learned gate's staging folders and ``gate/run<N>`` folders with no
      ``gates`` row of gate runs no longer running (``dlmstore.gate.gates.gate_debris``).

    A ``vNNNN`` folder without a row and without a marker is left alone: it
    was registered in a store.db that has since been replaced (moved aside
    after damage), and is the user's. A registered folder that still has a
    marker (killed between the commit and the marker's removal) only loses
    the marker.
    """
    versions = store.path / VERSIONS_DIR
    removed: list[str] = []
    with store.write() as conn:
        running = {
            row["id"]
            for row in conn.execute("SELECT id FROM runs WHERE status = 'running' AND command = 'train'")
        } - {run_id}
        registered = {row["version"] for row in conn.execute("SELECT version FROM adapters")}
        debris = [
            *(e for e in store.path.glob(f"{TRAINER_PREFIX}*") if _owner(e, TRAINER_PREFIX) not in running),
            *(e for e in versions.glob(f"{STAGING_PREFIX}*") if _owner(e, STAGING_PREFIX) not in running),
        ]
        for marker in versions.glob(f"v[0-9][0-9][0-9][0-9]/{PENDING_PREFIX}*"):
            folder = marker.parent
            if folder.name[1:].isdigit() and int(folder.name[1:]) in registered:
                marker.unlink(missing_ok=True)
            elif _owner(marker, PENDING_PREFIX) not in running:
                debris.append(folder)
        from dlmstore.gate.gates import gate_debris

        alive = {row["id"] for row in conn.execute("SELECT id FROM runs WHERE status = 'running'")} - {run_id}
        debris += gate_debris(conn, store.path, running=alive)
        for entry in debris:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(str(entry.relative_to(store.path)))
    return sorted(removed)


def _owner(entry: Path, prefix: str) -> int | None:
    """The run id in ``<prefix><N>-...`` (None when the name has none: nobody's, so swept)."""
    digits = entry.name.removeprefix(prefix).split("-", 1)[0]
    return int(digits) if digits.isdigit() else None

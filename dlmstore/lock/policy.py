"""Comparing a run's lock with the previous one, and deciding what to do.

:func:`compare` applies the severity table of docs/reproducibility.md and
nothing else; fields not in the table (seed, CUDA/ROCm versions, the base
model sha256, licence, timestamps, run ids) are recorded but never compared.

* ``dlm_sha256``: ALLOW (editing the document is the point);
* ``base_model_revision``: ERROR;
* ``pinned_versions.torch``: ERROR for a new major version, else WARN;
* ``pinned_versions.transformers`` / ``peft`` / ``trl`` / ``accelerate`` / ``llama_cpp``: WARN
  (``llama_cpp``: the llama-cpp-python ``dlm export`` wrote GGUF files with);
* ``pinned_versions.bitsandbytes``: WARN for any change, appearing or vanishing too;
* ``hardware_tier``, ``determinism_class``, each ``determinism_flags.<flag>``: WARN;
* each ``preference.<key>`` (the preference phase's method and
  hyperparameters): ALLOW. They are written in the document, so changing
  them is an edit like any other (``dlm_sha256`` is ALLOW for the same
  reason); the lock records them so ``dlm lock diff`` says what changed in
  training terms, and a run with a preference phase against one without
  shows as ``preference.method: None -> 'dpo'``.
* ``datasets.<path>#<split>.meta_sha256`` (a token dataset the run mixed
  in, ``dlmstore.train.data.inputs``): WARN. The same folder now holds other
  bytes (rebuilt, or edited in place), which the document does not show;
  ``--strict-lock`` makes it an error. A dataset added or dropped, or a
  weight changed, is ALLOW: the document or the command line says so.

:func:`decide` turns the mismatches into a :class:`LockDecision` for one of
four modes, the library side of ``dlm train``'s flags:

* ``validate`` (no flag): ERROR stops the run, WARN is reported, write;
* ``strict`` (``--strict-lock``): WARN counts as ERROR;
* ``update`` (``--update-lock``): no validation, write (a corrupt lock too);
* ``ignore`` (``--ignore-lock``): no validation, the file is not written
  (the run still gets a lock record with decision ``ignored``).
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from dlmstore.errors import LockError, LockValidationError
from dlmstore.lock.model import LOCK_NAME, REPLACE_HINT, Lock, read_lock
from dlmstore.store.database import Store

Severity = Literal["ALLOW", "WARN", "ERROR"]
LockMode = Literal["validate", "strict", "update", "ignore"]
Decision = Literal["written", "updated", "ignored"]

LOCK_MODES: tuple[str, ...] = get_args(LockMode)

#: The table, for every field compared as a whole.
SEVERITIES: dict[str, Severity] = {
    "dlm_sha256": "ALLOW",
    "base_model_revision": "ERROR",
    "hardware_tier": "WARN",
    "determinism_class": "WARN",
}

#: Pinned packages whose every change is a WARN (torch is graded by major version).
WARN_PACKAGES = ("transformers", "peft", "trl", "accelerate", "llama_cpp", "bitsandbytes")

VALIDATION_HINT = (
    "rerun with --update-lock to accept the change and rewrite dlm.lock, "
    "or --ignore-lock to train without checking or writing it"
)

Value = str | int | float | bool | None


@dataclass(frozen=True)
class Mismatch:
    """One field that differs between two locks.

    Attributes:
        field: the lock field, dotted for nested ones
            (``pinned_versions.torch``, ``determinism_flags.warn_only``).
        old: the value in the earlier lock (None when absent).
        new: the value in the later lock (None when absent).
        severity: ``ALLOW``, ``WARN`` or ``ERROR`` from the table.
    """

    field: str
    old: Value
    new: Value
    severity: Severity

    def describe(self) -> str:
        """``pinned_versions.torch: '2.5.1' -> '3.0.0' (ERROR)``."""
        return f"{self.field}: {self.old!r} -> {self.new!r} ({self.severity})"


@dataclass(frozen=True)
class LockDecision:
    """What a run does about its lock.

    Attributes:
        mode: the mode decided under.
        decision: ``written``, ``updated`` or ``ignored``: pass it to
            :func:`dlmstore.lock.write_lock` when the run succeeds.
        write: whether ``dlm.lock`` is (re)written on success.
        mismatches: every difference from the previous lock, ALLOW included
            (empty when there is no previous lock).
        warnings: one line per WARN to print on stderr (``validate`` only).
    """

    mode: str
    decision: Decision
    write: bool
    mismatches: list[Mismatch] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def compare(previous: Lock, current: Lock) -> list[Mismatch]:
    """Every field of the severity table that differs, in table order."""
    found: list[Mismatch] = []
    for name in ("dlm_sha256", "base_model_revision"):
        _add(found, name, getattr(previous, name), getattr(current, name), SEVERITIES[name])
    old_torch = previous.pinned_versions.get("torch")
    new_torch = current.pinned_versions.get("torch")
    torch_severity: Severity = "ERROR" if _major(old_torch) != _major(new_torch) else "WARN"
    _add(found, "pinned_versions.torch", old_torch, new_torch, torch_severity)
    for package in WARN_PACKAGES:
        _add(
            found,
            f"pinned_versions.{package}",
            previous.pinned_versions.get(package),
            current.pinned_versions.get(package),
            "WARN",
        )
    for name in ("hardware_tier", "determinism_class"):
        _add(found, name, getattr(previous, name), getattr(current, name), SEVERITIES[name])
    old_preference = previous.preference or {}
    new_preference = current.preference or {}
    for key in _preference_keys(old_preference, new_preference):
        _add(found, f"preference.{key}", old_preference.get(key), new_preference.get(key), "ALLOW")
    old_datasets = previous.datasets or {}
    new_datasets = current.datasets or {}
    for key in sorted(set(old_datasets) | set(new_datasets)):
        old, new = old_datasets.get(key), new_datasets.get(key)
        if old is None or new is None:
            _add(
                found,
                f"datasets.{key}",
                None if old is None else "present",
                None if new is None else "present",
                "ALLOW",
            )
            continue
        _add(found, f"datasets.{key}.meta_sha256", old.get("meta_sha256"), new.get("meta_sha256"), "WARN")
        _add(found, f"datasets.{key}.weight", old.get("weight"), new.get("weight"), "ALLOW")
    old_replay, new_replay = previous.replay or {}, current.replay or {}
    for key in ("generation", "draw_sha256"):
        _add(found, f"replay.{key}", old_replay.get(key), new_replay.get(key), "ALLOW")
    for flag in sorted(set(previous.determinism_flags) | set(current.determinism_flags)):
        _add(
            found,
            f"determinism_flags.{flag}",
            previous.determinism_flags.get(flag),
            current.determinism_flags.get(flag),
            "WARN",
        )
    return found


def decide(previous: Lock | None, current: Lock, *, mode: str) -> LockDecision:
    """Apply ``mode`` to the differences between ``previous`` and ``current``.

    Args:
        previous: the lock in ``dlm.lock``, or None when there is none yet.
        current: the lock captured for this run.
        mode: ``validate``, ``strict``, ``update`` or ``ignore``.

    Raises:
        LockValidationError: an ERROR (or, under ``strict``, a WARN)
            mismatch; the message lists every blocking change.
    """
    if mode not in LOCK_MODES:
        raise ValueError(f"unknown lock mode {mode!r}; expected one of {', '.join(LOCK_MODES)}")
    mismatches = compare(previous, current) if previous is not None else []
    if mode == "update":
        return LockDecision(mode, "updated", True, mismatches)
    if mode == "ignore":
        return LockDecision(mode, "ignored", False, mismatches)
    blocking = [m for m in mismatches if m.severity == "ERROR" or (mode == "strict" and m.severity == "WARN")]
    if blocking:
        lines = "\n".join(f"  {_blocking_line(m, mode)}" for m in blocking)
        noun = "change" if len(blocking) == 1 else "changes"
        raise LockValidationError(
            f"{LOCK_NAME} does not match this run ({len(blocking)} blocking {noun}):\n{lines}",
            hint=VALIDATION_HINT,
        )
    warnings = [f"{LOCK_NAME}: {m.describe()}" for m in mismatches if m.severity == "WARN"]
    return LockDecision(mode, "written", True, mismatches, warnings)


def check_lock(store: Store, current: Lock, *, mode: str) -> LockDecision:
    """Read the store's ``dlm.lock`` and :func:`decide` about ``current``.

    A corrupt ``dlm.lock`` is an error in every mode but ``update``, which
    replaces it. A ``dlm.lock`` that is no regular file (a directory, a
    FIFO) can be neither read (a FIFO would block) nor replaced, so it is an
    error in every mode: found here, before any training, rather than when
    the run's lock is written.

    Raises:
        LockError: ``dlm.lock`` is corrupt and ``mode`` is not ``update``,
            or it is no regular file.
        LockValidationError: see :func:`decide`.
    """
    path = store.path / LOCK_NAME
    _require_regular_file(path)
    try:
        previous = read_lock(path)
    except LockError:
        if mode != "update":
            raise
        previous = None
    return decide(previous, current, mode=mode)


def _require_regular_file(path: Path) -> None:
    """Raise LockError when ``path`` exists and is not a regular file (symlinks followed)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise LockError(f"cannot read {path}: {exc.strerror or exc}", hint=REPLACE_HINT) from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise LockError(
            f"{path} is {kind}, so no lock can be read from it or written to it",
            hint=f"move it out of the way (e.g. `mv {path} {path}.old`) and run again; "
            "dlm train writes a new dlm.lock",
        )


def _blocking_line(mismatch: Mismatch, mode: str) -> str:
    if mismatch.severity == "WARN" and mode == "strict":
        return f"{mismatch.field}: {mismatch.old!r} -> {mismatch.new!r} (WARN, an error under --strict-lock)"
    return mismatch.describe()


def _add(found: list[Mismatch], name: str, old: Value, new: Value, severity: Severity) -> None:
    if old != new:
        found.append(Mismatch(name, old, new, severity))


def _preference_keys(old: dict[str, Value], new: dict[str, Value]) -> list[str]:
    """``method`` first, then the rest in name order."""
    keys = set(old) | set(new)
    return (["method"] if "method" in keys else []) + sorted(keys - {"method"})


def _major(version: str | None) -> str | None:
    """``2.13.0+cpu`` -> ``2``; None stays None."""
    if version is None:
        return None
    return version.split(".", 1)[0].strip()

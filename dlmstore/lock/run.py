"""The two calls ``dlm train`` makes: :func:`begin_lock` before training, :func:`commit_lock` after.

:func:`begin_lock` applies the determinism settings, captures the run's
lock and checks it against ``dlm.lock`` before any expensive work, so a
blocking mismatch (or a ``dlm.lock`` that is a directory) costs nothing.
:func:`commit_lock` runs only when training succeeded: it is the write
transaction in which the run registers its adapter versions, and it
writes ``dlm.lock`` just before that transaction commits
(``dlmstore.lock.records.lock_transaction``), so a failed or interrupted
run never touches ``dlm.lock``, records no lock row and registers no
adapter. :func:`finish_lock` is :func:`commit_lock` with nothing to add.

A hub base that is not in the local Hugging Face cache yet has no known
revision when the run begins (it is downloaded when the model loads);
:func:`finish_lock` looks again, so the lock written for the run names the
commit it actually trained on.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlmstore.errors import LockError
from dlmstore.lock.identity import base_model_identity
from dlmstore.lock.model import LLAMA_CPP, LOCK_NAME, Lock, capture_lock, preference_record, read_lock
from dlmstore.lock.policy import LockDecision, check_lock
from dlmstore.lock.records import lock_transaction
from dlmstore.store.database import Store

if TYPE_CHECKING:
    from dlmstore.bases import BaseModelRef
    from dlmstore.determinism import DeterminismInfo
    from dlmstore.document.frontmatter import PreferenceSettings
    from dlmstore.document.parser import Document


@dataclass(frozen=True)
class PendingLock:
    """A run's captured lock and the decision taken about it, until the run ends."""

    lock: Lock
    decision: LockDecision
    ref: BaseModelRef

    @property
    def warnings(self) -> list[str]:
        """Lines to print on stderr (WARN mismatches under the default mode)."""
        return list(self.decision.warnings)


def begin_lock(
    store: Store,
    document: Document,
    ref: BaseModelRef,
    *,
    seed: int,
    run_id: int,
    mode: str,
    determinism: DeterminismInfo | None = None,
    datasets: Sequence[Mapping[str, Any]] = (),
) -> PendingLock:
    """Capture this run's lock and check it against ``dlm.lock``.

    Args:
        store: the document's store.
        document: the parsed document.
        ref: its resolved base model.
        seed: the seed the run trains with.
        run_id: the run being recorded.
        mode: ``validate``, ``strict``, ``update`` or ``ignore``.
        determinism: what :func:`~dlmstore.determinism.apply_determinism`
            returned; applied here when not given (it is idempotent).
        datasets: identities of the token datasets the run trains on.

    Raises:
        LockError: ``dlm.lock`` is corrupt and ``mode`` is not ``update``,
            or it is no regular file (a directory, a FIFO).
        LockValidationError: a blocking mismatch; nothing was written.
    """
    if determinism is None:
        from dlmstore.determinism import apply_determinism

        determinism = apply_determinism()
    lock = capture_lock(document, ref, seed=seed, determinism=determinism, run_id=run_id, datasets=datasets)
    lock = _carry_exported(store, lock)
    return PendingLock(lock, check_lock(store, lock, mode=mode), ref)


def _carry_exported(store: Store, lock: Lock) -> Lock:
    """``lock`` with the llama.cpp version ``dlm.lock`` pins: training does not use llama.cpp.

    A ``dlm.lock`` that cannot be read carries nothing (:func:`check_lock`
    reports it, by mode).
    """
    try:
        previous = read_lock(store.path / LOCK_NAME)
    except LockError:
        return lock
    exported = previous.pinned_versions.get(LLAMA_CPP) if previous is not None else None
    if exported is None:
        return lock
    return dataclasses.replace(lock, pinned_versions={**lock.pinned_versions, LLAMA_CPP: exported})


def finish_lock(store: Store, pending: PendingLock, *, preference: PreferenceSettings | None = None) -> str:
    """Record the lock of a successful run; returns the decision (``written``/``updated``/``ignored``).

    ``preference`` is the document's preference settings when the run
    trained a preference phase; the lock records its method and hyperparameters.
    """
    with commit_lock(store, pending, preference=preference):
        pass
    return pending.decision.decision


@contextmanager
def commit_lock(
    store: Store,
    pending: PendingLock,
    *,
    preference: PreferenceSettings | None = None,
    replay: Mapping[str, Any] | None = None,
) -> Iterator[sqlite3.Connection]:
    """The write transaction that records a successful run's lock, for the caller's rows too.

    The hub revision of a base downloaded during the run is looked up
    first, outside the transaction. ``dlm.lock`` is written when the block
    ends, then everything commits; if anything fails, nothing is recorded
    and ``dlm.lock`` is as it was.

    Raises:
        StoreError: the database or ``dlm.lock`` cannot be written.
    """
    lock = pending.lock
    if preference is not None:
        lock = dataclasses.replace(lock, preference=preference_record(preference))
    if replay is not None:  # what the run replayed (dlmstore.replay.run_plan): known once its rows are
        lock = dataclasses.replace(lock, replay=dict(replay))
    if lock.base_model_revision is None:
        revision, sha256 = base_model_identity(pending.ref)
        lock = dataclasses.replace(lock, base_model_revision=revision, base_model_sha256=sha256)
    with lock_transaction(store, lock, decision=pending.decision.decision) as (conn, _):
        yield conn

"""The reproducibility lock: ``dlm.lock`` beside ``store.db`` and its history in SQL.

A lock records everything that decides the bytes of an adapter, short of
the training rows themselves: the document hash, the base model's identity,
the versions of the training stack, the hardware tier, the seed and the
determinism flags. ``dlm train`` uses it in two calls (:mod:`~dlmstore.lock.run`)::

    pending = begin_lock(store, document, ref, seed=seed, run_id=run_id, mode=mode)
    ...print pending.warnings, train...                    # begin_lock may raise
    with commit_lock(store, pending) as conn:              # on success only
        ...register the run's adapters through conn...     # dlm.lock is written, then all commits

which are, step by step::

    info = apply_determinism()                             # dlmstore.determinism
    lock = capture_lock(document, ref, seed=seed, determinism=info, run_id=run_id)
    decision = check_lock(store, lock, mode=mode)          # reads dlm.lock, decide()
    with lock_transaction(store, lock, decision=decision.decision) as (conn, record):
        ...                                                # the row, the caller's rows, dlm.lock, COMMIT

The pieces, one module each:

* :mod:`~dlmstore.lock.model`: the :class:`Lock` dataclass, capture, strict JSON;
* :mod:`~dlmstore.lock.identity`: which base model, as revision and sha256;
* :mod:`~dlmstore.lock.policy`: the severity table and the four modes;
* :mod:`~dlmstore.lock.records`: writing ``dlm.lock`` + ``lock_records``,
  history and diffs;
* :mod:`~dlmstore.lock.run`: :func:`begin_lock` / :func:`commit_lock`
  (:func:`finish_lock` when there is nothing to add).

Nothing here imports torch; ``dlm lock show`` and ``dlm lock diff`` stay fast.
"""

from dlmstore.errors import LockError, LockValidationError
from dlmstore.lock.identity import base_model_identity
from dlmstore.lock.model import (
    LOCK_NAME,
    LOCK_VERSION,
    PINNED_PACKAGES,
    Lock,
    capture_lock,
    capture_runtime_versions,
    parse_lock,
    read_lock,
)
from dlmstore.lock.policy import (
    LOCK_MODES,
    LockDecision,
    LockMode,
    Mismatch,
    Severity,
    check_lock,
    compare,
    decide,
)
from dlmstore.lock.records import (
    LockDiff,
    LockRecord,
    current_lock,
    lock_diff,
    lock_history,
    lock_transaction,
    write_lock,
)
from dlmstore.lock.run import PendingLock, begin_lock, commit_lock, finish_lock

__all__ = [
    "LOCK_MODES",
    "LOCK_NAME",
    "LOCK_VERSION",
    "PINNED_PACKAGES",
    "Lock",
    "LockDecision",
    "LockDiff",
    "LockError",
    "LockMode",
    "LockRecord",
    "LockValidationError",
    "Mismatch",
    "PendingLock",
    "Severity",
    "base_model_identity",
    "begin_lock",
    "capture_lock",
    "capture_runtime_versions",
    "check_lock",
    "commit_lock",
    "compare",
    "current_lock",
    "decide",
    "finish_lock",
    "lock_diff",
    "lock_history",
    "lock_transaction",
    "parse_lock",
    "read_lock",
    "write_lock",
]

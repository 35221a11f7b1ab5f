"""The reproducibility lock: ``dlm.lock`` beside ``store.db`` and its history in SQL.

A lock records everything that decides the bytes of an adapter, short of
the training rows themselves: the document hash, the base model's identity,
the versions of the training stack, the hardware tier, the seed and the
determinism flags. ``dlm train`` uses it in two calls (:mod:`~dlmstore.lock.run`)::

    pending = begin_lock(store, document, ref, seed=seed, run_id=run_id, mode=mode)
    ...print pending.warnings, train...                    # begin_lock may raise
    decision = finish_lock(store, pending)                 # on success only

which are, step by step::

    info = apply_determinism()                             # dlmstore.train.determinism
    lock = capture_lock(document, ref, seed=seed, determinism=info, run_id=run_id)
    decision = check_lock(store, lock, mode=mode)          # reads dlm.lock, decide()
    write_lock(store, lock, decision=decision.decision)    # dlm.lock, then the row

The pieces, one module each:

* :mod:`~dlmstore.lock.model`: the :class:`Lock` dataclass, capture, strict JSON;
* :mod:`~dlmstore.lock.identity`: which base model, as revision and sha256;
* :mod:`~dlmstore.lock.policy`: the severity table and the four modes;
* :mod:`~dlmstore.lock.records`: writing ``dlm.lock`` + ``lock_records``,
  history and diffs;
* :mod:`~dlmstore.lock.run`: :func:`begin_lock` / :func:`finish_lock`.

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
from dlmstore.lock.records import LockDiff, LockRecord, current_lock, lock_diff, lock_history, write_lock
from dlmstore.lock.run import PendingLock, begin_lock, finish_lock

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
    "compare",
    "current_lock",
    "decide",
    "finish_lock",
    "lock_diff",
    "lock_history",
    "parse_lock",
    "read_lock",
    "write_lock",
]

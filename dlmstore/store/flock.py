"""Advisory file locks (``flock``): the store lock, and the short locks beside it.

**The store lock.** Every process that has a store open holds
``<store>/.store.lock`` *shared* for as long as it is open: ``open_store``
takes it, :meth:`~dlmstore.store.database.Store.close` drops it. So
``dlm tokenize``, ``dlm train`` and a dataset build hold it for the whole
run without asking. Sweeping debris (``dlm cache verify --repair``,
``dlm cache prune``) asks for it *exclusively* and without waiting
(:meth:`FileLock.try_exclusive`): when it gets it, no other process has the
store open, so every temp file and unregistered segment is a leftover of a
process that is gone, whatever its age; when it does not, a live writer may
own the young ones, and only files older than a grace period are touched.
No wall clock decides whether a file is debris unless another process is
actually there.

It is cheap: one ``open`` and one ``flock`` per open store (a few
microseconds), and it never blocks a writer for longer than a sweep holds
it exclusively (one directory listing and the unlinks).

``flock`` rather than ``fcntl``/``lockf`` record locks: a ``flock`` belongs
to one open file description, so two stores opened in one process conflict
like two processes do, and closing an unrelated descriptor of the same file
does not drop it (it would with ``lockf``). On a platform without
``fcntl`` (Windows) locks are never taken: :meth:`FileLock.try_exclusive`
reports failure, so sweeps fall back to the grace period.

The same class serves the short exclusive locks: ``.migrate.lock`` while a
store is migrated, and a base model's ``.convert.lock`` while it is
converted from GGUF.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import IO

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

STORE_LOCK_NAME = ".store.lock"


class FileLock:
    """An ``flock`` on one file, through a descriptor of its own.

    Args:
        path: the lock file; created (empty) when missing. In a directory
            that cannot be written, an existing lock file is opened
            read-only (``flock`` needs no write access); when there is none
            the lock is a no-op (:attr:`usable` is false): nothing can be
            written there anyway.
        required: raise instead of becoming a no-op.

    Raises:
        OSError: ``required`` and the lock file cannot be opened or created.
    """

    def __init__(self, path: Path, *, required: bool = False) -> None:
        self.path = path
        self.mode: str | None = None
        self._file: IO[bytes] | None = None
        try:
            self._file = open(path, "a+b")
        except OSError:
            if required:
                raise
            try:
                self._file = open(path, "rb")
            except OSError:
                self._file = None

    @property
    def usable(self) -> bool:
        return self._file is not None and fcntl is not None

    def shared(self) -> None:
        """Hold the lock shared, waiting while another process holds it exclusively."""
        self._flock("shared", blocking=True)

    def exclusive(self) -> None:
        """Hold the lock exclusively, waiting for every other holder to let go."""
        self._flock("exclusive", blocking=True)

    def try_exclusive(self) -> bool:
        """Hold the lock exclusively if no one else holds it; never waits.

        A shared lock held through this object is converted. When the
        conversion fails the shared lock is taken back (``flock`` drops it
        while converting), so the caller is left as it was.

        Returns:
            True when the lock is now held exclusively.
        """
        if not self.usable:
            return False
        previous = self.mode
        if self._flock("exclusive", blocking=False):
            return True
        if previous == "shared":
            self.shared()
        return False

    def downgrade(self) -> None:
        """From exclusive back to shared (other processes may open the store again)."""
        if self.mode == "exclusive":
            self._flock("shared", blocking=True)

    def _flock(self, mode: str, *, blocking: bool) -> bool:
        if not self.usable:
            return False
        assert self._file is not None and fcntl is not None  # usable
        operation = fcntl.LOCK_SH if mode == "shared" else fcntl.LOCK_EX
        try:
            fcntl.flock(self._file.fileno(), operation | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            self.mode = None  # a failed conversion has dropped the lock held before
            return False
        except OSError:
            # A filesystem without flock (ENOLCK, EOPNOTSUPP on some network
            # mounts): the lock becomes a no-op, and sweeps use the grace period.
            self.close()
            return False
        self.mode = mode
        return True

    def close(self) -> None:
        """Let go of the lock (closing the descriptor drops it)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self.mode = None

    def __enter__(self) -> FileLock:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def store_lock(directory: Path) -> FileLock:
    """The store lock of the store in ``directory``, held shared (see the module docstring)."""
    lock = FileLock(directory / STORE_LOCK_NAME)
    lock.shared()
    return lock

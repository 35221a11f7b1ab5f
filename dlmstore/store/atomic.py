"""Atomic writes of files and directories: temp beside the target, fsync, rename.

A reader (or a crash) sees either the old file or the whole new one, never
a partial write. Callers that record a file in store.db commit the row only
after the write is published, so no row ever points at a partial blob.

There is one implementation of each dance, and everything else is built
on it:

* :class:`AtomicFile` — a temp file ``.<name>.<random>.tmp`` beside the
  target, published by :meth:`~AtomicFile.commit` (flush, fsync, chmod
  0644, rename, fsync the directory) or dropped by
  :meth:`~AtomicFile.abort`. Streaming writers that outlive a ``with``
  block (dataset shards published on a background thread) hold one
  directly; :func:`atomic_file` is the ``with`` form, and
  :func:`write_bytes_atomic` the one-call form. The ``.tmp`` suffix is
  what the sweepers look for (``dlm cache prune`` counts any ``*.tmp`` in
  ``tokens/`` as a leftover temp file).
* :func:`replace_user_file` — the same dance for a file that is the
  user's (``dlm report -o``, ``dlm migrate`` and its ``.bak``), done the
  way an editor saves: a symlink is followed (its target is replaced, the
  link stays), the replaced file keeps its permission bits and owner, a
  path that is the command's own input is refused, and so is one that
  names a directory, FIFO or device.
* :class:`StagingDir` — a fresh directory beside the target, published by
  :meth:`~StagingDir.publish` (fsync every file and directory in it,
  chmod 0755, rename, fsync the parent). :func:`publish_dir` is the
  ``with`` form; adapter versions hold one directly because the version
  number they publish under is only settled at the rename.
  With ``owned=True`` it carries an owner file (:data:`OWNER_NAME`) its
  process holds locked until the folder is published or removed, so
  :func:`stale_staging` can tell a folder a killed process left (swept)
  from one a live process is filling (never touched), whatever its age:
  ``dlm export`` stages that way.

A directory rename cannot replace a non-empty directory, so ``replace``
removes the old one first: a reader may briefly see no directory, never a
partial one.

A SIGTERM or Ctrl-C that lands while this module's own code runs waits
until it is out (:data:`SIGNALS_WAIT`): raised between ``mkstemp`` and the
line that records the temp file, or inside :meth:`~AtomicFile.abort`, it
would leave a temp file behind that nothing removes.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import TracebackType
from typing import IO, Any, BinaryIO, Literal, TextIO, overload

from dlmstore.store.flock import FileLock
from dlmstore.store.regular_files import NotRegularFileError

Existing = Literal["refuse", "replace", "keep"]

#: Read by dlm's signal handler (``cli.main``): a SIGTERM or Ctrl-C that lands in this module's
#: code is sent again a moment later, once the temp file or folder it makes is recorded or removed.
SIGNALS_WAIT = True


class AtomicFile:
    """A file written under a temp name beside ``path`` and renamed onto it by :meth:`commit`.

    Args:
        path: destination; its directory must exist.
        mode: ``"wb"`` (bytes) or ``"w"`` (text, UTF-8).
        overwrite: when false, :meth:`commit` raises ``FileExistsError`` if
            ``path`` exists (checked atomically with a hard link, not a
            racy ``exists()``; with an ``O_EXCL`` claim where the
            filesystem makes no hard links).
        buffering: passed to ``open`` (streaming writers use large buffers).
        permissions: the published file's permission bits (``mkstemp``
            makes the temp file private; dlm's own files are 0644).

    Raises:
        OSError: the temp file cannot be created (missing or read-only
            directory).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        mode: Literal["wb", "w"] = "wb",
        *,
        overwrite: bool = True,
        buffering: int = -1,
        permissions: int = 0o644,
    ) -> None:
        if mode not in ("wb", "w"):
            raise ValueError(f"unsupported mode {mode!r}; expected 'wb' or 'w'")
        self.path = Path(path)
        self.overwrite = overwrite
        self.permissions = permissions
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        self.tmp = Path(tmp)
        try:
            self.file: IO[Any] = os.fdopen(
                fd, mode, buffering=buffering, encoding=None if mode == "wb" else "utf-8"
            )
        except BaseException:
            os.close(fd)
            self.tmp.unlink(missing_ok=True)
            raise

    def commit(self) -> None:
        """Flush, fsync, close and rename into place; then fsync the directory.

        May run on another thread than the writes. On any failure the temp
        file is removed and the destination is untouched.
        """
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.chmod(self.tmp, self.permissions)  # mkstemp makes it private; published files are not
            if self.overwrite:
                os.replace(self.tmp, self.path)
            else:
                _publish_new(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise
        fsync_dir(self.path.parent)

    def abort(self) -> None:
        """Close and delete the temp file; the destination is untouched."""
        if not self.file.closed:
            self.file.close()
        self.tmp.unlink(missing_ok=True)


#: ``link`` errors that mean the filesystem makes no hard link here (none at all, as FAT and some
#: network filesystems; not across mounts; not one more to this inode), not that the write failed.
LINK_REFUSED = frozenset(
    {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EACCES, errno.EROFS}
)


def _publish_new(tmp: Path, path: Path) -> None:
    """Give the finished ``tmp`` the name ``path``, which must not exist yet (``FileExistsError``).

    A hard link claims the name and publishes the whole file in one step.
    On a filesystem that makes no hard links (FAT, some network shares),
    the name is claimed with ``O_EXCL`` instead and the file renamed onto
    the claim: another writer still gets ``FileExistsError``, and a reader
    may see an empty file for that moment, never a partial one.
    """
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in LINK_REFUSED:
            raise
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        try:
            os.replace(tmp, path)
        except BaseException:
            path.unlink(missing_ok=True)  # the claim, still empty
            raise
        return
    os.unlink(tmp)


@overload
def atomic_file(
    path: str | os.PathLike[str], mode: Literal["wb"] = ..., *, overwrite: bool = ...
) -> AbstractContextManager[BinaryIO]: ...
@overload
def atomic_file(
    path: str | os.PathLike[str], mode: Literal["w"], *, overwrite: bool = ...
) -> AbstractContextManager[TextIO]: ...
@contextmanager
def atomic_file(
    path: str | os.PathLike[str], mode: Literal["wb", "w"] = "wb", *, overwrite: bool = True
) -> Iterator[Any]:  # the overloads say BinaryIO or TextIO
    """Write ``path`` atomically through the file object this yields.

    On a clean exit the file is published (see :meth:`AtomicFile.commit`);
    on an exception the temp file is removed, the old ``path`` (if any) is
    left as it was, and the exception propagates.

    Args:
        path: destination; its directory must exist.
        mode: ``"wb"`` (bytes) or ``"w"`` (text, UTF-8).
        overwrite: when false, raise ``FileExistsError`` on exit if ``path``
            exists, leaving it untouched.
    """
    pending = AtomicFile(path, mode, overwrite=overwrite)
    try:
        yield pending.file
    except BaseException:
        pending.abort()
        raise
    pending.commit()


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, overwrite: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (:func:`atomic_file` in one call)."""
    with atomic_file(path, overwrite=overwrite) as f:
        f.write(data)


class SameAsInputError(OSError):
    """An output path that names one of the command's own inputs (itself, or through a link)."""

    def __init__(self, path: str, source: str) -> None:
        super().__init__(errno.EEXIST, f"it is {source}, which this command reads", path)
        self.source = source


def replace_user_file(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    permissions: int | None = None,
) -> Path:
    """Write ``data`` to the user's file ``path`` atomically, keeping what makes it theirs.

    * A symlink is followed, however many levels: the file it points at is
      replaced (created, for a dangling link) and the link itself stays.
    * The replaced file keeps its permission bits and its owner and group
      (a process that may not give a file away keeps what it can: the
      group when it is one of its own). A new file gets ``0666`` less the
      umask, as ``>`` in a shell would.
    * The write is :class:`AtomicFile`'s: temp file beside the target,
      fsync, rename, fsync the folder.

    Args:
        path: the file to write.
        data: its new bytes.
        inputs: files the command reads; ``path`` naming any of them (the
            same file, by name, symlink or hard link) is refused.
        permissions: the permission bits to give the file instead of the
            replaced file's (a backup takes its original's).

    Returns:
        The path written: ``path`` with every symlink resolved.

    Raises:
        SameAsInputError: ``path`` is one of ``inputs``.
        NotRegularFileError: ``path`` names a directory, FIFO, socket or device.
        OSError: a symlink loop (``ELOOP``), or the write failed (missing or
            read-only folder, full disk); the file is then as it was.
    """
    shown = os.fspath(path)
    target = Path(os.path.realpath(shown))
    if os.path.islink(target):  # realpath stops where the links go round in a circle
        raise OSError(errno.ELOOP, "a symlink loop", shown)
    try:
        old: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        old = None
    if old is not None and not stat.S_ISREG(old.st_mode):
        raise NotRegularFileError(shown, old.st_mode)
    for source in inputs:
        if _same_file(target, old, os.fspath(source)):
            raise SameAsInputError(shown, os.fspath(source))
    if permissions is None:
        permissions = stat.S_IMODE(old.st_mode) if old is not None else 0o666 & ~_umask()
    pending = AtomicFile(target, permissions=permissions)
    try:
        if old is not None:
            _keep_owner(pending.tmp, old)
        pending.file.write(data)
    except BaseException:
        pending.abort()
        raise
    pending.commit()
    return target


def _same_file(target: Path, st: os.stat_result | None, source: str) -> bool:
    """Whether ``target`` (stat ``st``, ``None`` when absent) is the file ``source``."""
    try:
        other = os.stat(source)
    except OSError:
        return os.path.realpath(source) == os.fspath(target)
    return st is not None and (st.st_dev, st.st_ino) == (other.st_dev, other.st_ino)


def _keep_owner(tmp: Path, old: os.stat_result) -> None:
    """Give ``tmp`` the owner and group of the file it replaces, as far as this process may."""
    mine = os.stat(tmp)
    if (mine.st_uid, mine.st_gid) == (old.st_uid, old.st_gid):
        return
    for uid, gid in ((old.st_uid, old.st_gid), (-1, old.st_gid)):
        try:
            os.chown(tmp, uid, gid)
            return
        except PermissionError:
            continue  # only root gives a file away; a member of the group may still set it


def _umask() -> int:
    """The process's umask (read from ``/proc`` where it can be, so no thread sees it change)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class StagingDir:
    """A fresh directory in ``parent``, filled by the caller and renamed by :meth:`publish`.

    Also a context manager that removes the directory on the way out unless
    it was published.

    Args:
        parent: the directory the target will live in (must exist).
        prefix: name prefix of a fresh ``mkdtemp`` directory (default ``.dir-``).
        name: a fixed name instead, for staging that a sweeper must be able
            to attribute (e.g. ``.incoming-run7``); a leftover of that name
            is removed first.
        owned: hold an owner file (:data:`OWNER_NAME`) in it, locked until
            the directory is published or removed, so that
            :func:`stale_staging` sweeps it only once this process is gone.

    Raises:
        OSError: the directory cannot be created.
    """

    def __init__(
        self, parent: Path, *, prefix: str = ".dir-", name: str | None = None, owned: bool = False
    ) -> None:
        if name is None:
            self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        else:
            self.path = parent / name
            shutil.rmtree(self.path, ignore_errors=True)
            self.path.mkdir()
        self._synced = False
        self._published = False
        self._owner: FileLock | None = None
        if owned:
            try:
                self._owner = _own(self.path)
            except BaseException:
                shutil.rmtree(self.path, ignore_errors=True)
                raise

    def publish(self, target: Path, *, existing: Existing = "refuse") -> bool:
        """fsync the contents, rename to ``target`` and fsync its parent.

        Args:
            target: the final path, in the same filesystem (normally the
                same parent).
            existing: what to do when ``target`` is already there:
                ``refuse`` raises ``FileExistsError`` (the staging directory
                stays, so the caller may try another name); ``replace``
                removes it first; ``keep`` keeps it (another process won a
                race to make the same thing) and returns false.

        Returns:
            True if this directory is now ``target``.
        """
        if not self._synced:
            fsync_tree(self.path)
            self.path.chmod(0o755)  # mkdtemp makes it private; what we publish is not
            self._synced = True
        if existing == "replace" and target.exists():
            shutil.rmtree(target)
        try:
            os.rename(self.path, target)  # fails if target exists and is not empty
        except OSError:
            if existing == "keep" and target.is_dir():
                return False
            if not target.exists():
                raise
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target)) from None
        self._published = True
        fsync_dir(target.parent)
        self.release(target)
        return True

    def release(self, published: Path | None = None) -> None:
        """Let go of the owner file (removing it from ``published``, where it was renamed along)."""
        if self._owner is None:
            return
        if published is not None:
            (published / OWNER_NAME).unlink(missing_ok=True)
        self._owner.close()
        self._owner = None

    def abort(self) -> None:
        """Remove the staging directory (nothing, once published), then let go of its owner file."""
        if not self._published:
            shutil.rmtree(self.path, ignore_errors=True)
        self.release()

    def __enter__(self) -> StagingDir:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.abort()


#: The owner file of an owned :class:`StagingDir`: locked (``flock``) by the process filling it.
OWNER_NAME = ".dlm-staging-owner"


def staging_prefix(target: Path) -> str:
    """How the staging folders of ``target`` begin (``.<name>-``; they sit beside it)."""
    return f".{target.name}-"


def _own(folder: Path) -> FileLock:
    """Lock a new owner file, then rename it into place: the file a sweeper finds is already locked."""
    pending = folder / f"{OWNER_NAME}.new"
    lock = FileLock(pending, required=True)
    try:
        lock.exclusive()  # a no-op where there is no flock: sweepers cannot take it either
        os.rename(pending, folder / OWNER_NAME)
    except BaseException:
        lock.close()
        raise
    return lock


def stale_staging(parent: Path, prefix: str, *, remove: bool) -> list[Path]:
    """Owned staging folders in ``parent`` whose process is gone, removed too when ``remove``.

    A folder counts only when its name starts with ``prefix``, it is a real
    directory (not a symlink) and it holds the owner file
    :data:`OWNER_NAME`, which only an owned :class:`StagingDir` makes: any
    other folder, a user's included, is never touched. Of those, a folder
    whose owner file another process holds locked is being filled now and is
    skipped, whatever its age; every other one is a killed process's
    leftover. On a filesystem without ``flock`` nothing is taken.

    Returns:
        The leftover folders, sorted.
    """
    try:
        entries = sorted(os.scandir(parent), key=lambda entry: entry.name)
    except OSError:  # missing, not a directory, unreadable: nothing to sweep there
        return []
    stale: list[Path] = []
    for entry in entries:
        if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
            continue
        folder = Path(entry.path)
        owner = folder / OWNER_NAME
        if not owner.is_file() or owner.is_symlink():
            continue
        with FileLock(owner) as lock:
            if not lock.try_exclusive():
                continue  # a live process is filling it (or no flock here: leave it)
            if not folder.is_dir():
                continue  # published or removed by its owner meanwhile
            stale.append(folder)
            if remove:
                shutil.rmtree(folder, ignore_errors=True)
    return stale


@contextmanager
def publish_dir(path: Path, *, existing: Existing = "refuse") -> Iterator[Path]:
    """Build the directory ``path`` atomically in the fresh directory this yields.

    The staging directory (``.<name>-<random>`` beside ``path``) is
    published on a clean exit (see :meth:`StagingDir.publish` for
    ``existing``) and removed on an exception, or when ``keep`` found
    ``path`` already there.
    """
    with StagingDir(path.parent, prefix=f".{path.name}-") as staging:
        yield staging.path
        staging.publish(path, existing=existing)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root``, children before parents."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                continue  # its target is not ours to sync
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(directory))


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it survives a power cut (POSIX only)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename still happened
    finally:
        os.close(fd)

"""Opening files that must be regular files, so that a read can neither hang nor escape.

``open(path)`` on a FIFO blocks until something writes to it, and a path
checked a moment ago may be a symlink to somewhere else by the time it is
opened. Every read of a file dlm did not write itself (source files, a
``.dlm/ignore``, a segment, a dataset's ``meta.json``) goes through
:func:`open_regular`, which closes both holes on the *descriptor*:

* a path that names a FIFO, socket, device or directory is refused
  (:class:`NotRegularFileError`) before it is opened; the open itself is
  non-blocking (``O_NONBLOCK``), so a path swapped for a FIFO after that
  check opens at once instead of waiting, and ``fstat`` on the descriptor
  refuses it. On a regular file ``O_NONBLOCK`` changes nothing. (With
  ``exact`` the caller has classified the path already, and only the
  descriptor is checked.)
* with ``exact=True`` (a path the caller classified and resolved before,
  e.g. a file a ``training.sources`` walk chose), the last component is
  opened with ``O_NOFOLLOW`` and the descriptor's own path, as the kernel
  reports it (``/proc/self/fd`` on Linux, ``F_GETPATH`` on macOS), must be
  the path asked for: a file or a folder above it swapped for a symlink
  between the check and the open is refused (:class:`ReplacedFileError`)
  instead of read. Where the kernel cannot say, the path's ``lstat`` and
  the descriptor's ``fstat`` must name the same file.

Both errors are ``OSError`` subclasses whose ``strerror`` reads as a
sentence, so callers that already report ``OSError.strerror`` need no new
branch.

Small files dlm reads back and parses (``dlm.lock``, a dataset's
``meta.json``, a base's tokenizer files) also get a size limit
(:func:`read_regular`'s ``limit``: never more than ``fstat`` reported, so
nothing grows under the read) and, for JSON, a depth limit
(:func:`load_json`): JSON nested thousands deep would overflow the
decoder's recursion, and anything walking the result after it.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from typing import Any

#: How deep a JSON file dlmstore reads may nest; its own files nest 3 deep.
MAX_JSON_DEPTH = 64

#: Non-blocking (a FIFO opens at once), close-on-exec, never a controlling terminal.
OPEN_FLAGS = (
    os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class NotRegularFileError(OSError):
    """The path names a FIFO, socket, device or directory, not a regular file."""

    def __init__(self, path: str, mode: int) -> None:
        super().__init__(errno.EINVAL, f"{file_kind(mode)}, not a regular file", path)
        self.mode = mode


class ReplacedFileError(OSError):
    """The file at a checked path was replaced (by a symlink, or a folder above it moved) before it was opened."""

    def __init__(self, path: str, now: str | None) -> None:
        what = f"now {now}" if now else "now a symlink"
        super().__init__(errno.ELOOP, f"replaced while dlm was reading it ({what})", path)


class FileTooLarge(OSError):
    """A regular file larger than the reader accepts."""


class JsonTooDeep(ValueError):
    """JSON nested deeper than :data:`MAX_JSON_DEPTH`."""


def file_kind(mode: int) -> str:
    """``a FIFO``, ``a directory``, ...: what a mode that is not a regular file names."""
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def open_regular(path: str | os.PathLike[str], *, exact: bool = False) -> tuple[int, os.stat_result]:
    """Open ``path`` for reading and return ``(fd, fstat of fd)``; the caller closes ``fd``.

    Args:
        path: the file. With ``exact``, an absolute path with no symlink in
            it (a real path, as ``os.path.realpath`` returns).
        exact: refuse the file unless the descriptor is the file at exactly
            ``path``: no symlink as the last component (``O_NOFOLLOW``), none
            above it.

    Raises:
        NotRegularFileError: ``path`` is a FIFO, socket, device or directory.
        ReplacedFileError: (``exact``) the file or a folder above it was
            replaced after ``path`` was resolved.
        OSError: it cannot be opened (missing, permission denied, ...).
    """
    name = os.fspath(path)
    if not exact:
        # Not even opened when the path already names something else: opening
        # a device can have side effects. (The fstat below closes the race.)
        mode = os.stat(name).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(name, mode)
    try:
        fd = os.open(name, OPEN_FLAGS | (_NOFOLLOW if exact else 0))
    except OSError as exc:
        if exact and exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise ReplacedFileError(name, None) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(name, st.st_mode)
        if exact:
            now = _descriptor_path(fd)
            if now is None:
                if not _same_file(name, st):
                    raise ReplacedFileError(name, None)
            elif now != name and not (sys.platform == "darwin" and now.casefold() == name.casefold()):
                # (macOS reports the on-disk case of a case-insensitive volume)
                raise ReplacedFileError(name, now)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(path: str | os.PathLike[str], *, exact: bool = False, limit: int | None = None) -> bytes:
    """The bytes of regular file ``path`` (see :func:`open_regular` for ``exact`` and the errors).

    With ``limit``, a file larger than ``limit`` bytes is refused
    (:class:`FileTooLarge`) and no more than the size ``fstat`` reported is
    read (a file growing while it is read is cut there).
    """
    fd, st = open_regular(path, exact=exact)
    try:
        if limit is not None:
            if st.st_size > limit:
                raise FileTooLarge(
                    errno.EFBIG, f"{st.st_size:,} bytes, more than the {limit:,} accepted", os.fspath(path)
                )
            return _read_exactly(fd, st.st_size)
        chunks: list[bytes] = []
        size = max(st.st_size, 0) + 1  # one byte more, to notice growth
        while True:
            chunk = os.read(fd, size)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size = 1 << 20
    finally:
        os.close(fd)


def load_json(text: str | bytes) -> Any:
    """``json.loads(text)``, refusing nesting deeper than :data:`MAX_JSON_DEPTH`.

    Raises:
        json.JSONDecodeError: not JSON.
        JsonTooDeep: nested too deep.
    """
    try:
        data = json.loads(text)
    except RecursionError:
        raise JsonTooDeep(f"nests deeper than {MAX_JSON_DEPTH} levels") from None
    level: list[tuple[Any, int]] = [(data, 1)]
    while level:
        value, depth = level.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > MAX_JSON_DEPTH:
                    raise JsonTooDeep(f"nests deeper than {MAX_JSON_DEPTH} levels")
                level.append((child, depth + 1))
    return data


def _read_exactly(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    while size > 0:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _descriptor_path(fd: int) -> str | None:
    """The path the kernel has for ``fd``, or ``None`` where it cannot say."""
    if sys.platform.startswith("linux"):
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None
    if sys.platform == "darwin":
        import fcntl

        try:
            raw = fcntl.fcntl(fd, fcntl.F_GETPATH, bytes(1024))
        except OSError:
            return None
        return os.fsdecode(raw.split(b"\0", 1)[0])
    return None


def _same_file(path: str, st: os.stat_result) -> bool:
    """Fallback identity check: ``path`` resolves to itself and names the opened file."""
    try:
        here = os.lstat(path)
    except OSError:
        return False
    return os.path.realpath(path) == path and (here.st_dev, here.st_ino) == (st.st_dev, st.st_ino)

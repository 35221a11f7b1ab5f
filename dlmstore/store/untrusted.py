"""Reading files a person may have damaged or replaced with something else.

dlmstore reads back a few small files that live where anyone can edit
them: ``dlm.lock``, a dataset's ``meta.json``, a local base model's
tokenizer files. Each may turn out to be a directory, a FIFO (an ``open``
that never returns), a symlink to ``/dev/zero`` (a read that never ends),
or JSON nested so deep that the decoder overflows the interpreter's stack.
The functions here turn each into an ``OSError`` or ``ValueError`` whose
``strerror`` names what the path is, so that callers' usual
``f"cannot read {path}: {exc.strerror}"`` reads "cannot read dlm.lock: a
directory, not a file":

* :func:`open_regular` opens without blocking (``O_NONBLOCK``, so a FIFO
  opens at once) and refuses anything ``fstat`` does not call a regular
  file;
* :func:`read_regular` reads such a file in full, refusing one larger than
  a limit, and never more than the size ``fstat`` reported;
* :func:`load_json` refuses JSON nested deeper than :data:`MAX_JSON_DEPTH`.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any, BinaryIO

#: How deep a JSON file dlmstore reads may nest; its own files nest 3 deep.
MAX_JSON_DEPTH = 64

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)

_KINDS = (
    (stat.S_ISDIR, errno.EISDIR, "a directory, not a file"),
    (stat.S_ISFIFO, errno.EINVAL, "a FIFO (named pipe), not a file"),
    (stat.S_ISCHR, errno.EINVAL, "a character device, not a file"),
    (stat.S_ISBLK, errno.EINVAL, "a block device, not a file"),
    (stat.S_ISSOCK, errno.EINVAL, "a socket, not a file"),
)


class NotRegularFile(OSError):
    """The path exists but is no regular file (``strerror`` says what it is)."""


class FileTooLarge(OSError):
    """A regular file larger than the reader accepts."""


class JsonTooDeep(ValueError):
    """JSON nested deeper than :data:`MAX_JSON_DEPTH`."""


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open ``path`` for reading bytes, without blocking, if it is a regular file.

    Raises:
        FileNotFoundError, PermissionError, ...: as ``open`` would.
        NotRegularFile: ``path`` is a directory, FIFO, device or socket
            (a symlink is followed to what it names).
    """
    fd = os.open(path, _OPEN_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            code = next((c for test, c, _ in _KINDS if test(mode)), errno.EINVAL)
            raise NotRegularFile(code, describe_mode(mode), os.fspath(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def describe_mode(mode: int) -> str:
    """What an ``st_mode`` that is no regular file is: ``a FIFO (named pipe), not a file``."""
    return next((what for test, _, what in _KINDS if test(mode)), "not a file")


def read_regular(path: str | os.PathLike[str], *, limit: int) -> bytes:
    """The bytes of regular file ``path``, at most ``limit`` of them.

    Reads no more than the size ``fstat`` reported (a file that grows while
    it is read is cut there).

    Raises:
        OSError: as :func:`open_regular`; :class:`FileTooLarge` over ``limit`` bytes.
    """
    with open_regular(path) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise FileTooLarge(
                errno.EFBIG, f"{size:,} bytes, more than the {limit:,} accepted", os.fspath(path)
            )
        return handle.read(size)


def load_json(text: str | bytes) -> Any:
    """``json.loads(text)``, refusing nesting deeper than :data:`MAX_JSON_DEPTH`.

    Raises:
        json.JSONDecodeError: not JSON.
        JsonTooDeep: nested too deep (the decoder recurses per level and
            would overflow the stack; so would anything walking the result).
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

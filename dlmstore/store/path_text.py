"""A path as text: what store.db records for a file name that is not UTF-8.

A POSIX file name is bytes; Python hands one that is not valid UTF-8
(``bad\\xff.dlm``) to code as a ``str`` holding surrogates (``'bad\\udcff.dlm'``,
PEP 383), which ``open`` and ``os.stat`` take back faithfully but SQLite's
TEXT, and a UTF-8 terminal, refuse. Everything dlm records about a
document's path in store.db (the runs, the tokenize pass's snapshot)
records :func:`path_text` of it:

* a path whose bytes are UTF-8 (nearly every path) is itself, unchanged;
* in any other, each byte that is not part of a UTF-8 character is
  written ``\\xNN`` (lowercase hex), the way Python's ``backslashreplace``
  and ``ls -b`` show it: ``/docs/bad\\xff.dlm``.

The text is one-to-one with the path except where a UTF-8 name spells
such an escape itself (a file literally named ``bad\\xff.dlm``, backslash
and all). :func:`text_paths` therefore gives every path a recorded text
can stand for, and code that asks "does the document still exist" must
ask it of each (it exists if any does).

The libraries that read and write models take a path only as UTF-8 text:
safetensors refuses one ("Path ... is not valid UTF-8"), tokenizers and
llama-cpp-python raise ``UnicodeEncodeError`` on it. :func:`utf8_alias`
hands them such a path under a name that is UTF-8: a symlink to it in a
temporary folder, removed when the block ends (what was written through
it stays where the path is).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: ``\xNN`` for a byte 0x80-0xff: only those can be bytes that were not UTF-8.
_ESCAPED_BYTE = re.compile(r"\\x([89a-f][0-9a-f])")


def path_text(path: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> str:
    """``path`` as valid UTF-8 text: itself, with each byte that is not UTF-8 as ``\\xNN``."""
    name = os.fspath(path)
    if isinstance(name, str):
        try:
            name.encode("utf-8")
            return name
        except UnicodeEncodeError:
            try:
                raw = name.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:  # a lone surrogate that stands for no byte
                return name.encode("utf-8", "backslashreplace").decode("utf-8")
    else:
        raw = name
    return raw.decode("utf-8", "backslashreplace")


def text_paths(text: str) -> tuple[str, ...]:
    """Every path :func:`path_text` could have made ``text`` from, as ``os`` functions take them.

    ``text`` itself, and, when it holds ``\\xNN`` escapes of bytes 0x80-0xff,
    the path whose bytes those escapes spell (surrogate-escaped) first.
    """
    if not _ESCAPED_BYTE.search(text):
        return (text,)
    raw = _ESCAPED_BYTE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), text)
    return (raw, text) if raw != text else (text,)


@contextmanager
def utf8_alias(path: Path) -> Iterator[Path]:
    """``path`` under a name that is UTF-8, for the block: itself when it is, else a symlink to it.

    The symlink is ``path``'s name, as :func:`path_text` writes it, in a new
    temporary folder (``dlm-utf8-*``); a folder's files are read and written
    through it as through ``path``. The folder and the symlink are removed
    when the block ends, never what the symlink leads to.
    """
    if path_text(path) == os.fspath(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="dlm-utf8-") as scratch:
        alias = Path(scratch) / path_text(path.name)
        alias.symlink_to(path.absolute())
        yield alias

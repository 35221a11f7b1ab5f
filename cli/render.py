"""Rendering helpers shared by commands: JSON for data, sizes for people."""

from __future__ import annotations

import dataclasses
import io
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from dlmstore.plural import plural
from dlmstore.report.units import human_bytes

F = TypeVar("F", bound=Callable[..., Any])


class JsonOption(click.Option):
    """``--json``, naming the dataclass the command prints (``module:Class``).

    ``docs/json.md`` is generated from that class's schema
    (``dlmstore.cli.contract``), and the tests check every command has this
    option and prints what its class promises. The class is named, not
    imported, so ``dlm --help`` loads no library module.
    """

    def __init__(self, *args: Any, result: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.result = result


def json_option(result: str, help: str = "Print the result as JSON.") -> Callable[[F], F]:
    """Add ``--json`` (passed as ``as_json``) to a command that prints ``result`` with it."""
    return click.option("--json", "as_json", cls=JsonOption, result=result, is_flag=True, help=help)


__all__ = ["emit_json", "human_bytes", "is_quiet", "note", "plural", "printable", "printable_line", "warn"]


def emit_json(value: Any) -> None:
    """Print a dataclass (or plain data) as indented JSON on stdout."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    text = json.dumps(value, indent=2, ensure_ascii=False)
    # A file name that is not UTF-8 reaches here holding surrogates (PEP 383);
    # written as JSON's \udcNN escape it is valid UTF-8 and decodes back to
    # the same str, which os functions turn back into the same bytes.
    click.echo(text.encode("utf-8", "backslashreplace").decode("utf-8"))


#: Characters escaped in messages: controls other than tab and newline, and
#: the Unicode line and paragraph separators. A quoted line or file name
#: holding one would otherwise break the message's line or drive the terminal
#: (``\x1b[...``). A byte of a file name that is not UTF-8 (a surrogate,
#: PEP 383) is shown ``\xNN``, as store.db records it (store/path_text.py).
_UNPRINTABLE = {
    code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    for code in (*range(0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029)
    if chr(code) not in "\t\n"
} | {code: f"\\x{code - 0xDC00:02x}" for code in range(0xDC80, 0xDD00)}


def file_names_pass_through_stdout() -> None:
    """Let stdout write a file name that is not UTF-8 as the bytes it is, instead of failing.

    Python hands such a name around holding surrogates (PEP 383); its own
    UTF-8 mode and the C locale write them back as the original bytes
    (``surrogateescape``), as ``ls`` and ``find`` print names to a pipe, but
    a ``strict`` stdout (any other UTF-8 locale) raises ``UnicodeEncodeError``.
    Messages on stderr go through :func:`printable` instead (``\\xNN``).
    """
    stream = sys.stdout
    if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
        stream.reconfigure(errors="surrogateescape")


def printable(text: str) -> str:
    """``text`` with control characters and line separators escaped (``\\x1b``, ``\\u2028``)."""
    return text.translate(_UNPRINTABLE)


def printable_line(text: str) -> str:
    """:func:`printable`, with a line break shown ``\\n`` too: ``text`` stays one line (``ls -b`` writes it so).

    For what must be one line whatever it quotes: an ``error:`` or ``hint:``
    line naming a file whose name holds a line break.
    """
    return printable(text).replace("\n", "\\n")


def warn(message: str) -> None:
    """A warning line on stderr (shown under ``-q`` too)."""
    click.echo(f"warning: {printable(message)}", err=True)


def note(message: str) -> None:
    """A ``note: ...`` line on stderr, for what is worth knowing but not wrong; ``-q`` drops it."""
    if not is_quiet():
        click.echo(f"note: {printable(message)}", err=True)


def is_quiet() -> bool:
    """Whether ``dlm -q`` was given (no progress, no notes)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.find_root().meta.get(QUIET_KEY, False))


#: Where the group's ``-q`` is kept in the root context's ``meta``.
QUIET_KEY = "dlm.quiet"

"""Logging for the ``dlm`` process, configured once, by the command group.

The library logs through ``logging.getLogger(__name__)`` and never
configures anything (a library that did would fight its callers). The CLI
sends every record at WARNING or above, from any logger, to stderr as
``warning: ...`` / ``error: ...``, the same shape as the warnings commands
print themselves; ``-v`` adds dlmstore's DEBUG and INFO records as
``debug: ...`` / ``info: ...``. Other packages stay at WARNING under
``-v``: their debug output (HTTP, file locks) would drown dlmstore's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import click

from .render import printable


class _StderrHandler(logging.Handler):
    """Writes ``level: message`` to the *current* ``sys.stderr`` (click's test runner swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = printable(record.getMessage())
            click.echo(f"{record.levelname.lower()}: {message}", err=True)
        except Exception:  # a failing log line must not end the command
            self.handleError(record)


def configure_logging(*, verbose: bool) -> Callable[[], None]:
    """Route log records to stderr; dlmstore's from DEBUG with ``verbose``, else from WARNING.

    Returns the function that puts logging back as it was, which the group
    calls when the command ends: one process may run the CLI many times
    (tests do), and a library caller's logging is not the CLI's to keep.
    """
    root = logging.getLogger()
    package = logging.getLogger("dlmstore")
    before = (root.level, package.level)
    handler = _StderrHandler()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    package.setLevel(logging.DEBUG if verbose else logging.WARNING)

    def restore() -> None:
        root.removeHandler(handler)
        root.setLevel(before[0])
        package.setLevel(before[1])

    return restore

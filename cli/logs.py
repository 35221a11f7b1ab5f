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


def configure_logging(*, verbose: bool) -> None:
    """Route log records to stderr; dlmstore's from DEBUG with ``verbose``, else from WARNING.

    Calling it again (one process invoking the CLI several times, as tests
    do) replaces the handler instead of adding a second one.
    """
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(handler)
    root.addHandler(_StderrHandler())
    root.setLevel(logging.WARNING)
    logging.getLogger("dlmstore").setLevel(logging.DEBUG if verbose else logging.WARNING)

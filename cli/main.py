"""The ``dlm`` command group and the one place errors become messages.

Importing this module imports click and the command modules, which import
nothing heavy at module level: ``dlm --help`` never loads sqlalchemy,
pydantic, torch or transformers. Every command body imports the library
function it calls.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from dlmstore import __version__

#: Exit statuses of ``dlm`` (docs/cli.md lists them; scripts/docgen.py reads this).
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success"),
    (1, "an error dlm reports as `error: ...` (bad input, a damaged store, a failed run); "
        "`dlm cache verify` when problems remain"),
    (2, "a usage error: an unknown option, a missing or invalid argument"),
    (130, "interrupted (Ctrl-C)"),
)  # fmt: skip


class DlmGroup(click.Group):
    """A click group that turns ``DlmError`` into ``error: ...`` and exit 1.

    With ``--traceback`` or ``DLM_DEBUG=1`` the error is raised instead,
    with every exception it came from shown (also those raised ``from None``).
    """

    def invoke(self, ctx: click.Context) -> Any:
        from dlmstore.errors import DlmError

        try:
            return super().invoke(ctx)
        except DlmError as exc:
            if ctx.params.get("traceback") or _debug_env():
                _reveal_causes(exc)
                raise
            from .render import printable

            for message, hint in exc.reports():
                click.echo(f"error: {printable(message)}", err=True)
                if hint:
                    click.echo(f"hint: {printable(hint)}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(130)


def _debug_env() -> bool:
    """``DLM_DEBUG`` set to anything but empty, ``0``, ``false`` or ``no``."""
    return os.environ.get("DLM_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


def _reveal_causes(exc: BaseException) -> None:
    """Let the traceback show every exception in ``exc``'s chain, ``raise ... from None`` included."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.__suppress_context__ = False
        current = current.__cause__ or current.__context__


@click.group(
    cls=DlmGroup,
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "DLM"},
)
@click.version_option(
    __version__, "--version", prog_name="dlm", message="%(prog)s %(version)s",
    allow_from_autoenv=False,  # DLM_VERSION is too likely a name to print the version and exit on
)  # fmt: skip
@click.option("-q", "--quiet", is_flag=True, help="No progress and no notes; warnings and errors still.")
@click.option("-v", "--verbose", is_flag=True, help="Also print dlmstore's debug log on stderr.")
@click.option(
    "--traceback",
    is_flag=True,
    help="On an error, show the Python traceback with its causes instead of the one-line "
    "message (also DLM_DEBUG=1).",
)
@click.pass_context
def cli(ctx: click.Context, quiet: bool, verbose: bool, traceback: bool) -> None:
    """dlm: a local-first store for LLM training data.

    Write a .dlm document (Markdown + YAML frontmatter) with `dlm init`,
    see what dlm makes of it with `dlm show`, tokenize it through the cache
    with `dlm tokenize`, train a LoRA adapter with `dlm train`. Everything a
    store holds is recorded in one SQLite database per document (`dlm show`
    says where).

    Data goes to stdout; progress, notes, warnings and errors to stderr.
    Every option can also be set from an environment variable named DLM_,
    the command path and the option's name (DLM_QUIET=1,
    DLM_TRAIN_MAX_STEPS=5, DLM_CACHE_PRUNE_OLDER_THAN=7d); docs/cli.md
    lists them, and the exit codes.
    """
    from .logs import configure_logging
    from .render import QUIET_KEY

    if quiet and verbose:
        raise click.UsageError("-q/--quiet and -v/--verbose cannot be used together")
    ctx.meta[QUIET_KEY] = quiet
    ctx.call_on_close(configure_logging(verbose=verbose))


def _register() -> None:
    from . import cache, data, init, lock, metrics, migrate, prompt, report, show, stores, tokenize, train

    cli.add_command(init.init_command)
    cli.add_command(show.show_command)
    cli.add_command(migrate.migrate_command)
    cli.add_command(tokenize.tokenize_command)
    cli.add_command(cache.cache_group)
    cli.add_command(metrics.metrics_command)
    cli.add_command(report.report_command)
    cli.add_command(data.data_group)
    cli.add_command(lock.lock_group)
    cli.add_command(train.train_command)
    cli.add_command(prompt.prompt_command)
    cli.add_command(stores.stores_group)


_register()

if __name__ == "__main__":  # `python -m dlmstore.cli.main`: how `dlm train --nproc` starts its ranks
    cli()

"""The ``dlm`` command group and the one place errors become messages.

Importing this module imports click and the command modules, which import
nothing heavy at module level: ``dlm --help`` never loads sqlalchemy,
pydantic, torch or transformers. Every command body imports the library
function it calls.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from dlmstore import __version__


class DlmGroup(click.Group):
    """A click group that turns ``DlmError`` into ``error: ...`` and exit 1."""

    def invoke(self, ctx: click.Context) -> Any:
        from dlmstore.errors import DlmError

        try:
            return super().invoke(ctx)
        except DlmError as exc:
            from .render import printable

            for message, hint in exc.reports():
                click.echo(f"error: {printable(message)}", err=True)
                if hint:
                    click.echo(f"hint: {printable(hint)}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(130)


@click.group(cls=DlmGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="dlm", message="%(prog)s %(version)s")
def cli() -> None:
    """dlm: a local-first store for LLM training data.

    Write a .dlm document (Markdown + YAML frontmatter) with `dlm init`,
    see what dlm makes of it with `dlm show`, tokenize it through the cache
    with `dlm tokenize`, train a LoRA adapter with `dlm train`. Everything a
    store holds is recorded in one SQLite database per document (`dlm show`
    says where).
    """


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

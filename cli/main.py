"""The ``dlm`` command group and the one place errors become messages.

Importing this module imports click and nothing else: a command's module is
imported when that command runs (:data:`COMMANDS`), and ``dlm --help``
lists the commands from the summaries kept here, so it imports none of
them (``tests/test_cli.py`` checks the summaries are each command's own).
Command modules import nothing heavy at module level either: every command
body imports the library function it calls, so no command loads
sqlalchemy, pydantic, torch or transformers before it needs them.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn

import click

from dlmstore import __version__

if TYPE_CHECKING:
    from types import FrameType

#: Exit statuses of ``dlm`` (docs/cli.md lists them; scripts/docgen.py reads this).
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success"),
    (1, "an error dlm reports as `error: ...` (bad input, a damaged store, a failed run); "
        "`dlm cache verify` when problems remain"),
    (2, "a usage error: an unknown option, a missing or invalid argument (a URL where only a local path "
        "is taken, a scheme other than `s3://` or a malformed `s3://` URL where object storage is)"),
    (130, "interrupted (Ctrl-C, SIGINT): one `error: interrupted` line; a run is recorded as failed"),
    (143, "terminated (SIGTERM, as `timeout`, systemd and CI send it): one `error: terminated by SIGTERM` "
          "line; a run is recorded as failed, `dlm train --nproc` stops its ranks first"),
)  # fmt: skip


#: ``dlm`` subcommand -> (module in dlmstore.cli, attribute, the first paragraph of its help).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "cache": ("cache", "cache_group", "Inspect and maintain the tokenized cache of a document's store."),
    "data": ("data", "data_group", "Token datasets: pretrain shards and SFT caches, registered in store.db."),
    "eval": ("eval", "eval_command", "Evaluate a stored adapter of the document at PATH on its val split and probes."),
    "export": (
        "export", "export_command",
        "Export the document's adapter: a merged HF folder, GGUF files and a Modelfile or server command.",
    ),
    "init": ("init", "init_command", "Write a new .dlm document at PATH and create its store."),
    "lock": ("lock", "lock_group", "Show and compare a document's reproducibility lock (dlm.lock)."),
    "metrics": ("metrics", "metrics_command", "List the runs recorded for the document at PATH, newest first."),
    "migrate": ("migrate", "migrate_command", "Rewrite the .dlm document at PATH at the current dlm_version."),
    "pack": (
        "pack", "pack_command",
        "Write the document at PATH, its store and the adapters chosen into one .dlm.pack file.",
    ),
    "prompt": (
        "prompt", "prompt_command", "Answer QUESTION with the base model plus the document's latest adapter (greedy).",
    ),
    "replay": ("replay", "replay_group", "Show and prune the replay history: the rows completed runs trained on."),
    "report": ("report", "report_command", "Write an HTML report of the store of the document at PATH."),
    "show": ("show", "show_command", "Summarise the .dlm document at PATH (read-only)."),
    "stores": ("stores", "stores_group", "List every store under the dlm home (read-only)."),
    "templates": (
        "templates", "templates_group", "List the gallery of starter documents for `dlm init PATH --template NAME`.",
    ),
    "tokenize": (
        "tokenize", "tokenize_command", "Tokenize the rows of the document at PATH, through the tokenized cache.",
    ),
    "train": ("train", "train_command", "Train a LoRA adapter on the rows of the document at PATH."),
    "unpack": ("pack", "unpack_command", "Check every member of PACK, then install its document and store."),
    "verify": (
        "pack", "verify_command",
        "Check every member of PACK, its adapters against store.db, its signature, and optionally a retrain.",
    ),
}  # fmt: skip


class DlmGroup(click.Group):
    """A click group that turns ``DlmError`` into ``error: ...`` and exit 1.

    With ``--traceback`` or ``DLM_DEBUG=1`` the error is raised instead,
    with every exception it came from shown (also those raised ``from None``).
    Subcommands are imported when they are used (:data:`COMMANDS`).
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        import importlib

        module, attribute, _ = COMMANDS[cmd_name]
        command: click.Command = getattr(importlib.import_module(f"{__package__}.{module}"), attribute)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their summaries, as click draws them, without importing any command."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        # click's own shortening, applied to the summary (a bare Command just carries the text)
        rows = [
            (name, click.Command(name, help=COMMANDS[name][2]).get_short_help_str(limit)) for name in names
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        from dlmstore.errors import DlmError

        with _sigterm_raises():
            try:
                return super().invoke(ctx)
            except DlmError as exc:
                if ctx.params.get("traceback") or _debug_env():
                    _reveal_causes(exc)
                    raise
                _fail(exc.reports(), exc.exit_code)
            except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (dlmstore.errors.Terminated)
                import signal

                signum = int(getattr(exc, "signum", signal.SIGINT))
                _fail([(str(exc) or "interrupted", None)], 128 + signum, signum=signum)
            except Exception as exc:
                _crashed_in_a_rank(exc)
                raise


def _sigterm_raises() -> contextlib.AbstractContextManager[None]:
    """SIGTERM raises :class:`~dlmstore.errors.Terminated` (once) while a command runs, as Ctrl-C raises
    KeyboardInterrupt: the same cleanup runs, and the command ends with one ``error:`` line.

    A second SIGTERM during that cleanup is ignored (SIGKILL still ends the
    process). Both are raised only where the exception cannot be lost (:func:`_would_be_lost`);
    one that comes inside a finalizer or an import is sent again a moment later. Only the main thread
    can set a handler; elsewhere nothing changes.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return contextlib.nullcontext()

    def terminated(signum: int, frame: FrameType | None) -> None:
        from dlmstore.errors import Terminated
        from dlmstore.train.distributed import LAUNCHER_GONE, launcher_gone

        if _would_be_lost(frame):
            _send_again(signum)
            return
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated(signum, LAUNCHER_GONE if launcher_gone() else None)

    def interrupted(signum: int, frame: FrameType | None) -> None:
        if _would_be_lost(frame):
            _send_again(signum)
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def handled() -> Iterator[None]:
        previous = {
            signal.SIGTERM: signal.signal(signal.SIGTERM, terminated),
            signal.SIGINT: signal.signal(signal.SIGINT, interrupted),
        }
        try:
            yield
        finally:
            for which, handler in previous.items():
                signal.signal(which, handler)

    return handled()


#: How long after a signal that came inside a finalizer or an import it is sent again.
RESEND_S = 0.02
#: The modules whose frames run an import (frozen or not, under these names).
_IMPORT_MACHINERY = frozenset({"importlib._bootstrap", "importlib._bootstrap_external"})


def _would_be_lost(frame: FrameType | None) -> bool:
    """Whether an exception raised in ``frame`` may never reach the command: a finalizer or an import runs it.

    Raised in a finalizer (a ``__del__``, a ``weakref.finalize`` callback), it
    is printed as ``Exception ignored in ...`` and the code goes on: a
    SIGTERM that landed in a regex object's ``__del__`` during a Ray build
    was lost so (the build ran to its end and exited 0). Raised while a
    module is being imported, it may meet that module's own bare
    ``except:``: every Cython module with memoryviews registers them with
    ``collections.abc`` inside ``try: ... except: pass``, and a SIGTERM that
    landed there, in ``numpy.random``'s first import halfway through a Ray
    build, was lost the same way. Raised inside a module that sets
    ``SIGNALS_WAIT`` (``dlmstore.store.atomic``), it may land between a temp
    file's creation and the line that records it: the temp file is left behind
    (a Ctrl-C during ``dlm tokenize`` left a ``.high-water.json.*.tmp`` so).
    """
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or (
            code.co_name == "__call__" and code.co_filename.endswith("weakref.py")
        ):
            return True
        if frame.f_globals.get("__name__") in _IMPORT_MACHINERY:
            return True
        if frame.f_globals.get("SIGNALS_WAIT") is True:
            return True
        frame = frame.f_back
    return False


def _send_again(signum: int) -> None:
    """``signum`` to this process again in :data:`RESEND_S`, once the finalizer or import it came in is over."""
    import threading

    timer = threading.Timer(RESEND_S, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()


def _fail(reports: list[tuple[str, str | None]], code: int, *, signum: int | None = None) -> NoReturn:
    """End the command with ``error:``/``hint:`` lines and ``code``.

    A rank of ``dlm train --nproc`` hands them to its launcher instead,
    which prints one report for the whole run; any distributed rank ends
    without interpreter teardown (``dlmstore.train.distributed.exit_rank``).
    """
    from dlmstore.train.distributed import RankReport, exit_rank, report_fd

    if report_fd() is not None:
        RankReport(errors=() if signum else tuple(reports), signal=signum).send()
    else:
        from .render import printable_line

        for message, hint in reports:
            click.echo(f"error: {printable_line(message)}", err=True)
            if hint:
                click.echo(f"hint: {printable_line(hint)}", err=True)
    if os.environ.get("WORLD_SIZE", "1").strip() not in ("", "0", "1"):  # a rank of several
        exit_rank(code)
    sys.exit(code)


def _crashed_in_a_rank(exc: Exception) -> None:
    """In a rank of ``dlm train --nproc``, tell the launcher about an exception no DlmError explains, and end.

    Click's own exceptions (usage errors, exit) pass through untouched.
    With ``DLM_DEBUG`` the traceback is printed too (rank 0's stderr is the terminal).
    """
    from dlmstore.train.distributed import RankReport, exit_rank, report_fd

    if report_fd() is None or isinstance(
        exc, (click.exceptions.Exit, click.exceptions.Abort, click.ClickException)
    ):
        return
    if _debug_env():
        import traceback

        traceback.print_exception(exc)
    first = str(exc).splitlines()[0] if str(exc) else ""
    RankReport(crash=f"{type(exc).__name__}: {first}" if first else type(exc).__name__).send()
    exit_rank(1)


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
    from dlmstore.collector import no_collection_at_exit

    from .logs import configure_logging
    from .render import QUIET_KEY, file_names_pass_through_stdout

    no_collection_at_exit()
    file_names_pass_through_stdout()
    if quiet and verbose:
        raise click.UsageError("-q/--quiet and -v/--verbose cannot be used together")
    ctx.meta[QUIET_KEY] = quiet
    ctx.call_on_close(configure_logging(verbose=verbose))


if __name__ == "__main__":  # `python -m dlmstore.cli.main`: how `dlm train --nproc` starts its ranks
    cli()

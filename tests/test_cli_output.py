"""What `dlm` says and where: -q and -v, logging, tracebacks on request, DLM_* variables, counts, streams."""

from __future__ import annotations

import json
import logging
import os
import signal
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from dlmstore.cli import cache as cache_commands
from dlmstore.cli.logs import configure_logging
from dlmstore.cli.main import EXIT_CODES, cli
from dlmstore.errors import DocumentError
from dlmstore.plural import plural
from dlmstore.store.database import open_store

from .helpers import VALID_ID, write_doc


@pytest.fixture
def tiny_doc(tmp_path: Path, tiny_base: Path) -> Path:
    return write_doc(
        tmp_path / "doc.dlm",
        body="One paragraph of prose.\n",
        frontmatter=f"base_model: {tiny_base}\ntraining:\n  sequence_len: 64\n  max_steps: 2\n",
    )


def test_plural_says_one_row_and_two_rows() -> None:
    assert [plural(n, "preference row") for n in (0, 1, 2, 1234)] == [
        "0 preference rows",
        "1 preference row",
        "2 preference rows",
        "1,234 preference rows",
    ]
    assert [plural(n, "entry", "entries") for n in (1, 3)] == ["1 entry", "3 entries"]


def test_tokenize_counts_one_row_in_the_singular(tiny_doc: Path) -> None:
    result = CliRunner().invoke(cli, ["-q", "tokenize", str(tiny_doc)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[:2] == [
        "run 1: 1 row, 6 tokens",
        "cache:  on, 0 hits, 1 miss (0.0%)",
    ]


def test_verbose_shows_dlmstores_debug_log_on_stderr(tiny_doc: Path) -> None:
    quiet = CliRunner().invoke(cli, ["tokenize", str(tiny_doc)])
    verbose = CliRunner().invoke(cli, ["-v", "tokenize", str(tiny_doc)])
    assert (quiet.exit_code, verbose.exit_code) == (0, 0)
    assert "debug:" not in quiet.stderr
    # The first pass kept a snapshot (nothing to walk here), and the snapshot answers the second.
    assert (
        "debug: tokenize pass: 1 row, all found in the cache (the snapshot of run 1 holds)\n"
        in verbose.stderr
    )
    assert "debug:" not in verbose.stdout


def test_quiet_and_verbose_together_are_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["-q", "-v", "show", "x.dlm"])
    assert result.exit_code == 2
    assert "-q/--quiet and -v/--verbose cannot be used together" in result.stderr


def test_library_warnings_print_as_warning_lines_and_logging_is_put_back_afterwards(
    capsys: pytest.CaptureFixture[str],
) -> None:
    prefix_log = logging.getLogger("dlmstore.prefix.cached")
    before = (logging.getLogger().handlers[:], logging.getLogger("dlmstore").level)
    restore = configure_logging(verbose=False)
    prefix_log.warning("prefix cache: prefix level (L1) off: %s", "no template")
    prefix_log.debug("not shown without -v")
    restore()
    assert capsys.readouterr().err == "warning: prefix cache: prefix level (L1) off: no template\n"
    assert (logging.getLogger().handlers, logging.getLogger("dlmstore").level) == before


def test_an_error_is_one_line_with_its_hint_by_default(tmp_path: Path) -> None:
    missing = tmp_path / "missing.dlm"
    result = CliRunner().invoke(cli, ["show", str(missing)])
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == f"error: {missing}: no such file\nhint: run `dlm init {missing}` to create one\n"


@pytest.mark.parametrize(
    ("args", "env"), [(["--traceback"], {}), ([], {"DLM_DEBUG": "1"}), ([], {"DLM_TRACEBACK": "true"})]
)
def test_traceback_or_dlm_debug_raises_the_error_with_the_cause_it_hid(
    tmp_path: Path, args: list[str], env: dict[str, str]
) -> None:
    result = CliRunner().invoke(cli, [*args, "show", str(tmp_path / "missing.dlm")], env=env)
    error = result.exception
    assert isinstance(error, DocumentError)  # raised, not turned into `error: ...`
    # parse_document raises it `from None`; the traceback shows the cause all the same.
    assert isinstance(error.__context__, FileNotFoundError) and not error.__suppress_context__
    shown = "".join(traceback.format_exception(error))
    assert "FileNotFoundError" in shown and "DocumentError" in shown


def test_dlm_exits_with_each_status_the_table_in_docs_cli_md_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    runner = CliRunner()
    statuses = {
        "success": runner.invoke(cli, ["show", str(doc)]).exit_code,
        "error": runner.invoke(cli, ["show", str(tmp_path / "missing.dlm")]).exit_code,
        "usage": runner.invoke(cli, ["show", "--bogus", str(doc)]).exit_code,
    }

    def ctrl_c(path: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("dlmstore.corpus.show.summarize", ctrl_c)
    interrupted = runner.invoke(cli, ["show", str(doc)])
    assert interrupted.stderr == "error: interrupted\n"
    statuses["interrupted"] = interrupted.exit_code

    def sigterm(path: str) -> None:  # as `timeout` or systemd sends it: the command's handler raises
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr("dlmstore.corpus.show.summarize", sigterm)
    terminated = runner.invoke(cli, ["show", str(doc)])
    assert terminated.stderr == "error: terminated by SIGTERM\n"
    statuses["terminated"] = terminated.exit_code
    assert statuses == {"success": 0, "error": 1, "usage": 2, "interrupted": 130, "terminated": 143}
    assert sorted(statuses.values()) == [status for status, _ in EXIT_CODES]


def test_dlm_debug_set_to_zero_keeps_the_one_line_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["show", str(tmp_path / "missing.dlm")], env={"DLM_DEBUG": "0"})
    assert result.exit_code == 1 and result.stderr.startswith("error: ")


def test_dlm_environment_variables_set_options(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    result = CliRunner().invoke(cli, ["show", str(doc)], env={"DLM_SHOW_AS_JSON": "1"})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["path"] == str(doc)
    limited = CliRunner().invoke(cli, ["metrics", str(doc)], env={"DLM_METRICS_LIMIT": "0"})
    assert limited.exit_code == 2 and "DLM_METRICS_LIMIT" not in limited.stdout


def test_dlm_quiet_in_the_environment_is_dash_q(tmp_path: Path, tiny_base: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm", frontmatter=f"base_model: {tiny_base}\n")
    loud = CliRunner().invoke(cli, ["tokenize", str(doc)])
    quiet = CliRunner().invoke(cli, ["tokenize", str(doc)], env={"DLM_QUIET": "1"})
    assert (loud.exit_code, quiet.exit_code) == (0, 0)
    assert "tokenizing:" in loud.stderr and quiet.stderr == ""


def test_dlm_version_in_the_environment_does_not_print_the_version(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    result = CliRunner().invoke(cli, ["show", str(doc)], env={"DLM_VERSION": "1"})
    assert result.exit_code == 0 and result.stdout.startswith("document: ")


def test_cache_clear_asks_its_question_on_stderr(tmp_path: Path, tiny_base: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm", frontmatter=f"base_model: {tiny_base}\n")
    runner = CliRunner()
    assert runner.invoke(cli, ["-q", "tokenize", str(doc)]).exit_code == 0
    # CliRunner's stdin is no terminal; let the command see one so it asks instead of refusing.
    terminal = SimpleNamespace(stdin=SimpleNamespace(isatty=lambda: True))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cache_commands, "sys", terminal)
        result = runner.invoke(cli, ["cache", "clear", str(doc)], input="y\n")
    assert result.exit_code == 0, result.output
    assert "Delete 1 cache entry (" in result.stderr
    assert result.stdout.startswith("cleared 1 entry (")


@pytest.mark.slow
def test_piped_train_reports_every_step_on_stderr_and_its_summary_on_stdout(
    tiny_doc: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    result = CliRunner().invoke(cli, ["train", str(tiny_doc)])
    assert result.exit_code == 0, result.output
    stderr = result.stderr.splitlines()
    assert [line.split(": ")[0] for line in stderr] == ["tokenizing", f"loading {tiny_base}", "training sft"]
    assert stderr[2].startswith("training sft: 2 steps in ") and ", loss " in stderr[2]
    # The val line sits under its phase: one row is too few to hold any out (#29).
    assert [line.split(":")[0].split()[0] for line in result.stdout.splitlines()] == [
        "run", "val", "adapter", "sha256", "cache", "lock",
    ], result.stdout  # fmt: skip
    assert "  val:    no rows held out" in result.stdout.splitlines()
    assert "sft: 2 steps on 1 row (" in result.stdout


def test_shell_completion_offers_commands_and_subcommands() -> None:
    def complete(words: str, cword: int) -> list[str]:
        env = {"_DLM_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
        result = CliRunner().invoke(cli, [], env=env, prog_name="dlm")
        assert result.exit_code == 0, result.output
        return result.stdout.splitlines()

    assert complete("dlm ca", 1) == ["plain,cache"]
    assert complete("dlm cache ", 2) == ["plain,clear", "plain,prune", "plain,show", "plain,verify"]
    assert "plain,--quiet" in complete("dlm --", 1)


def test_metrics_of_a_store_without_runs_prints_its_header_and_a_note_on_stderr(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    open_store(VALID_ID).close()  # the store exists, with no run in it
    result = CliRunner().invoke(cli, ["metrics", str(doc)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].split() == [
        "run", "command", "status", "started", "(UTC)", "duration", "rows", "hits", "misses", "hit", "rate",
        "tokenize", "cache", "loss",
    ]  # fmt: skip
    assert len(result.stdout.splitlines()) == 1
    assert result.stderr == "note: no runs yet: run `dlm tokenize` or `dlm train` first\n"
    assert CliRunner().invoke(cli, ["-q", "metrics", str(doc)]).stderr == ""

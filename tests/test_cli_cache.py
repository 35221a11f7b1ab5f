"""`dlm tokenize`, `dlm cache ...`, `dlm metrics` and `dlm show`'s training_cache, as a person uses them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.home import store_dir

from .helpers import VALID_ID, write_doc


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(3):
        (notes / f"{i}.md").write_text(f"note {i}\n")
    return write_doc(
        tmp_path / "doc.dlm",
        body="Prose.\n\n::instruction::\n### Q\nq?\n### A\na.\n",
        frontmatter="training:\n  sources:\n    - path: notes\n",
    )


def _tokenize(runner: CliRunner, doc: Path, *extra: str) -> dict:  # type: ignore[type-arg]
    result = runner.invoke(cli, ["tokenize", str(doc), "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_tokenize_json_reports_the_run_and_its_tokenization_event(runner: CliRunner, doc: Path) -> None:
    first = _tokenize(runner, doc)
    second = _tokenize(runner, doc)
    assert first["run_id"] == 1 and second["run_id"] == 2
    assert first["tokenization"]["cache_misses"] == 5 and first["tokenization"]["cache_hits"] == 0
    event = second["tokenization"]
    assert {k: event[k] for k in ("total_sections", "total_rows", "cache_hits", "cache_misses", "hit_rate", "cache_mode")} == {
        "total_sections": 5, "total_rows": 5, "cache_hits": 5, "cache_misses": 0, "hit_rate": 1.0, "cache_mode": "on",
    }  # fmt: skip
    assert event["cache_bytes_after"] > 0 and second["tokens"] == first["tokens"] > 0


def test_tokenize_prints_a_readable_summary(runner: CliRunner, doc: Path) -> None:
    result = runner.invoke(cli, ["tokenize", str(doc)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert re.fullmatch(r"run 1: 5 rows, [\d,]+ tokens", lines[0])
    assert lines[1] == "cache:  on, 0 hits, 5 misses (0.0%)"


def test_cache_show_matches_the_spec_layout(runner: CliRunner, doc: Path) -> None:
    _tokenize(runner, doc)
    _tokenize(runner, doc)
    result = runner.invoke(cli, ["cache", "show", str(doc)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"Cache for {VALID_ID}"
    assert lines[1] == f"path: {store_dir(VALID_ID) / 'tokens'}"
    assert lines[2] == "entries: 5"
    assert re.fullmatch(r"size: [\d.]+ (B|KB)", lines[3])
    assert lines[4] == "last-run hit rate: 100.0% (5/5)"


def test_cache_show_json_and_show_json_agree(runner: CliRunner, doc: Path) -> None:
    _tokenize(runner, doc)
    cache = json.loads(runner.invoke(cli, ["cache", "show", str(doc), "--json"]).stdout)
    shown = json.loads(runner.invoke(cli, ["show", str(doc), "--json"]).stdout)["training_cache"]
    assert shown == {
        "path": cache["path"], "entry_count": 5, "bytes": cache["bytes"],
        "last_run_hit_rate": 0.0, "last_run_id": 1,
    }  # fmt: skip


def test_cache_show_of_a_new_document_is_read_only(runner: CliRunner, doc: Path, dlm_home: Path) -> None:
    result = runner.invoke(cli, ["cache", "show", str(doc)])
    assert result.exit_code == 0
    assert "entries: 0" in result.output and "last-run hit rate: n/a (no cached run yet)" in result.output
    assert not (dlm_home / "store").exists()


def test_metrics_json_lists_runs_newest_first_with_their_tokenization(runner: CliRunner, doc: Path) -> None:
    _tokenize(runner, doc)
    _tokenize(runner, doc)
    report = json.loads(runner.invoke(cli, ["metrics", str(doc), "--json"]).stdout)
    assert [run["run_id"] for run in report["runs"]] == [2, 1]
    assert set(report["runs"][0]["tokenization"]) == {
        "total_sections", "cache_hits", "cache_misses", "total_tokenize_seconds",
        "cache_bytes_after", "hit_rate", "total_rows", "cache_mode", "cache_shared",
    }  # fmt: skip
    assert report["runs"][0]["tokenization"]["hit_rate"] == 1.0
    only = json.loads(runner.invoke(cli, ["metrics", str(doc), "--json", "--run-id", "1"]).stdout)
    assert [run["run_id"] for run in only["runs"]] == [1]
    assert (
        json.loads(runner.invoke(cli, ["metrics", str(doc), "--json", "--limit", "1"]).stdout)["runs"][0][
            "run_id"
        ]
        == 2
    )
    assert (
        len(json.loads(runner.invoke(cli, ["metrics", str(doc), "--json", "--since", "1h"]).stdout)["runs"])
        == 2
    )


def test_metrics_prints_a_table(runner: CliRunner, doc: Path) -> None:
    _tokenize(runner, doc)
    lines = runner.invoke(cli, ["metrics", str(doc)]).output.splitlines()
    assert lines[0].split() == [
        "run",
        "command",
        "status",
        "started",
        "(UTC)",
        "duration",
        "rows",
        "hits",
        "misses",
        "hit",
        "rate",
        "tokenize",
        "cache",
        "loss",
    ]
    assert lines[1].split()[:3] == ["1", "tokenize", "completed"]


def test_no_cache_tokenize_records_a_bypassed_run(runner: CliRunner, doc: Path) -> None:
    summary = _tokenize(runner, doc, "--no-cache")
    assert summary["tokenization"]["cache_mode"] == "bypassed"
    assert json.loads(runner.invoke(cli, ["cache", "show", str(doc), "--json"]).stdout)["entry_count"] == 0


@pytest.mark.parametrize("value", ["3x", "d", "10", "-1d", "1.5h"])
def test_a_bad_prune_duration_is_a_usage_error_with_an_example(
    runner: CliRunner, doc: Path, value: str
) -> None:
    _tokenize(runner, doc)
    result = runner.invoke(cli, ["cache", "prune", str(doc), "--older-than", value])
    assert result.exit_code == 2
    assert result.output.rstrip().endswith(
        f"Invalid value for '--older-than': invalid duration '{value}': use a number and a unit d, h, m or s, "
        "e.g. 30d, 12h, 45m or 10s"
    )


def test_prune_defaults_to_the_frontmatter_cutoff_and_the_flag_wins(runner: CliRunner, doc: Path) -> None:
    _tokenize(runner, doc)
    kept = json.loads(runner.invoke(cli, ["cache", "prune", str(doc), "--json"]).stdout)
    assert kept["entries_removed"] == 0  # 90 days by default
    gone = json.loads(runner.invoke(cli, ["cache", "prune", str(doc), "--older-than", "0s", "--json"]).stdout)
    assert gone["entries_removed"] == 5


def test_clear_without_a_terminal_or_force_refuses(runner: CliRunner, doc: Path) -> None:
    _tokenize(runner, doc)
    result = runner.invoke(cli, ["cache", "clear", str(doc)])
    assert result.exit_code == 1
    assert result.output.splitlines()[0].startswith("error: refusing to clear 5 entries (")
    assert result.output.splitlines()[1] == f"hint: pass --force: dlm cache clear {doc} --force"
    forced = runner.invoke(cli, ["cache", "clear", str(doc), "--force"])
    assert forced.exit_code == 0 and forced.output.startswith("cleared 5 entries")


def test_verify_exits_1_on_a_problem_and_repair_fixes_it(runner: CliRunner, doc: Path) -> None:
    _tokenize(runner, doc)
    clean = runner.invoke(cli, ["cache", "verify", str(doc)])
    assert clean.exit_code == 0 and clean.output.endswith("0 problems, 0 remaining\n")
    for segment in (store_dir(VALID_ID) / "tokens").glob("segment-*.bin"):
        segment.write_bytes(segment.read_bytes()[:3])
    broken = runner.invoke(cli, ["cache", "verify", str(doc), "--json"])
    assert broken.exit_code == 1
    assert json.loads(broken.stdout)["remaining"] == 6  # one short segment and five bad entries
    repaired = runner.invoke(cli, ["cache", "verify", str(doc), "--repair"])
    assert repaired.exit_code == 0, repaired.output
    assert runner.invoke(cli, ["cache", "verify", str(doc)]).exit_code == 0


def test_cache_commands_on_a_document_without_a_store_say_what_to_run(runner: CliRunner, doc: Path) -> None:
    result = runner.invoke(cli, ["cache", "prune", str(doc)])
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == "hint: run `dlm tokenize` on the document to create it"


@pytest.mark.parametrize("argv", [["cache", "show"], ["metrics"], ["tokenize"]])
def test_cache_metrics_and_a_warm_tokenize_import_neither_torch_nor_transformers(
    runner: CliRunner, doc: Path, argv: list[str]
) -> None:
    import subprocess
    import sys

    _tokenize(runner, doc)  # warm: every row is cached
    code = (
        "import sys; from dlmstore.cli.main import cli\n"
        f"try:\n    cli({[*argv, str(doc)]!r})\nexcept SystemExit:\n    pass\n"
        "print([m for m in ('torch', 'transformers', 'sqlalchemy') if m in sys.modules], file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip().splitlines()[-1] == "[]"


def test_clearing_an_empty_cache_is_success_without_a_question(runner: CliRunner, doc: Path) -> None:
    runner.invoke(cli, ["cache", "clear", str(doc), "--force"])  # a store with an emptied cache
    again = runner.invoke(cli, ["cache", "clear", str(doc)])
    assert (again.exit_code, again.output) == (0, "nothing to clear: the cache is empty\n")
    as_json = runner.invoke(cli, ["cache", "clear", str(doc), "--json"])
    assert as_json.exit_code == 0
    assert json.loads(as_json.stdout) == {"entries_removed": 0, "bytes_removed": 0, "files_removed": 0}


def test_clear_json_prints_what_it_removed_and_the_cache_is_then_empty(runner: CliRunner, doc: Path) -> None:
    cached = _tokenize(runner, doc)["tokenization"]["cache_bytes_after"]
    result = runner.invoke(cli, ["cache", "clear", str(doc), "--force", "--json"])
    assert result.exit_code == 0, result.output
    cleared = json.loads(result.stdout)
    assert (cleared["entries_removed"], cleared["bytes_removed"]) == (5, cached)
    assert cleared["files_removed"] >= 1
    shown = json.loads(runner.invoke(cli, ["cache", "show", str(doc), "--json"]).stdout)
    assert (shown["entry_count"], shown["bytes"]) == (0, 0)

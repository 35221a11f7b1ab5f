"""Hostile files and arguments: each is one ``error:`` line (or a usage error), never a traceback.

Every case provokes its fault through the CLI as a person would meet it:
JSON nested 500 deep in ``dlm.lock`` and a dataset's ``meta.json``, a
``meta.json`` field of the wrong type, numbers too large for a date or for
SQLite, a seed NumPy refuses, a ``base_model`` path no file system can
hold, a store whose ``alembic_version`` disagrees with its tables, and a
local base folder whose ``tokenizer.json`` is a directory, a FIFO or a
symlink to ``/dev/zero``.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from dlmstore.cli.main import cli
from dlmstore.cli.params import SEED
from dlmstore.datasets.build.pretrain import build_pretrain_cache
from dlmstore.document.frontmatter import MAX_PRUNE_DAYS, MAX_SEED
from dlmstore.home import store_dir
from dlmstore.lock import LOCK_NAME, check_lock, write_lock
from dlmstore.store.database import HEAD_REVISION, open_store
from dlmstore.store.runs import start_run

from .helpers import VALID_ID, WORD_SHA, WordTokenizer, make_lock, words, write_doc

DEEP_JSON = "[" * 500 + "]" * 500


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def one_error(result: Result, exit_code: int = 1) -> str:
    """The one ``error:`` line of a failed command (``hint:`` lines allowed), checked."""
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and all(line.startswith(("error: ", "hint: ")) for line in lines), lines
    return errors[0]


def usage_error(result: Result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    return result.stderr.splitlines()[-1]


# --- nesting 500 deep -----------------------------------------------------------------------


def test_frontmatter_nested_500_deep_is_one_error(runner: CliRunner, tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm", frontmatter=f"system_prompt: {DEEP_JSON}\n")
    assert one_error(runner.invoke(cli, ["show", str(doc)])) == (
        f"error: {doc}:3: the frontmatter nests values more than 64 levels deep"
    )


def test_a_dlm_lock_nested_500_deep_is_one_error_and_update_lock_replaces_it(
    runner: CliRunner, tmp_path: Path
) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    with open_store(VALID_ID) as store:
        path = store.path / LOCK_NAME
        path.write_text(DEEP_JSON)
        assert one_error(runner.invoke(cli, ["lock", "show", str(doc)])) == (
            f"error: {path} is not a lock: its JSON nests deeper than 64 levels"
        )
        run_id = start_run(store, command="train", dlm_path=doc, dlm_sha256="a" * 64)
        lock = make_lock(last_run_id=run_id)
        decision = check_lock(store, lock, mode="update")
        assert decision.decision == "updated"
        write_lock(store, lock, decision=decision.decision)
    assert json.loads(path.read_text())["last_run_id"] == run_id


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_dlm_lock_that_is_no_file_is_one_error(runner: CliRunner, tmp_path: Path, kind: str) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    path = open_store(VALID_ID).path / LOCK_NAME
    if kind == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)
    what = "a directory" if kind == "directory" else "a FIFO"
    assert one_error(runner.invoke(cli, ["lock", "show", str(doc)])) == (
        f"error: cannot read {path}: {what}, not a regular file"
    )


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    texts = [words(*range(10 * i + 1, 10 * i + 9)) for i in range(4)]
    build_pretrain_cache(
        texts, tmp_path / "ds", tokenizer=WordTokenizer(), tokenizer_sha256=WORD_SHA, val_frac=0.0, seed=0
    )
    return tmp_path / "ds"


def test_a_meta_json_nested_500_deep_is_one_error(runner: CliRunner, dataset: Path) -> None:
    (dataset / "meta.json").write_text(DEEP_JSON)
    assert one_error(runner.invoke(cli, ["data", "show", str(dataset)])) == (
        f"error: {dataset / 'meta.json'} is not valid JSON: nests deeper than 64 levels"
    )


@pytest.mark.parametrize(
    ("field", "value", "words_"),
    [
        ("vocab_size", "big", "a whole number"),
        ("built", 1, "true or false"),
        ("kind", ["pretrain"], "a string"),
    ],
)
def test_a_meta_json_field_of_the_wrong_type_is_one_error_naming_it(
    runner: CliRunner, dataset: Path, field: str, value: object, words_: str
) -> None:
    meta = json.loads((dataset / "meta.json").read_text())
    meta[field] = value
    (dataset / "meta.json").write_text(json.dumps(meta))
    assert one_error(runner.invoke(cli, ["data", "show", str(dataset)])) == (
        f"error: {dataset / 'meta.json'}: field {field!r} must be {words_}, not {value!r}"
    )


def test_a_meta_json_that_is_a_fifo_is_one_error(runner: CliRunner, dataset: Path) -> None:
    (dataset / "meta.json").unlink()
    os.mkfifo(dataset / "meta.json")
    result = runner.invoke(cli, ["data", "validate", str(dataset)])
    assert one_error(result) == f"error: {dataset}: 1 problem"
    assert result.stdout == f"problem: cannot read {dataset / 'meta.json'}: a FIFO, not a regular file\n"


# --- numbers out of range -------------------------------------------------------------------


@pytest.mark.parametrize("seed", [-1, MAX_SEED + 1, 2**64])
def test_a_seed_numpy_refuses_is_a_frontmatter_error(runner: CliRunner, tmp_path: Path, seed: int) -> None:
    doc = write_doc(tmp_path / "doc.dlm", frontmatter=f"training:\n  seed: {seed}\n")
    assert one_error(runner.invoke(cli, ["show", str(doc)])) == (
        f"error: {doc}:4: training.seed: must be between 0 and {MAX_SEED}"
    )


def test_the_seed_option_has_the_frontmatters_bounds() -> None:
    assert (SEED.min, SEED.max) == (0, MAX_SEED)


def test_a_retention_past_a_century_is_a_frontmatter_error(runner: CliRunner, tmp_path: Path) -> None:
    doc = write_doc(
        tmp_path / "doc.dlm", frontmatter="training:\n  cache:\n    prune_older_than_days: 99999999999\n"
    )
    assert one_error(runner.invoke(cli, ["cache", "prune", str(doc)])) == (
        f"error: {doc}:5: training.cache.prune_older_than_days: must be between 0 and {MAX_PRUNE_DAYS}"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["cache", "prune", "{doc}", "--older-than", "99999999999d"],
        ["cache", "prune", "{doc}", "--older-than", "36501d"],
        ["cache", "prune", "{doc}", "--older-than", "9" * 5000 + "s"],
        ["metrics", "{doc}", "--since", "99999999999d"],
    ],
    ids=["older-than overflow", "older-than past a century", "older-than of 5000 digits", "since"],
)
def test_a_duration_past_a_century_is_a_usage_error(
    runner: CliRunner, tmp_path: Path, args: list[str]
) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    runner.invoke(cli, ["tokenize", str(doc)])
    line = usage_error(runner.invoke(cli, [arg.replace("{doc}", str(doc)) for arg in args]))
    assert line.endswith("is too long: at most 36500d (100 years)")


@pytest.mark.parametrize("args", [["metrics", "{doc}", "--run-id"], ["lock", "diff", "{doc}", "--against"]])
def test_a_run_id_sqlite_cannot_hold_is_a_usage_error(
    runner: CliRunner, tmp_path: Path, args: list[str]
) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    runner.invoke(cli, ["tokenize", str(doc)])
    line = usage_error(runner.invoke(cli, [*(arg.replace("{doc}", str(doc)) for arg in args), str(2**70)]))
    assert f"{2**70} is not in the range 1<=x<=9223372036854775807" in line


# --- base models ----------------------------------------------------------------------------


def test_a_base_model_path_no_file_system_can_hold_is_one_error(runner: CliRunner, tmp_path: Path) -> None:
    name = "./" + "x" * 300
    doc = write_doc(tmp_path / "doc.dlm", frontmatter=f"base_model: {name}\n")
    assert one_error(runner.invoke(cli, ["tokenize", str(doc)])) == (
        f"error: base model {name!r} cannot be a local folder: File name too long"
    )


@pytest.mark.parametrize("kind", ["directory", "fifo", "dev-zero"])
def test_a_local_base_whose_tokenizer_json_is_no_file_is_one_error_naming_it(
    runner: CliRunner, tmp_path: Path, kind: str
) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    target = base / "tokenizer.json"
    if kind == "directory":
        target.mkdir()
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    doc = write_doc(tmp_path / "doc.dlm", frontmatter=f"base_model: {base}\n")
    what = {
        "directory": "a directory, not a regular file",
        "fifo": "a FIFO, not a regular file",
        "dev-zero": "a character device, not a regular file",
    }[kind]
    assert one_error(runner.invoke(cli, ["tokenize", str(doc)])) == (
        f"error: base model {str(base)!r}: {target} is {what}"
    )


def test_tokenizer_fingerprints_read_only_regular_files(tmp_path: Path) -> None:
    from dlmstore.errors import BaseModelError
    from dlmstore.fingerprint import files_sha256

    os.mkfifo(tmp_path / "tokenizer.json")
    with pytest.raises(BaseModelError) as info:
        files_sha256(tmp_path)
    assert info.value.message == (
        f"cannot read tokenizer file {tmp_path / 'tokenizer.json'}: a FIFO, not a regular file"
    )


# --- a store whose schema stamp disagrees with its tables -----------------------------------


@pytest.mark.parametrize("stamp", [None, "0001"], ids=["empty alembic_version", "older alembic_version"])
def test_a_store_stamped_wrongly_is_one_error_without_sql(
    runner: CliRunner, tmp_path: Path, stamp: str | None
) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    open_store(VALID_ID).close()
    db = store_dir(VALID_ID) / "store.db"
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM alembic_version")
        if stamp is not None:
            conn.execute("INSERT INTO alembic_version (version_num) VALUES (?)", (stamp,))
    conn.close()
    line = one_error(runner.invoke(cli, ["metrics", str(doc)]))
    assert line.startswith(
        f"error: cannot migrate {db} from schema revision {stamp or '(none)'} to {HEAD_REVISION}: "
    )
    assert line.endswith("already exists")


# --- what an error line quotes --------------------------------------------------------------


def test_an_error_quoting_control_characters_or_line_separators_stays_one_escaped_line(
    runner: CliRunner, tmp_path: Path
) -> None:
    doc = write_doc(tmp_path / "doc.dlm", body="\u2028\x0b::prose::\n")
    result = runner.invoke(cli, ["show", str(doc)])
    assert one_error(result) == f"error: {doc}:4: fence line '\\u2028\\x0b::prose::' has spaces around it"


def test_printable_escapes_terminal_controls_and_separators_but_keeps_tabs_and_newlines() -> None:
    from dlmstore.cli.render import printable

    assert printable("a\x1b[31mb\u2028c\x85d\re\x00f\tg\nh") == "a\\x1b[31mb\\u2028c\\x85d\\x0de\\x00f\tg\nh"


def test_update_lock_refuses_a_dlm_lock_directory_before_any_work(tmp_path: Path) -> None:
    from dlmstore.errors import LockError

    doc = write_doc(tmp_path / "doc.dlm")
    with open_store(VALID_ID) as store:
        path = store.path / LOCK_NAME
        path.mkdir()
        run_id = start_run(store, command="train", dlm_path=doc, dlm_sha256="a" * 64)
        with pytest.raises(LockError) as info:
            check_lock(store, make_lock(last_run_id=run_id), mode="update")
    assert info.value.message == f"{path} is a directory, so no lock can be read from it or written to it"
    assert info.value.hint.startswith(f"move it out of the way (e.g. `mv {path} {path}.old`)")

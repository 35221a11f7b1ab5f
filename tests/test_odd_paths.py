"""Odd document paths: a file name that is not UTF-8 works, and one that is not a regular file is refused.

A POSIX file name is bytes; Python hands ``bad\\xff.dlm`` around as a str
holding a surrogate, which SQLite's TEXT and a strict UTF-8 stdout refuse.
store.db records such a path as ``store.path_text`` writes it (each byte
that is not UTF-8 as ``\\xNN``), messages show it the same way, text on
stdout passes the bytes through, and ``--json`` writes JSON's ``\\udcNN``
escape, which decodes back to the same name. A document that is a FIFO,
socket or device is refused by its kind before it is opened, so a FIFO
with no writer never hangs a command.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from dlmstore.cli.main import cli
from dlmstore.home import store_dir
from dlmstore.store.path_text import path_text, text_paths

from .helpers import VALID_ID, write_doc

#: ``bad\xff.dlm``: the byte 0xff is never part of UTF-8.
BAD_NAME = os.fsdecode(b"bad\xff.dlm")


@pytest.fixture
def bad_doc(tmp_path: Path) -> Path:
    return write_doc(tmp_path / BAD_NAME)


def test_show_and_tokenize_work_on_a_document_whose_name_is_not_utf8(bad_doc: Path, tiny_base: Path) -> None:
    write_doc(bad_doc, frontmatter=f"base_model: {tiny_base}\n")
    runner = CliRunner()
    tokenized = runner.invoke(cli, ["tokenize", str(bad_doc)])
    assert tokenized.exit_code == 0, tokenized.output
    shown = runner.invoke(cli, ["show", str(bad_doc), "--json"])
    assert shown.exit_code == 0, shown.output
    assert "\\udcff" in shown.stdout  # JSON's escape, valid UTF-8 ...
    assert json.loads(shown.stdout)["path"] == str(bad_doc)  # ... that decodes to the very name
    assert os.fsencode(json.loads(shown.stdout)["path"]).endswith(b"/bad\xff.dlm")
    text = runner.invoke(cli, ["show", str(bad_doc)])
    assert text.exit_code == 0 and text.stdout_bytes.startswith(b"document: " + os.fsencode(bad_doc) + b"\n")
    with sqlite3.connect(store_dir(VALID_ID) / "store.db") as db:
        recorded = db.execute("SELECT dlm_path FROM runs").fetchone()[0]
    assert recorded == path_text(bad_doc) and recorded.endswith("/bad\\xff.dlm")
    assert text_paths(recorded)[0] == str(bad_doc)


def test_stores_gc_keeps_the_store_of_a_document_whose_name_is_not_utf8(
    bad_doc: Path, tiny_base: Path
) -> None:
    write_doc(bad_doc, frontmatter=f"base_model: {tiny_base}\n")
    runner = CliRunner()
    assert runner.invoke(cli, ["tokenize", str(bad_doc)]).exit_code == 0
    listed = json.loads(runner.invoke(cli, ["stores", "--json"]).stdout)["stores"]
    assert [(s["dlm_id"], s["document_state"]) for s in listed] == [(VALID_ID, "present")]
    gc = runner.invoke(cli, ["stores", "gc", "--force"])
    assert gc.exit_code == 0, gc.output
    assert store_dir(VALID_ID).is_dir()


def test_train_works_on_a_document_whose_name_is_not_utf8(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    doc = write_doc(
        tmp_path / BAD_NAME,
        body="::instruction::\n### Q\nWhat is dlm?\n### A\nA store.\n",
        frontmatter=f"base_model: {tiny_base}\ntraining:\n  sequence_len: 64\n  max_steps: 1\n"
        "  preference:\n    enabled: false\n",
    )
    result = CliRunner().invoke(cli, ["train", str(doc)])
    assert result.exit_code == 0, result.output
    report = CliRunner().invoke(cli, ["report", str(doc), "--json"])
    assert json.loads(report.stdout)["document_path"] == path_text(doc)


def test_an_error_about_a_document_whose_name_is_not_utf8_shows_the_byte_escaped(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / BAD_NAME)
    doc.write_text("---\ndlm_id: nope\n---\n")
    result = CliRunner().invoke(cli, ["show", str(doc)])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == (
        f"error: {tmp_path}/bad\\xff.dlm:2: dlm_id: must be a 26-character Crockford base32 ULID "
        "(run `dlm init` to mint one)"
    )
    assert not store_dir("nope").exists()


def test_init_writes_a_document_whose_name_is_not_utf8(tmp_path: Path) -> None:
    doc = tmp_path / BAD_NAME
    result = CliRunner().invoke(cli, ["init", str(doc), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["path"] == str(doc) and doc.is_file()


def test_migrate_works_on_a_document_whose_name_is_not_utf8(tmp_path: Path) -> None:
    doc = tmp_path / BAD_NAME
    doc.write_text(f"---\ndlm_id: {VALID_ID}\n---\nBody.\n")
    result = CliRunner().invoke(cli, ["migrate", str(doc)])
    assert result.exit_code == 0, result.output
    assert "dlm_version: 15" in doc.read_text()
    assert Path(f"{doc}.bak").read_text() == f"---\ndlm_id: {VALID_ID}\n---\nBody.\n"


def run_dlm(*args: str) -> subprocess.CompletedProcess[str]:
    """dlm in a child process (a FIFO that hangs it fails the test instead of the whole run)."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    return subprocess.run(
        [sys.executable, "-m", "dlmstore.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.parametrize("command", ["show", "report", "migrate", "tokenize", "train"])
def test_a_document_that_is_a_fifo_is_refused_without_hanging(tmp_path: Path, command: str) -> None:
    fifo = tmp_path / "doc.dlm"
    os.mkfifo(fifo)
    result = run_dlm(command, str(fifo))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: {fifo}: is a FIFO, not a regular file",
        "hint: a .dlm document is read from a regular file: save it to one",
    ]


def test_a_document_that_is_a_device_is_refused_by_its_kind(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["show", os.devnull])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == f"error: {os.devnull}: is a character device, not a regular file"


@given(st.binary(min_size=1, max_size=40).filter(lambda b: b"/" not in b and b"\0" not in b))
def test_a_recorded_path_names_the_file_it_was_made_from(name: bytes) -> None:
    path = os.fsdecode(b"/docs/" + name)
    text = path_text(path)
    text.encode("utf-8")  # valid UTF-8: SQLite's TEXT takes it
    assert path in text_paths(text)


def test_a_utf8_path_is_recorded_as_itself() -> None:
    assert path_text("/docs/naïve.dlm") == "/docs/naïve.dlm"
    assert text_paths("/docs/naïve.dlm") == ("/docs/naïve.dlm",)
    assert path_text(b"/docs/bad\xff\xfe.dlm") == "/docs/bad\\xff\\xfe.dlm"
    assert text_paths("/docs/bad\\xff.dlm") == (os.fsdecode(b"/docs/bad\xff.dlm"), "/docs/bad\\xff.dlm")

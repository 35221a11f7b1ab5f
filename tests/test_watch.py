"""``dlm train --watch``: a run per save that changes a row, one line for one that changes none.

The sessions run as real processes on the tiny base (conftest.py) and are
read line by line; each wait has a hang guard, none measures time.
"""

from __future__ import annotations

import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.home import store_dir
from dlmstore.watch.saves import Saves, Watched, counts

from .helpers import VALID_ID, write_doc

#: What a test waits for at most before it calls the session stuck (a hang guard, not a measurement).
PATIENCE_S = 300

FRONT = "training:\n  sequence_len: 64\n  max_steps: 2\n  micro_batch_size: 1\n  grad_accum: 1\n"


class _Session:
    """``dlm train DOC --watch`` started as a process, its output (stdout and stderr) read line by line."""

    def __init__(self, doc: Path, *extra: str) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dlmstore.cli.main", "train", str(doc), "--watch",
             "--watch-debounce-ms", "100", "--watch-max-steps", "2", *extra],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def line(self, starting: str) -> str:
        """The next line that starts with ``starting`` (the lines before it are kept in ``lines``)."""
        deadline = time.monotonic() + PATIENCE_S
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=1)
            except queue.Empty:
                continue
            assert line is not None, f"the session ended without {starting!r}:\n" + "\n".join(self.lines)
            self.lines.append(line)
            if line.startswith(starting):
                return line
        raise AssertionError(f"no {starting!r} line:\n" + "\n".join(self.lines))

    def stopped_by(self, sig: signal.Signals) -> tuple[int, list[psutil.Process]]:
        """Its exit code once ``sig`` is sent, and the processes it had started that are still running."""
        children = psutil.Process(self.process.pid).children(recursive=True)
        self.process.send_signal(sig)
        code = self.process.wait(timeout=PATIENCE_S)
        while (line := self._queue.get(timeout=PATIENCE_S)) is not None:  # whatever it printed last
            self.lines.append(line)
        _, alive = psutil.wait_procs(children, timeout=PATIENCE_S)
        return code, [child for child in alive if child.status() != psutil.STATUS_ZOMBIE]

    def errors(self) -> list[str]:
        return [line for line in self.lines if line.startswith(("error:", "Traceback", "Exception"))]


def _query(sql: str, *args: object) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(store_dir(VALID_ID) / "store.db")
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def _steps_logged(run_id: int) -> int:
    return int(_query("SELECT COUNT(*) FROM train_steps WHERE run_id = ?", run_id)[0][0])


def _doc(tmp_path: Path, base: Path, body: str = "Prose about light.\n") -> Path:
    return write_doc(tmp_path / "doc.dlm", body, f"base_model: {base}\n{FRONT}")


def _saved_by_rename(doc: Path, text: str) -> None:
    """Saved as editors that write a temporary file and rename it over the document do."""
    temporary = doc.with_name(doc.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, doc)


@pytest.mark.slow
def test_a_watch_session_retrains_after_a_save_skips_one_that_changes_no_row_and_survives_an_invalid_one(
    tmp_path: Path, tiny_base: Path
) -> None:
    doc = _doc(tmp_path, tiny_base)
    session = _Session(doc)
    session.line("watching ")
    text = doc.read_text(encoding="utf-8")

    doc.write_text(text + "\nA second paragraph about shadows.\n", encoding="utf-8")
    # The body is one prose section: one row, replaced by the edit.
    assert session.line("cycle 1:").startswith("cycle 1: doc.dlm saved: 1 row added, 1 removed; training")
    trained = session.line("cycle 1:")
    assert trained.startswith("cycle 1: doc.dlm saved: run ") and "2 steps on 1 row," in trained
    assert "-> v0002 in " in trained

    doc.write_text(text + "\nA second paragraph about shadows.\n\n\n", encoding="utf-8")  # blank lines only
    assert session.line("cycle 2:") == "cycle 2: doc.dlm saved: no row changed (1 row), skipped"

    _saved_by_rename(doc, text + "\nA third paragraph, saved by a rename.\n")
    assert session.line("cycle 3:").startswith("cycle 3: doc.dlm saved: 1 row added, 1 removed; training")
    assert "-> v0003 in " in session.line("cycle 3:")

    doc.write_text(text.replace("training:", "training:\n  no_such_key: 1"), encoding="utf-8")
    assert session.line("error:").startswith("error: ")
    doc.write_text(text + "\nA fourth paragraph after the broken save.\n", encoding="utf-8")
    assert session.line("cycle 5:").startswith("cycle 5: doc.dlm saved: 1 row added, 1 removed; training")
    assert "-> v0004 in " in session.line("cycle 5:")

    code, left = session.stopped_by(signal.SIGINT)
    assert (code, left) == (130, [])
    assert [line for line in session.errors() if not line.startswith("error: ")] == []
    assert len(session.errors()) == 2  # the invalid save's line, and the interrupt's


@pytest.mark.slow
def test_a_save_under_the_documents_sources_starts_a_run(tmp_path: Path, tiny_base: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("Notes about rivers.\n", encoding="utf-8")
    doc = write_doc(
        tmp_path / "doc.dlm",
        "Prose about light.\n",
        f"base_model: {tiny_base}\n{FRONT}  sources:\n    - path: notes\n      include: ['**/*.md']\n",
    )
    session = _Session(doc, "--watch-max-steps", "50")  # training.max_steps (2) is fewer: it caps the cycles
    session.line("watching ")
    (notes / "b.md").write_text("Notes about lakes.\n", encoding="utf-8")
    assert session.line("cycle 1:").startswith("cycle 1: b.md saved: 1 row added, 0 removed; training")
    assert "2 steps on 3 rows," in session.line("cycle 1:")
    (notes / "b.md~").write_text("An editor's backup.\n", encoding="utf-8")  # not a save of a source
    (notes / "c.md").write_text("Notes about the sea.\n", encoding="utf-8")
    assert session.line("cycle 2:").startswith("cycle 2: c.md saved: 1 row added, 0 removed; training")
    # A save that changes only what tag weights make of the rows trains too: the rows train twice now.
    (notes / ".dlm").mkdir()
    (notes / ".dlm" / "training.yaml").write_text(
        "metadata:\n  kind: note\nweights:\n  kind:\n    note: 2\n", encoding="utf-8"
    )
    assert session.line("cycle 3:").startswith(
        "cycle 3: training.yaml saved: 0 rows added, 0 removed; training"
    )
    assert session.stopped_by(signal.SIGINT) == (130, [])


@pytest.mark.slow
def test_sigterm_while_watching_ends_the_session_as_an_interrupted_command_with_nothing_left_running(
    tmp_path: Path, tiny_base: Path
) -> None:
    session = _Session(_doc(tmp_path, tiny_base))
    session.line("watching ")
    assert session.stopped_by(signal.SIGTERM) == (143, [])
    assert session.errors() == ["error: terminated by SIGTERM"]


@pytest.mark.slow
def test_sigterm_during_a_cycles_run_ends_it_as_an_interrupted_train_run(
    tmp_path: Path, tiny_base: Path
) -> None:
    doc = _doc(tmp_path, tiny_base)
    session = _Session(doc, "--watch-max-steps", "5000")
    session.line("watching ")
    doc.write_text(doc.read_text(encoding="utf-8") + "\nMore prose.\n", encoding="utf-8")
    session.line("cycle 1:")  # its run starts
    deadline = time.monotonic() + PATIENCE_S
    while _steps_logged(run_id=2) < 1:  # and trains
        assert session.process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    assert session.stopped_by(signal.SIGTERM) == (143, [])
    assert session.errors() == ["error: terminated by SIGTERM"]
    # Recorded as any interrupted dlm train is: --resume continues it from its checkpoints.
    assert _query("SELECT id, status, error FROM runs WHERE command = 'train'") == [
        (1, "completed", None),
        (2, "failed", "terminated by SIGTERM"),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--watch", "--watch-max-steps", "0"], "Invalid value for '--watch-max-steps'"),
        (["--watch", "--watch-debounce-ms", "-1"], "Invalid value for '--watch-debounce-ms'"),
        (["--watch-max-steps", "5"], "--watch-max-steps only applies with --watch; add --watch or leave"),
        (["--watch", "--json"], "--watch prints a line per run, not JSON; leave out --json"),
        (["--watch", "--nproc", "2"], "--watch trains in this process; leave out --nproc"),
    ],
)
def test_a_watch_option_given_wrong_is_a_usage_error(tmp_path: Path, args: list[str], message: str) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    result = CliRunner().invoke(cli, ["train", str(doc), *args])
    assert result.exit_code == 2
    assert message in result.output


def test_the_store_and_editors_temporary_files_are_not_saves_and_other_files_are(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    tree = Watched(str(tmp_path), True, None)
    assert counts(str(tmp_path / "notes" / "a.md"), tree, home)
    assert counts(str(tmp_path / ".dlm" / "training.yaml"), tree, home)
    for name in ("a.md.tmp", "a.md~", ".a.md.swp", "#a.md#", ".#a.md", "4913"):
        assert not counts(str(tmp_path / name), tree, home), name
    assert not counts(str(tmp_path / "home" / "store" / "store.db"), tree, home)


def test_only_the_document_counts_in_its_own_folder(tmp_path: Path) -> None:
    doc = tmp_path / "doc.dlm"
    folder = Watched(str(tmp_path), False, str(doc))
    assert counts(str(doc), folder, "/nowhere")
    assert not counts(str(tmp_path / "other.dlm"), folder, "/nowhere")
    assert not counts(str(tmp_path / "doc.dlm.tmp"), folder, "/nowhere")


def test_a_folder_made_under_a_watched_tree_reports_the_files_already_in_it(tmp_path: Path) -> None:
    # mkdir then a file at once: the file can land before the new folder's own watch begins, so the
    # folder's creation stands for the files found in it (editors' temporary files left out).
    folder = tmp_path / "notes" / ".dlm"
    folder.mkdir(parents=True)
    (folder / "training.yaml").write_text("weights: {}\n", encoding="utf-8")
    (folder / "training.yaml~").write_text("", encoding="utf-8")
    with Saves() as saves:
        found = saves._saved_under(str(folder), Watched(str(tmp_path / "notes"), True, None))
    assert found == [str(folder / "training.yaml")]

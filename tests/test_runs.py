"""Runs: lifecycle, ids never reused, failures recorded."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dlmstore.store.database import open_store
from dlmstore.store.runs import get_run, list_runs, recorded_run, start_run

from .helpers import VALID_ID

DOC = Path("/tmp/doc.dlm")


def test_a_recorded_run_goes_from_running_to_completed() -> None:
    with open_store(VALID_ID) as store:
        with recorded_run(store, command="tokenize", dlm_path=DOC, dlm_sha256="ab") as run_id:
            run = get_run(store, run_id)
            assert run is not None and run.status == "running" and run.finished_at is None
        run = get_run(store, run_id)
        assert run is not None
        assert (run.status, run.command, run.error) == ("completed", "tokenize", None)
        assert run.finished_at is not None and run.finished_at >= run.started_at
        assert run.started_at.endswith("Z")


def test_an_interrupted_run_is_marked_failed_and_the_interrupt_propagates() -> None:
    with open_store(VALID_ID) as store:
        with pytest.raises(KeyboardInterrupt):
            with recorded_run(store, command="train", dlm_path=DOC, dlm_sha256="ab") as run_id:
                raise KeyboardInterrupt
        run = get_run(store, run_id)
        assert run is not None and (run.status, run.error) == ("failed", "interrupted")


def test_run_ids_are_never_reused_even_after_the_newest_row_is_deleted() -> None:
    with open_store(VALID_ID) as store:
        first = start_run(store, command="train", dlm_path=DOC, dlm_sha256="ab")
        conn = sqlite3.connect(store.db_path)
        conn.execute("DELETE FROM runs WHERE id = ?", (first,))
        conn.commit()
        conn.close()
        second = start_run(store, command="train", dlm_path=DOC, dlm_sha256="ab")
        assert second == first + 1


def test_runs_are_listed_newest_first_with_a_limit() -> None:
    with open_store(VALID_ID) as store:
        ids = [start_run(store, command="tokenize", dlm_path=DOC, dlm_sha256="ab") for _ in range(3)]
        assert [r.id for r in list_runs(store, limit=2)] == ids[::-1][:2]
        assert list_runs(store, since="2999-01-01T00:00:00.000Z") == []


def test_a_run_status_outside_the_lifecycle_is_rejected_by_the_database() -> None:
    with open_store(VALID_ID) as store:
        conn = sqlite3.connect(store.db_path)
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(
                "INSERT INTO runs (command, status, started_at, dlm_path, dlm_sha256, dlmstore_version) "
                "VALUES ('train', 'paused', 'x', 'y', 'z', '0')"
            )
        conn.close()


def test_a_run_left_running_by_a_killed_process_is_marked_failed_by_the_next_run() -> None:
    import subprocess
    import sys

    with open_store(VALID_ID) as store:
        ghost = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
        )
        dead_pid = int(ghost.stdout)
        first = start_run(store, command="tokenize", dlm_path=DOC, dlm_sha256="ab")
        conn = sqlite3.connect(store.db_path)
        conn.execute("UPDATE runs SET pid = ? WHERE id = ?", (dead_pid, first))
        conn.commit()
        conn.close()
        start_run(store, command="tokenize", dlm_path=DOC, dlm_sha256="ab")
        run = get_run(store, first)
        assert run is not None
        assert (run.status, run.error) == ("failed", "the process ended without finishing the run")

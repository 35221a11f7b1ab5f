"""Runs: lifecycle, ids never reused, failures recorded, a run whose process died failed by the next writer."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.home import store_dir
from dlmstore.store.database import open_store
from dlmstore.store.runs import get_run, list_runs, recorded_run, start_run

from .helpers import VALID_ID, write_doc

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


def test_a_sigterm_that_lands_just_after_the_running_row_committed_still_fails_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Seen by the signal tests: a SIGTERM inside the high-water mark's write, before recorded_run's
    # try, left a cold tokenize's run `running` after the command had ended with exit 143.
    import signal

    from dlmstore.errors import Terminated
    from dlmstore.store import highwater

    def terminated(store: object) -> None:
        raise Terminated(signal.SIGTERM)

    monkeypatch.setattr(highwater, "record", terminated)
    with open_store(VALID_ID) as store:
        with pytest.raises(Terminated):
            with recorded_run(store, command="tokenize", dlm_path=DOC, dlm_sha256="ab"):
                pytest.fail("the block ran")
        (run,) = list_runs(store)
        assert (run.status, run.error) == ("failed", "terminated by SIGTERM")


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
        assert (run.status, run.error) == (
            "failed",
            f"process {dead_pid} ended without finishing the run (killed?)",
        )


@pytest.fixture
def dead_run(tmp_path: Path) -> Iterator[tuple[Path, int, int]]:
    """A document whose store holds a run still `running` whose process is gone: (document, run id, pid)."""
    doc = write_doc(tmp_path / "doc.dlm")
    ghost = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(ghost.stdout)
    with open_store(VALID_ID) as store:
        run_id = start_run(store, command="train", dlm_path=doc, dlm_sha256="ab")
    conn = sqlite3.connect(store_dir(VALID_ID) / "store.db")
    conn.execute("UPDATE runs SET pid = ? WHERE id = ?", (pid, run_id))
    conn.commit()
    conn.close()
    yield doc, run_id, pid


def test_metrics_and_stores_show_a_run_whose_process_died_as_dead_and_write_nothing(
    dead_run: tuple[Path, int, int],
) -> None:
    doc, run_id, pid = dead_run
    metrics = CliRunner().invoke(cli, ["metrics", str(doc), "--json"])
    assert metrics.exit_code == 0, metrics.output
    (run,) = json.loads(metrics.stdout)["runs"]
    reason = f"process {pid} ended without finishing the run (killed?)"
    assert (run["run_id"], run["status"], run["error"]) == (run_id, "dead", reason)
    assert f"{run_id:>5}  train     dead " in CliRunner().invoke(cli, ["metrics", str(doc)]).stdout
    stores = json.loads(CliRunner().invoke(cli, ["stores", "--json"]).stdout)
    assert stores["stores"][0]["last_run"]["status"] == "dead"
    with open_store(VALID_ID, create=False) as store:
        run = get_run(store, run_id)
    assert run is not None and (run.status, run.error) == ("running", None)  # only looked


@pytest.mark.parametrize(
    "command", [["cache", "prune"], ["cache", "clear", "--force"], ["cache", "verify", "--repair"]]
)
def test_cache_maintenance_fails_a_run_whose_process_died_with_the_reason(
    dead_run: tuple[Path, int, int], command: list[str]
) -> None:
    doc, run_id, pid = dead_run
    result = CliRunner().invoke(cli, [*command[:2], str(doc), *command[2:]])
    assert result.exit_code == 0, result.output
    with open_store(VALID_ID, create=False) as store:
        run = get_run(store, run_id)
    assert run is not None
    assert (run.status, run.error) == ("failed", f"process {pid} ended without finishing the run (killed?)")
    assert run.finished_at is not None

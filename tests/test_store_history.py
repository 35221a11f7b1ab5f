"""A store.db that lost its latest records (its WAL deleted, an older copy put back) is refused, not reused.

The real fault: a process killed with ``kill -9`` leaves its last commits
in ``store.db-wal``; deleting that file before the next open makes SQLite
open a sound but older database, whose ``AUTOINCREMENT`` counter went back
with it. Here a child process starts a run and kills itself, so its run is
committed to the WAL alone (deterministically: no checkpoint ran), and the
test deletes the WAL as a person tidying up would.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.errors import StoreDamagedError
from dlmstore.home import store_dir
from dlmstore.store import highwater
from dlmstore.store.database import open_store
from dlmstore.store.runs import finish_run, start_run

from .helpers import REPO, VALID_ID, write_doc

DOC = Path("/tmp/doc.dlm")

LOST_HINT = (
    "hint: if you still have the store.db-wal that belongs with it, put it back beside store.db; otherwise "
    "run `dlm cache verify --repair` on the document to accept the loss (ids already handed out are not reused)"
)

#: Starts a run in the store of argv[1] and dies before any checkpoint: the run is only in the WAL.
KILLED_RUN = """
import os, signal, sys
from pathlib import Path
from dlmstore.store.database import open_store
from dlmstore.store.runs import start_run
store = open_store(sys.argv[1])
start_run(store, command="tokenize", dlm_path=Path("/tmp/doc.dlm"), dlm_sha256="x")
os.kill(os.getpid(), signal.SIGKILL)
"""


def _run_and_die_in_another_process() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, VALID_ID], env=env, capture_output=True, text=True
    )
    assert proc.returncode == -9, proc.stderr


def _delete_wal() -> Path:
    db = store_dir(VALID_ID) / "store.db"
    wal = db.with_name("store.db-wal")
    assert wal.stat().st_size > 0  # the killed run's commit lives here and nowhere else
    wal.unlink()
    db.with_name("store.db-shm").unlink(missing_ok=True)
    return db


def _completed_run() -> int:
    with open_store(VALID_ID) as store:
        run_id = start_run(store, command="tokenize", dlm_path=DOC, dlm_sha256="x")
        finish_run(store, run_id, status="completed")
    return run_id


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    return write_doc(tmp_path / "doc.dlm")


def test_deleting_the_wal_of_a_killed_run_makes_every_command_refuse_the_store_naming_the_lost_run(
    doc: Path,
) -> None:
    assert _completed_run() == 1
    _run_and_die_in_another_process()
    db = _delete_wal()
    before = db.read_bytes()
    for command in (["tokenize"], ["metrics"], ["cache", "prune"], ["lock", "show"]):
        result = CliRunner().invoke(cli, [*command, str(doc)])
        assert (result.exit_code, result.stdout) == (1, ""), command
        assert result.stderr.splitlines() == [
            f"error: {db} is damaged: records high-water.json counts are gone from it: run 2 "
            "(store.db-wal deleted, or store.db replaced by an older copy)",
            LOST_HINT,
        ], command
    assert db.read_bytes() == before  # refused before anything was written


def test_verify_reports_the_lost_run_and_repair_accepts_the_loss_without_reusing_its_id(doc: Path) -> None:
    _completed_run()
    _run_and_die_in_another_process()
    _delete_wal()
    found = CliRunner().invoke(cli, ["cache", "verify", str(doc)])
    assert found.exit_code == 1
    assert found.stdout.splitlines()[0] == (
        "problem: lost_history: store.db: records high-water.json counts are gone from it: run 2 "
        "(store.db-wal deleted, or store.db replaced by an older copy)"
    )
    repaired = CliRunner().invoke(cli, ["cache", "verify", "--repair", "--json", str(doc)])
    assert repaired.exit_code == 0, repaired.output
    payload = json.loads(repaired.stdout)
    assert [(p["kind"], p["repaired"]) for p in payload["problems"]] == [("lost_history", True)]
    assert CliRunner().invoke(cli, ["cache", "verify", str(doc)]).exit_code == 0
    with open_store(VALID_ID) as store:
        assert start_run(store, command="tokenize", dlm_path=DOC, dlm_sha256="x") == 3  # 2 was handed out


def test_an_older_copy_of_store_db_put_back_is_refused_naming_the_runs_and_adapter_it_lacks(
    tmp_path: Path,
) -> None:
    _completed_run()
    db = store_dir(VALID_ID) / "store.db"
    shutil.copy(db, tmp_path / "backup.db")  # closed: the WAL was checkpointed into store.db
    with open_store(VALID_ID) as store:
        for _ in range(2):
            run_id = start_run(store, command="train", dlm_path=DOC, dlm_sha256="x")
            with store.write() as conn:
                conn.execute(
                    "INSERT INTO adapters (version, run_id, path, sha256, bytes, base_model, steps, created_at) "
                    "VALUES (?, ?, 'adapter/versions/v', 'sha256:x', 1, 'b', 1, 'now')",
                    (run_id - 1, run_id),
                )
            finish_run(store, run_id, status="completed")
    shutil.copy(tmp_path / "backup.db", db)
    with pytest.raises(StoreDamagedError) as err:
        open_store(VALID_ID)
    assert err.value.reason == (
        "records high-water.json counts are gone from it: runs 2 to 3, adapters v0001 to v0002 "
        "(store.db-wal deleted, or store.db replaced by an older copy)"
    )
    with open_store(VALID_ID, check_history=False) as store:
        highwater.accept(store)
    assert highwater.adapter_floor(store_dir(VALID_ID)) == 2  # where the next adapter version starts
    with open_store(VALID_ID) as store:
        assert start_run(store, command="train", dlm_path=DOC, dlm_sha256="x") == 4


def test_a_store_whose_commits_all_reached_store_db_opens_and_its_mark_follows_each_run() -> None:
    for expected in (1, 2):
        assert _completed_run() == expected
    mark = json.loads((store_dir(VALID_ID) / "high-water.json").read_text())
    assert mark == {
        "format": 1,
        "expected": {"runs": 2, "lock_records": 0, "adapter_version": 0},
        "issued": {"runs": 2, "lock_records": 0, "adapter_version": 0},
    }


def test_putting_the_deleted_wal_back_as_the_hint_says_brings_the_run_back(tmp_path: Path) -> None:
    _completed_run()
    _run_and_die_in_another_process()
    wal = store_dir(VALID_ID) / "store.db-wal"
    shutil.copy(wal, tmp_path / "saved-wal")
    _delete_wal()
    with pytest.raises(StoreDamagedError):
        open_store(VALID_ID)
    shutil.copy(tmp_path / "saved-wal", wal)
    with open_store(VALID_ID) as store:
        assert start_run(store, command="tokenize", dlm_path=DOC, dlm_sha256="x") == 3


def test_a_store_db_moved_aside_as_damaged_is_replaced_by_one_whose_ids_go_on(doc: Path) -> None:
    for _ in range(2):
        _completed_run()
    db = store_dir(VALID_ID) / "store.db"
    db.rename(db.with_name("store.db.damaged"))  # what the damaged-store hint says to do
    with open_store(VALID_ID) as store:
        assert start_run(store, command="tokenize", dlm_path=DOC, dlm_sha256="x") == 3
    assert CliRunner().invoke(cli, ["cache", "verify", str(doc)]).exit_code == 0


def test_a_run_killed_with_its_wal_intact_is_no_loss() -> None:
    _completed_run()
    _run_and_die_in_another_process()
    with open_store(VALID_ID) as store:  # SQLite replays the WAL: nothing is missing
        assert start_run(store, command="tokenize", dlm_path=DOC, dlm_sha256="x") == 3


def test_an_unreadable_mark_is_reported_by_verify_and_written_afresh_by_repair(doc: Path) -> None:
    _completed_run()
    mark = store_dir(VALID_ID) / "high-water.json"
    mark.write_text("{not json")
    found = CliRunner().invoke(cli, ["cache", "verify", str(doc)])
    assert found.exit_code == 1
    assert found.stdout.splitlines()[0] == (
        "problem: unreadable_mark: high-water.json: high-water.json cannot be read as a high-water mark; "
        "store.db's losses would go unnoticed"
    )
    assert CliRunner().invoke(cli, ["cache", "verify", "--repair", str(doc)]).exit_code == 0
    assert json.loads(mark.read_text())["expected"]["runs"] == 1


def test_the_mark_never_goes_back_when_the_database_is_behind_it() -> None:
    _completed_run()
    conn = sqlite3.connect(store_dir(VALID_ID) / "store.db")
    conn.execute("UPDATE sqlite_sequence SET seq = 0 WHERE name = 'runs'")  # as a lost WAL leaves it
    conn.execute("DELETE FROM runs")
    conn.commit()
    conn.close()
    with pytest.raises(StoreDamagedError):
        open_store(VALID_ID)
    assert json.loads((store_dir(VALID_ID) / "high-water.json").read_text())["issued"]["runs"] == 1

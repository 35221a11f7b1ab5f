"""The per-store SQLite database: creation, pragmas, versions, concurrency."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from dlmstore.errors import StoreError, StoreVersionError
from dlmstore.home import store_dir
from dlmstore.store.connection import first_value
from dlmstore.store.database import current_revision, open_store, store_exists
from dlmstore.store.schema import HEAD_REVISION

from .helpers import VALID_ID

OTHER_ID = "01KPQ1FFEDGPPSMWRAS18SAZSV"


def test_home_is_dlm_home_env_when_set(dlm_home: Path) -> None:
    from dlmstore import home

    assert home.dlm_home() == dlm_home


def test_home_defaults_to_the_platform_user_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    import platformdirs

    from dlmstore import home

    monkeypatch.delenv("DLM_HOME")
    assert home.dlm_home() == Path(platformdirs.user_data_dir("dlm")).absolute()


def test_opening_a_new_store_creates_a_migrated_database(dlm_home: Path) -> None:
    assert not store_exists(VALID_ID)
    with open_store(VALID_ID) as store:
        assert store.path == dlm_home / "store" / VALID_ID
        assert store.db_path.is_file()
    assert store_exists(VALID_ID)
    assert current_revision(store_dir(VALID_ID) / "store.db") == HEAD_REVISION
    conn = sqlite3.connect(store_dir(VALID_ID) / "store.db")
    assert conn.execute("SELECT id, dlm_id FROM store_info").fetchall() == [(1, VALID_ID)]
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_store_connections_enable_foreign_keys_and_a_busy_timeout() -> None:
    with open_store(VALID_ID) as store, store.read() as conn:
        assert first_value(conn, "PRAGMA foreign_keys") == 1
        assert first_value(conn, "PRAGMA busy_timeout") == 30000


def test_opening_without_create_does_not_create_anything(dlm_home: Path) -> None:
    with pytest.raises(StoreError) as err:
        open_store(VALID_ID, create=False)
    assert str(err.value) == f"no store for document {VALID_ID} at {dlm_home / 'store' / VALID_ID}"
    assert not (dlm_home / "store").exists()


def test_reopening_an_up_to_date_store_does_not_import_alembic(tmp_path: Path) -> None:
    import subprocess
    import sys

    open_store(VALID_ID).close()
    code = (
        "import sys; from dlmstore.store.database import open_store; "
        f"open_store({VALID_ID!r}).close(); print('alembic' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_database_from_a_newer_dlmstore_is_refused_and_left_untouched() -> None:
    open_store(VALID_ID).close()
    db = store_dir(VALID_ID) / "store.db"
    conn = sqlite3.connect(db)
    conn.execute("UPDATE alembic_version SET version_num = '9999'")
    conn.execute("UPDATE store_info SET dlmstore_version = '7.0.0'")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    with pytest.raises(StoreVersionError) as err:
        open_store(VALID_ID)
    assert str(err.value) == (
        f"{db} was written by dlmstore 7.0.0 (schema revision 9999); "
        f"this is dlmstore 0.1.0 (schema up to {HEAD_REVISION})"
    )
    assert err.value.hint == "upgrade dlmstore (pip install -U dlmstore); the database was not modified"
    assert db.read_bytes() == before


def test_a_store_directory_holding_another_documents_database_is_refused(dlm_home: Path) -> None:
    open_store(OTHER_ID).close()
    (dlm_home / "store" / OTHER_ID).rename(dlm_home / "store" / VALID_ID)
    with pytest.raises(StoreError) as err:
        open_store(VALID_ID)
    assert str(err.value) == (
        f"{dlm_home / 'store' / VALID_ID / 'store.db'} belongs to document {OTHER_ID}, not {VALID_ID}"
    )


def test_a_file_that_is_not_a_database_is_a_clear_error() -> None:
    path = store_dir(VALID_ID)
    path.mkdir(parents=True)
    (path / "store.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError) as err:
        open_store(VALID_ID)
    assert str(err.value) == f"{path / 'store.db'} is damaged: file is not a database"


def test_a_store_on_a_read_only_filesystem_path_is_a_clear_error(
    dlm_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Root ignores permission bits, so simulate the OS refusing the mkdir.
    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(StoreError) as err:
        open_store(VALID_ID)
    assert str(err.value) == (
        f"cannot create store directory {dlm_home / 'store' / VALID_ID}: Permission denied"
    )
    assert err.value.hint == "make the directory writable or point DLM_HOME somewhere writable"


def _open_and_write(home: str, n: int) -> None:
    import os

    os.environ["DLM_HOME"] = home
    from dlmstore.store.runs import finish_run, start_run

    with open_store(VALID_ID) as store:
        for _ in range(n):
            run_id = start_run(store, command="tokenize", dlm_path=Path("/x.dlm"), dlm_sha256="0" * 64)
            finish_run(store, run_id, status="completed")


def test_two_processes_creating_and_writing_one_store_both_succeed(dlm_home: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_open_and_write, args=(str(dlm_home), 25)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    conn = sqlite3.connect(store_dir(VALID_ID) / "store.db")
    rows = conn.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM runs WHERE status = 'completed'").fetchone()
    assert rows == (50, 50)


def test_a_store_outside_the_home_gets_its_own_id_and_keeps_it(tmp_path: Path) -> None:
    from dlmstore.store.database import open_store_at
    from dlmstore.ulid import is_valid_ulid

    with open_store_at(tmp_path / "datasets") as store:
        first = store.dlm_id
    assert is_valid_ulid(first)
    with open_store_at(tmp_path / "datasets") as store:
        assert store.dlm_id == first

"""`dlm stores` lists the stores of a home without touching them; `dlm stores gc` removes the orphans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.home import store_dir
from dlmstore.store.database import open_store
from dlmstore.store.runs import finish_run, start_run
from dlmstore.store.stores import gc, list_stores
from dlmstore.ulid import new_ulid

from .helpers import REPO


def _store(document: Path | None, *, runs: int = 1) -> str:
    """A store with ``runs`` completed tokenize runs on ``document`` (none when it is None)."""
    dlm_id = new_ulid()
    with open_store(dlm_id) as store:
        for _ in range(runs if document is not None else 0):
            assert document is not None
            run_id = start_run(store, command="tokenize", dlm_path=document, dlm_sha256="0" * 64)
            finish_run(store, run_id, status="completed")
    return dlm_id


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    """Each file under ``folder``: (size, mtime in ns)."""
    return {
        str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in folder.rglob("*")
        if path.is_file()
    }


def test_stores_lists_each_store_with_its_document_size_last_run_and_cache(tmp_path: Path) -> None:
    document = tmp_path / "notes.dlm"
    document.write_text("---\n---\n")
    dlm_id = _store(document, runs=2)
    (store_dir(dlm_id) / "tokens").mkdir()
    (store_dir(dlm_id) / "tokens" / "pack-1.bin").write_bytes(b"\0" * 1000)

    report = list_stores()

    assert [store.dlm_id for store in report.stores] == [dlm_id]
    store = report.stores[0]
    assert (store.status, store.document, store.document_state) == ("ok", str(document), "present")
    assert store.last_run is not None and (store.last_run.run_id, store.last_run.command) == (2, "tokenize")
    assert store.cache_entries == 0
    files = _files(store_dir(dlm_id))
    assert store.bytes == sum(size for name, (size, _) in files.items() if name != "store.db-shm")
    assert store.bytes >= store.db_bytes + 1000
    assert report.bytes == store.bytes


def test_a_store_that_never_ran_has_no_document_and_is_not_garbage(tmp_path: Path) -> None:
    dlm_id = _store(None)
    store = list_stores().stores[0]
    assert (store.dlm_id, store.document, store.document_state, store.last_run) == (
        dlm_id,
        None,
        "unknown",
        None,
    )
    result = CliRunner().invoke(cli, ["stores", "gc", "--force"])
    assert result.exit_code == 0, result.output
    assert result.output == "removed 0 stores (0 B)\n"
    assert store_dir(dlm_id).is_dir()


def test_a_store_whose_document_was_deleted_is_listed_as_missing_and_gc_removes_it(tmp_path: Path) -> None:
    kept_doc = tmp_path / "kept.dlm"
    kept_doc.write_text("---\n---\n")
    gone_doc = tmp_path / "gone.dlm"
    kept, gone = _store(kept_doc), _store(gone_doc)
    size = list_stores().stores[[s.dlm_id for s in list_stores().stores].index(gone)].bytes

    listed = CliRunner().invoke(cli, ["stores"])
    assert listed.exit_code == 0, listed.output
    assert f"{gone_doc} (missing)" in listed.output
    assert f"{kept_doc}\n" in listed.output

    result = CliRunner().invoke(cli, ["stores", "gc", "--force", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert [store["dlm_id"] for store in payload["removed"]] == [gone]
    assert payload["bytes_removed"] == size
    assert not store_dir(gone).exists()
    assert store_dir(kept).is_dir()
    assert [p.name for p in store_dir(kept).parent.iterdir()] == [kept]  # no half-removed folder left


def test_a_store_with_a_corrupt_db_is_listed_as_damaged_and_the_others_still_list(tmp_path: Path) -> None:
    document = tmp_path / "doc.dlm"
    document.write_text("---\n---\n")
    sound, broken = _store(document), _store(document)
    db = store_dir(broken) / "store.db"
    db.write_bytes(b"this is not a database" * 100)

    result = CliRunner().invoke(cli, ["stores", "--json"])

    assert result.exit_code == 0, result.output
    by_id = {store["dlm_id"]: store for store in json.loads(result.output)["stores"]}
    assert by_id[sound]["status"] == "ok"
    assert by_id[broken]["status"] == "damaged"
    assert by_id[broken]["detail"] == f"{db} is damaged: file is not a database"
    assert (by_id[broken]["document_state"], by_id[broken]["last_run"]) == ("unknown", None)
    text = CliRunner().invoke(cli, ["stores"])
    assert f"(damaged: {db} is damaged: file is not a database)" in text.output


def test_a_store_written_by_a_newer_dlmstore_is_listed_as_such_and_left_untouched(tmp_path: Path) -> None:
    import sqlite3

    dlm_id = _store(None)
    db = store_dir(dlm_id) / "store.db"
    conn = sqlite3.connect(db)
    conn.execute("UPDATE alembic_version SET version_num = '9999'")
    conn.commit()
    conn.close()
    before = db.read_bytes()

    store = list_stores().stores[0]

    assert store.status == "newer_schema"
    assert store.detail is not None and store.detail.startswith(
        "schema revision 9999 (this dlmstore knows up to "
    )
    assert db.read_bytes() == before


def test_listing_never_writes_store_db_nor_takes_a_lock_nor_migrates(tmp_path: Path) -> None:
    import sqlite3

    document = tmp_path / "doc.dlm"
    document.write_text("---\n---\n")
    dlm_id = _store(document)
    db = store_dir(dlm_id) / "store.db"
    conn = sqlite3.connect(db)
    conn.execute("UPDATE alembic_version SET version_num = '0006'")  # an older store: opening would migrate
    conn.commit()
    conn.close()
    before = db.read_bytes()

    with open_store(_store(None)):  # another store held open in this process: listing does not wait
        store = [s for s in list_stores().stores if s.dlm_id == dlm_id][0]

    assert (store.status, store.document) == ("old_schema", str(document))
    assert db.read_bytes() == before  # still at 0006: not migrated


def test_gc_keeps_a_store_another_dlm_process_has_open(tmp_path: Path) -> None:
    gone = _store(tmp_path / "gone.dlm")
    with open_store(gone, create=False):  # holds the store lock shared, as any running dlm does
        result = gc([gone])
    assert (result.removed, [(k.dlm_id, k.reason) for k in result.kept]) == ([], [(gone, "in_use")])
    assert store_dir(gone).is_dir()


def test_gc_says_it_kept_a_locked_store_and_removes_it_once_let_go(tmp_path: Path) -> None:
    gone = _store(tmp_path / "gone.dlm")
    with open_store(gone, create=False):
        held = CliRunner().invoke(cli, ["stores", "gc", "--force"])
    assert held.exit_code == 0, held.output
    assert held.output == (
        f"kept {gone}: another dlm process has it open (run gc again when it is done)\n"
        "removed 0 stores (0 B)\n"
    )
    freed = CliRunner().invoke(cli, ["stores", "gc", "--force"])
    assert freed.output.startswith(f"removed {gone} (")
    assert not store_dir(gone).exists()


def test_gc_keeps_a_store_whose_document_came_back_after_it_was_listed(tmp_path: Path) -> None:
    document = tmp_path / "back.dlm"
    dlm_id = _store(document)
    document.write_text("---\n---\n")
    result = gc([dlm_id])
    assert [(k.dlm_id, k.reason) for k in result.kept] == [(dlm_id, "document_present")]
    assert store_dir(dlm_id).is_dir()


def test_gc_without_a_terminal_refuses_without_force_and_removes_nothing(tmp_path: Path) -> None:
    gone = _store(tmp_path / "gone.dlm")
    result = CliRunner().invoke(cli, ["stores", "gc"])
    assert result.exit_code == 1
    assert result.output.splitlines()[0].startswith("error: refusing to remove 1 store (")
    assert result.output.splitlines()[0].endswith(") without confirmation")
    assert result.output.splitlines()[1] == "hint: run `dlm stores` to see them, then `dlm stores gc --force`"
    assert store_dir(gone).is_dir()


def test_a_home_without_stores_lists_none(dlm_home: Path) -> None:
    result = CliRunner().invoke(cli, ["stores"])
    assert (result.exit_code, result.output) == (0, f"no stores under {dlm_home}\n")
    assert list_stores().stores == []


def test_dlm_stores_imports_neither_torch_nor_transformers(tmp_path: Path) -> None:
    _store(tmp_path / "doc.dlm")
    code = (
        "import sys\nfrom dlmstore.cli.main import cli\n"
        "try:\n    cli(['stores', '--json'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'transformers', 'sqlalchemy') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.splitlines()[-1] == "[]"


def test_gc_on_a_terminal_lists_what_it_will_remove_and_asks_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    import dlmstore.cli.stores as stores_cli

    gone_doc = tmp_path / "gone.dlm"
    gone = _store(gone_doc)
    monkeypatch.setattr(stores_cli, "sys", SimpleNamespace(stdin=SimpleNamespace(isatty=lambda: True)))

    declined = CliRunner().invoke(cli, ["stores", "gc"], input="n\n")
    assert declined.exit_code == 1
    assert f"{gone}" in declined.stderr and str(gone_doc) in declined.stderr
    assert "Remove 1 store (" in declined.stderr and declined.stdout == ""
    assert store_dir(gone).is_dir()

    accepted = CliRunner().invoke(cli, ["stores", "gc"], input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert accepted.stdout.splitlines()[-1].startswith("removed 1 store (")
    assert not store_dir(gone).exists()

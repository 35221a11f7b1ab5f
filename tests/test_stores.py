"""`dlm stores` lists the stores of a home without touching them; `dlm stores gc` removes the orphans."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.cli.render import human_bytes
from dlmstore.home import store_dir
from dlmstore.store.database import open_store
from dlmstore.store.runs import finish_run, start_run
from dlmstore.store.stores import NO_PATH, gc, list_stores
from dlmstore.ulid import new_ulid

from .helpers import REPO, VALID_ID, write_doc


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
    (store_dir(dlm_id) / "tokens" / "segment-1.bin").write_bytes(b"\0" * 1000)

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


def test_a_store_that_records_no_path_is_kept_and_the_listing_and_gc_say_why(tmp_path: Path) -> None:
    dlm_id = _store(None)  # opened, never run, by a dlmstore that did not record the path
    store = list_stores().stores[0]
    assert (store.dlm_id, store.document, store.documents, store.document_state, store.last_run) == (
        dlm_id,
        None,
        [],
        "unknown",
        None,
    )
    assert store.document_detail == NO_PATH
    listed = CliRunner().invoke(cli, ["stores"])
    assert listed.output.splitlines()[1].endswith(f"  -         - ({NO_PATH}; gc keeps it)")
    result = CliRunner().invoke(cli, ["stores", "gc", "--force"])
    assert result.exit_code == 0, result.output
    assert result.output == f"kept {dlm_id}: {NO_PATH}\nremoved 0 stores (0 B)\n"
    assert store_dir(dlm_id).is_dir()


def test_dlm_init_records_the_documents_resolved_path_before_any_run(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    result = CliRunner().invoke(cli, ["init", str(tmp_path / "link" / "doc.dlm"), "--json"])
    assert result.exit_code == 0, result.output
    store = list_stores().stores[0]
    assert [(d.path, d.state) for d in store.documents] == [(str(tmp_path / "real" / "doc.dlm"), "present")]
    assert (store.document_state, store.last_run) == ("present", None)


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
        result = gc(list_stores())
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
    report = list_stores()
    document.write_text("---\n---\n")
    result = gc(report)
    assert [(k.dlm_id, k.reason) for k in result.kept] == [(dlm_id, "document_present")]
    assert store_dir(dlm_id).is_dir()


def test_gc_without_a_terminal_refuses_without_force_and_removes_nothing(tmp_path: Path) -> None:
    gone = _store(tmp_path / "gone.dlm")
    result = CliRunner().invoke(cli, ["stores", "gc"])
    assert result.exit_code == 1
    assert result.output.splitlines()[0].startswith("error: refusing to remove 1 store (")
    assert result.output.splitlines()[0].endswith(") without confirmation")
    assert result.output.splitlines()[1] == (
        "hint: run `dlm stores gc --dry-run` to see them, then `dlm stores gc --force`"
    )
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


def _recorded(dlm_id: str) -> list[tuple[str, str]]:
    """(path, state) of every path the store records, most recently seen first."""
    (store,) = [s for s in list_stores().stores if s.dlm_id == dlm_id]
    return [(document.path, document.state) for document in store.documents]


def test_a_copied_document_deleted_after_it_ran_leaves_the_store_its_original_uses(
    tmp_path: Path, tiny_base: Path
) -> None:
    (tmp_path / "a").mkdir()
    original = write_doc(tmp_path / "a" / "doc.dlm", frontmatter=f"base_model: {tiny_base}\n")
    copy = tmp_path / "b" / "doc.dlm"
    copy.parent.mkdir()
    shutil.copy(original, copy)
    for folder in (original.parent, copy.parent):  # an empty folder could be a disk not mounted
        (folder / "notes.md").write_text("the folder holds more than the document\n")
    for document in (original, copy):
        result = CliRunner().invoke(cli, ["tokenize", str(document)])
        assert result.exit_code == 0, result.output
    copy.unlink()

    assert _recorded(VALID_ID) == [(str(copy), "missing"), (str(original), "present")]
    listed = CliRunner().invoke(cli, ["stores"])
    assert f"  {copy} (missing)\n" in listed.output and f"  {original}\n" in listed.output
    result = CliRunner().invoke(cli, ["stores", "gc", "--force"])
    assert result.output == "removed 0 stores (0 B)\n"
    assert store_dir(VALID_ID).is_dir()

    original.unlink()
    result = CliRunner().invoke(cli, ["stores", "gc", "--force"])
    assert result.output.startswith(f"removed {VALID_ID} (")
    assert result.output.splitlines()[0].endswith(f"), document was {copy}, {original}")
    assert not store_dir(VALID_ID).exists()


def test_a_document_run_through_a_symlink_is_known_by_the_file_it_leads_to(tmp_path: Path) -> None:
    real = tmp_path / "real.dlm"
    real.write_text("---\n---\n")
    link = tmp_path / "link.dlm"
    link.symlink_to(real)
    dlm_id = _store(link)
    link.unlink()  # the link was only a way in: the document is still there
    assert _recorded(dlm_id) == [(str(real), "present")]
    assert gc(list_stores()).removed == []
    real.unlink()
    assert [store.dlm_id for store in gc(list_stores()).removed] == [dlm_id]


def test_a_store_is_orphaned_only_when_every_path_its_document_was_read_at_is_gone(tmp_path: Path) -> None:
    first, second = tmp_path / "first.dlm", tmp_path / "second.dlm"
    first.write_text("---\n---\n")
    dlm_id = _store(first)
    with open_store(dlm_id, create=False) as store:
        finish_run(
            store, start_run(store, command="train", dlm_path=second, dlm_sha256="0" * 64), status="completed"
        )
    (listed,) = list_stores().stores
    assert (listed.document, listed.document_state) == (str(second), "present")  # the newest run's is gone
    assert [(d.path, d.state) for d in listed.documents] == [
        (str(second), "missing"),
        (str(first), "present"),
    ]
    first.unlink()
    assert list_stores().stores[0].document_state == "missing"


def _deep_folder(root: Path, length: int) -> str:
    """A folder under ``root`` whose path is longer than ``length`` (made a folder at a time)."""
    name = "d" * 200
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    path = str(root)
    while len(path) <= length:
        os.mkdir(name, dir_fd=fd)
        inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd, path = inner, f"{path}/{name}"
    for file in ("doc.dlm", "notes.md"):
        os.close(os.open(file, os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.close(fd)
    return path


def test_a_document_on_a_path_longer_than_path_max_is_present_until_it_is_deleted(tmp_path: Path) -> None:
    folder = _deep_folder(tmp_path, os.pathconf("/", "PC_PATH_MAX"))
    document = f"{folder}/doc.dlm"
    with pytest.raises(OSError) as caught:
        os.stat(document)
    assert caught.value.errno == errno.ENAMETOOLONG  # what made it count as gone
    dlm_id = _store(Path(document))
    assert _recorded(dlm_id) == [(document, "present")]
    assert gc(list_stores()).removed == []

    head, name = folder.rsplit("/", 1)
    fd = _walk_to(head)
    inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.unlink("doc.dlm", dir_fd=inner)
    os.close(inner)
    os.close(fd)
    assert _recorded(dlm_id) == [(document, "missing")]
    assert [store.dlm_id for store in gc(list_stores()).removed] == [dlm_id]


def _walk_to(folder: str) -> int:
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    for part in folder.strip("/").split("/"):
        inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    return fd


def _renamed(folder: Path) -> str:
    folder.rename(folder.with_name("moved"))
    return f"its folder {folder} is not there: renamed or moved, or on a disk not mounted?"


def _emptied(folder: Path) -> str:
    for file in folder.iterdir():
        file.unlink()
    return f"its folder {folder} is empty: the mount point of a disk not mounted?"


def _now_a_file(folder: Path) -> str:
    shutil.rmtree(folder)
    folder.write_text("a file where the folder was\n")
    return f"cannot check {folder}/doc.dlm: a folder on the path is now a file"


def _a_symlink_loop(folder: Path) -> str:
    shutil.rmtree(folder)
    folder.symlink_to(folder)
    return f"cannot check {folder}/doc.dlm: a symlink loop on the path"


@pytest.mark.parametrize("change", [_renamed, _emptied, _now_a_file, _a_symlink_loop])
def test_a_document_that_cannot_be_told_gone_keeps_its_store_and_gc_says_why(
    tmp_path: Path, change: Callable[[Path], str]
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "doc.dlm").write_text("---\n---\n")
    dlm_id = _store(folder / "doc.dlm")
    (folder / "doc.dlm").unlink()
    why = change(folder)

    (store,) = list_stores().stores
    assert [(d.path, d.state, d.detail) for d in store.documents] == [
        (str(folder / "doc.dlm"), "unknown", why)
    ]
    assert (store.document_state, store.document_detail) == (
        "unknown",
        f"cannot tell whether {folder / 'doc.dlm'} exists: {why}",
    )
    listed = CliRunner().invoke(cli, ["stores"])
    assert listed.output.splitlines()[1].endswith(f"  {folder / 'doc.dlm'} (cannot tell: {why})")
    for args in (["--force"], ["--dry-run"]):
        result = CliRunner().invoke(cli, ["stores", "gc", *args])
        assert result.exit_code == 0, result.output
        assert result.output.splitlines()[0] == f"kept {dlm_id}: {store.document_detail}"
    assert store_dir(dlm_id).is_dir()


def test_a_recorded_name_too_long_for_any_file_cannot_be_told_gone(tmp_path: Path) -> None:
    document = tmp_path / ("n" * 300 + ".dlm")
    dlm_id = _store(document)
    assert _recorded(dlm_id) == [(str(document), "unknown")]
    assert [(k.reason, k.detail) for k in gc(list_stores()).kept] == [
        ("cannot_tell", f"cannot tell whether {document} exists: cannot check {document}: "
                        "a name on the path is too long for this system")
    ]  # fmt: skip


def test_gc_dry_run_lists_what_would_go_and_why_and_removes_nothing(tmp_path: Path) -> None:
    gone_doc = tmp_path / "gone.dlm"
    gone, never = _store(gone_doc), _store(None)
    size = [s.bytes for s in list_stores().stores if s.dlm_id == gone][0]

    text = CliRunner().invoke(
        cli, ["stores", "gc", "--dry-run"]
    )  # no terminal, no --force: a dry run needs neither
    assert text.exit_code == 0, text.output
    assert sorted(text.output.splitlines()[:-1]) == sorted(
        [f"would remove {gone} ({human_bytes(size)}), document was {gone_doc}", f"kept {never}: {NO_PATH}"]
    )
    assert text.output.splitlines()[-1] == (
        f"would remove 1 store ({human_bytes(size)}); nothing was removed (--dry-run)"
    )
    payload = json.loads(CliRunner().invoke(cli, ["stores", "gc", "--dry-run", "--json"]).output)
    assert payload["dry_run"] is True and payload["bytes_removed"] == size
    assert [
        (s["dlm_id"], s["documents"][0]["path"], s["documents"][0]["state"]) for s in payload["removed"]
    ] == [(gone, str(gone_doc), "missing")]
    assert [(k["dlm_id"], k["reason"], k["detail"]) for k in payload["kept"]] == [(never, "no_path", NO_PATH)]
    assert store_dir(gone).is_dir() and store_dir(never).is_dir()

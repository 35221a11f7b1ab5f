"""A new store's database is copied from the empty database at head the first new store was migrated to (#31)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from dlmstore.store import database
from dlmstore.store.database import open_store, template_dir
from dlmstore.store.revisions import HEAD_REVISION

FIRST = "01M7YJ087N2NEP493AF56E3T01"
SECOND = "01M7YJ087N2NEP493AF56E3T02"
THIRD = "01M7YJ087N2NEP493AF56E3T03"


def _dump(db: Path) -> list[str]:
    """Every statement that rebuilds ``db``, but the store's own row (its id and creation time)."""
    with closing(sqlite3.connect(db)) as conn:
        return [line for line in conn.iterdump() if not line.startswith('INSERT INTO "store_info"')]


def _journal_mode(db: Path) -> str:
    with closing(sqlite3.connect(db)) as conn:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])


def _no_migrations(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("the migrations ran")

    monkeypatch.setattr(database, "_upgrade", refuse)


def test_a_new_store_is_a_copy_of_the_first_migrated_one_without_running_the_migrations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with open_store(FIRST) as first:
        migrated = first.db_path
    (template,) = template_dir().iterdir()
    assert template.name.startswith(f"store-{HEAD_REVISION}-")
    _no_migrations(monkeypatch)
    with open_store(SECOND) as second:
        copied = second.db_path
        with second.read() as conn:
            assert [tuple(row) for row in conn.execute("SELECT dlm_id FROM store_info")] == [(SECOND,)]
    assert _dump(copied) == _dump(migrated)
    assert _journal_mode(copied) == _journal_mode(migrated) == "wal"
    assert database.current_revision(copied) == HEAD_REVISION


def test_a_damaged_template_is_removed_and_the_new_store_is_migrated_instead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with open_store(FIRST) as first:
        migrated = first.db_path
    (template,) = template_dir().iterdir()
    data = bytearray(template.read_bytes())
    data[200] ^= 0x01
    template.write_bytes(bytes(data))
    upgrades: list[object] = []
    real_upgrade = database._upgrade
    monkeypatch.setattr(database, "_upgrade", lambda *args: upgrades.append(args) or real_upgrade(*args))
    with open_store(SECOND) as second:
        copied = second.db_path
    assert len(upgrades) == 1  # the damaged copy was not used
    assert _dump(copied) == _dump(migrated)
    (kept,) = template_dir().iterdir()  # the damaged one is gone; the new migration left a sound one
    assert kept.read_bytes() != bytes(data)
    _no_migrations(monkeypatch)
    with open_store(THIRD) as third:
        assert _dump(third.db_path) == _dump(migrated)


def test_a_template_of_another_schema_revision_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    with open_store(FIRST):
        pass
    (template,) = template_dir().iterdir()
    template.rename(template.with_name(template.name.replace(f"store-{HEAD_REVISION}-", "store-0001-")))
    upgrades: list[object] = []
    real_upgrade = database._upgrade
    monkeypatch.setattr(database, "_upgrade", lambda *args: upgrades.append(args) or real_upgrade(*args))
    with open_store(SECOND):
        pass
    assert len(upgrades) == 1

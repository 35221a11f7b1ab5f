"""A damaged store.db: every command that opens a store says so in one error line, never a traceback.

One real ``dlm tokenize`` builds a store once per module; each test copies
it into its own home, damages the copy's store.db and runs a command
through the CLI. The damage kinds are what happens to files in practice:
pages overwritten with garbage (the header and schema page intact),
truncation, and the whole file replaced by text. A second set of garbage
spares the tables opening a store reads, so the damage is first met by a
later statement of the command itself. A third puts garbage at chosen
places in the middle of the file: the header, one table page, one index
page, and a table's name in the schema (which SQLite quotes back in bytes
Python cannot decode). The command tests also check store.db is
byte-for-byte what the damage left: dlm never writes to a store it has
found damaged.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.errors import StoreDamagedError, StoreError
from dlmstore.home import store_dir
from dlmstore.store import database
from dlmstore.store.database import open_store

from .helpers import VALID_ID, write_doc

#: Tables opening a store reads: its revision and owner, and what its high-water mark counts
#: (``dlmstore.store.highwater``); damage elsewhere is met later.
OPENING_TABLES = ("alembic_version", "store_info", "sqlite_sequence", "adapters")

HINT = (
    "hint: restore it from a backup, or move it aside (rename it store.db.damaged) to start the store "
    "afresh, losing the runs, metrics, lock history and cache, adapter and dataset records it holds "
    "(the files beside it stay; the cache refills on the next run)"
)

#: Every command that opens a store, as argv before the document path.
COMMANDS = {
    "show": ["show"],
    "cache show": ["cache", "show"],
    "cache prune": ["cache", "prune"],
    "cache clear": ["cache", "clear", "--force"],
    "cache verify": ["cache", "verify"],
    "cache verify --repair": ["cache", "verify", "--repair"],
    "tokenize": ["tokenize"],
    "metrics": ["metrics"],
    "lock show": ["lock", "show"],
    "lock diff": ["lock", "diff"],
    "train": ["train"],
}


def _root_pages(db: Path, *, skip: tuple[str, ...] = ()) -> list[int]:
    """Root pages of every table and index (page 1, the schema, excluded) but those of ``skip``."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT tbl_name, rootpage FROM sqlite_master WHERE rootpage > 1").fetchall()
    finally:
        conn.close()
    return sorted(page for table, page in rows if table not in skip)


def _scribble(db: Path, offsets: list[int], size: int) -> None:
    """Overwrite ``size`` bytes at each offset with seeded random bytes (the same every run)."""
    rng = random.Random(0)
    with open(db, "r+b") as f:
        for offset in offsets:
            f.seek(offset)
            f.write(rng.randbytes(size))


def _page_size(db: Path) -> int:
    return int.from_bytes(db.read_bytes()[16:18], "big")  # the header's page size field


def garbage_over_every_table(db: Path) -> None:
    size = _page_size(db)
    _scribble(db, [(page - 1) * size for page in _root_pages(db)], size)


def garbage_past_the_opening_tables(db: Path) -> None:
    size = _page_size(db)
    _scribble(db, [(page - 1) * size for page in _root_pages(db, skip=OPENING_TABLES)], size)


def garbage_at_offset_8192(db: Path) -> None:
    _scribble(db, [8192], 4096)


def truncated_to_half(db: Path) -> None:
    os.truncate(db, db.stat().st_size // 2)


def replaced_by_text(db: Path) -> None:
    db.write_text("notes saved over the store by mistake\n")


@pytest.fixture(scope="module")
def pristine(tiny_base: Path, session_bases: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store directory made by one real `dlm tokenize` of the document ``_doc`` writes."""
    home = tmp_path_factory.mktemp("pristine-home")
    (home / "bases").symlink_to(session_bases, target_is_directory=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DLM_HOME", str(home))
        result = CliRunner().invoke(cli, ["tokenize", str(_doc(home, tiny_base))])
        assert result.exit_code == 0, result.output
        path = store_dir(VALID_ID)
    assert not (path / "store.db-wal").exists()  # everything is in store.db, where the damage goes
    return path


def _doc(directory: Path, base: Path) -> Path:
    return write_doc(
        directory / "doc.dlm",
        body="Prose.\n\n::instruction::\n### Q\nq?\n### A\na.\n",
        frontmatter=f"base_model: {base}\n",
    )


@pytest.fixture
def doc(pristine: Path, tiny_base: Path, tmp_path: Path) -> Path:
    """The document, its store a fresh copy of the pristine one in this test's home."""
    shutil.copytree(pristine, store_dir(VALID_ID))
    return _doc(tmp_path, tiny_base)


def _run(doc: Path, command: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [*COMMANDS[command], str(doc)])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (garbage_over_every_table, "database disk image is malformed"),
        (truncated_to_half, "database disk image is malformed"),
        (replaced_by_text, "file is not a database"),
    ],
    ids=["garbage", "truncated", "text"],
)
def test_every_command_on_a_damaged_store_db_prints_one_error_line_and_exits_1(
    doc: Path, command: str, damage: Callable[[Path], None], reason: str
) -> None:
    db = store_dir(VALID_ID) / "store.db"
    damage(db)
    damaged = db.read_bytes()
    code, stdout, stderr = _run(doc, command)
    assert (code, stdout) == (1, "")
    assert stderr.splitlines() == [f"error: {db} is damaged: {reason}", HINT]
    assert db.read_bytes() == damaged


@pytest.mark.parametrize(
    "command",
    # `lock show` reads dlm.lock, not the database, once the store is open.
    [c for c in COMMANDS if c not in ("cache verify", "cache verify --repair", "lock show")],
)
def test_damage_first_met_by_a_later_statement_is_the_same_one_error_line(doc: Path, command: str) -> None:
    db = store_dir(VALID_ID) / "store.db"
    garbage_past_the_opening_tables(db)
    damaged = db.read_bytes()
    open_store(VALID_ID, create=False).close()  # opening still works: the damage is met later
    code, stdout, stderr = _run(doc, command)
    assert (code, stdout) == (1, "")
    assert stderr.splitlines() == [f"error: {db} is damaged: database disk image is malformed", HINT]
    assert db.read_bytes() == damaged


@pytest.mark.parametrize("damage", [garbage_past_the_opening_tables, garbage_at_offset_8192])
@pytest.mark.parametrize("repair", [False, True], ids=["verify", "verify --repair"])
def test_verify_reports_a_damaged_store_db_that_opens_as_a_problem_and_never_repairs_it(
    doc: Path, damage: Callable[[Path], None], repair: bool
) -> None:
    db = store_dir(VALID_ID) / "store.db"
    damage(db)
    damaged = db.read_bytes()
    result = CliRunner().invoke(
        cli, ["cache", "verify", str(doc), "--json", *(["--repair"] if repair else [])]
    )
    assert result.exit_code == 1, result.output
    payload = json.loads(result.stdout)
    [problem] = payload["problems"]
    assert (payload["remaining"], payload["entries_checked"], problem["kind"], problem["path"]) == (
        1, 0, "damaged_database", "store.db",
    )  # fmt: skip
    assert problem["repaired"] is False
    assert problem["detail"].startswith("SQLite's integrity_check: ")
    assert problem["detail"].endswith(
        "; nothing else was checked or repaired: "
        "restore store.db from a backup, or move it aside to start the store afresh"
    )
    assert db.read_bytes() == damaged


def test_verify_names_the_page_of_damage_no_other_command_reads(doc: Path) -> None:
    # Page 3 is alembic_version's index, which no statement of dlm reads:
    # only verify's full check meets it.
    db = store_dir(VALID_ID) / "store.db"
    garbage_at_offset_8192(db)
    assert _run(doc, "metrics")[0] == 0
    code, stdout, _ = _run(doc, "cache verify")
    assert code == 1
    assert stdout.splitlines() == [
        "problem: damaged_database: store.db: SQLite's integrity_check: "
        "Page 3: btreeInitPage() returns error code 11; nothing else was checked or repaired: "
        "restore store.db from a backup, or move it aside to start the store afresh",
        "checked 0 entries in 0 token files: 1 problem, 1 remaining",
    ]


def test_a_sound_store_passes_sqlites_integrity_check(doc: Path) -> None:
    with open_store(VALID_ID, create=False) as store:
        assert store.integrity_problems() == []
    code, stdout, _ = _run(doc, "cache verify")
    assert (code, stdout.splitlines()[-1]) == (
        0,
        "checked 2 entries in 1 token file: 0 problems, 0 remaining",
    )


def test_show_leaves_a_damaged_store_directory_exactly_as_it_was(doc: Path) -> None:
    path = store_dir(VALID_ID)
    garbage_over_every_table(path / "store.db")
    before = {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}
    for command in ("show", "cache show"):
        assert _run(doc, command)[0] == 1
    assert {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()} == before


def test_damage_met_by_the_second_statement_of_a_transaction_is_a_store_damaged_error(doc: Path) -> None:
    db = store_dir(VALID_ID) / "store.db"
    with open_store(VALID_ID, create=False) as store:
        garbage_past_the_opening_tables(db)
        with pytest.raises(StoreDamagedError) as err, store.read() as conn:
            assert conn.execute("SELECT dlm_id FROM store_info").fetchone()[0] == VALID_ID
            conn.execute("SELECT * FROM runs").fetchall()
    assert (err.value.path, err.value.reason) == (str(db), "database disk image is malformed")
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_a_constraint_violation_is_a_bug_and_not_reported_as_damage(doc: Path) -> None:
    with open_store(VALID_ID, create=False) as store:
        with pytest.raises(sqlite3.IntegrityError), store.write() as conn:
            conn.execute(
                "INSERT INTO store_info (id, dlm_id, created_at, dlmstore_version) VALUES (1, 'x', 'x', 'x')"
            )
        assert store.integrity_problems() == []


def test_a_locked_database_keeps_its_own_error_and_is_not_called_damaged(
    doc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(database, "BUSY_TIMEOUT_S", 0.05)
    db = store_dir(VALID_ID) / "store.db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with open_store(VALID_ID, create=False) as store, pytest.raises(StoreError) as err, store.write():
            pass
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert not isinstance(err.value, StoreDamagedError)
    assert str(err.value) == f"cannot write {db}: database is locked"


def test_a_store_that_found_damage_writes_nothing_more_not_even_the_failed_run(doc: Path) -> None:
    # Only the cache's pages: `dlm tokenize` records its run, then its cache lookup meets the damage.
    db = store_dir(VALID_ID) / "store.db"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    tables = {table for (table,) in conn.execute("SELECT tbl_name FROM sqlite_master")}
    conn.close()
    size = _page_size(db)
    spared = tuple(tables - {"cache_entries", "token_segments"})
    _scribble(db, [(page - 1) * size for page in _root_pages(db, skip=spared)], size)
    code, _, stderr = _run(doc, "tokenize")
    assert (code, stderr.splitlines()[0]) == (1, f"error: {db} is damaged: database disk image is malformed")
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    runs = conn.execute("SELECT id, status FROM runs ORDER BY id").fetchall()
    conn.close()
    assert runs == [(1, "completed"), (2, "running")]  # not marked failed: that would be a write


def _root_page_of(db: Path, name: str) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0])
    finally:
        conn.close()


def garbage_over_the_header(db: Path) -> None:
    _scribble(db, [0], 100)


def garbage_over_the_runs_table(db: Path) -> None:
    _scribble(db, [(_root_page_of(db, "runs") - 1) * _page_size(db)], _page_size(db))


def garbage_over_the_row_key_index(db: Path) -> None:
    # The unique index behind every cache lookup by row key.
    _scribble(db, [(_root_page_of(db, "sqlite_autoindex_cache_entries_1") - 1) * _page_size(db)], 64)


def garbage_in_an_object_name_of_the_schema(db: Path) -> None:
    """Bytes that are not UTF-8 over a table's name in the schema, and its SQL broken.

    SQLite then quotes the name in its error ("malformed database schema
    (<bytes>)"), which Python's sqlite3 cannot decode: it raises
    ``UnicodeDecodeError`` instead of the ``DatabaseError`` SQLite meant.
    """
    data = bytearray(db.read_bytes())
    at = data.find(b"tabletrain_stepstrain_steps")
    data[at + 5 : at + 16] = b"\xbc\xff\xfe" * 3 + b"\xbc\xff"
    create = data.find(b"CREATE TABLE train_steps")
    data[create : create + 6] = b"CRXATE"
    db.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "reason", "failing"),
    [
        (garbage_over_the_header, "file is not a database", {"show", "metrics", "tokenize", "train"}),
        (garbage_over_the_runs_table, "database disk image is malformed", {"metrics", "tokenize", "train"}),
        # A lookup of most of the cache scans the entries table instead of
        # searching this index key by key, so no command meets the damaged
        # index; `dlm cache verify` still reports it.
        (garbage_over_the_row_key_index, "database disk image is malformed", set()),
        (
            garbage_in_an_object_name_of_the_schema,
            'malformed database schema (\\xbc\\xff\\xfe\\xbc\\xff\\xfe\\xbc\\xff\\xfe\\xbc\\xff) - near "CRXATE": '
            "syntax error",
            {"show", "metrics", "tokenize", "train"},
        ),
    ],
    ids=["header", "table page", "index page", "schema name"],
)
def test_garbage_in_the_middle_of_store_db_is_one_error_line_from_each_command_and_verify_reports_it(
    doc: Path, damage: Callable[[Path], None], reason: str, failing: set[str]
) -> None:
    db = store_dir(VALID_ID) / "store.db"
    damage(db)
    outcomes = {}
    for command in ("show", "metrics", "tokenize", "train"):
        code, _, stderr = _run(doc, command)
        assert "Traceback" not in stderr
        if code:
            assert stderr.splitlines() == [f"error: {db} is damaged: {reason}", HINT], command
        outcomes[command] = code
    assert {c for c, code in outcomes.items() if code} == failing
    damaged = db.read_bytes()  # what verify finds (commands that could open the store wrote runs)
    code, stdout, stderr = _run(doc, "cache verify")
    assert code == 1
    if failing == set(outcomes):  # too damaged to open at all: the same one error
        assert (stdout, stderr.splitlines()) == ("", [f"error: {db} is damaged: {reason}", HINT])
    else:
        assert stdout.startswith("problem: damaged_database: store.db: SQLite's integrity_check: ")
    assert db.read_bytes() == damaged

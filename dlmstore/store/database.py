"""A store: one directory per document id, holding ``store.db`` and blobs.

Opening a store migrates it. The common case (database already at head) is
one plain ``sqlite3`` query against ``alembic_version`` and never imports
alembic, which keeps ``dlm`` start-up fast; only a new or older database
pays for Alembic. Migration runs under an exclusive file lock so two ``dlm``
processes opening a brand-new store do not race each other.

Connections are plain ``sqlite3``, not a SQLAlchemy engine: importing
SQLAlchemy costs more than everything else a warm ``dlm tokenize`` does on
a small corpus (``bench/bench_startup.py``). SQLAlchemy stays the source of truth for the
schema (``dlmstore.store.schema``) and runs the migrations (Alembic), and is
imported only when a database needs migrating. All SQL is plain text with
``?`` placeholders; rows are ``sqlite3.Row``, read by column name
(``row["cache_hits"]``). A ``Row`` is neither a tuple nor a dict, so code
that returns rows, compares them or prints them as JSON converts them
(``tuple(row)``, ``dict(row)``, or a dataclass built from named columns).
The two bulk reads of a warm run (the cache lookup and the stat cache) use
a plain-tuple cursor instead, with the reason beside them.

The connection is set up for several processes sharing one database:

* WAL journal, so readers never block the writer and vice versa;
* ``busy_timeout`` of 30 s, so a second writer waits instead of failing;
* write transactions start with ``BEGIN IMMEDIATE`` (:meth:`Store.write`),
  taking the write lock up front: a deferred transaction that reads and
  then writes can fail with SQLITE_BUSY even with a busy timeout;
* foreign keys on.

A new store's database is a copy of the empty database at head the first
new store of the home was migrated to (``<home>/templates``, checked
against the sha256 in its name), so only that first one imports Alembic.

A database stamped with a revision this dlmstore does not know was written
by a newer dlmstore; it is refused with both versions named and left
untouched.

A damaged database (SQLite's ``SQLITE_CORRUPT`` or ``SQLITE_NOTADB``: bytes
overwritten, the file truncated or replaced) becomes
:class:`~dlmstore.errors.StoreDamagedError` naming the file, wherever SQLite
notices it: opening, migrating, or any statement run through
:meth:`Store.read` / :meth:`Store.write` or :func:`read_only`, so callers
never see ``sqlite3.DatabaseError``. SQLite only notices damage in the pages
a statement reads; :meth:`Store.integrity_problems` (``dlm cache verify``)
reads them all. Nothing here tries to repair a damaged file, and a
:class:`Store` that has met damage writes nothing more to it; the error
says to restore it or move it aside.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dlmstore import __version__
from dlmstore.clock import utc_now
from dlmstore.errors import StoreDamagedError, StoreError, StoreVersionError
from dlmstore.home import dlm_home, store_dir
from dlmstore.store import highwater
from dlmstore.store.connection import (
    BUSY_TIMEOUT_S,
    DB_NAME,
    damaged_error,
    first_value,
    is_damage,
    read_only,
)
from dlmstore.store.flock import FileLock, store_lock
from dlmstore.store.revisions import HEAD_REVISION, REVISIONS, script_location
from dlmstore.ulid import new_ulid

#: What a statement can raise: SQLite's errors, and the decode error of a
#: message quoting garbage (see :func:`is_damage`).
_SQLITE_ERRORS = (sqlite3.Error, UnicodeDecodeError)

#: How many findings ``integrity_check`` reports before it stops looking.
INTEGRITY_CHECK_LIMIT = 10


class Store:
    """An open store: its directory, id and a connection to store.db."""

    def __init__(self, dlm_id: str, path: Path) -> None:
        self.dlm_id = dlm_id
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._damage: StoreDamagedError | None = None
        # Held shared while the store is open, so a sweep can tell whether
        # another process is here (``dlmstore.store.flock``).
        self.flock = store_lock(path)

    @property
    def db_path(self) -> Path:
        return self.path / DB_NAME

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            # isolation_level=None: sqlite3 opens no transactions of its own;
            # _transaction issues BEGIN / COMMIT itself.
            conn = sqlite3.connect(self.db_path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._conn = conn
        return self._conn

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """The store's connection (rows are ``sqlite3.Row``) in a deferred (read) transaction.

        Raises:
            StoreDamagedError: a statement run inside the block finds the
                database damaged.
        """
        with self._transaction("BEGIN") as conn:
            yield conn

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """The store's connection in a ``BEGIN IMMEDIATE`` transaction, committed on success.

        Raises:
            StoreError: the database cannot be written (read-only file or
                directory, disk full, locked past the busy timeout); the
                transaction is rolled back.
            StoreDamagedError: a statement run inside the block finds the
                database damaged; the transaction is rolled back. Once this
                store has found damage, every later ``write`` raises it
                again without touching the file (not even to mark a run
                failed).
        """
        if self._damage is not None:
            raise self._damage
        with self._transaction("BEGIN IMMEDIATE") as conn:
            yield conn

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        # Every statement a caller runs happens inside the ``yield``, so the
        # errors it raises (damage found by the tenth query as much as by
        # the first) are converted here and nowhere else.
        try:
            conn = self._connection()
            conn.execute(begin)
        except _SQLITE_ERRORS as exc:
            if (error := self._error(exc)) is None:
                raise
            raise error from None
        try:
            yield conn
        except BaseException as exc:
            _rollback(conn)
            if (error := self._error(exc)) is None:
                raise
            raise error from None
        try:
            conn.execute("COMMIT")
        except _SQLITE_ERRORS as exc:
            _rollback(conn)
            if (error := self._error(exc)) is None:
                raise
            raise error from None

    def _error(self, exc: BaseException) -> StoreError | None:
        """The StoreError for ``exc``; ``None`` for what is no store problem (a constraint, a bug)."""
        if is_damage(exc):
            self._damage = damaged_error(self.db_path, exc)
            return self._damage
        if isinstance(exc, sqlite3.OperationalError):
            return StoreError(
                f"cannot write {self.db_path}: {exc}",
                hint="make the store writable (see `dlm show` for its path) or point DLM_HOME elsewhere",
            )
        return None

    def integrity_problems(self) -> list[str]:
        """What SQLite's ``PRAGMA integrity_check`` finds wrong with store.db; empty when sound.

        Reads every page, so it also finds damage no other command would
        read. ``integrity_check`` rather than ``quick_check``: on a store of
        10K cache entries (7 MB store.db, 2 shared cores) it took 27-36 ms
        against quick_check's 8-9 ms, beside 40-60 ms for the rest of
        ``verify`` and 0.35-0.75 s for the whole ``dlm cache verify``
        process (``bench/bench_verify.py``). The difference buys the one
        check quick_check skips: that every index agrees with its table.
        Cache lookups go through the ``row_key`` index, so an index that
        disagrees would lose or mismatch entries that quick_check calls sound.

        Returns:
            One line per finding (at most ``INTEGRITY_CHECK_LIMIT``); a
            database too damaged to check at all gives SQLite's error.
        """
        try:
            found = self._check("integrity_check")
        except StoreDamagedError:
            # integrity_check gives up with a bare "database disk image is
            # malformed" when an index it compares cannot be read;
            # quick_check skips that comparison and names the damaged page.
            try:
                found = self._check("quick_check")
            except StoreDamagedError as exc:
                return [exc.reason]
        if found == ["ok"]:
            return []
        # SQLite heads the first finding with "*** in database main ***\n".
        return [line for finding in found for line in finding.splitlines() if not line.startswith("***")]

    def _check(self, pragma: str) -> list[str]:
        with self.read() as conn:
            return [row[0] for row in conn.execute(f"PRAGMA {pragma}({INTEGRITY_CHECK_LIMIT})")]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self.flock.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.dlm_id!r}, {str(self.path)!r})"


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back an open transaction, keeping the error that caused it."""
    if not conn.in_transaction:
        return
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        # The error being raised says more than a failed ROLLBACK of a
        # damaged file would; SQLite discards the transaction on close anyway.
        pass


def store_exists(dlm_id: str) -> bool:
    """True when the store for ``dlm_id`` has a database (creates nothing)."""
    return (store_dir(dlm_id) / DB_NAME).is_file()


def open_store(dlm_id: str, *, create: bool = True, check_history: bool = True) -> Store:
    """Open (and migrate to head) the store for ``dlm_id`` under the dlm home.

    The open store holds the store lock shared until it is closed
    (``dlmstore.store.flock``).

    Args:
        dlm_id: the document id.
        create: make the directory and database when missing; with
            ``False`` a missing store raises ``StoreError`` and nothing is
            created.
        check_history: refuse a store.db that has lost records its
            high-water mark counts (``dlmstore.store.highwater``); only
            ``dlm cache verify``, which reports and repairs that, opens
            without the check.

    Raises:
        StoreError: the store cannot be created or opened, or belongs to
            another document.
        StoreVersionError: the database was written by a newer dlmstore.
        StoreDamagedError: store.db is damaged, or has lost records.
    """
    return open_store_at(store_dir(dlm_id), dlm_id, create=create, check_history=check_history)


def open_store_at(
    path: Path, dlm_id: str | None = None, *, create: bool = True, check_history: bool = True
) -> Store:
    """Open (and migrate) the store whose directory is ``path`` (see :func:`open_store`).

    A store that belongs to no document (a dataset directory built by
    ``dlm data``) passes ``dlm_id=None``: a new one gets a fresh ULID, an
    existing one keeps the id it has.
    """
    db_path = path / DB_NAME
    if dlm_id is None:
        dlm_id = _existing_id(db_path) if db_path.is_file() else new_ulid()
    created = not db_path.is_file()
    if created:
        if not create:
            raise StoreError(
                f"no store for document {dlm_id} at {path}",
                hint="run `dlm tokenize` on the document to create it",
            )
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create store directory {path}: {exc.strerror or exc}",
                hint="make the directory writable or point DLM_HOME somewhere writable",
            ) from None
    migrate(db_path, dlm_id)
    if created and highwater.read_mark(path) is not None:
        # A store.db made afresh beside the mark of the one it replaces (moved
        # aside as damaged): it starts where that one's ids ended.
        store = Store(dlm_id, path)
        try:
            highwater.accept(store)
        except BaseException:
            store.close()
            raise
        return store
    if check_history:
        highwater.check(path)
    return Store(dlm_id, path)


def _existing_id(db_path: Path) -> str:
    with read_only(db_path) as conn:
        try:
            dlm_id = first_value(conn, "SELECT dlm_id FROM store_info WHERE id = 1")
        except sqlite3.OperationalError:  # no store_info yet: a database from before it existed
            dlm_id = None
    return new_ulid() if dlm_id is None else str(dlm_id)


def migrate(db_path: Path, dlm_id: str) -> None:
    """Bring the database at ``db_path`` to head, creating it when missing."""
    revision, owner = _read_state(db_path)
    if revision == HEAD_REVISION:  # the everyday case: one read-only connection, no alembic
        _refuse_other_owner(db_path, owner, dlm_id)
        return
    _refuse_unknown(db_path, revision)
    try:
        lock = FileLock(db_path.parent / ".migrate.lock", required=True)
    except OSError as exc:
        raise StoreError(
            f"cannot write to store directory {db_path.parent}: {exc.strerror or exc}",
            hint="make the directory writable or point DLM_HOME somewhere writable",
        ) from None
    with lock:
        lock.exclusive()
        revision = current_revision(db_path)  # another process may have migrated meanwhile
        _refuse_unknown(db_path, revision)
        if revision != HEAD_REVISION:
            fresh = not db_path.exists()
            # a new store copies the empty database at head that the first one migrated
            if not (fresh and _from_template(db_path)):
                _upgrade(db_path, revision)
                if fresh:
                    _keep_template(db_path)
        _stamp_store_info(db_path, dlm_id)


def template_dir() -> Path:
    """Where empty databases at head are kept, one per schema revision (``<home>/templates``)."""
    return dlm_home() / "templates"


def _template_name(digest: str) -> str:
    return f"store-{HEAD_REVISION}-{digest}.db"


def _keep_template(db_path: Path) -> None:
    """Keep the database Alembic just made from nothing (at head, not yet stamped) for the next new store.

    A new store's database used to be made by running every migration:
    importing SQLAlchemy and Alembic and committing each step took most of
    a second (more with a busy disk), more than the rest of a cold
    ``dlm tokenize`` of a small corpus. The result is the same bytes'
    worth of schema and seeds every time, so the first one made in a home
    is kept (an SQLite backup, named by the revision and the sha256 of its
    bytes) and later new stores copy it. Best effort: a home that cannot
    be written keeps none.
    """
    import hashlib

    from dlmstore.store.atomic import write_bytes_atomic

    try:
        with (
            contextlib.closing(sqlite3.connect(db_path)) as source,
            contextlib.closing(sqlite3.connect(":memory:")) as copy,
        ):
            source.backup(copy)
            data = copy.serialize()
        folder = template_dir()
        folder.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(folder / _template_name(hashlib.sha256(data).hexdigest()), data)
    except (OSError, sqlite3.Error):
        pass


def _from_template(db_path: Path) -> bool:
    """Make the new database at ``db_path`` from a kept template; False when there is none sound.

    A template is used only when its bytes still have the sha256 its name
    records (a damaged one is removed, and the migrations run instead).
    """
    import hashlib

    from dlmstore.store.atomic import write_bytes_atomic

    prefix = f"store-{HEAD_REVISION}-"
    try:
        candidates = [path for path in template_dir().iterdir() if path.name.startswith(prefix)]
    except OSError:
        return False
    for path in candidates:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if path.name != _template_name(hashlib.sha256(data).hexdigest()):
            path.unlink(missing_ok=True)
            continue
        try:
            write_bytes_atomic(db_path, data, overwrite=False)
            with contextlib.closing(sqlite3.connect(db_path, timeout=BUSY_TIMEOUT_S)) as conn:
                conn.execute("PRAGMA journal_mode=WAL")  # as _upgrade sets it
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(
                f"cannot create {db_path}: {exc}",
                hint="make the directory writable or point DLM_HOME somewhere writable",
            ) from None
        return True
    return False


def current_revision(db_path: Path) -> str | None:
    """The Alembic revision stamped in ``db_path``; ``None`` when unstamped or missing."""
    return _read_state(db_path)[0]


def _read_state(db_path: Path) -> tuple[str | None, str | None]:
    """The stamped revision and, for a database at head, the owning document id."""
    if not db_path.is_file():
        return None, None
    with read_only(db_path) as conn:
        try:
            revision = first_value(conn, "SELECT version_num FROM alembic_version")
            owner = None
            if revision == HEAD_REVISION:
                owner = first_value(conn, "SELECT dlm_id FROM store_info WHERE id = 1")
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None, None
            raise StoreError(f"cannot read {db_path}: {exc}") from None
    return revision, owner


def _refuse_unknown(db_path: Path, revision: str | None) -> None:
    if revision is None or revision in REVISIONS:
        return
    writer = "a newer dlmstore"
    try:
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        try:
            version = first_value(conn, "SELECT dlmstore_version FROM store_info")
        finally:
            conn.close()
        if version is not None:
            writer = f"dlmstore {version}"
    except _SQLITE_ERRORS:
        pass  # the writer's version is only a nicety in the message
    raise StoreVersionError(
        f"{db_path} was written by {writer} (schema revision {revision}); "
        f"this is dlmstore {__version__} (schema up to {HEAD_REVISION})",
        hint="upgrade dlmstore (pip install -U dlmstore); the database was not modified",
    )


def _upgrade(db_path: Path, revision: str | None) -> None:
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine

    config = Config()
    config.set_main_option("script_location", str(script_location()))
    engine = create_engine(f"sqlite:///{db_path}", connect_args={"timeout": BUSY_TIMEOUT_S})
    try:
        with engine.connect() as conn:
            # Batch migrations copy tables; foreign keys must be off meanwhile.
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")
            config.attributes["connection"] = conn
            command.upgrade(config, "head")
            conn.commit()
    except Exception as exc:
        if isinstance(exc, StoreError):
            raise
        cause = getattr(exc, "orig", exc)  # SQLAlchemy wraps the sqlite3 error
        if is_damage(cause):
            raise damaged_error(db_path, cause) from None
        # The first line only: SQLAlchemy appends the statement and a link.
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise StoreError(
            f"cannot migrate {db_path} from schema revision {revision or '(none)'} to {HEAD_REVISION}: {reason}",
            hint="its alembic_version table may not match its tables (edited or restored by hand); "
            "restore store.db from a backup, or move the store's folder away to start afresh",
        ) from None
    finally:
        engine.dispose()


def _stamp_store_info(db_path: Path, dlm_id: str) -> None:
    conn = sqlite3.connect(db_path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        owner = first_value(conn, "SELECT dlm_id FROM store_info WHERE id = 1")  # NOT NULL: None means no row
        if owner is None:
            conn.execute(
                "INSERT INTO store_info (id, dlm_id, created_at, dlmstore_version) VALUES (1, ?, ?, ?)",
                (dlm_id, utc_now(), __version__),
            )
        elif owner == dlm_id:
            conn.execute("UPDATE store_info SET dlmstore_version = ? WHERE id = 1", (__version__,))
        conn.execute("COMMIT")
    except _SQLITE_ERRORS as exc:
        if is_damage(exc):
            raise damaged_error(db_path, exc) from None
        raise StoreError(f"cannot write {db_path}: {exc}") from None
    finally:
        conn.close()
    _check_owner(db_path, dlm_id)


def _check_owner(db_path: Path, dlm_id: str) -> None:
    _refuse_other_owner(db_path, _read_state(db_path)[1], dlm_id)


def _refuse_other_owner(db_path: Path, owner: str | None, dlm_id: str) -> None:
    if owner is not None and owner != dlm_id:
        raise StoreError(
            f"{db_path} belongs to document {owner}, not {dlm_id}",
            hint="the store directory was copied or renamed by hand; move it back",
        )

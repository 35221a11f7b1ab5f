"""The store.db schema as SQLAlchemy Core tables: the models side.

The database itself is only ever created or changed by the numbered Alembic
revisions in ``dlmstore.migrations.versions``; these tables describe the
head of that chain so library code can build queries, and a test checks
that models and migrations agree (``compare_metadata`` is empty).

Conventions, so ``sqlite3 store.db`` is pleasant to use:

* plural snake_case table names, readable column names, no abbreviations;
* timestamps are ISO-8601 UTC text with a ``Z`` suffix, e.g.
  ``2026-11-21T08:15:03.123Z`` (they sort as text and read as dates);
* ids that must never be reused (runs) are ``INTEGER PRIMARY KEY
  AUTOINCREMENT``;
* column comments below are the schema documentation: ``docs/schema.md`` is
  generated from a freshly migrated database plus these comments.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    CheckConstraint,
    Column,
    Integer,
    MetaData,
    Table,
    Text,
)

#: Every revision in order; the last is the head. A test checks this
#: against the Alembic script directory, so opening an up-to-date store
#: never has to import alembic.
REVISIONS = ("0001", "0002")
HEAD_REVISION = REVISIONS[-1]

metadata = MetaData()


def utc_now() -> str:
    """Current time as the ISO-8601 UTC text stored in every timestamp column."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


store_info = Table(
    "store_info",
    metadata,
    Column("id", Integer, primary_key=True, comment="Always 1: this table has one row."),
    Column("dlm_id", Text, nullable=False, comment="The document id (ULID) this store belongs to."),
    Column("created_at", Text, nullable=False, comment="When the store was created."),
    Column(
        "dlmstore_version",
        Text,
        nullable=False,
        comment="Version of the newest dlmstore that migrated this database.",
    ),
    CheckConstraint("id = 1", name="store_info_single_row"),
    comment="Identity of the store: one row.",
)

runs = Table(
    "runs",
    metadata,
    Column(
        "id",
        Integer,
        primary_key=True,
        comment="Run id; AUTOINCREMENT so an id is never reused, even after a crash.",
    ),
    Column("command", Text, nullable=False, comment="What ran: tokenize or train."),
    Column(
        "status",
        Text,
        nullable=False,
        comment="running while in progress, then completed or failed.",
    ),
    Column("started_at", Text, nullable=False, comment="When the run started."),
    Column("finished_at", Text, comment="When the run ended; NULL while running."),
    Column("dlm_path", Text, nullable=False, comment="Absolute path of the .dlm document."),
    Column("dlm_sha256", Text, nullable=False, comment="sha256 of the document bytes at run time."),
    Column("dlmstore_version", Text, nullable=False, comment="dlmstore version that ran it."),
    Column("pid", Integer, comment="Process id of the dlm process that ran it."),
    Column("error", Text, comment="One-line reason when status is failed."),
    CheckConstraint("status IN ('running', 'completed', 'failed')", name="runs_status"),
    comment="Every tokenize or train run, newest has the largest id.",
    sqlite_autoincrement=True,
)

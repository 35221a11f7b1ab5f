"""The tokenized cache's files are token segments, no longer "packs".

Revision ID: 0018
Revises: 0017
Why this revision exists: `dlm pack` (issue 39) writes a `.dlm.pack`, a
document and its store in one file, as DocumentLanguageModel names it.
The cache's append-only token files were called packs too, so one word
meant two things. They are token segments now:

* `token_packs` becomes `token_segments` (its rows' `path` still names
  each file as it was written: files made before this revision keep their
  `tokens/pack-*.bin` names, new ones are `tokens/segment-*.bin`), its
  dtype check `token_segments_dtype`;
* `cache_entries.pack_id` becomes `segment_id`, its index
  `cache_entries_segment_id`;
* `pass_snapshots.pack_reach` becomes `segment_reach`.

No data changes: SQLite renames tables and columns in place, and rewrites
the foreign keys and the cache_entries triggers that name them. It renames
no constraint, so the table is copied once under the new check's name
(a table of one row per segment: milliseconds), keeping every id and the
AUTOINCREMENT counter.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_COLUMNS = "id, path, dtype, bytes, live_bytes, created_at, run_id"


def upgrade() -> None:
    op.execute("ALTER TABLE token_packs RENAME TO token_segments")
    op.execute("ALTER TABLE cache_entries RENAME COLUMN pack_id TO segment_id")
    op.execute("DROP INDEX cache_entries_pack_id")
    op.execute("CREATE INDEX cache_entries_segment_id ON cache_entries (segment_id)")
    op.execute("ALTER TABLE pass_snapshots RENAME COLUMN pack_reach TO segment_reach")
    _copy_with_dtype_check("token_segments", "token_segments_dtype")


def downgrade() -> None:
    _copy_with_dtype_check("token_segments", "token_packs_dtype")
    op.execute("ALTER TABLE pass_snapshots RENAME COLUMN segment_reach TO pack_reach")
    op.execute("DROP INDEX cache_entries_segment_id")
    op.execute("ALTER TABLE cache_entries RENAME COLUMN segment_id TO pack_id")
    op.execute("CREATE INDEX cache_entries_pack_id ON cache_entries (pack_id)")
    op.execute("ALTER TABLE token_segments RENAME TO token_packs")


def _copy_with_dtype_check(table: str, check: str) -> None:
    """Copy ``table`` into one whose dtype check is named ``check``, under the same name.

    SQLite's own recipe for a change ALTER TABLE cannot make (foreign keys
    are off while migrating): make the new table, copy the rows, drop the
    old, rename the new. The ids are copied and the AUTOINCREMENT counter
    carried over, so the id of a segment a prune deleted is still never
    handed out again, as the table promises.
    ``legacy_alter_table`` lets the last rename leave the cache_entries
    triggers alone: they name ``table``, which the copy then is.
    """
    copy = f"{table}_copy"
    op.create_table(
        copy,
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("path", sa.Text(), nullable=False, unique=True),
        sa.Column("dtype", sa.Text(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("live_bytes", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id")),
        sa.CheckConstraint("dtype IN ('uint16', 'uint32')", name=check),
        sqlite_autoincrement=True,
    )
    op.execute(f"INSERT INTO {copy} ({_COLUMNS}) SELECT {_COLUMNS} FROM {table}")
    op.execute(f"DELETE FROM sqlite_sequence WHERE name = '{copy}'")
    op.execute(
        f"INSERT INTO sqlite_sequence (name, seq) SELECT '{copy}', seq FROM sqlite_sequence WHERE name = '{table}'"
    )
    op.execute(f"DROP TABLE {table}")
    op.execute("PRAGMA legacy_alter_table = ON")
    op.execute(f"ALTER TABLE {copy} RENAME TO {table}")
    op.execute("PRAGMA legacy_alter_table = OFF")

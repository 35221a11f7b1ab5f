"""Pass snapshots and a count of cache entry changes.

Revision ID: 0010
Revises: 0009
Why this revision exists: a warm `dlm tokenize` of 100,000 unchanged source
files still walked the tree, loaded one stat record per file, built a
section and a row per file and looked every row up in the cache, about two
seconds to learn that nothing had changed. `pass_snapshots` keeps, per
document, what its last all-hits pass found (counts, the entries it used,
what each directive included) with the proof to check that it still holds:
the stat fields of every folder the walk listed and every file it examined
(see dlmstore.cache.snapshot). `cache_totals.changes` counts every cache
entry deleted or moved, so one comparison tells a snapshot that none of its
entries went away since it was taken.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pass_snapshots",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("document", sa.Text(), nullable=False, unique=True),
        sa.Column("context", sa.Text(), nullable=False),
        sa.Column("dlm_sha256", sa.Text(), nullable=False),
        sa.Column("tokenizer_sha256", sa.Text(), nullable=False),
        sa.Column("sequence_len", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("dir_paths", sa.LargeBinary(), nullable=False),
        sa.Column("dir_stamps", sa.LargeBinary(), nullable=False),
        sa.Column("file_paths", sa.LargeBinary(), nullable=False),
        sa.Column("file_stamps", sa.LargeBinary(), nullable=False),
        sa.Column("cache_changes", sa.Integer(), nullable=False),
        sa.Column("pack_reach", sa.Text(), nullable=False),
        sa.Column("entry_ids", sa.LargeBinary(), nullable=False),
        sa.Column("result", sa.Text(), nullable=False),
    )
    with op.batch_alter_table("cache_totals", recreate="never") as batch:
        batch.add_column(sa.Column("changes", sa.Integer(), nullable=False, server_default="0"))
    op.execute(
        """
        CREATE TRIGGER cache_entries_count_delete AFTER DELETE ON cache_entries BEGIN
          UPDATE cache_totals SET changes = changes + 1 WHERE id = 1;
        END
        """
    )
    op.execute(
        """
        CREATE TRIGGER cache_entries_count_move
        AFTER UPDATE OF pack_id, byte_offset, bytes, token_count, checksum, dtype ON cache_entries BEGIN
          UPDATE cache_totals SET changes = changes + 1 WHERE id = 1;
        END
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER cache_entries_count_move")
    op.execute("DROP TRIGGER cache_entries_count_delete")
    # Not a batch copy: triggers on cache_entries name cache_totals, and a copy would drop it under them.
    with op.batch_alter_table("cache_totals", recreate="never") as batch:
        batch.drop_column("changes")
    op.drop_table("pass_snapshots")

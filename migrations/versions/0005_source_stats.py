"""Source file stat cache.

Revision ID: 0005
Revises: 0004
Why this revision exists: a warm `dlm tokenize` should not re-read and
re-hash every source file when a stat check proves it unchanged. This table
remembers, per source file, the stat fields and the section digest seen
when it was last read, the way git's index does; entries written within
the racy window of a file's mtime are not trusted (see dlmstore.sources.statcache).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "source_stats",
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("relpath", sa.Text(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("mtime_ns", sa.Integer(), nullable=False),
        sa.Column("ctime_ns", sa.Integer(), nullable=False),
        sa.Column("inode", sa.Integer(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("digest", sa.Text()),
        sa.Column("checked_ns", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("path", "relpath", name="source_stats_pk"),
        sa.CheckConstraint("status IN ('ok', 'binary', 'encoding')", name="source_stats_status"),
    )


def downgrade() -> None:
    op.drop_table("source_stats")

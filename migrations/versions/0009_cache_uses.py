"""Cache use log and source row keys.

Revision ID: 0009
Revises: 0008
Why this revision exists: a warm `dlm tokenize` of 100,000 source files
spent half a second rewriting every cache entry's LRU mark (`last_access_at`,
`last_run_id`) and a quarter hashing row keys it had hashed on the run
before. A pass now appends one row to `cache_uses` naming the entries it
used (their ids, packed), and the marks are brought up to date from that
log only when something needs the LRU order (eviction, prune) or the log
grows long (see dlmstore.cache.uses). `source_stats.row_key` keeps the key
of an unchanged file's text row, so it is read rather than recomputed.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cache_uses",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("used_at", sa.Text(), nullable=False),
        sa.Column("entries", sa.Integer(), nullable=False),
        sa.Column("entry_ids", sa.LargeBinary(), nullable=False),
    )
    with op.batch_alter_table("source_stats", recreate="never") as batch:
        batch.add_column(sa.Column("row_key", sa.Text()))


def downgrade() -> None:
    with op.batch_alter_table("source_stats") as batch:
        batch.drop_column("row_key")
    op.drop_table("cache_uses")

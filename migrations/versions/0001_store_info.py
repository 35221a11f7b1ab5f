"""Store identity.

Revision ID: 0001
Revises:
Why this revision exists: every store.db must say which document it belongs
to and which dlmstore last migrated it, so a database copied to the wrong
place, or written by a newer dlmstore, is detected with a clear message.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "store_info",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("dlm_id", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("dlmstore_version", sa.Text(), nullable=False),
        sa.CheckConstraint("id = 1", name="store_info_single_row"),
    )


def downgrade() -> None:
    op.drop_table("store_info")

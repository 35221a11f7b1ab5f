"""Runs.

Revision ID: 0002
Revises: 0001
Why this revision exists: `dlm tokenize` and `dlm train` each record a run
(status running -> completed | failed) that tokenization events, metrics,
lock records and adapters hang off. AUTOINCREMENT keeps run ids from ever
being reused, also after a crash deleted the newest row.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("command", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("started_at", sa.Text(), nullable=False),
        sa.Column("finished_at", sa.Text()),
        sa.Column("dlm_path", sa.Text(), nullable=False),
        sa.Column("dlm_sha256", sa.Text(), nullable=False),
        sa.Column("dlmstore_version", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer()),
        sa.Column("error", sa.Text()),
        sa.CheckConstraint("status IN ('running', 'completed', 'failed')", name="runs_status"),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("runs")

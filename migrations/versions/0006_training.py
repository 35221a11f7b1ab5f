"""Training: adapters, per-step metrics and lock records.

Revision ID: 0006
Revises: 0005
Why this revision exists: `dlm train` registers each adapter version it
writes (with its sha256), records loss and learning rate at every logged
step for `dlm metrics --run-id N`, and keeps every reproducibility lock as
a row, so lock history and diffs are SQL rather than a single JSON file.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "adapters",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("version", sa.Integer(), nullable=False, unique=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), nullable=False, unique=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("base_model", sa.Text(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("final_loss", sa.Float()),
        sa.Column("created_at", sa.Text(), nullable=False),
    )
    op.create_table(
        "train_steps",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Float()),
        sa.Column("loss", sa.Float()),
        sa.Column("learning_rate", sa.Float()),
        sa.Column("tokens_per_second", sa.Float()),
        sa.Column("recorded_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "step", name="train_steps_pk"),
    )
    op.create_table(
        "lock_records",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id")),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("decision", sa.Text(), nullable=False),
        sa.Column("lock_version", sa.Integer(), nullable=False),
        sa.Column("dlm_sha256", sa.Text(), nullable=False),
        sa.Column("base_model_revision", sa.Text()),
        sa.Column("base_model_sha256", sa.Text()),
        sa.Column("hardware_tier", sa.Text(), nullable=False),
        sa.Column("determinism_class", sa.Text(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("lock_json", sa.Text(), nullable=False),
        sa.CheckConstraint("decision IN ('written', 'updated', 'ignored')", name="lock_records_decision"),
        sqlite_autoincrement=True,
    )
    op.execute(
        """
        CREATE VIEW train_runs AS
        SELECT r.id AS run_id, r.status, r.started_at, r.finished_at,
               a.version AS adapter_version, a.sha256 AS adapter_sha256, a.steps, a.final_loss,
               (SELECT COUNT(*) FROM train_steps s WHERE s.run_id = r.id) AS logged_steps
        FROM runs AS r LEFT JOIN adapters AS a ON a.run_id = r.id
        WHERE r.command = 'train'
        """
    )


def downgrade() -> None:
    op.execute("DROP VIEW train_runs")
    op.drop_table("lock_records")
    op.drop_table("train_steps")
    op.drop_table("adapters")

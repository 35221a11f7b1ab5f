"""Training on token datasets, resumable runs and data-parallel ranks.

Revision ID: 0008
Revises: 0007
Why this revision exists: `dlm train` now trains on registered token
datasets beside the document's rows, resumes an interrupted run from a
checkpoint kept in the store, and runs on several processes. A run records
which datasets it trained on and how much of each it used (`run_datasets`),
how many ranks it ran on and which run it continued (`runs.world_size`,
`runs.resumed_from`), what each rank trained (`run_ranks`), and the
checkpoints it left to resume from (`checkpoints`, one row per complete
checkpoint folder: a folder without a row was never finished and is swept).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", recreate="never") as batch:
        batch.add_column(sa.Column("world_size", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("resumed_from", sa.Integer()))
    op.create_table(
        "run_datasets",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("split", sa.Text(), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("meta_sha256", sa.Text(), nullable=False),
        sa.Column("tokenizer_sha256", sa.Text(), nullable=False),
        sa.Column("tokens_available", sa.Integer(), nullable=False),
        sa.Column("samples_used", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("tokens_used", sa.Integer(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("run_id", "position", name="run_datasets_pk"),
        sa.CheckConstraint("kind IN ('pretrain', 'sft')", name="run_datasets_kind"),
    )
    op.create_table(
        "run_ranks",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("phase", sa.Text(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("samples_path", sa.Text()),
        sa.PrimaryKeyConstraint("run_id", "phase", "rank", name="run_ranks_pk"),
    )
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("phase", sa.Text(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False, unique=True),
        sa.Column("dlm_sha256", sa.Text(), nullable=False),
        sa.Column("base_model", sa.Text(), nullable=False),
        sa.Column("inputs_sha256", sa.Text(), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("micro_batch_size", sa.Integer(), nullable=False),
        sa.Column("grad_accum", sa.Integer(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.CheckConstraint("phase IN ('sft', 'preference')", name="checkpoints_phase"),
    )


def downgrade() -> None:
    op.drop_table("checkpoints")
    op.drop_table("run_ranks")
    op.drop_table("run_datasets")
    with op.batch_alter_table("runs", recreate="never") as batch:
        batch.drop_column("resumed_from")
        batch.drop_column("world_size")

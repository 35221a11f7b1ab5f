"""Validation rows that duplicate training rows, recorded per run.

Revision ID: 0015
Revises: 0014
Why this revision exists: a validation row that is a copy (or a near
copy) of a row that trains makes the held-out loss read low, and a train
run only said so in a warning that nothing kept. Each train run now records
the split it drew and every contaminated validation row: which training
row it duplicates, how closely, and whether `training.dedup` kept it out of
the validation split (`dlm show`, `dlm metrics` and `dlm report` read them).

* `val_splits`: one row per run that drew a validation split: its seed and
  `training.dedup`, the rows held out, how many of them duplicated training
  rows and how many were kept out; `from_run_id` when the run read the
  rows of an earlier run over the same clusters instead of finding them.
* `val_contamination`: each contaminated validation row, the training row
  it is most like, exact or near, their similarity and whether it was kept
  out (it trains instead) or held out (its loss measured).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "val_splits",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("mode", sa.Text(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("val_rows", sa.Integer(), nullable=False),
        sa.Column("contaminated_rows", sa.Integer(), nullable=False),
        sa.Column("kept_out_rows", sa.Integer(), nullable=False),
        sa.Column("from_run_id", sa.Integer()),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.CheckConstraint("mode IN ('off', 'exact', 'near')", name="val_splits_mode"),
    )
    op.create_table(
        "val_contamination",
        sa.Column(
            "run_id", sa.Integer(), sa.ForeignKey("val_splits.run_id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("row_key", sa.Text(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("train_row_key", sa.Text(), nullable=False),
        sa.Column("train_path", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("similarity", sa.Float(), nullable=False),
        sa.Column("kept_out", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "row_key", name="val_contamination_pk"),
        sa.CheckConstraint("kind IN ('exact', 'near')", name="val_contamination_kind"),
    )


def downgrade() -> None:
    op.drop_table("val_contamination")
    op.drop_table("val_splits")

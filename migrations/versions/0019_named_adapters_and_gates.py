"""Named adapters and the learned gate (DocumentLanguageModel's multi-adapter documents).

Revision ID: 0019
Revises: 0018
Why this revision exists: a document may declare several named adapters
(`training.adapters`), each trained on the rows routed to it, and a small
learned gate that chooses between them at prompt time (issue 40). One
`dlm train` of such a document records one train run per adapter, so every
per-run record (lock, evaluations, checkpoints, steps) stays per adapter:

* `runs.adapter`: the named adapter a train run trained (NULL for a
  document's one adapter, and for every other command);
* `adapters.name`: the same name on each version the run registered, so an
  adapter's version line is `WHERE name = ?`;
* `gates`: each gate a train invocation trained after its adapters' SFT:
  its file, checksum, mode (trained, or uniform below the cold-start
  floor), the adapter versions it routes between and its mean output over
  the training prompts (the static mix `dlm export` uses).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("adapter", sa.Text()))
    op.add_column("adapters", sa.Column("name", sa.Text()))
    op.create_index("adapters_name_version", "adapters", ["name", "version"])
    op.create_table(
        "gates",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("path", sa.Text(), nullable=False, unique=True),
        sa.Column("mode", sa.Text(), nullable=False),
        sa.Column("sha256", sa.Text()),
        sa.Column("bytes", sa.Integer()),
        sa.Column("adapters", sa.Text(), nullable=False),
        sa.Column("input_dim", sa.Integer(), nullable=False),
        sa.Column("hidden_proj_dim", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("lr", sa.Float(), nullable=False),
        sa.Column("entropy_lambda", sa.Float(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("prompts", sa.Integer(), nullable=False),
        sa.Column("final_loss", sa.Float()),
        sa.Column("mean_weights", sa.Text(), nullable=False),
        sa.Column("note", sa.Text()),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.CheckConstraint("mode IN ('trained', 'uniform')", name="gates_mode"),
        sa.CheckConstraint(
            "(mode = 'trained' AND sha256 IS NOT NULL AND bytes IS NOT NULL) OR "
            "(mode = 'uniform' AND sha256 IS NULL AND bytes IS NULL)",
            name="gates_weights",
        ),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("gates")
    op.drop_index("adapters_name_version", table_name="adapters")
    op.drop_column("adapters", "name")
    op.drop_column("runs", "adapter")

"""Replay in training: each run's draw, and retention measured beside val.

Revision ID: 0017
Revises: 0016
Why this revision exists: with 0016 the store kept what every run trained
on, but training did not use it, so an edited document's next adapter
forgot what the edit removed (issue 38). A train run now replays history
rows the document no longer holds, and this revision records what it drew
and what it measured of the forgetting:

* `replay_runs`: one row per completed train run: the generation it
  trained, how many candidates each phase had, how many rows were new,
  how many it drew, the draw's identity, and why it did not replay
  (`--no-replay`, or `training.replay.enabled: false`) when it did not.
* `replay_draws`: each row a run replayed (its key digest, phase, weight
  and the generation that last trained it).
* `evaluations` gains the retention columns: the probes of earlier
  versions that the document no longer holds, asked beside the current
  ones (`retained_*`), and the loss of the frozen retention slice
  (`retention_*`), with the previous adapter's loss on the same rows and
  the difference.
* `probe_results.retained`: 1 for such a probe.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_EVALUATION_COLUMNS = (
    ("retained_probes", sa.Integer(), False),
    ("retained_exact", sa.Integer(), False),
    ("retained_nll", sa.Float(), True),
    ("retained_f1", sa.Float(), True),
    ("retention_loss", sa.Float(), True),
    ("retention_rows", sa.Integer(), False),
    ("retention_tokens", sa.Integer(), False),
    ("retention_previous_loss", sa.Float(), True),
    ("retention_delta", sa.Float(), True),
)


def upgrade() -> None:
    op.create_table(
        "replay_runs",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("sft_candidates", sa.Integer(), nullable=False),
        sa.Column("preference_candidates", sa.Integer(), nullable=False),
        sa.Column("sft_new", sa.Integer(), nullable=False),
        sa.Column("preference_new", sa.Integer(), nullable=False),
        sa.Column("sft_drawn", sa.Integer(), nullable=False),
        sa.Column("preference_drawn", sa.Integer(), nullable=False),
        sa.Column("draw_sha256", sa.Text(), nullable=False),
        sa.Column("skipped", sa.Text()),
    )
    op.create_table(
        "replay_draws",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("key", sa.LargeBinary(), nullable=False),
        sa.Column("phase", sa.Text(), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("last_generation", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "key", name="replay_draws_pk"),
        sa.CheckConstraint("length(key) = 32", name="replay_draws_key"),
        sa.CheckConstraint("phase IN ('sft', 'preference')", name="replay_draws_phase"),
        sqlite_with_rowid=False,
    )
    for name, kind, nullable in _EVALUATION_COLUMNS:
        default = None if nullable else sa.text("0")
        op.add_column("evaluations", sa.Column(name, kind, nullable=nullable, server_default=default))
    op.add_column(
        "probe_results", sa.Column("retained", sa.Integer(), nullable=False, server_default=sa.text("0"))
    )


def downgrade() -> None:
    with op.batch_alter_table("probe_results") as batch:
        batch.drop_column("retained")
    with op.batch_alter_table("evaluations") as batch:
        for name, _, _ in reversed(_EVALUATION_COLUMNS):
            batch.drop_column(name)
    op.drop_table("replay_draws")
    op.drop_table("replay_runs")

"""Evaluation: the validation split's loss, early stopping and the probes' scores.

Revision ID: 0014
Revises: 0013
Why this revision exists: nothing in store.db said whether a run taught
anything. Every train run now holds out a validation split (DLM's rule,
dlmstore.eval.split), measures its loss during the SFT phase, may stop
early, and after each phase asks the base model and the adapter the
document's probes; `dlm eval` does the same for any stored adapter as a run
of its own (runs.command = 'eval').

* `val_steps`: the val loss and perplexity at each evaluation step of a
  phase, beside `train_steps`.
* `evaluations`: one model (the base or an adapter version) evaluated by a
  run after a phase (or by `dlm eval`, phase 'eval'): its val loss and
  perplexity, its probe scores summed up, and for the adapter a train run
  produced, the eval cadence, the best val loss and its step, and whether
  and why early stopping ended the phase.
* `probe_results`: each probe's question, reference, the greedy answer and
  its scores (the reference's mean NLL, exact match, token-F1), per
  evaluation and probe row key.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "val_steps",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("phase", sa.Text(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("loss", sa.Float()),
        sa.Column("perplexity", sa.Float()),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("recorded_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "phase", "step", name="val_steps_pk"),
        sa.CheckConstraint("phase IN ('sft', 'preference')", name="val_steps_phase"),
    )
    op.create_table(
        "evaluations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("phase", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("adapter_version", sa.Integer()),
        sa.Column("val_loss", sa.Float()),
        sa.Column("val_perplexity", sa.Float()),
        sa.Column("val_rows", sa.Integer(), nullable=False),
        sa.Column("val_tokens", sa.Integer(), nullable=False),
        sa.Column("probes", sa.Integer(), nullable=False),
        sa.Column("probe_nll", sa.Float()),
        sa.Column("probe_exact", sa.Integer(), nullable=False),
        sa.Column("probe_f1", sa.Float()),
        sa.Column("eval_interval", sa.Integer()),
        sa.Column("best_step", sa.Integer()),
        sa.Column("best_val_loss", sa.Float()),
        sa.Column("stopped_early", sa.Integer()),
        sa.Column("stop_reason", sa.Text()),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.UniqueConstraint("run_id", "phase", "model", name="evaluations_run_phase_model"),
        sa.CheckConstraint("phase IN ('sft', 'preference', 'eval')", name="evaluations_phase"),
        sa.CheckConstraint(
            "(model = 'base' AND adapter_version IS NULL) OR model = printf('v%04d', adapter_version)",
            name="evaluations_model",
        ),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "probe_results",
        sa.Column(
            "evaluation_id", sa.Integer(), sa.ForeignKey("evaluations.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("row_key", sa.Text(), nullable=False),
        sa.Column("marked", sa.Integer(), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("reference", sa.Text(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=False),
        sa.Column("answer_tokens", sa.Integer(), nullable=False),
        sa.Column("nll", sa.Float()),
        sa.Column("exact", sa.Integer(), nullable=False),
        sa.Column("f1", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("evaluation_id", "row_key", name="probe_results_pk"),
    )


def downgrade() -> None:
    op.drop_table("probe_results")
    op.drop_table("evaluations")
    op.drop_table("val_steps")

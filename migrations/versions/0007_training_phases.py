"""Training phases: preference adapters, per-phase steps and TRL's extra step metrics.

Revision ID: 0007
Revises: 0006
Why this revision exists: `dlm train` gains a preference phase (DPO or ORPO)
after SFT, and one run can register two adapters: the SFT one and the
preference one trained from it. Adapters therefore carry their phase, the
preference method and the version they started from, and are unique per
(run, phase) instead of per run; steps are keyed by (run, phase, step),
since each phase counts its steps from 1; and the numbers TRL logs beside
the loss (rewards/chosen, rewards/margins, grad_norm, ...) get a table of
their own, one row per name, so `dlm metrics` can show them.

SQLite cannot change a primary key or drop a unique constraint in place, so
both tables are rebuilt: the old one is renamed aside, the new one created
under the real name (so `sqlite_master` keeps a plain CREATE statement),
the rows copied (every existing row is phase 'sft') and the old one
dropped. The `train_runs` view reads both tables and is recreated around
the rebuild. Downgrading keeps the SFT rows and drops the preference ones,
which the 0006 tables cannot hold (two adapters or two step 1s per run).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

PHASES = "phase IN ('sft', 'preference')"

VIEW_0006 = """
    CREATE VIEW train_runs AS
    SELECT r.id AS run_id, r.status, r.started_at, r.finished_at,
           a.version AS adapter_version, a.sha256 AS adapter_sha256, a.steps, a.final_loss,
           (SELECT COUNT(*) FROM train_steps s WHERE s.run_id = r.id) AS logged_steps
    FROM runs AS r LEFT JOIN adapters AS a ON a.run_id = r.id
    WHERE r.command = 'train'
"""

# The adapter columns show the run's newest adapter: the preference one of a
# run that trained both phases.
VIEW_0007 = """
    CREATE VIEW train_runs AS
    SELECT r.id AS run_id, r.status, r.started_at, r.finished_at,
           a.version AS adapter_version, a.phase AS adapter_phase, a.method AS adapter_method,
           a.sha256 AS adapter_sha256, a.steps, a.final_loss,
           (SELECT COUNT(*) FROM train_steps s WHERE s.run_id = r.id) AS logged_steps
    FROM runs AS r
    LEFT JOIN adapters AS a ON a.version = (SELECT MAX(version) FROM adapters WHERE run_id = r.id)
    WHERE r.command = 'train'
"""

ADAPTER_COLUMNS = "id, version, run_id, path, sha256, bytes, base_model, steps, final_loss, created_at"
STEP_COLUMNS = "run_id, step, epoch, loss, learning_rate, tokens_per_second, recorded_at"


def upgrade() -> None:
    op.execute("DROP VIEW train_runs")
    op.rename_table("adapters", "adapters_0006")
    op.create_table(
        "adapters",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("version", sa.Integer(), nullable=False, unique=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("phase", sa.Text(), nullable=False, server_default="sft"),
        sa.Column("method", sa.Text()),
        sa.Column("parent_version", sa.Integer(), sa.ForeignKey("adapters.version")),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("base_model", sa.Text(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("final_loss", sa.Float()),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.UniqueConstraint("run_id", "phase", name="adapters_run_phase"),
        sa.CheckConstraint(PHASES, name="adapters_phase"),
        sa.CheckConstraint(
            "(phase = 'sft' AND method IS NULL AND parent_version IS NULL) OR "
            "(phase = 'preference' AND method IS NOT NULL AND method IN ('dpo', 'orpo') "
            "AND parent_version IS NOT NULL)",
            name="adapters_preference_origin",
        ),
    )
    op.execute(
        f"INSERT INTO adapters ({ADAPTER_COLUMNS}, phase) SELECT {ADAPTER_COLUMNS}, 'sft' FROM adapters_0006"
    )
    op.drop_table("adapters_0006")

    op.rename_table("train_steps", "train_steps_0006")
    op.create_table(
        "train_steps",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("phase", sa.Text(), nullable=False, server_default="sft"),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Float()),
        sa.Column("loss", sa.Float()),
        sa.Column("learning_rate", sa.Float()),
        sa.Column("tokens_per_second", sa.Float()),
        sa.Column("recorded_at", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "phase", "step", name="train_steps_pk"),
        sa.CheckConstraint(PHASES, name="train_steps_phase"),
    )
    op.execute(
        f"INSERT INTO train_steps ({STEP_COLUMNS}, phase) SELECT {STEP_COLUMNS}, 'sft' FROM train_steps_0006"
    )
    op.drop_table("train_steps_0006")

    op.create_table(
        "train_step_metrics",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("phase", sa.Text(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("value", sa.Float()),
        sa.PrimaryKeyConstraint("run_id", "phase", "step", "name", name="train_step_metrics_pk"),
        sa.CheckConstraint(PHASES, name="train_step_metrics_phase"),
        sqlite_with_rowid=False,
    )
    op.execute(VIEW_0007)


def downgrade() -> None:
    op.execute("DROP VIEW train_runs")
    op.drop_table("train_step_metrics")

    op.rename_table("train_steps", "train_steps_0007")
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
    op.execute(
        f"INSERT INTO train_steps ({STEP_COLUMNS}) SELECT {STEP_COLUMNS} FROM train_steps_0007 "
        "WHERE phase = 'sft'"
    )
    op.drop_table("train_steps_0007")

    op.rename_table("adapters", "adapters_0007")
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
    op.execute(
        f"INSERT INTO adapters ({ADAPTER_COLUMNS}) SELECT {ADAPTER_COLUMNS} FROM adapters_0007 "
        "WHERE phase = 'sft'"
    )
    op.drop_table("adapters_0007")
    op.execute(VIEW_0006)

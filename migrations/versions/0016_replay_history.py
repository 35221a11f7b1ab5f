"""The replay history: every row a completed train run trained on, by content.

Revision ID: 0016
Revises: 0015
Why this revision exists: every `dlm train` builds its adapter from the
base on the document's current rows, so whatever an edit removes is gone
from the next adapter (issue 38). Replay trains such rows again; this
revision keeps what it needs, first: which rows each completed run trained
on, their content (compressed, so they can be tokenized again after a base
or `sequence_len` change or `dlm cache clear`), and the versions of the
document trained (generations), so that the draw is a function of those
versions and the seed, never of a clock.

* `history_rows`: one row per trained row key: its kind, what an edit of it
  replaces (`supersede_key`), where it came from, whether it is a probe,
  whether it is in the frozen retention slice, the first and last run and
  generation that trained it, and its content's size and sha256.
* `history_content`: the row's canonical JSON, zlib-compressed, in a table
  of its own so that scans of `history_rows` stay small.
* `history_generations`: one row per version of the document as trained
  (the identity of the row keys its runs trained).
* `history_runs`: which generation each completed train run belongs to.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "history_generations",
        sa.Column("generation", sa.Integer(), primary_key=True),
        sa.Column("rows_sha256", sa.Text(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("first_run_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
    )
    op.create_table(
        "history_runs",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("generation", sa.Integer(), nullable=False),
    )
    op.create_table(
        "history_rows",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("row_key", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("supersede_key", sa.Text()),
        sa.Column("origin", sa.Text(), nullable=False),
        sa.Column("probe", sa.Integer(), nullable=False),
        sa.Column("retention", sa.Integer(), nullable=False),
        sa.Column("first_run_id", sa.Integer(), nullable=False),
        sa.Column("last_run_id", sa.Integer(), nullable=False),
        sa.Column("first_generation", sa.Integer(), nullable=False),
        sa.Column("last_generation", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("content_sha256", sa.Text(), nullable=False),
        sa.UniqueConstraint("row_key", name="history_rows_row_key"),
        sa.CheckConstraint("kind IN ('text', 'messages', 'preference')", name="history_rows_kind"),
    )
    op.create_index("history_rows_supersede_key", "history_rows", ["supersede_key"])
    op.create_table(
        "history_content",
        sa.Column(
            "history_id", sa.Integer(), sa.ForeignKey("history_rows.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("content", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("history_content")
    op.drop_index("history_rows_supersede_key", table_name="history_rows")
    op.drop_table("history_rows")
    op.drop_table("history_runs")
    op.drop_table("history_generations")

"""Tokens taken from the other stores of a home, and the duplicates each run found.

Revision ID: 0013
Revises: 0012
Why this revision exists: two documents over one tree (one per
experiment, the usual way to fork a document) tokenized it twice, and
duplicated rows (vendored copies, generated files, near-identical
versions) were trained as often as they appear without a word.

* `entry_origins`: a cache entry a pass took from another store of the
  home (its pack hard-linked, or its bytes copied, beside this store.db)
  instead of tokenizing its row: which store and entry it came from, and
  how. It goes with its entry (ON DELETE CASCADE): entry ids are reused.
* `tokenization_events.cache_shared`: of a pass's hits, the rows whose
  tokens came from another store (0 for the passes before this revision).
* `row_signatures`: each text row's content hash and MinHash signature,
  by row key, so a warm `dlm show` or pass hashes nothing again.
* `dedup_runs` and `dedup_members`: the duplicate clusters each run found
  among its text rows, what each member is to its cluster's kept row, and
  what `training.dedup: exact|near` drops.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "entry_origins",
        sa.Column(
            "entry_id",
            sa.Integer(),
            sa.ForeignKey("cache_entries.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("from_store", sa.Text(), nullable=False),
        sa.Column("from_entry_id", sa.Integer(), nullable=False),
        sa.Column("how", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id")),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.CheckConstraint("how IN ('link', 'copy')", name="entry_origins_how"),
    )
    op.add_column(
        "tokenization_events",
        sa.Column("cache_shared", sa.Integer(), nullable=False, server_default="0"),
    )
    op.create_table(
        "row_signatures",
        sa.Column("row_key", sa.Text(), primary_key=True),
        sa.Column("scheme", sa.Text(), nullable=False),
        sa.Column("content_sha256", sa.Text(), nullable=False),
        sa.Column("shingles", sa.Integer(), nullable=False),
        sa.Column("minhash", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
    )
    op.create_table(
        "dedup_runs",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("mode", sa.Text(), nullable=False),
        sa.Column("scheme", sa.Text(), nullable=False),
        sa.Column("corpus_sha256", sa.Text(), nullable=False),
        sa.Column("members_run_id", sa.Integer(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("clusters", sa.Integer(), nullable=False),
        sa.Column("duplicate_rows", sa.Integer(), nullable=False),
        sa.Column("dropped_rows", sa.Integer(), nullable=False),
        sa.Column("signatures_computed", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.CheckConstraint("mode IN ('off', 'exact', 'near')", name="dedup_runs_mode"),
    )
    op.create_table(
        "dedup_members",
        sa.Column(
            "run_id", sa.Integer(), sa.ForeignKey("dedup_runs.run_id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("cluster", sa.Integer(), nullable=False),
        sa.Column("row_key", sa.Text(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("similarity", sa.Float(), nullable=False),
        sa.Column("drop_exact", sa.Integer(), nullable=False),
        sa.Column("drop_near", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "row_key", name="dedup_members_pk"),
    )


def downgrade() -> None:
    op.drop_table("dedup_members")
    op.drop_table("dedup_runs")
    op.drop_table("row_signatures")
    # SQLite's own DROP COLUMN (3.35+): a batch copy of the table would break the
    # run_hit_rates view over it while the copy is renamed into place.
    op.execute("ALTER TABLE tokenization_events DROP COLUMN cache_shared")
    op.drop_table("entry_origins")

"""Every document path a store served, and what a checkpoint must match to be resumed.

Revision ID: 0011
Revises: 0010
Why this revision exists: the second fault hunt found two things a store
could not know. `dlm stores gc` decided a store was orphaned from the
newest run's `dlm_path` alone, so a store used by a copied document, or
by a document reached through a symlink, was removed while its real
document still existed. `document_paths` records every (resolved) path of
a document that used the store; a store is orphaned only when every one
of them is gone. It is filled here from the paths earlier runs recorded.

A checkpoint was trusted on its folder alone: flipped bytes in its weights
resumed and published another adapter, and a source file edited after the
interrupt, or another `--max-steps`, resumed into an adapter that matched
neither run. `checkpoints.files` holds the sha256 of every file of the
folder, taken when the checkpoint is registered and checked before it is
resumed; `rows_sha256` and `plan_sha256` extend its identity to the rows
the run trains on (sources included) and every setting that changes the
adapter (the command line's overrides included). Checkpoints from before
this revision have them NULL and cannot be verified.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "document_paths",
        sa.Column("path", sa.Text(), primary_key=True),
        sa.Column("first_seen_at", sa.Text(), nullable=False),
        sa.Column("last_seen_at", sa.Text(), nullable=False),
        sa.Column("last_run_id", sa.Integer(), sa.ForeignKey("runs.id")),
    )
    op.execute(
        """
        INSERT INTO document_paths (path, first_seen_at, last_seen_at, last_run_id)
        SELECT dlm_path, MIN(started_at), MAX(started_at), MAX(id) FROM runs GROUP BY dlm_path
        """
    )
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("files", sa.Text(), nullable=True))
        batch.add_column(sa.Column("rows_sha256", sa.Text(), nullable=True))
        batch.add_column(sa.Column("plan_sha256", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("plan_sha256")
        batch.drop_column("rows_sha256")
        batch.drop_column("files")
    op.drop_table("document_paths")

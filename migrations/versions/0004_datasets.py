"""Token datasets.

Revision ID: 0004
Revises: 0003
Why this revision exists: datasets built by `dlm data` (pretrain shards, SFT
token/offset/mask files) are registered in the database, so "which shards,
how many tokens, which tokenizer" is one sqlite3 query. Registration is a
separate, idempotent step after the files are written, so parallel workers
can each write their own shards and register them afterwards.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False, unique=True),
        sa.Column("tokenizer_sha256", sa.Text(), nullable=False),
        sa.Column("token_dtype", sa.Text(), nullable=False),
        sa.Column("vocab_size", sa.Integer(), nullable=False),
        sa.Column("seed", sa.Integer()),
        sa.Column("meta_json", sa.Text(), nullable=False),
        sa.Column("registered_at", sa.Text(), nullable=False),
        sa.CheckConstraint("kind IN ('pretrain', 'sft')", name="datasets_kind"),
        sa.CheckConstraint("token_dtype IN ('uint16', 'uint32')", name="datasets_token_dtype"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "dataset_files",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "dataset_id", sa.Integer(), sa.ForeignKey("datasets.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("split", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("shard_index", sa.Integer(), nullable=False),
        sa.Column("token_offset", sa.Integer(), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("doc_count", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.UniqueConstraint("dataset_id", "path", name="dataset_files_path"),
    )
    op.execute(
        """
        CREATE VIEW dataset_split_totals AS
        SELECT d.id AS dataset_id, d.name, d.kind, f.split,
               COUNT(*) AS token_files, SUM(f.token_count) AS tokens, SUM(f.bytes) AS bytes
        FROM datasets AS d JOIN dataset_files AS f ON f.dataset_id = d.id
        WHERE f.role = 'tokens'
        GROUP BY d.id, f.split
        """
    )


def downgrade() -> None:
    op.execute("DROP VIEW dataset_split_totals")
    op.drop_table("dataset_files")
    op.drop_table("datasets")

"""The exports of a trained adapter: what `dlm export` wrote, where, and with which tools.

Revision ID: 0012
Revises: 0011
Why this revision exists: an adapter left the store only through `dlm
prompt`. `dlm export` now writes a merged Hugging Face folder, GGUF files
(the merged model at a quantisation, the adapter as a GGUF LoRA) and the
files a runtime needs (an Ollama Modelfile, a llama-server command line).
`exports` records each export: the adapter version and the choices it was
made with, the folder and the sha256 of every file in it (so `dlm prompt
--backend llama.cpp` can check a GGUF before it answers from it), the
versions of the tools that wrote them, and how long it took.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "exports",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("adapter_version", sa.Integer(), sa.ForeignKey("adapters.version"), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("quant", sa.Text()),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("files", sa.Text(), nullable=False),
        sa.Column("manifest_sha256", sa.Text(), nullable=False),
        sa.Column("tool_versions", sa.Text(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.CheckConstraint("target IN ('hf', 'ollama', 'llama-server')", name="exports_target"),
        sa.CheckConstraint(
            "(target = 'hf' AND quant IS NULL) OR quant IN ('Q4_K_M', 'Q5_K_M', 'Q6_K', 'Q8_0', 'F16')",
            name="exports_quant",
        ),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("exports")

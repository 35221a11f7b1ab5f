"""What an export mixed: `exports.mix` (dlm export --adapter-mix, and the gate's static mix).

Revision ID: 0020
Revises: 0019
Why this revision exists: a multi-adapter document can be exported as one
adapter mixed from several named ones (`dlm export --adapter-mix
knowledge:1.0,tone:0.5`, PEFT's `add_weighted_adapter`). `exports.adapter_version`
names one version, which says nothing of the others or of their weights, so
the export row records the mix itself: a JSON object with each part (the
adapter's name, the version mixed, its sha256, its weight), the combination
type, and the learned gate whose mean output gave the weights (`gate_id`,
null when the weights were given on the command line). NULL for an export
of one adapter.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("exports", sa.Column("mix", sa.Text()))


def downgrade() -> None:
    with op.batch_alter_table("exports") as batch:
        batch.drop_column("mix")

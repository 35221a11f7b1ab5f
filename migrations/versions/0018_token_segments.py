"""The tokenized cache's files are token segments, no longer "packs".

Revision ID: 0018
Revises: 0017
Why this revision exists: `dlm pack` (issue 39) writes a `.dlm.pack`, a
document and its store in one file, as DocumentLanguageModel names it.
The cache's append-only token files were called packs too, so one word
meant two things. They are token segments now:

* `token_packs` becomes `token_segments` (its rows' `path` still names
  each file as it was written: files made before this revision keep their
  `tokens/pack-*.bin` names, new ones are `tokens/segment-*.bin`);
* `cache_entries.pack_id` becomes `segment_id`, its index
  `cache_entries_segment_id`;
* `pass_snapshots.pack_reach` becomes `segment_reach`.

No data changes: SQLite renames in place and rewrites the foreign keys
that name the table.
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE token_packs RENAME TO token_segments")
    op.execute("ALTER TABLE cache_entries RENAME COLUMN pack_id TO segment_id")
    op.execute("DROP INDEX cache_entries_pack_id")
    op.execute("CREATE INDEX cache_entries_segment_id ON cache_entries (segment_id)")
    op.execute("ALTER TABLE pass_snapshots RENAME COLUMN pack_reach TO segment_reach")


def downgrade() -> None:
    op.execute("ALTER TABLE pass_snapshots RENAME COLUMN segment_reach TO pack_reach")
    op.execute("DROP INDEX cache_entries_segment_id")
    op.execute("ALTER TABLE cache_entries RENAME COLUMN segment_id TO pack_id")
    op.execute("CREATE INDEX cache_entries_pack_id ON cache_entries (pack_id)")
    op.execute("ALTER TABLE token_segments RENAME TO token_packs")

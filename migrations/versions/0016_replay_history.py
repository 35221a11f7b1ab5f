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

The layout is sized for 1,000,000 rows (issue 38's scale targets,
`bench/bench_replay.py`): a row's key is stored once, as its 32-byte
digest, in the primary key of a WITHOUT ROWID table (no second copy in an
index); the supersede key is the first 8 bytes of a sha256, an integer; the
content check is a CRC-32; the runs that trained a row are found through
its generations rather than stored per row, so recording an unchanged
retrain touches no row at all. The `history` view shows it all as text.

* `history_rows`: one row per trained row: its key digest, kind (0 text,
  1 messages, 2 preference), what an edit of it replaces (`supersede`),
  the `training.sources` file it came from (NULL: the document's body),
  whether it is a probe, whether it is in the frozen retention slice, the
  first and last generation that trained it, its content's size and
  checksum, and where its content is (`content_id`).
* `history_content`: the row's canonical JSON, zlib-compressed, in a table
  of its own (appended in order, so its pages stay full) so that scans of
  `history_rows` stay small. A trigger removes it with its row.
* `history_generations`: one row per version of the document as trained
  (the identity of the row keys its runs trained).
* `history_runs`: which generation each completed train run belongs to.
* `history` (view): `history_rows` with the key as `sha256:` text, the kind
  and origin as words, and the first and last run.
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
        "history_content",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("content", sa.LargeBinary(), nullable=False),
    )
    # No foreign key on content_id: SQLite would check it on every delete of
    # content by scanning history_rows (1,000,000 rows) without an index, and
    # an index on it costs ~20 B a row. The trigger keeps the two together.
    op.create_table(
        "history_rows",
        sa.Column("key", sa.LargeBinary(), primary_key=True),
        sa.Column("kind", sa.Integer(), nullable=False),
        sa.Column("supersede", sa.Integer()),
        sa.Column("source", sa.Text()),
        sa.Column("probe", sa.Integer(), nullable=False),
        sa.Column("retention", sa.Integer(), nullable=False),
        sa.Column("first_generation", sa.Integer(), nullable=False),
        sa.Column("last_generation", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("checksum", sa.Integer(), nullable=False),
        sa.Column("content_id", sa.Integer(), nullable=False),
        sa.CheckConstraint("length(key) = 32", name="history_rows_key"),
        sa.CheckConstraint("kind IN (0, 1, 2)", name="history_rows_kind"),
        sqlite_with_rowid=False,
    )
    op.execute(
        """
        CREATE TRIGGER history_rows_delete AFTER DELETE ON history_rows BEGIN
          DELETE FROM history_content WHERE id = old.content_id;
        END
        """
    )
    op.execute(
        """
        CREATE VIEW history AS
        SELECT 'sha256:' || lower(hex(h.key)) AS row_key,
               CASE h.kind WHEN 0 THEN 'text' WHEN 1 THEN 'messages' ELSE 'preference' END AS kind,
               h.supersede, COALESCE(h.source, 'body') AS origin, h.probe, h.retention,
               (SELECT first_run_id FROM history_generations WHERE generation = h.first_generation)
                 AS first_run_id,
               (SELECT max(run_id) FROM history_runs WHERE generation = h.last_generation) AS last_run_id,
               h.first_generation, h.last_generation, h.bytes, h.checksum, h.content_id
        FROM history_rows AS h
        """
    )


def downgrade() -> None:
    op.execute("DROP VIEW history")
    op.execute("DROP TRIGGER history_rows_delete")
    op.drop_table("history_rows")
    op.drop_table("history_content")
    op.drop_table("history_runs")
    op.drop_table("history_generations")

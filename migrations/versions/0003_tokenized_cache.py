"""Tokenized-section cache.

Revision ID: 0003
Revises: 0002
Why this revision exists: the tokenized cache keeps its manifest in store.db
instead of a JSON file, so LRU eviction, pruning and hit-rate metrics are SQL.
Tokens live in append-only pack files (token_packs); each cache entry points
at a byte range of one pack. cache_totals and token_packs.live_bytes are
kept by triggers so checking the cache size never scans the entries, and
the run_hit_rates view answers "how well did the cache work per run".
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "token_packs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("path", sa.Text(), nullable=False, unique=True),
        sa.Column("dtype", sa.Text(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("live_bytes", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id")),
        sa.CheckConstraint("dtype IN ('uint16', 'uint32')", name="token_packs_dtype"),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "cache_entries",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("row_key", sa.Text(), nullable=False),
        sa.Column("tokenizer_sha256", sa.Text(), nullable=False),
        sa.Column("sequence_len", sa.Integer(), nullable=False),
        sa.Column("pack_id", sa.Integer(), sa.ForeignKey("token_packs.id"), nullable=False),
        sa.Column("byte_offset", sa.Integer(), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.Text(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("checksum", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.Column("last_access_at", sa.Text(), nullable=False),
        sa.Column("last_run_id", sa.Integer(), sa.ForeignKey("runs.id")),
        sa.UniqueConstraint("row_key", "tokenizer_sha256", "sequence_len", name="cache_entries_key"),
    )
    op.create_index("cache_entries_lru", "cache_entries", ["last_access_at", "last_run_id"])
    op.create_index("cache_entries_pack_id", "cache_entries", ["pack_id"])
    op.create_table(
        "cache_totals",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("entry_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("bytes", sa.Integer(), nullable=False, server_default="0"),
        sa.CheckConstraint("id = 1", name="cache_totals_single_row"),
    )
    op.execute("INSERT INTO cache_totals (id, entry_count, bytes) VALUES (1, 0, 0)")
    op.execute(
        """
        CREATE TRIGGER cache_entries_after_insert AFTER INSERT ON cache_entries BEGIN
          UPDATE cache_totals SET entry_count = entry_count + 1, bytes = bytes + NEW.bytes WHERE id = 1;
          UPDATE token_packs SET live_bytes = live_bytes + NEW.bytes WHERE id = NEW.pack_id;
        END
        """
    )
    op.execute(
        """
        CREATE TRIGGER cache_entries_after_delete AFTER DELETE ON cache_entries BEGIN
          UPDATE cache_totals SET entry_count = entry_count - 1, bytes = bytes - OLD.bytes WHERE id = 1;
          UPDATE token_packs SET live_bytes = live_bytes - OLD.bytes WHERE id = OLD.pack_id;
        END
        """
    )
    op.execute(
        """
        CREATE TRIGGER cache_entries_after_update_size AFTER UPDATE OF bytes, pack_id ON cache_entries BEGIN
          UPDATE cache_totals SET bytes = bytes - OLD.bytes + NEW.bytes WHERE id = 1;
          UPDATE token_packs SET live_bytes = live_bytes - OLD.bytes WHERE id = OLD.pack_id;
          UPDATE token_packs SET live_bytes = live_bytes + NEW.bytes WHERE id = NEW.pack_id;
        END
        """
    )
    op.create_table(
        "tokenization_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False, unique=True
        ),
        sa.Column("total_sections", sa.Integer(), nullable=False),
        sa.Column("total_rows", sa.Integer(), nullable=False),
        sa.Column("cache_hits", sa.Integer(), nullable=False),
        sa.Column("cache_misses", sa.Integer(), nullable=False),
        sa.Column("total_tokenize_seconds", sa.Float(), nullable=False),
        sa.Column("cache_bytes_after", sa.Integer(), nullable=False),
        sa.Column("cache_mode", sa.Text(), nullable=False),
        sa.Column("tokenizer_sha256", sa.Text(), nullable=False),
        sa.Column("sequence_len", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Text(), nullable=False),
        sa.CheckConstraint("cache_mode IN ('on', 'off', 'bypassed')", name="tokenization_events_cache_mode"),
    )
    op.execute(
        """
        CREATE VIEW run_hit_rates AS
        SELECT r.id AS run_id, r.command, r.status, r.started_at,
               e.total_rows, e.cache_hits, e.cache_misses,
               CASE WHEN e.cache_hits + e.cache_misses > 0
                    THEN ROUND(1.0 * e.cache_hits / (e.cache_hits + e.cache_misses), 4) END AS hit_rate,
               e.total_tokenize_seconds, e.cache_bytes_after, e.cache_mode
        FROM runs AS r JOIN tokenization_events AS e ON e.run_id = r.id
        """
    )


def downgrade() -> None:
    op.execute("DROP VIEW run_hit_rates")
    op.drop_table("tokenization_events")
    op.execute("DROP TRIGGER cache_entries_after_update_size")
    op.execute("DROP TRIGGER cache_entries_after_delete")
    op.execute("DROP TRIGGER cache_entries_after_insert")
    op.drop_table("cache_totals")
    op.drop_index("cache_entries_pack_id", "cache_entries")
    op.drop_index("cache_entries_lru", "cache_entries")
    op.drop_table("cache_entries")
    op.drop_table("token_packs")

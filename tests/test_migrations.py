"""Migrations: empty to head, each revision keeps seeded data, models agree."""

from __future__ import annotations

import ast
import re
import sqlite3
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

import dlmstore.migrations
from dlmstore.store.database import current_revision, migrate
from dlmstore.store.schema import HEAD_REVISION, REVISIONS, metadata

from .helpers import VALID_ID

VERSIONS = Path(dlmstore.migrations.__file__).parent / "versions"

# Rows inserted at the revision that created each table, and checked after
# every later revision: a migration that loses or mangles data fails here.
SEEDS: dict[str, list[str]] = {
    "0001": [
        f"INSERT INTO store_info (id, dlm_id, created_at, dlmstore_version) "
        f"VALUES (1, '{VALID_ID}', '2026-01-01T00:00:00.000Z', '0.0.1')"
    ],
    "0002": [
        "INSERT INTO runs (command, status, started_at, finished_at, dlm_path, dlm_sha256, "
        "dlmstore_version, pid, error) VALUES ('train', 'failed', '2026-01-02T00:00:00.000Z', "
        "'2026-01-02T00:01:00.000Z', '/doc.dlm', 'ab', '0.0.1', 7, 'interrupted')"
    ],
    "0003": [
        "INSERT INTO token_packs (path, dtype, bytes, created_at, run_id) "
        "VALUES ('tokens/p1.bin', 'uint16', 8, '2026-01-03T00:00:00.000Z', 1)",
        "INSERT INTO cache_entries (row_key, tokenizer_sha256, sequence_len, pack_id, byte_offset, "
        "token_count, dtype, bytes, checksum, created_at, last_access_at, last_run_id) VALUES "
        "('sha256:r', 'sha256:t', 2048, 1, 0, 4, 'uint16', 8, 'crc32:00000000', "
        "'2026-01-03T00:00:00.000Z', '2026-01-03T00:00:00.000Z', 1)",
        "INSERT INTO tokenization_events (run_id, total_sections, total_rows, cache_hits, cache_misses, "
        "total_tokenize_seconds, cache_bytes_after, cache_mode, tokenizer_sha256, sequence_len, created_at) "
        "VALUES (1, 2, 3, 1, 2, 0.5, 8, 'on', 'sha256:t', 2048, '2026-01-03T00:00:00.000Z')",
    ],
    "0004": [
        "INSERT INTO datasets (name, kind, path, tokenizer_sha256, token_dtype, vocab_size, seed, "
        "meta_json, registered_at) VALUES ('wiki', 'pretrain', '/d', 'sha256:t', 'uint16', 49152, 42, "
        "'{}', '2026-01-04T00:00:00.000Z')",
        "INSERT INTO dataset_files (dataset_id, split, role, path, shard_index, token_offset, "
        "token_count, doc_count, bytes, sha256) VALUES (1, 'train', 'tokens', 'train/shard_00000.bin', "
        "0, 0, 100, 3, 200, 'sha256:f')",
    ],
    "0005": [
        "INSERT INTO source_stats (path, relpath, size, mtime_ns, ctime_ns, inode, status, digest, "
        "checked_ns) VALUES ('/src/a.py', 'a.py', 10, 1, 1, 7, 'ok', 'ab', 5)"
    ],
    "0006": [
        "INSERT INTO adapters (version, run_id, path, sha256, bytes, base_model, steps, final_loss, created_at) "
        "VALUES (1, 1, 'adapter/versions/v0001', 'sha256:a', 10, 'smollm2-135m', 3, 2.5, 'x')",
        "INSERT INTO train_steps (run_id, step, epoch, loss, learning_rate, tokens_per_second, recorded_at) "
        "VALUES (1, 1, 0.5, 2.5, 0.0002, 100.0, 'x')",
        "INSERT INTO lock_records (run_id, created_at, decision, lock_version, dlm_sha256, hardware_tier, "
        "determinism_class, seed, lock_json) VALUES (1, 'x', 'written', 1, 'ab', 'cpu', 'advisory', 42, '{}')",
    ],
    # Run 2 trained both phases: an SFT adapter and a DPO one started from it, step 1 in each.
    "0007": [
        "INSERT INTO runs (command, status, started_at, dlm_path, dlm_sha256, dlmstore_version) "
        "VALUES ('train', 'completed', '2026-01-07T00:00:00.000Z', '/doc.dlm', 'ab', '0.0.1')",
        "INSERT INTO adapters (version, run_id, path, sha256, bytes, base_model, steps, final_loss, created_at) "
        "VALUES (2, 2, 'adapter/versions/v0002', 'sha256:b', 10, 'smollm2-135m', 4, 2.0, 'x')",
        "INSERT INTO adapters (version, run_id, phase, method, parent_version, path, sha256, bytes, base_model, "
        "steps, final_loss, created_at) VALUES (3, 2, 'preference', 'dpo', 2, 'adapter/versions/v0003', "
        "'sha256:c', 10, 'smollm2-135m', 2, 0.69, 'x')",
        "INSERT INTO train_steps (run_id, step, loss, recorded_at) VALUES (2, 1, 2.0, 'x')",
        "INSERT INTO train_steps (run_id, phase, step, loss, recorded_at) VALUES (2, 'preference', 1, 0.69, 'x')",
        "INSERT INTO train_step_metrics (run_id, phase, step, name, value) "
        "VALUES (2, 'preference', 1, 'rewards/margins', 0.25)",
    ],
    # Run 3 resumed run 1 on two ranks, mixing in a pretrain dataset, and left a checkpoint.
    "0008": [
        "INSERT INTO runs (command, status, started_at, dlm_path, dlm_sha256, dlmstore_version, world_size, "
        "resumed_from) VALUES ('train', 'failed', '2026-01-08T00:00:00.000Z', '/doc.dlm', 'ab', '0.0.1', 2, 1)",
        "INSERT INTO run_datasets (run_id, position, path, kind, name, split, weight, meta_sha256, "
        "tokenizer_sha256, tokens_available, samples_used, tokens_used) "
        "VALUES (3, 0, '/data/wiki', 'pretrain', 'wiki', 'train', 2.0, 'sha256:m', 'sha256:t', 100, 4, 64)",
        "INSERT INTO run_ranks (run_id, phase, rank, samples, tokens) VALUES (3, 'sft', 1, 2, 32)",
        "INSERT INTO checkpoints (run_id, phase, step, path, dlm_sha256, base_model, inputs_sha256, world_size, "
        "micro_batch_size, grad_accum, seed, created_at) VALUES (3, 'sft', 2, 'checkpoints/run3/checkpoint-2', "
        "'ab', 'smollm2-135m', 'sha256:i', 2, 1, 1, 42, 'x')",
    ],
    # Run 3's pass used entry 1 (one packed id); the stat record of a.py knows its row's key.
    "0009": [
        "INSERT INTO cache_uses (run_id, used_at, entries, entry_ids) "
        "VALUES (3, '2026-01-09T00:00:00.000Z', 1, X'0100000000000000')",
        "UPDATE source_stats SET row_key = 'sha256:k' WHERE relpath = 'a.py'",
    ],
    # Run 3's pass left a snapshot of one folder and one file; an entry's checksum was rewritten.
    "0010": [
        "INSERT INTO pass_snapshots (document, context, dlm_sha256, tokenizer_sha256, sequence_len, run_id, "
        "created_at, dir_paths, dir_stamps, file_paths, file_stamps, cache_changes, pack_reach, entry_ids, "
        "result) VALUES ('/doc.dlm', '{}', 'ab', 'sha256:t', 2048, 3, 'x', X'2F737263', X'01', "
        "X'2F7372632F612E7079', X'02', 0, '{}', X'0100000000000000', '{}')",
        "UPDATE cache_entries SET checksum = checksum",
    ],
    "0011": [
        "UPDATE checkpoints SET files = '{\"a.bin\": \"sha256:00\"}', rows_sha256 = 'sha256:r', "
        "plan_sha256 = 'sha256:p'",
    ],
    # Adapter v1 was exported once, for Ollama at Q4_K_M.
    "0012": [
        "INSERT INTO exports (adapter_version, target, quant, path, files, manifest_sha256, tool_versions, "
        "seconds, created_at) VALUES (1, 'ollama', 'Q4_K_M', '/exports/v0001-Q4_K_M', "
        """'{"Modelfile": {"sha256": "sha256:00", "bytes": 9}}', 'sha256:m', '{"llama_cpp": "0.3.36"}', """
        "1.5, '2026-01-12T00:00:00.000Z')",
    ],
    # Entry 1 was taken from another store; run 3 found one exact cluster of two rows.
    "0013": [
        "INSERT INTO entry_origins (entry_id, from_store, from_entry_id, how, run_id, created_at) "
        "VALUES (1, '01KPQ1FFEDGPPSMWRAS18SAZST', 9, 'link', 3, '2026-01-13T00:00:00.000Z')",
        "UPDATE tokenization_events SET cache_shared = 1",
        "INSERT INTO row_signatures (row_key, scheme, content_sha256, shingles, minhash, created_at) "
        "VALUES ('sha256:r', 'minhash-v1', 'sha256:c', 3, X'01000000', '2026-01-13T00:00:00.000Z')",
        "INSERT INTO dedup_runs (run_id, mode, scheme, corpus_sha256, members_run_id, rows, clusters, "
        "duplicate_rows, dropped_rows, signatures_computed, seconds, created_at) VALUES (3, 'exact', "
        "'minhash-v1', 'sha256:x', 3, 2, 1, 1, 1, 2, 0.1, '2026-01-13T00:00:00.000Z')",
        "INSERT INTO dedup_members (run_id, cluster, row_key, path, similarity, drop_exact, drop_near) "
        "VALUES (3, 1, 'sha256:r', 'a.py', 1.0, 0, 0), (3, 1, 'sha256:s', 'b.py', 1.0, 1, 1)",
    ],
    # Run 3 validated at step 2 and evaluated the base and adapter v0001 on one probe.
    "0014": [
        "INSERT INTO val_steps (run_id, phase, step, loss, perplexity, rows, tokens, recorded_at) "
        "VALUES (3, 'sft', 2, 1.5, 4.48, 2, 40, '2026-01-14T00:00:00.000Z')",
        "INSERT INTO evaluations (run_id, phase, model, adapter_version, val_loss, val_perplexity, val_rows, "
        "val_tokens, probes, probe_nll, probe_exact, probe_f1, seconds, created_at) VALUES "
        "(3, 'sft', 'base', NULL, 2.0, 7.39, 2, 40, 1, 3.0, 0, 0.2, 0.5, '2026-01-14T00:00:00.000Z'), "
        "(3, 'sft', 'v0001', 1, 1.5, 4.48, 2, 40, 1, 0.5, 1, 1.0, 0.5, '2026-01-14T00:00:00.000Z')",
        "INSERT INTO probe_results (evaluation_id, position, row_key, marked, question, reference, answer, "
        "answer_tokens, nll, exact, f1) VALUES (2, 0, 'sha256:q', 1, 'Q?', 'A.', 'A.', 3, 0.5, 1, 1.0)",
    ],
    # Run 3 held out 2 rows with seed 42; one, b.py, is an exact copy of a.py, which trained.
    "0015": [
        "INSERT INTO val_splits (run_id, mode, seed, val_rows, contaminated_rows, kept_out_rows, from_run_id, "
        "seconds, created_at) VALUES (3, 'off', 42, 2, 1, 0, NULL, 0.01, '2026-01-15T00:00:00.000Z')",
        "INSERT INTO val_contamination (run_id, row_key, path, train_row_key, train_path, kind, similarity, "
        "kept_out) VALUES (3, 'sha256:s', 'b.py', 'sha256:r', 'a.py', 'exact', 1.0, 0)",
    ],
    # Run 3 opened generation 1 and trained one source file's row, whose content history keeps.
    "0016": [
        "INSERT INTO history_generations (generation, rows_sha256, rows, first_run_id, created_at) "
        "VALUES (1, 'sha256:g', 1, 3, '2026-01-16T00:00:00.000Z')",
        "INSERT INTO history_runs (run_id, generation) VALUES (3, 1)",
        "INSERT INTO history_content (id, content) VALUES (1, X'789c')",
        "INSERT INTO history_rows (key, kind, supersede, source, probe, retention, first_generation, "
        "last_generation, bytes, checksum, content_id) VALUES (zeroblob(32), 0, 12345, 'src/a.py', 0, 1, 1, 1, "
        "40, -7, 1)",
    ],
    # Run 3 replayed that row in SFT; its adapter v0001 forgot a little of the retention slice.
    "0017": [
        "INSERT INTO replay_runs (run_id, generation, sft_candidates, preference_candidates, sft_new, "
        "preference_new, sft_drawn, preference_drawn, draw_sha256, skipped) "
        "VALUES (3, 1, 1, 0, 2, 0, 1, 0, 'sha256:d', NULL)",
        "INSERT INTO replay_draws (run_id, key, phase, weight, last_generation) "
        "VALUES (3, zeroblob(32), 'sft', 0.5, 1)",
        "UPDATE evaluations SET retention_loss = 1.75, retention_rows = 1, retention_previous_loss = 1.5, "
        "retention_delta = 0.25 WHERE model = 'v0001'",
        "UPDATE probe_results SET retained = 1",
    ],
    # A segment written after the rename, beside 0003's file written as a pack.
    "0018": [
        "INSERT INTO token_segments (path, dtype, bytes, created_at, run_id) "
        "VALUES ('tokens/segment-1.bin', 'uint16', 4, '2026-01-20T00:00:00.000Z', 3)",
        "INSERT INTO cache_entries (row_key, tokenizer_sha256, sequence_len, segment_id, byte_offset, "
        "token_count, dtype, bytes, checksum, created_at, last_access_at, last_run_id) VALUES "
        "('sha256:s', 'sha256:t', 2048, 2, 0, 2, 'uint16', 4, 'crc32:00000000', "
        "'2026-01-20T00:00:00.000Z', '2026-01-20T00:00:00.000Z', 3)",
    ],
    # Run 4 trained the named adapter 'tone' (v0004); the invocation's gate routes between it and v0001.
    "0019": [
        "INSERT INTO runs (command, status, started_at, dlm_path, dlm_sha256, dlmstore_version, adapter) "
        "VALUES ('train', 'completed', '2026-01-21T00:00:00.000Z', '/doc.dlm', 'ab', '0.0.1', 'tone')",
        "INSERT INTO adapters (version, run_id, path, sha256, bytes, base_model, steps, final_loss, created_at, "
        "name) VALUES (4, 4, 'adapter/versions/v0004', 'sha256:e', 10, 'smollm2-135m', 3, 2.5, 'x', 'tone')",
        "INSERT INTO gates (run_id, path, mode, sha256, bytes, adapters, input_dim, hidden_proj_dim, steps, lr, "
        "entropy_lambda, seed, prompts, final_loss, mean_weights, created_at) VALUES (4, 'gate/run4', 'trained', "
        "'sha256:g', 20, '[]', 64, 8, 10, 0.0003, 0.01, 42, 8, 0.5, '{\"tone\": 0.5}', 'x')",
    ],
    # Adapter v4 (tone) was exported mixed with v1 at half weight.
    "0020": [
        "INSERT INTO exports (adapter_version, target, quant, path, files, manifest_sha256, tool_versions, "
        "seconds, created_at, mix) VALUES (4, 'hf', NULL, '/exports/mix-hf', '{}', 'sha256:m', '{}', 2.0, 'x', "
        """'{"parts": [{"name": "tone", "version": 4, "sha256": "sha256:e", "weight": 0.5}], """
        """ "combination": "linear", "gate_id": null}')""",
    ],
}
CHECKS: dict[str, tuple[str, list[tuple[object, ...]]]] = {
    "0001": ("SELECT dlm_id, created_at FROM store_info", [(VALID_ID, "2026-01-01T00:00:00.000Z")]),
    "0002": (
        "SELECT id, command, status, error FROM runs WHERE id = 1",
        [(1, "train", "failed", "interrupted")],
    ),
    "0003": (
        "SELECT c.entry_count = (SELECT count(*) FROM cache_entries), "
        "c.bytes = (SELECT sum(bytes) FROM cache_entries), p.live_bytes, h.hit_rate "
        "FROM cache_totals c, token_packs p, run_hit_rates h WHERE p.id = 1",
        [(1, 1, 8, 0.3333)],
    ),
    "0004": ("SELECT name, split, tokens FROM dataset_split_totals", [("wiki", "train", 100)]),
    "0005": ("SELECT relpath, status FROM source_stats", [("a.py", "ok")]),
    "0006": ("SELECT adapter_version, steps, logged_steps FROM train_runs WHERE run_id = 1", [(1, 3, 1)]),
    "0007": (
        "SELECT v.adapter_version, v.adapter_phase, v.adapter_method, v.logged_steps, "
        "(SELECT group_concat(name || '=' || value) FROM train_step_metrics m WHERE m.run_id = v.run_id) "
        "FROM train_runs v WHERE run_id = 2",
        [(3, "preference", "dpo", 2, "rewards/margins=0.25")],
    ),
    "0008": (
        "SELECT r.world_size, r.resumed_from, d.tokens_used, k.samples, c.step "
        "FROM runs r, run_datasets d, run_ranks k, checkpoints c WHERE r.id = 3",
        [(2, 1, 64, 2, 2)],
    ),
    "0009": (
        "SELECT u.run_id, u.entries, length(u.entry_ids), s.row_key FROM cache_uses u, source_stats s",
        [(3, 1, 8, "sha256:k")],
    ),
    "0010": (
        "SELECT s.document, s.run_id, length(s.entry_ids), t.changes FROM pass_snapshots s, cache_totals t",
        [("/doc.dlm", 3, 8, 1)],
    ),
    "0011": (
        "SELECT (SELECT count(*) FROM document_paths), (SELECT max(last_run_id) FROM document_paths), "
        "c.files, c.rows_sha256, c.plan_sha256 FROM checkpoints c",
        [(1, 3, '{"a.bin": "sha256:00"}', "sha256:r", "sha256:p")],
    ),
    "0012": (
        "SELECT e.id, a.version, e.target, e.quant, json_extract(e.tool_versions, '$.llama_cpp') "
        "FROM exports e JOIN adapters a ON a.version = e.adapter_version",
        [(1, 1, "ollama", "Q4_K_M", "0.3.36")],
    ),
    "0013": (
        "SELECT o.from_store, e.row_key, t.cache_shared, s.content_sha256, d.clusters, "
        "(SELECT sum(drop_exact) FROM dedup_members m WHERE m.run_id = d.run_id) "
        "FROM entry_origins o JOIN cache_entries e ON e.id = o.entry_id, tokenization_events t, "
        "row_signatures s, dedup_runs d",
        [("01KPQ1FFEDGPPSMWRAS18SAZST", "sha256:r", 1, "sha256:c", 1, 1)],
    ),
    "0014": (
        "SELECT e.model, e.val_loss, p.answer, p.exact, v.loss FROM evaluations e "
        "JOIN probe_results p ON p.evaluation_id = e.id JOIN val_steps v ON v.run_id = e.run_id",
        [("v0001", 1.5, "A.", 1, 1.5)],
    ),
    "0015": (
        "SELECT s.seed, s.contaminated_rows, c.path, c.train_path, c.kind FROM val_splits s "
        "JOIN val_contamination c ON c.run_id = s.run_id JOIN dedup_members m ON m.row_key = c.row_key",
        [(42, 1, "b.py", "a.py", "exact")],
    ),
    "0016": (
        "SELECT g.generation, h.last_run_id, h.origin, h.retention, length(c.content) FROM history_generations g "
        "JOIN history h ON h.first_run_id = g.first_run_id JOIN history_content c ON c.id = h.content_id",
        [(1, 3, "src/a.py", 1, 2)],
    ),
    "0017": (
        "SELECT r.sft_drawn, d.weight, h.origin, e.retention_delta, e.retained_probes, p.retained "
        "FROM replay_runs r JOIN replay_draws d ON d.run_id = r.run_id "
        "JOIN history h ON h.row_key = 'sha256:' || lower(hex(d.key)), evaluations e "
        "JOIN probe_results p ON p.evaluation_id = e.id WHERE e.model = 'v0001'",
        [(1, 0.5, "src/a.py", 0.25, 0, 1)],
    ),
    "0018": (
        "SELECT p.path, p.live_bytes, e.row_key FROM token_segments p JOIN cache_entries e ON e.segment_id = p.id "
        "ORDER BY p.id",
        [("tokens/p1.bin", 8, "sha256:r"), ("tokens/segment-1.bin", 4, "sha256:s")],
    ),
    "0019": (
        "SELECT r.adapter, a.name, g.mode, json_extract(g.mean_weights, '$.tone') FROM runs r "
        "JOIN adapters a ON a.run_id = r.id JOIN gates g ON g.run_id = r.id",
        [("tone", "tone", "trained", 0.5)],
    ),
    "0020": (
        "SELECT adapter_version, json_extract(mix, '$.parts[0].weight'), json_extract(mix, '$.combination') "
        "FROM exports WHERE mix IS NOT NULL",
        [(4, 0.5, "linear")],
    ),
}

#: Names a later revision changed, old -> new: a check of older data run once the database is at
#: or past that revision says the new names.
RENAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "0018": (("token_packs", "token_segments"), ("pack_id", "segment_id"), ("pack_reach", "segment_reach")),
}


def _as_of(query: str, revision: str) -> str:
    """``query`` with the names the revisions up to ``revision`` renamed."""
    for renamed_in, pairs in RENAMES.items():
        if REVISIONS.index(renamed_in) <= REVISIONS.index(revision):
            for old, new in pairs:
                query = re.sub(rf"\b{old}\b", new, query)
    return query


def _config(db: Path) -> Config:
    config = Config()
    config.set_main_option("script_location", str(VERSIONS.parent))
    config.set_main_option("sqlalchemy.url", f"sqlite:///{db}")
    return config


def test_known_revisions_match_the_alembic_script_directory() -> None:
    script = ScriptDirectory(str(VERSIONS.parent))
    chain = [rev.revision for rev in reversed(list(script.walk_revisions()))]
    assert tuple(chain) == REVISIONS
    assert script.get_current_head() == HEAD_REVISION


def test_revision_files_are_numbered_in_order_and_say_why_they_exist() -> None:
    files = sorted(p for p in VERSIONS.glob("[0-9]*.py"))
    assert [p.name[:4] for p in files] == list(REVISIONS)
    for path in files:
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert "Why this revision exists:" in docstring, path.name


def test_an_empty_database_migrates_to_head(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    migrate(db, VALID_ID)
    assert current_revision(db) == HEAD_REVISION
    tables = {r[0] for r in sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert set(metadata.tables) <= tables


@pytest.mark.parametrize("index", range(1, len(REVISIONS)))
def test_each_revision_keeps_the_data_seeded_before_it(tmp_path: Path, index: int) -> None:
    db = tmp_path / "store.db"
    config = _config(db)
    for revision in REVISIONS[:index]:
        command.upgrade(config, revision)
        conn = sqlite3.connect(db)
        for statement in SEEDS.get(revision, []):
            conn.execute(statement)
        conn.commit()
        conn.close()
    command.upgrade(config, REVISIONS[index])
    conn = sqlite3.connect(db)
    for revision in REVISIONS[: index + 1]:
        if revision in CHECKS and revision in REVISIONS[:index]:
            query, expected = CHECKS[revision]
            assert conn.execute(_as_of(query, REVISIONS[index])).fetchall() == expected, revision


def test_every_revision_has_seed_rows_and_checks() -> None:
    assert set(SEEDS) == set(REVISIONS) == set(CHECKS)


def test_models_and_migrations_agree(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    migrate(db, VALID_ID)
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    engine.dispose()
    assert diff == []


def test_every_revision_downgrades_cleanly_and_upgrades_again(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    config = _config(db)
    command.upgrade(config, "head")
    command.downgrade(config, "base")
    command.upgrade(config, "head")
    assert current_revision(db) == HEAD_REVISION


def _at_0006_with_a_trained_run(db: Path) -> Config:
    return _seeded_up_to(db, "0006")


def _seeded_up_to(db: Path, last: str) -> Config:
    """The database at revision ``last``, with the seed rows of every revision up to it."""
    config = _config(db)
    for revision in REVISIONS[: REVISIONS.index(last) + 1]:
        command.upgrade(config, revision)
        conn = sqlite3.connect(db)
        for statement in SEEDS[revision]:
            conn.execute(statement)
        conn.commit()
        conn.close()
    return config


def test_0007_makes_existing_adapters_and_steps_sft_and_allows_a_second_phase_per_run(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    config = _at_0006_with_a_trained_run(db)
    command.upgrade(config, "0007")
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT version, phase, method, parent_version, steps FROM adapters").fetchall() == [
        (1, "sft", None, None, 3)
    ]
    assert conn.execute("SELECT run_id, phase, step, loss FROM train_steps").fetchall() == [
        (1, "sft", 1, 2.5)
    ]
    for statement in SEEDS["0007"]:
        conn.execute(statement)
    conn.commit()
    assert conn.execute(
        "SELECT run_id, adapter_version, adapter_phase FROM train_runs ORDER BY run_id"
    ).fetchall() == [
        (1, 1, "sft"),
        (2, 3, "preference"),
    ]


@pytest.mark.parametrize(
    "values",
    [
        "'preference', NULL, 1",  # no method
        "'preference', 'ppo', 1",  # not a preference method
        "'preference', 'dpo', NULL",  # not started from an SFT adapter
        "'sft', 'dpo', NULL",  # an sft adapter has no method
        "'reward', NULL, NULL",  # not a phase
    ],
)
def test_0007_refuses_an_adapter_whose_phase_method_and_parent_disagree(tmp_path: Path, values: str) -> None:
    db = tmp_path / "store.db"
    config = _at_0006_with_a_trained_run(db)
    command.upgrade(config, "0007")
    conn = sqlite3.connect(db)
    with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"):
        conn.execute(
            "INSERT INTO adapters (version, run_id, phase, method, parent_version, path, sha256, bytes, "
            f"base_model, steps, created_at) VALUES (2, 1, {values}, 'p', 's', 1, 'b', 1, 'x')"
        )


def test_downgrading_0007_keeps_the_sft_rows_and_drops_the_preference_ones(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    config = _at_0006_with_a_trained_run(db)
    command.upgrade(config, "0007")
    conn = sqlite3.connect(db)
    for statement in SEEDS["0007"]:
        conn.execute(statement)
    conn.commit()
    conn.close()
    command.downgrade(config, "0006")
    conn = sqlite3.connect(db)
    assert conn.execute(
        "SELECT run_id, adapter_version, logged_steps FROM train_runs ORDER BY run_id"
    ).fetchall() == [
        (1, 1, 1),
        (2, 2, 1),
    ]
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "train_step_metrics" not in tables and not any(t.endswith("_0007") for t in tables)


def test_0018_names_the_dtype_check_for_segments_and_never_hands_out_a_deleted_segments_id_again(
    tmp_path: Path,
) -> None:
    db = tmp_path / "store.db"
    config = _seeded_up_to(db, "0017")
    conn = sqlite3.connect(db)
    conn.execute(
        "INSERT INTO token_packs (path, dtype, bytes, created_at) VALUES ('tokens/pack-2.bin', 'uint16', 0, 'x')"
    )
    # Deleted as a prune drops a file no entry points into any more.
    conn.execute("DELETE FROM token_packs WHERE path = 'tokens/pack-2.bin'")
    conn.commit()
    conn.close()
    command.upgrade(config, "0018")
    conn = sqlite3.connect(db)
    with pytest.raises(sqlite3.IntegrityError, match="^CHECK constraint failed: token_segments_dtype$"):
        conn.execute(
            "INSERT INTO token_segments (path, dtype, bytes, created_at) VALUES ('tokens/x.bin', 'uint8', 0, 'x')"
        )
    cursor = conn.execute(
        "INSERT INTO token_segments (path, dtype, bytes, created_at) VALUES ('tokens/segment-3.bin', 'uint16', 0, 'x')"
    )
    assert cursor.lastrowid == 3  # not 2, the id the deleted file had
    conn.commit()
    conn.close()
    command.downgrade(config, "0017")
    conn = sqlite3.connect(db)
    with pytest.raises(sqlite3.IntegrityError, match="^CHECK constraint failed: token_packs_dtype$"):
        conn.execute(
            "INSERT INTO token_packs (path, dtype, bytes, created_at) VALUES ('tokens/x.bin', 'uint8', 0, 'x')"
        )
    cursor = conn.execute(
        "INSERT INTO token_packs (path, dtype, bytes, created_at) VALUES ('tokens/pack-4.bin', 'uint16', 0, 'x')"
    )
    assert cursor.lastrowid == 4
    assert conn.execute("SELECT path, live_bytes FROM token_packs ORDER BY id").fetchall() == [
        ("tokens/p1.bin", 8),
        ("tokens/segment-3.bin", 0),
        ("tokens/pack-4.bin", 0),
    ]

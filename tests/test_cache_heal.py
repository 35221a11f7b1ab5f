"""A pass that meets a damaged segment heals the cache and leaves its manifest consistent.

`dlm tokenize` (and `dlm train`) re-tokenize the rows whose entries point
at a missing, short or damaged segment; the same transaction that drops those
entries settles the segment's rows (shrunk to what survives, or dropped with
its file), so `dlm cache verify` finds nothing to repair afterwards.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.corpus.tokenize import tokenize_document
from dlmstore.home import store_dir

from .helpers import VALID_ID, write_doc

TWO_ROWS = "Prose.\n\n::instruction::\n### Q\nq?\n### A\na.\n"


def _dlm(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    doc = write_doc(tmp_path / "doc.dlm", body=TWO_ROWS)
    assert _dlm("tokenize", str(doc))[0] == 0
    return doc


def _segment() -> Path:
    (segment,) = (store_dir(VALID_ID) / "tokens").glob("segment-*.bin")
    return segment


def _rows(sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(store_dir(VALID_ID) / "store.db")
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _first_entry_end() -> int:
    ((end,),) = _rows("SELECT bytes FROM cache_entries WHERE byte_offset = 0")
    assert isinstance(end, int)
    return end


CLEAN = (0, "checked 2 entries in 2 token files: 0 problems, 0 remaining\n")


def test_a_truncated_segment_healed_by_dlm_tokenize_leaves_cache_verify_with_nothing_to_report(
    doc: Path,
) -> None:
    segment = _segment()
    os.truncate(segment, _first_entry_end())  # the second entry is cut off
    code, _, stderr = _dlm("tokenize", str(doc))
    assert code == 0
    assert "1 cache entry pointed at missing or damaged token files; its row was re-tokenized" in stderr
    assert _dlm("cache", "verify", str(doc))[:2] == CLEAN
    assert segment.exists()  # the first entry still reads back from it
    assert _rows(f"SELECT bytes FROM token_segments WHERE path = 'tokens/{segment.name}'") == [
        (segment.stat().st_size,)
    ]


def test_a_segment_truncated_to_nothing_is_dropped_with_its_file_by_the_pass_that_heals_it(doc: Path) -> None:
    segment = _segment()
    os.truncate(segment, 0)
    assert _dlm("tokenize", str(doc))[0] == 0
    assert not segment.exists()
    assert _dlm("cache", "verify", str(doc))[:2] == (
        0,
        "checked 2 entries in 1 token file: 0 problems, 0 remaining\n",
    )


def test_a_missing_segment_healed_by_dlm_tokenize_leaves_no_row_pointing_at_it(doc: Path) -> None:
    segment = _segment()
    segment.unlink()
    assert _dlm("tokenize", str(doc))[0] == 0
    assert _rows(f"SELECT count(*) FROM token_segments WHERE path = 'tokens/{segment.name}'") == [(0,)]
    assert _dlm("cache", "verify", str(doc))[:2] == (
        0,
        "checked 2 entries in 1 token file: 0 problems, 0 remaining\n",
    )


def test_a_truncated_segment_healed_by_a_pass_that_reads_the_tokens_leaves_the_manifest_consistent(
    doc: Path,
) -> None:
    os.truncate(_segment(), _first_entry_end())
    result, rows = tokenize_document(str(doc))  # what `dlm train` runs: every entry's bytes read
    assert result.damaged_entries == 1 and rows is not None
    assert _dlm("cache", "verify", str(doc))[:2] == CLEAN


def test_entries_of_another_tokenizer_in_the_cut_off_part_of_a_segment_go_with_it(doc: Path) -> None:
    segment = _segment()
    conn = sqlite3.connect(store_dir(VALID_ID) / "store.db")
    conn.execute(
        "INSERT INTO cache_entries (row_key, tokenizer_sha256, sequence_len, segment_id, byte_offset, "
        "token_count, dtype, bytes, checksum, created_at, last_access_at, last_run_id) "
        "SELECT 'sha256:other', 'sha256:' || hex(zeroblob(32)), sequence_len, segment_id, byte_offset, "
        "token_count, dtype, bytes, checksum, created_at, last_access_at, last_run_id "
        "FROM cache_entries WHERE byte_offset > 0"
    )
    conn.commit()
    conn.close()
    os.truncate(segment, _first_entry_end())
    assert _dlm("tokenize", str(doc))[0] == 0  # looks up this tokenizer's entries only
    assert _rows("SELECT count(*) FROM cache_entries WHERE row_key = 'sha256:other'") == [(0,)]
    assert _dlm("cache", "verify", str(doc))[:2] == CLEAN

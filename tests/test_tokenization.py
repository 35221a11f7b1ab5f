"""The tokenize pass: parity with TRL, the cache path, and faults that become misses."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dlmstore.cache.trl_encoding import encode_rows
from dlmstore.corpus.assemble import load_corpus
from dlmstore.corpus.tokenize import tokenize_document
from dlmstore.document.parser import parse_document
from dlmstore.home import store_dir

from .helpers import VALID_ID, write_doc

BODY = """Intro prose about caching.

::instruction::
### Q
What is a segment?
### A
A file of token arrays.

### Q
What is a segment?
### A
An append-only file.

::preference::
### Prompt
p
### Chosen
c
### Rejected
r
"""


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("def f(x):\n    return x + 1\n")
    (src / "pkg" / "b.py").write_text("print('héllo wörld')  # ünïcode\n" * 20)
    (src / "notes.md").write_text("Ends with the EOS already<|im_end|>")
    return write_doc(
        tmp_path / "doc.dlm",
        body=BODY,
        frontmatter="training:\n  sequence_len: 256\n  sources:\n    - path: src\n",
    )


def test_cached_uncached_and_trl_tokenization_give_identical_ids(doc: Path, smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    from trl.data_utils import _tokenize

    all_rows = load_corpus(parse_document(doc)).rows()
    rows = [r for r in all_rows if r.kind != "preference"]
    eos = smollm2_tokenizer.eos_token
    expected = []
    for row in rows:
        if row.kind == "messages":
            ids = _tokenize(smollm2_tokenizer, row.data["messages"], add_generation_prompt=False)["input_ids"]
        else:
            text = row.data["text"]
            ids = _tokenize(smollm2_tokenizer, text if text.endswith(eos) else text + eos)["input_ids"]
        expected.append(list(ids))

    cold, cold_rows = tokenize_document(str(doc))
    warm, warm_rows = tokenize_document(str(doc))
    bypass, bypass_rows = tokenize_document(str(doc), no_cache=True)
    # preference rows are counted too (their tokens: tests/test_preference_tokens.py)
    assert (cold.tokenization.cache_misses, warm.tokenization.cache_hits) == (len(all_rows), len(all_rows))
    for result in (cold_rows, warm_rows, bypass_rows):
        assert [result.input_ids(i).tolist() for i in range(len(result))] == expected
    assert [list(ids) for ids in encode_rows(smollm2_tokenizer, rows)] == expected


def test_two_identical_pairs_in_one_section_are_cached_under_their_own_keys(doc: Path) -> None:
    summary, rows = tokenize_document(str(doc))
    assert len(set(rows.row_keys)) == len(rows.row_keys)
    messages = [i for i, kind in enumerate(rows.kinds) if kind == "messages"]
    first, second = (rows.input_ids(i).tolist() for i in messages)
    assert first != second  # pair 2 never gets pair 1's tokens


def test_preference_rows_are_tokenized_apart_from_the_rows_sft_trains_on(doc: Path) -> None:
    summary, rows = tokenize_document(str(doc))
    assert summary.preference_rows == 1
    assert summary.preference_tokens > 0
    assert "preference" not in rows.kinds
    assert summary.tokens == rows.token_count


def test_the_dataset_for_training_is_built_from_the_arrays(doc: Path) -> None:
    _, rows = tokenize_document(str(doc))
    dataset = rows.to_dataset()
    assert dataset.column_names == ["input_ids", "attention_mask", "labels"]
    assert dataset[0]["labels"] == dataset[0]["input_ids"]
    assert dataset[0]["input_ids"] == rows.input_ids(0).tolist()
    assert dataset[0]["attention_mask"] == [1] * len(rows.input_ids(0))


def test_no_cache_leaves_existing_entries_untouched(doc: Path) -> None:
    tokenize_document(str(doc))
    db = store_dir(VALID_ID) / "store.db"
    before = (
        sqlite3.connect(db).execute("SELECT id, last_access_at, last_run_id FROM cache_entries").fetchall()
    )
    summary, _ = tokenize_document(str(doc), no_cache=True)
    after = (
        sqlite3.connect(db).execute("SELECT id, last_access_at, last_run_id FROM cache_entries").fetchall()
    )
    assert before == after
    assert summary.tokenization.cache_mode == "bypassed"
    assert summary.tokenization.cache_hits == 0


def test_a_disabled_cache_in_the_frontmatter_skips_it(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm", frontmatter="training:\n  cache:\n    enabled: false\n")
    summary, _ = tokenize_document(str(doc))
    assert summary.tokenization.cache_mode == "off"
    assert sqlite3.connect(store_dir(VALID_ID) / "store.db").execute(
        "SELECT COUNT(*) FROM cache_entries"
    ).fetchone() == (0,)


def test_a_swapped_tokenizer_misses_every_entry(doc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dlmstore.fingerprint as fingerprint

    first, _ = tokenize_document(str(doc))
    monkeypatch.setattr(fingerprint, "SCHEME", "tok-v2")  # any change of identity
    second, _ = tokenize_document(str(doc))
    assert second.tokenization.cache_hits == 0
    assert second.tokenization.cache_misses == first.tokenization.total_rows
    keys = (
        sqlite3.connect(store_dir(VALID_ID) / "store.db")
        .execute("SELECT COUNT(DISTINCT tokenizer_sha256) FROM cache_entries")
        .fetchone()
    )
    assert keys == (2,)  # the old entries stay, orphaned, for prune


def test_an_edited_source_file_misses_only_its_own_entry(doc: Path) -> None:
    tokenize_document(str(doc))
    (doc.parent / "src" / "pkg" / "a.py").write_text("def f(x):\n    return x + 2\n")
    summary, _ = tokenize_document(str(doc))
    assert (summary.tokenization.cache_hits, summary.tokenization.cache_misses) == (
        summary.tokenization.total_rows - 1, 1,
    )  # fmt: skip


def test_a_deleted_source_file_just_leaves_its_entry_unused(doc: Path) -> None:
    tokenize_document(str(doc))
    (doc.parent / "src" / "pkg" / "a.py").unlink()
    summary, _ = tokenize_document(str(doc))
    assert summary.tokenization.cache_misses == 0
    assert summary.tokenization.cache_hits == summary.tokenization.total_rows


def _segment_files(dlm_id: str = VALID_ID) -> list[Path]:
    return sorted((store_dir(dlm_id) / "tokens").glob("segment-*.bin"))


def test_a_deleted_segment_file_is_a_miss_retokenized_with_one_warning(doc: Path) -> None:
    _, expected = tokenize_document(str(doc))
    for segment in _segment_files():
        segment.unlink()
    summary, rows = tokenize_document(str(doc))
    assert summary.tokenization.cache_misses == summary.tokenization.total_rows
    # every entry was damaged: one per row, four per preference row (its parts)
    assert summary.damaged_entries == summary.tokenization.total_rows + 3 * summary.preference_rows
    assert len(summary.warnings) == 1 and "re-tokenized" in summary.warnings[0]
    assert np.array_equal(rows.values, expected.values)
    third, _ = tokenize_document(str(doc))
    assert third.tokenization.cache_hits == third.tokenization.total_rows and third.warnings == []


def test_corrupted_or_truncated_segment_bytes_are_misses_not_errors(doc: Path) -> None:
    _, expected = tokenize_document(str(doc))
    (segment,) = _segment_files()
    data = bytearray(segment.read_bytes())
    data[3] ^= 0xFF
    segment.write_bytes(bytes(data[: len(data) - 7]))
    summary, rows = tokenize_document(str(doc))
    assert summary.damaged_entries >= 2  # the flipped entry and the truncated last one
    assert np.array_equal(rows.values, expected.values)


def test_chats_go_through_the_prefix_cache_and_its_stats_are_reported(
    tmp_path: Path, smollm2_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    from trl.data_utils import _tokenize

    # Rows carry no system message (as in DLM), so the prefix every chat
    # shares is the one SmolLM2's chat template adds: its default system turn.
    pairs = "".join(f"### Q\nQuestion {i}?\n### A\nAnswer {i}.\n\n" for i in range(12))
    doc = write_doc(tmp_path / "doc.dlm", body=f"::instruction::\n{pairs}")
    summary, rows = tokenize_document(str(doc))
    stats = summary.prefix_cache
    assert stats is not None and stats.l1_enabled is True and stats.hits > 0
    for i, row in enumerate(r for r in load_corpus(parse_document(doc)).rows()):
        expected = _tokenize(smollm2_tokenizer, row.data["messages"], add_generation_prompt=False)[
            "input_ids"
        ]
        assert rows.input_ids(i).tolist() == list(expected)
    warm, _ = tokenize_document(str(doc))
    assert warm.prefix_cache is None  # all hits: no tokenizer, no prefix cache


def test_a_text_only_pass_uses_the_kept_rust_tokenizer_and_still_gives_trls_ids(
    tmp_path: Path,
    smollm2_tokenizer,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    from trl.data_utils import _tokenize

    import dlmstore.bases
    from dlmstore.cache.rust_tokenizer import load_snapshot, snapshot_path

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.md").write_text("Plain text with <|im_end|> inside and ünïcode.\n")
    (src / "b.md").write_text("Ends with the EOS already<|im_end|>")
    doc = write_doc(
        tmp_path / "doc.dlm", body="Prose.\n", frontmatter="training:\n  sources:\n    - path: src\n"
    )
    first, _ = tokenize_document(str(doc))  # loads through transformers, keeps the backend
    kept = snapshot_path(first.tokenizer_sha256)
    assert kept.is_file()
    text = load_snapshot(first.tokenizer_sha256)
    assert text is not None and len(text) == len(smollm2_tokenizer)
    assert text._tokenizer.to_str() == smollm2_tokenizer._tokenizer.to_str()

    (src / "c.md").write_text("A new file: one miss, a text row.\n")
    loader = dlmstore.bases.load_tokenizer
    monkeypatch.setattr(dlmstore.bases, "load_tokenizer", _refuse)
    second, rows = tokenize_document(str(doc))  # never reaches transformers
    assert second.tokenization.cache_misses == 1
    eos = smollm2_tokenizer.eos_token
    for index, row in enumerate(load_corpus(parse_document(doc)).rows()):
        expected = row.data["text"] if row.data["text"].endswith(eos) else row.data["text"] + eos
        assert rows.input_ids(index).tolist() == list(_tokenize(smollm2_tokenizer, expected)["input_ids"])

    kept.write_text("{not json")  # a damaged file is ignored: the tokenizer loads the usual way
    monkeypatch.setattr(dlmstore.bases, "load_tokenizer", loader)
    (src / "d.md").write_text("Another new file.\n")
    third, _ = tokenize_document(str(doc))
    assert third.tokenization.cache_misses == 1
    assert load_snapshot(first.tokenizer_sha256) is not None  # and is written again


def _refuse(*_: object) -> None:
    raise AssertionError("the tokenizer was loaded through transformers")


#: Modules a warm ``dlm tokenize`` (every row cached) must not import: the
#: heavy libraries, which only a miss needs.
NOT_ON_THE_WARM_PATH = ("numpy", "torch", "transformers", "dlmstore.prefix.cached", "dlmstore.store.metrics")


def test_a_warm_tokenize_imports_none_of_what_only_a_miss_needs(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm", BODY)
    code = (
        "import sys; from dlmstore.cli.main import cli\n"
        f"try:\n    cli(['tokenize', {str(doc)!r}, '--json'])\nexcept SystemExit:\n    pass\n"
        f"print('imported:', [m for m in {NOT_ON_THE_WARM_PATH!r} if m in sys.modules], file=sys.stderr)"
    )
    cold = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert '"cache_misses": 0' not in cold.stdout
    warm = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert '"cache_misses": 0' in warm.stdout
    assert warm.stderr.strip().splitlines()[-1] == "imported: []"

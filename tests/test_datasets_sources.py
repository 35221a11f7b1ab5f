"""Local inputs and the light conversions of build-all's sources (wikitext, dolly, oasst1)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlmstore.datasets.build import catalog as src
from dlmstore.datasets.build.local import iter_local_records, iter_local_texts
from dlmstore.errors import DatasetError, SourceUnavailableError


def test_a_folder_of_text_files_is_read_in_sorted_order_skipping_hidden_files(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("second")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "z.md").write_text("first")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref")
    assert list(iter_local_texts(tmp_path)) == ["first", "second"]


def test_a_folder_with_parquet_or_jsonl_reads_their_records(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": ["p1", "p2"], "id": [1, 2]}), tmp_path / "part-0.parquet")
    (tmp_path / "part-1.jsonl").write_text(
        json.dumps({"text": "j1"}) + "\n\n" + json.dumps({"text": "j2"}) + "\n"
    )
    (tmp_path / "README.md").write_text("not a document")
    assert list(iter_local_texts(tmp_path)) == ["p1", "p2", "j1", "j2"]
    assert [r["text"] for r in iter_local_records(tmp_path)] == ["p1", "p2", "j1", "j2"]


def test_a_record_without_the_text_field_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(DatasetError) as info:
        list(iter_local_texts(tmp_path))
    assert info.value.message == f"{tmp_path / 'd.jsonl'}: record 1 has no string field 'text'"


def test_a_binary_file_in_a_text_folder_is_an_error_not_a_silent_skip(tmp_path: Path) -> None:
    (tmp_path / "img.png").write_bytes(b"\x89PNG\xff\xfe")
    with pytest.raises(DatasetError) as info:
        list(iter_local_texts(tmp_path))
    assert info.value.message == f"{tmp_path / 'img.png'} is not UTF-8 text"


def test_wikitext_lines_are_joined_into_articles_at_top_level_headings() -> None:
    lines = [
        "",
        " = Alpha = \n",
        "",
        " Alpha text . \n",
        " = = Section = = \n",
        " more . \n",
        " = Beta = \n",
        " b . \n",
    ]
    articles = list(src.wikitext_articles(lines))
    assert articles == [
        " = Alpha = \n\n Alpha text . \n = = Section = = \n more . ",
        " = Beta = \n b . ",
    ]


def test_dolly_records_become_a_user_turn_with_context_and_an_assistant_turn() -> None:
    record = {"instruction": "Summarise.", "context": "Long text.", "response": "Short.", "category": "x"}
    assert src.dolly_messages(record) == [
        {"role": "user", "content": "Summarise.\n\nLong text."},
        {"role": "assistant", "content": "Short."},
    ]
    assert src.dolly_messages({"instruction": "Hi", "context": None, "response": ""}) == [
        {"role": "user", "content": "Hi"}
    ]


def test_oasst_trees_become_their_top_ranked_thread_ending_on_an_assistant_turn() -> None:
    rows = [
        {"message_id": "r", "parent_id": None, "role": "prompter", "text": "Q1", "rank": None},
        {"message_id": "a2", "parent_id": "r", "role": "assistant", "text": "worse", "rank": 1},
        {"message_id": "a1", "parent_id": "r", "role": "assistant", "text": "best", "rank": 0},
        {"message_id": "f", "parent_id": "a1", "role": "prompter", "text": "follow-up", "rank": 0},
        {"message_id": "gone", "parent_id": "f", "role": "assistant", "text": "deleted", "deleted": True},
        {"message_id": "r2", "parent_id": None, "role": "prompter", "text": "unanswered", "rank": None},
    ]
    assert list(src.oasst_threads(rows)) == [
        [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "best"}],
        [],
    ]


def test_a_stream_that_fails_midway_becomes_one_line_naming_the_source() -> None:
    def flaky() -> object:
        yield {"text": "one"}
        raise ConnectionError("Connection reset by peer\nlong traceback text")

    stream = src.guarded("fineweb-edu", "HuggingFaceFW/fineweb-edu", "CC-MAIN-2024-10", flaky())  # type: ignore[arg-type]
    assert next(stream) == {"text": "one"}
    with pytest.raises(SourceUnavailableError) as info:
        next(stream)
    assert "\n" not in info.value.message
    assert info.value.message.startswith(
        "fineweb-edu: cannot read HuggingFaceFW/fineweb-edu (CC-MAIN-2024-10) from the Hugging Face hub"
    )
    assert info.value.message.endswith(
        ": Connection reset by peer; point it at local files with --local fineweb-edu=PATH "
        "(Parquet/JSONL files with a 'text' field, or text files)"
    )

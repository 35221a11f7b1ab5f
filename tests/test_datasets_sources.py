"""Local inputs, whole or by range, and the light conversions of build-all's sources (wikitext, dolly, oasst1)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlmstore.datasets.build import catalog as src
from dlmstore.datasets.build.local import (
    LocatedInput,
    Range,
    count_piece,
    iter_local_records,
    iter_local_texts,
    range_records,
    range_texts,
    ranges_of,
)
from dlmstore.errors import DatasetError, ObjectStoreError, SourceUnavailableError

from .s3_server import CutProxy, S3Bucket


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


def ranges(
    source: Path, range_bytes: int, range_rows: int = 8192, text_field: str | None = "text"
) -> list[Range]:
    """What a Ray build's driver plans: pieces from file sizes, counted, then prefix sums."""
    pieces = LocatedInput(str(source), text_field).pieces(range_bytes)
    return ranges_of(pieces, [count_piece(piece) for piece in pieces], range_rows)


def mixed_input(folder: Path) -> Path:
    """JSONL with every line ending, blank lines and multi-byte text; an empty JSONL; Parquet; a JSON list."""
    endings = ["\n", "\r\n", "\r"]
    lines = []
    for i in range(120):
        lines.append(
            json.dumps({"text": "é" * (i % 13) + f" document {i}"}, ensure_ascii=False) + endings[i % 3]
        )
        if i % 17 == 0:
            lines.append("  \t" + endings[(i + 1) % 3])  # a blank line: a line, no record
    folder.mkdir()
    (folder / "a.jsonl").write_bytes("".join(lines).encode())
    (folder / "b.jsonl").write_bytes(b"")
    (folder / "c.jsonl").write_text('{"text": "no newline at the end"}')
    pq.write_table(
        pa.table({"text": [f"row {i}" for i in range(50)]}), folder / "d.parquet", row_group_size=7
    )
    (folder / "e.json").write_text(json.dumps([{"text": "listed 1"}, {"text": "listed 2"}]))
    return folder


@pytest.mark.parametrize("range_bytes", [1, 2, 5, 64, 1000, 1 << 20])
def test_ranges_cut_anywhere_read_the_documents_of_reading_the_whole_input_in_order(
    tmp_path: Path, range_bytes: int
) -> None:
    source = mixed_input(tmp_path / "in")
    parts = ranges(source, range_bytes, range_rows=10)
    assert [t for part in parts for t in range_texts(part, "text")] == list(iter_local_texts(source))
    assert [part.position for part in parts] == [sum(p.count for p in parts[:i]) for i in range(len(parts))]


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (b'\n{"body": "no text"}\n', "a.jsonl: record 121 has no string field 'text'"),
        (b'\n\n{"text": \n', "a.jsonl:131: not JSON: Expecting value"),
        (b"\n[1, 2]\n", "a.jsonl:130: expected a JSON object, found list"),
    ],
)
def test_a_bad_record_read_by_range_is_the_error_of_reading_the_whole_file(
    tmp_path: Path, tail: bytes, expected: str
) -> None:
    source = mixed_input(tmp_path / "in")
    (source / "a.jsonl").write_bytes((source / "a.jsonl").read_bytes() + tail)
    messages = []
    for read in [lambda: list(iter_local_texts(source)), *(
        lambda size=size: [t for part in ranges(source, size) for t in range_texts(part, "text")]
        for size in (7, 300, 1 << 20)
    )]:  # fmt: skip
        with pytest.raises(DatasetError) as info:
            read()
        messages.append(info.value.message)
    assert messages == [f"{source / expected.split(':')[0]}:{expected.split(':', 1)[1]}"] * 4


def test_text_files_by_range_are_read_as_whole_files_with_their_newlines_translated(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"note{i}.md").write_bytes(f"note {i}\r\nsecond line\r".encode())
    for size in (1, 30, 1 << 20):
        assert [t for part in ranges(tmp_path, size) for t in range_texts(part, "text")] == list(
            iter_local_texts(tmp_path)
        )
    assert list(iter_local_texts(tmp_path))[0] == "note 0\nsecond line\n"


def test_conversations_by_range_are_the_records_of_the_whole_input(tmp_path: Path) -> None:
    source = mixed_input(tmp_path / "in")
    for size in (3, 1 << 20):
        parts = ranges(source, size, range_rows=4, text_field=None)
        assert [r for part in parts for r in range_records(part)] == list(iter_local_records(source))


def test_a_file_changed_after_the_build_was_planned_is_refused_by_name(tmp_path: Path) -> None:
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(20)))
    (first, *_) = ranges(source, 64)
    with open(source, "a") as grown:
        grown.write(json.dumps({"text": "appended"}) + "\n")
    with pytest.raises(DatasetError) as info:
        range_texts(first, "text")
    assert info.value.message == f"{source} changed while the build read it (size or modification time)"


def uploaded(s3: S3Bucket, folder: Path, prefix: str) -> str:
    """Every file of ``folder`` put under ``prefix``; returns the prefix's URL."""
    for file in sorted(folder.rglob("*")):
        if file.is_file():
            s3.put(f"{prefix}/{file.relative_to(folder).as_posix()}", file.read_bytes())
    return s3.url(prefix)


def test_an_s3_prefix_read_whole_or_by_range_gives_the_documents_of_a_local_copy(
    tmp_path: Path, s3: S3Bucket
) -> None:
    source = mixed_input(tmp_path / "in")
    url = uploaded(s3, source, "corpus")
    s3.put("corpus/.hidden/skipped.jsonl", b'{"text": "never read"}\n')
    s3.put("corpus-other/not-under-the-prefix.jsonl", b'{"text": "never read"}\n')
    local = list(iter_local_texts(source))
    assert list(LocatedInput(url)) == local
    for size in (5, 1 << 20):
        pieces = LocatedInput(url).pieces(size)
        parts = ranges_of(pieces, [count_piece(piece) for piece in pieces], 10)
        assert [t for part in parts for t in range_texts(part, "text")] == local
    s3.put("one/a.jsonl", (source / "a.jsonl").read_bytes())  # a prefix that is one object's key
    assert list(LocatedInput(s3.url("one/a.jsonl"))) == list(iter_local_texts(source / "a.jsonl"))


def test_an_object_replaced_after_the_build_was_planned_is_refused_by_name(
    tmp_path: Path, s3: S3Bucket
) -> None:
    s3.put(
        "docs/a.jsonl", b"".join(json.dumps({"text": f"document {i}"}).encode() + b"\n" for i in range(20))
    )
    pieces = LocatedInput(s3.url("docs")).pieces(64)
    (first, *_) = ranges_of(pieces, [count_piece(piece) for piece in pieces], 10)
    s3.put("docs/a.jsonl", b'{"text": "another file under the same key"}\n')
    with pytest.raises(ObjectStoreError) as info:
        range_texts(first, "text")
    assert info.value.message == f"{s3.url('docs/a.jsonl')} changed while the build read it (another ETag)"


def test_a_bucket_that_is_not_there_given_to_from_is_one_error_line_and_nothing_is_written(
    tmp_path: Path, s3: S3Bucket
) -> None:
    from click.testing import CliRunner

    from dlmstore.cli.main import cli

    out = tmp_path / "out"
    args = ["data", "build", "pretrain", "--from", "s3://no-such-bucket/corpus", "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith(("error:", "Traceback"))]
    assert errors == ["error: s3://no-such-bucket/corpus: the bucket no-such-bucket does not exist"]
    assert not out.exists()


def test_a_server_gone_while_a_range_is_read_is_one_error_naming_the_object(
    tmp_path: Path, s3: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3.put(
        "docs/a.jsonl",
        b"".join(json.dumps({"text": f"document {i} " * 50}).encode() + b"\n" for i in range(200)),
    )
    pieces = LocatedInput(s3.url("docs")).pieces(4096)
    parts = ranges_of(pieces, [count_piece(piece) for piece in pieces], 10)
    proxy = CutProxy(int(s3.endpoint.rsplit(":", 1)[1]), allow=3000)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)  # a task's client reaches the server through it
    monkeypatch.setenv("DLM_S3_MAX_ATTEMPTS", "2")
    with pytest.raises(ObjectStoreError) as info:
        for part in parts:
            range_texts(part, "text")
    assert proxy.cut.is_set()
    assert "\n" not in info.value.message and s3.url("docs/a.jsonl") in info.value.message
    assert " after 2 attempts: " in info.value.message or " failed 2 times: " in info.value.message


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

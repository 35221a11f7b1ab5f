"""Sections to training rows (DLM's row shapes), and the row key recipe."""

from __future__ import annotations

import hashlib
import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlmstore.document.rows as rows_module
from dlmstore.corpus.assemble import load_corpus
from dlmstore.document.parser import parse_text
from dlmstore.document.rows import ROW_KEY_SCHEME, Row, document_rows, row_counts, row_key, section_rows
from dlmstore.document.sections import Section

PROSE = Section("prose", "hello world")
PAIRS = Section("instruction", "### Q\nWhat is 2+2?\n### A\n4\n### Q\nAnd 3+3?\n### A\n6")
SAME_PAIRS = Section("instruction", "### Q\nq\n### A\na\n### Q\nq\n### A\na")
PREFERENCE = Section("preference", "### Prompt\nHi?\n### Chosen\nHello!\n### Rejected\nGo away.")


def keys(rows: list[Row]) -> list[str]:
    return [r.row_key for r in rows]


def test_a_prose_section_is_one_text_row():
    (row,) = section_rows(PROSE)
    assert row == Row(
        row_key=row.row_key,
        section_id=PROSE.section_id,
        index=0,
        kind="text",
        data={"text": "hello world"},
    )


def test_each_instruction_pair_is_one_messages_row():
    rows = section_rows(PAIRS)
    assert [(r.index, r.kind, r.section_id) for r in rows] == [
        (0, "messages", PAIRS.section_id),
        (1, "messages", PAIRS.section_id),
    ]
    assert rows[1].data == {
        "messages": [
            {"role": "user", "content": "And 3+3?"},
            {"role": "assistant", "content": "6"},
        ]
    }


def test_a_messages_row_is_a_user_then_an_assistant_message_and_nothing_else():
    (first, _) = section_rows(PAIRS)
    assert first.data["messages"] == [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ]


def test_a_prose_row_is_the_section_text_stripped_of_surrounding_whitespace():
    section = Section("prose", "\n  indented first line\n\n\tinner  \n\n")
    (row,) = section_rows(section)
    assert row.data == {"text": "indented first line\n\n\tinner"}
    assert section.content == "\n  indented first line\n\n\tinner  \n\n"  # the section keeps its text


def test_a_lazily_loaded_prose_section_gives_the_same_stripped_row():
    content = "  from a source file  \n"
    eager = Section("prose", content)
    lazy = Section("prose", digest=eager.digest, load=lambda: content)
    assert section_rows(lazy) == section_rows(eager)
    assert section_rows(lazy)[0].data == {"text": "from a source file"}


def test_a_preference_triple_is_one_preference_row():
    (row,) = section_rows(PREFERENCE)
    assert row.kind == "preference"
    assert row.data == {"prompt": "Hi?", "chosen": "Hello!", "rejected": "Go away."}


def test_an_unknown_section_type_is_refused():
    with pytest.raises(ValueError, match="unknown section type 'poem'"):
        section_rows(Section("poem", "roses"))


# --------------------------------------------------------------------------
# Keys


def test_row_keys_are_stable_across_runs():
    (row,) = section_rows(PROSE)
    assert row.row_key == ("sha256:f359140f99bd8274b72fbb5b8ee396b6eb203e3d8645e5dd05e4edd9508f3c2c")
    (first, _) = section_rows(PAIRS)
    assert first.row_key == ("sha256:9a1ffd878c0a76755fd62fa7c8a13d54618be4ff4bb676fef677f0eda4904ae5")


def test_the_row_key_scheme_is_row_v2():
    # row-v1 keys covered rows with a system message and unstripped prose;
    # those rows are gone, so no v1 key may match a v2 row.
    assert ROW_KEY_SCHEME == "row-v2"


def test_the_row_key_recipe_is_the_documented_one():
    (row,) = section_rows(PREFERENCE, occurrence=2)
    payload = json.dumps(row.data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    material = f"row-v2\n{PREFERENCE.digest}\npreference\n0\n2\n{payload}"
    assert row.row_key == "sha256:" + hashlib.sha256(material.encode()).hexdigest()
    (text,) = section_rows(PROSE)
    material = f"row-v2\n{PROSE.digest}\ntext\n0\n0\n"
    assert text.row_key == "sha256:" + hashlib.sha256(material.encode()).hexdigest()
    (first, _) = section_rows(PAIRS)
    payload = json.dumps(first.data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    material = f"row-v2\n{PAIRS.digest}\nmessages\n0\n0\n{payload}"
    assert first.row_key == "sha256:" + hashlib.sha256(material.encode()).hexdigest()


def test_a_change_of_content_changes_the_key():
    (a,) = section_rows(Section("prose", "hello world"))
    (b,) = section_rows(Section("prose", "hello world!"))
    assert a.row_key != b.row_key


BODY = (
    "Intro prose.\n"
    "::instruction::\n### Q\nWhat is 2+2?\n### A\n4\n"
    "::preference::\n### Prompt\nHi?\n### Chosen\nHello!\n### Rejected\nGo away.\n"
)


def corpus_rows(frontmatter: str) -> list[Row]:
    document = parse_text(f"---\ndlm_id: 01J9ZK3M4N5P6Q7R8S9T0VWXYZ\n{frontmatter}---\n{BODY}")
    return load_corpus(document).rows()


@pytest.mark.parametrize(
    "frontmatter",
    [
        "system_prompt: Be brief.\n",
        "system_prompt: ''\n",
        "export:\n  default_quant: Q8_0\n  default_temperature: 0.2\n",
        "dlm_version: 15\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\n",
        "training:\n  lora_r: 4\n  seed: 7\n  cpt:\n    schedule: dapt\n  gate:\n    steps: 10\n",
        "training:\n  preference:\n    enabled: true\n",
    ],
)
def test_a_documents_row_keys_do_not_change_when_only_its_frontmatter_changes(frontmatter):
    plain = corpus_rows("")
    assert [r.kind for r in plain] == ["text", "messages", "preference"]
    assert corpus_rows(frontmatter) == plain


def test_the_system_prompt_is_part_of_no_row():
    rows = corpus_rows("system_prompt: Be brief.\n")
    assert rows[1].data["messages"] == [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert all("Be brief." not in json.dumps(r.data) for r in rows)


def test_a_change_of_kind_changes_the_key():
    section = Section("prose", "x")
    data = {"text": "x"}
    assert row_key(section, "text", 0, 0, data) != row_key(section, "messages", 0, 0, data)


def test_a_change_of_index_changes_the_key():
    section = Section("prose", "x")
    assert row_key(section, "text", 0, 0, {}) != row_key(section, "text", 1, 0, {})


def test_a_change_of_occurrence_changes_the_key():
    assert keys(section_rows(PROSE)) != keys(section_rows(PROSE, occurrence=1))


def test_the_same_type_and_text_in_another_section_type_changes_the_key():
    text = "### Q\nq\n### A\na"
    assert keys(section_rows(Section("prose", text))) != keys(section_rows(Section("instruction", text))[:1])


def test_the_second_pair_of_a_section_never_reuses_the_first_pairs_key():
    first, second = section_rows(PAIRS)
    assert first.row_key != second.row_key
    assert second.data["messages"][0]["content"] == "And 3+3?"


def test_two_identical_pairs_in_one_section_still_get_distinct_keys():
    first, second = section_rows(SAME_PAIRS)
    assert first.data == second.data
    assert first.row_key != second.row_key


def test_identical_sections_in_a_document_get_distinct_keys():
    rows = document_rows([PROSE, PAIRS, PROSE, PAIRS])
    assert len(rows) == 6
    assert len(set(keys(rows))) == 6


def test_inserting_an_unrelated_section_does_not_move_keys():
    before = document_rows([PROSE, PAIRS, PROSE])
    after = document_rows([PREFERENCE, PROSE, Section("prose", "new"), PAIRS, PROSE])
    assert set(keys(before)) <= set(keys(after))


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(st.sampled_from(["a", "b", "c", "a\nb"]), max_size=12))
def test_document_rows_are_always_unique(texts):
    sections = [Section("prose", t) for t in texts] + [SAME_PAIRS, SAME_PAIRS]
    rows = document_rows(sections)
    assert len(set(keys(rows))) == len(rows)


# --------------------------------------------------------------------------
# Cost


def test_document_rows_does_not_rehash_big_prose(monkeypatch):
    content = "x" * 13_000
    # Digests passed in, as dlmstore.sources.read does after hashing file bytes.
    sections = [
        Section("prose", content, digest=hashlib.sha256(str(i).encode()).hexdigest()) for i in range(13_000)
    ]
    hashed = 0
    real = hashlib.sha256

    def counting(data: bytes = b""):
        nonlocal hashed
        hashed += len(data)
        return real(data)

    monkeypatch.setattr(rows_module, "sha256", counting)
    started = time.perf_counter()
    rows = document_rows(sections)
    elapsed = time.perf_counter() - started
    assert len(rows) == 13_000
    assert rows[5].data["text"] is content
    assert hashed < 13_000 * 120  # ~95 bytes of key material per row
    assert elapsed < 5


def test_row_counts_are_the_kinds_of_the_rows_without_building_them() -> None:
    def unreadable() -> str:
        raise AssertionError("a source file's text was loaded to count its row")

    lazy = Section("prose", None, None, "a.py", "0" * 64, load=unreadable)
    sections = [PROSE, PAIRS, SAME_PAIRS, PREFERENCE, Section("prose", "   "), lazy]
    kinds = [row.kind for row in document_rows(sections[:-1])] + ["text"]
    assert row_counts(sections) == {kind: kinds.count(kind) for kind in ("text", "messages", "preference")}
    assert row_counts(sections) == {"text": 3, "messages": 4, "preference": 1}

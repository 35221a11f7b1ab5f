"""Sections to training rows, and the row key recipe."""

from __future__ import annotations

import hashlib
import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlmstore.document.rows as rows_module
from dlmstore.document.rows import Row, document_rows, row_key, section_rows
from dlmstore.document.sections import Section

PROSE = Section("prose", "hello world")
PAIRS = Section("instruction", "### Q\nWhat is 2+2?\n### A\n4\n### Q\nAnd 3+3?\n### A\n6")
SAME_PAIRS = Section("instruction", "### Q\nq\n### A\na\n### Q\nq\n### A\na")
PREFERENCE = Section("preference", "### Prompt\nHi?\n### Chosen\nHello!\n### Rejected\nGo away.")


def keys(rows: list[Row]) -> list[str]:
    return [r.row_key for r in rows]


def test_a_prose_section_is_one_text_row():
    (row,) = section_rows(PROSE, system_prompt="ignored")
    assert row == Row(
        row_key=row.row_key,
        section_id=PROSE.section_id,
        index=0,
        kind="text",
        data={"text": "hello world"},
    )


def test_each_instruction_pair_is_one_messages_row():
    rows = section_rows(PAIRS, system_prompt=None)
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


def test_the_system_prompt_comes_first_when_set():
    (first, _) = section_rows(PAIRS, system_prompt="Be brief.")
    assert first.data["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ]


def test_a_preference_triple_is_one_preference_row():
    (row,) = section_rows(PREFERENCE, system_prompt="ignored")
    assert row.kind == "preference"
    assert row.data == {"prompt": "Hi?", "chosen": "Hello!", "rejected": "Go away."}


def test_an_unknown_section_type_is_refused():
    with pytest.raises(ValueError, match="unknown section type 'poem'"):
        section_rows(Section("poem", "roses"), system_prompt=None)


# --------------------------------------------------------------------------
# Keys


def test_row_keys_are_stable_across_runs():
    (row,) = section_rows(PROSE, system_prompt=None)
    assert row.row_key == ("sha256:9f7db502fc46e5727764850b5396e8806b84693993a6ac7cbb446470c34efa93")
    (first, _) = section_rows(PAIRS, system_prompt="Be brief.")
    assert first.row_key == ("sha256:c6ef3062c9958903159f6b9a68d59142b8a571ab60efc43a3cb66a2986e16dcd")


def test_the_row_key_recipe_is_the_documented_one():
    (row,) = section_rows(PREFERENCE, system_prompt=None, occurrence=2)
    payload = json.dumps(row.data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    material = f"row-v1\n{PREFERENCE.digest}\npreference\n0\n2\n{payload}"
    assert row.row_key == "sha256:" + hashlib.sha256(material.encode()).hexdigest()
    (text,) = section_rows(PROSE, system_prompt=None)
    material = f"row-v1\n{PROSE.digest}\ntext\n0\n0\n"
    assert text.row_key == "sha256:" + hashlib.sha256(material.encode()).hexdigest()


def test_a_change_of_content_changes_the_key():
    (a,) = section_rows(Section("prose", "hello world"), system_prompt=None)
    (b,) = section_rows(Section("prose", "hello world!"), system_prompt=None)
    assert a.row_key != b.row_key


def test_a_change_of_system_prompt_changes_the_key():
    none = keys(section_rows(PAIRS, system_prompt=None))
    brief = keys(section_rows(PAIRS, system_prompt="Be brief."))
    empty = keys(section_rows(PAIRS, system_prompt=""))
    assert len(set(none) | set(brief) | set(empty)) == 6


def test_a_change_of_kind_changes_the_key():
    section = Section("prose", "x")
    data = {"text": "x"}
    assert row_key(section, "text", 0, 0, data) != row_key(section, "messages", 0, 0, data)


def test_a_change_of_index_changes_the_key():
    section = Section("prose", "x")
    assert row_key(section, "text", 0, 0, {}) != row_key(section, "text", 1, 0, {})


def test_a_change_of_occurrence_changes_the_key():
    assert keys(section_rows(PROSE, system_prompt=None)) != keys(
        section_rows(PROSE, system_prompt=None, occurrence=1)
    )


def test_the_same_type_and_text_in_another_section_type_changes_the_key():
    text = "### Q\nq\n### A\na"
    assert keys(section_rows(Section("prose", text), system_prompt=None)) != keys(
        section_rows(Section("instruction", text), system_prompt=None)[:1]
    )


def test_the_second_pair_of_a_section_never_reuses_the_first_pairs_key():
    first, second = section_rows(PAIRS, system_prompt=None)
    assert first.row_key != second.row_key
    assert second.data["messages"][0]["content"] == "And 3+3?"


def test_two_identical_pairs_in_one_section_still_get_distinct_keys():
    first, second = section_rows(SAME_PAIRS, system_prompt="s")
    assert first.data == second.data
    assert first.row_key != second.row_key


def test_identical_sections_in_a_document_get_distinct_keys():
    rows = document_rows([PROSE, PAIRS, PROSE, PAIRS], system_prompt=None)
    assert len(rows) == 6
    assert len(set(keys(rows))) == 6


def test_inserting_an_unrelated_section_does_not_move_keys():
    before = document_rows([PROSE, PAIRS, PROSE], system_prompt=None)
    after = document_rows([PREFERENCE, PROSE, Section("prose", "new"), PAIRS, PROSE], system_prompt=None)
    assert set(keys(before)) <= set(keys(after))


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(st.sampled_from(["a", "b", "c", "a\nb"]), max_size=12))
def test_document_rows_are_always_unique(texts):
    sections = [Section("prose", t) for t in texts] + [SAME_PAIRS, SAME_PAIRS]
    rows = document_rows(sections, system_prompt=None)
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
    rows = document_rows(sections, system_prompt="s")
    elapsed = time.perf_counter() - started
    assert len(rows) == 13_000
    assert rows[5].data["text"] is content
    assert hashed < 13_000 * 120  # ~95 bytes of key material per row
    assert elapsed < 5

"""Parsing .dlm documents: files, fences, sections, and their error messages."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmstore.document.frontmatter import DEFAULT_BASE_MODEL
from dlmstore.document.parser import (
    Document,
    instruction_pairs,
    parse_document,
    parse_text,
    preference_triples,
)
from dlmstore.document.sections import Section
from dlmstore.errors import DocumentError

ULID = "01J9ZK3M4N5P6Q7R8S9T0VWXYZ"
HEAD = f"---\ndlm_id: {ULID}\n---\n"


def doc(body: str) -> str:
    return HEAD + body


def error_of(text: str, path: str = "doc.dlm") -> DocumentError:
    with pytest.raises(DocumentError) as info:
        parse_text(text, path)
    return info.value


# --------------------------------------------------------------------------
# Minimal documents and defaults


def test_a_minimal_document_is_just_an_id():
    parsed = parse_text(HEAD, "doc.dlm")
    assert isinstance(parsed, Document)
    assert parsed.dlm_id == ULID
    assert parsed.sections == ()


def test_parse_document_reads_the_file_and_hashes_its_bytes(tmp_path: Path):
    raw = doc("Hello.\n").encode("utf-8")
    path = tmp_path / "notes.dlm"
    path.write_bytes(raw)
    parsed = parse_document(path)
    assert parsed.sha256 == hashlib.sha256(raw).hexdigest()
    assert parsed.path == path
    assert parsed.directory == tmp_path
    assert parsed.base_model == DEFAULT_BASE_MODEL
    assert [s.content for s in parsed.sections] == ["Hello."]


def test_parse_document_makes_a_relative_path_absolute(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("a.dlm").write_text(HEAD, encoding="utf-8")
    assert parse_document("a.dlm").path == tmp_path / "a.dlm"


def test_parse_text_hashes_the_utf8_of_the_text():
    text = doc("Grüße\n")
    assert parse_text(text).sha256 == hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_a_utf8_bom_before_the_frontmatter_is_tolerated(tmp_path: Path):
    raw = b"\xef\xbb\xbf" + doc("Body\n").encode("utf-8")
    path = tmp_path / "bom.dlm"
    path.write_bytes(raw)
    parsed = parse_document(path)
    assert parsed.dlm_id == ULID
    assert parsed.sections == (Section("prose", "Body", line=4),)
    assert parsed.sha256 == hashlib.sha256(raw).hexdigest()


# --------------------------------------------------------------------------
# Sections

ALL_TYPES = doc(
    "\n"
    "Intro prose.\n"
    "\n"
    "::instruction::\n"
    "### Q\n"
    "What is 2+2?\n"
    "### A\n"
    "4\n"
    "\n"
    "### Q   \n"
    "And 3+3?\n"
    "### A\n"
    "\n"
    "6\n"
    "\n"
    "  ::preference::  \n"
    "### Prompt\n"
    "Say hi.\n"
    "### Chosen\n"
    "Hi!\n"
    "### Rejected\n"
    "No.\n"
    "::prose::\n"
    "  indented\n"
    "\n"
    "\tkept inner  \n"
    "\n"
    "::prose::\n"
    "   \n"
)


def test_every_section_type_parses_in_order_with_its_line():
    sections = parse_text(ALL_TYPES).sections
    assert [(s.type, s.line) for s in sections] == [
        ("prose", 5),
        ("instruction", 7),
        ("preference", 19),
        ("prose", 26),
    ]


def test_section_content_strips_outer_blank_lines_but_keeps_inner_whitespace():
    sections = parse_text(ALL_TYPES).sections
    assert sections[0].content == "Intro prose."
    assert sections[3].content == "  indented\n\n\tkept inner  "


def test_an_empty_prose_section_is_dropped():
    assert [s.type for s in parse_text(ALL_TYPES).sections].count("prose") == 2
    assert parse_text(doc("\n\n  \n::prose::\n\n")).sections == ()


def test_instruction_pairs_are_the_stripped_q_and_a_texts():
    section = parse_text(ALL_TYPES).sections[1]
    assert instruction_pairs(section) == [("What is 2+2?", "4"), ("And 3+3?", "6")]


def test_preference_triples_are_prompt_chosen_rejected():
    section = parse_text(ALL_TYPES).sections[2]
    assert preference_triples(section) == [("Say hi.", "Hi!", "No.")]


def test_section_id_is_the_first_16_hex_of_sha256_of_type_newline_content():
    (section,) = parse_text(doc("hello world\n")).sections
    assert section.section_id == hashlib.sha256(b"prose\nhello world").hexdigest()[:16]
    assert section.section_id == "8d9802fc772f67c6"


def test_a_crlf_document_gives_the_same_sections_as_lf():
    lf = parse_text(ALL_TYPES).sections
    crlf = parse_text(ALL_TYPES.replace("\n", "\r\n")).sections
    cr = parse_text(ALL_TYPES.replace("\n", "\r")).sections
    assert [s.section_id for s in crlf] == [s.section_id for s in lf]
    assert crlf == lf
    assert cr == lf


def test_a_fence_line_inside_a_backtick_code_block_is_text():
    (section,) = parse_text(doc("```\n::instruction::\n```\n")).sections
    assert section == Section("prose", "```\n::instruction::\n```", line=4)


def test_a_fence_line_inside_a_tilde_code_block_is_text():
    (section,) = parse_text(doc("~~~~ python\n::preference::\n~~~\n::prose::\n~~~~\n")).sections
    assert section.type == "prose"
    assert section.content == "~~~~ python\n::preference::\n~~~\n::prose::\n~~~~"


def test_a_code_block_closes_only_on_the_same_fence_character():
    body = "```\n~~~\n::instruction::\n```\n::prose::\nafter\n"
    sections = parse_text(doc(body)).sections
    assert [(s.type, s.content) for s in sections] == [
        ("prose", "```\n~~~\n::instruction::\n```"),
        ("prose", "after"),
    ]


def test_a_heading_inside_a_code_block_in_an_answer_is_text():
    body = "::instruction::\n### Q\nShow a .dlm pair.\n### A\n```markdown\n### Q\nhi\n### A\n::prose::\n```\n"
    (section,) = parse_text(doc(body)).sections
    assert instruction_pairs(section) == [
        ("Show a .dlm pair.", "```markdown\n### Q\nhi\n### A\n::prose::\n```")
    ]


def test_instruction_pairs_refuses_a_section_of_another_type():
    with pytest.raises(ValueError, match="expected a section of type .instruction., got .prose."):
        instruction_pairs(Section("prose", "### Q\nq\n### A\na"))


def test_instruction_pairs_refuses_malformed_content_with_a_relative_line():
    with pytest.raises(ValueError) as info:
        instruction_pairs(Section("instruction", "### Q\nq"))
    assert str(info.value) == "question at line 1 has no `### A` answer"


# --------------------------------------------------------------------------
# Body errors


def test_an_empty_instruction_section_is_an_error():
    err = error_of(doc("::instruction::\n\n"))
    assert str(err) == "doc.dlm:4: instruction section at line 4 is empty"
    assert err.line == 4
    assert err.hint == ("each pair is a `### Q` line and its question, then a `### A` line and its answer")


def test_an_empty_preference_section_is_an_error():
    err = error_of(doc("::preference::\n   \n::prose::\nx\n"))
    assert str(err) == "doc.dlm:4: preference section at line 4 is empty"


def test_text_before_the_first_question_is_an_error():
    err = error_of(doc("::instruction::\n\nhello\n### Q\nq\n### A\na\n"))
    assert str(err) == "doc.dlm:6: text at line 6 comes before the first `### Q`"


def test_a_question_without_an_answer_is_an_error():
    err = error_of(doc("::instruction::\n### Q\nq\n"))
    assert str(err) == "doc.dlm:5: question at line 5 has no `### A` answer"


def test_a_question_followed_by_another_question_is_an_error():
    err = error_of(doc("::instruction::\n### Q\nq1\n### Q\nq2\n### A\na\n"))
    assert str(err) == "doc.dlm:5: question at line 5 has no `### A` answer"


def test_an_answer_without_a_question_is_an_error():
    err = error_of(doc("::instruction::\n### Q\nq\n### A\na\n### A\nb\n"))
    assert str(err) == "doc.dlm:9: `### A` at line 9 has no `### Q` before it"


def test_an_empty_question_is_an_error():
    err = error_of(doc("::instruction::\n### Q\n\n### A\na\n"))
    assert str(err) == "doc.dlm:5: `### Q` at line 5 has no text"


def test_an_empty_answer_is_an_error():
    err = error_of(doc("::instruction::\n### Q\nq\n### A\n  \n\n::prose::\nx\n"))
    assert str(err) == "doc.dlm:7: `### A` at line 7 has no text"


def test_a_heading_with_leading_space_or_other_words_is_not_a_heading():
    err = error_of(doc("::instruction::\n### Q\nq\n ### A\n### Answer\n"))
    assert str(err) == "doc.dlm:5: question at line 5 has no `### A` answer"


def test_a_preference_without_rejected_is_an_error():
    err = error_of(doc("::preference::\n### Prompt\np\n### Chosen\nc\n"))
    assert str(err) == "doc.dlm:5: prompt at line 5 has no `### Rejected` response"


def test_a_preference_heading_out_of_order_is_an_error():
    err = error_of(doc("::preference::\n### Prompt\np\n### Rejected\nr\n### Chosen\nc\n"))
    assert str(err) == "doc.dlm:7: `### Rejected` at line 7 is out of order: expected `### Chosen`"


def test_a_chosen_without_a_prompt_is_an_error():
    err = error_of(doc("::preference::\n### Chosen\nc\n"))
    assert str(err) == "doc.dlm:5: `### Chosen` at line 5 has no `### Prompt` before it"
    assert err.hint == (
        "each triple is a `### Prompt`, a `### Chosen` and a `### Rejected` line, each followed by its text"
    )


def test_a_new_prompt_before_the_last_one_is_complete_is_an_error():
    err = error_of(doc("::preference::\n### Prompt\np\n### Chosen\nc\n### Prompt\nq\n"))
    assert str(err) == "doc.dlm:5: prompt at line 5 has no `### Rejected` response"


# --------------------------------------------------------------------------
# File and fence errors (frontmatter contents: tests/test_frontmatter.py)


def test_a_missing_file_is_an_error_naming_the_path_as_given(tmp_path: Path):
    path = tmp_path / "nope.dlm"
    with pytest.raises(DocumentError) as info:
        parse_document(path)
    assert str(info.value) == f"{path}: no such file"
    assert info.value.line is None
    assert info.value.hint == f"run `dlm init {path}` to create one"


def test_a_file_that_is_not_utf8_is_an_error(tmp_path: Path):
    path = tmp_path / "latin1.dlm"
    path.write_bytes(HEAD.encode() + b"caf\xe9\n")
    with pytest.raises(DocumentError) as info:
        parse_document(path)
    assert str(info.value) == f"{path}: not UTF-8 text (invalid byte 0xe9 at offset 46)"
    assert info.value.line is None


def test_a_directory_is_not_a_document(tmp_path: Path):
    with pytest.raises(DocumentError) as info:
        parse_document(tmp_path)
    assert str(info.value) == f"{tmp_path}: is a directory, not a .dlm file"


def test_a_document_without_frontmatter_is_an_error():
    err = error_of("# Notes\n")
    assert str(err) == "doc.dlm:1: no frontmatter: a .dlm file starts with a '---' line"
    assert err.hint == "run `dlm init doc.dlm` to create a document with frontmatter"


def test_an_empty_file_has_no_frontmatter():
    assert str(error_of("")) == "doc.dlm:1: no frontmatter: a .dlm file starts with a '---' line"


def test_unclosed_frontmatter_is_an_error():
    err = error_of(f"---\ndlm_id: {ULID}\n")
    assert str(err) == ("doc.dlm:1: frontmatter is not closed: no '---' line after the one at line 1")


def test_errors_in_a_file_name_the_path_as_given(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("sub").mkdir()
    Path("sub/x.dlm").write_text("---\n---\n", encoding="utf-8")
    with pytest.raises(DocumentError) as info:
        parse_document("sub/x.dlm")
    assert str(info.value) == "sub/x.dlm:1: missing required key 'dlm_id'"
    assert info.value.path == "sub/x.dlm"


# --------------------------------------------------------------------------
# Round trip

_HEADING_LIKE = ("#", "`", "~")


def _plain_line(line: str) -> bool:
    stripped = line.strip()
    return not stripped.startswith(_HEADING_LIKE) and not (
        stripped.startswith("::") and stripped.endswith("::")
    )


_line = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=30).filter(_plain_line)
_block = (
    st.lists(_line, min_size=1, max_size=6)
    .filter(lambda lines: bool(lines[0].strip()) and bool(lines[-1].strip()))
    .map("\n".join)
)


@settings(max_examples=200, deadline=None)
@given(pairs=st.lists(st.tuples(_block, _block), min_size=1, max_size=4))
def test_instruction_pairs_round_trip_through_a_document(pairs):
    body = "::instruction::\n" + "".join(f"### Q\n{q}\n\n### A\n\n{a}\n" for q, a in pairs)
    (section,) = parse_text(doc(body)).sections
    assert section.type == "instruction"
    assert instruction_pairs(section) == pairs


@settings(max_examples=100, deadline=None)
@given(triples=st.lists(st.tuples(_block, _block, _block), min_size=1, max_size=3))
def test_preference_triples_round_trip_through_a_document(triples):
    body = "::preference::\n" + "".join(
        f"### Prompt\n{p}\n### Chosen\n{c}\n### Rejected\n{r}\n" for p, c, r in triples
    )
    (section,) = parse_text(doc(body).replace("\n", "\r\n")).sections
    assert preference_triples(section) == triples

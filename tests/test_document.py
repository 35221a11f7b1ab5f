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
from dlmstore.errors import DocumentError, DocumentProblems

ULID = "01J9ZK3M4N5P6Q7R8S9T0VWXYZ"
HEAD = f"---\ndlm_id: {ULID}\n---\n"


def doc(body: str) -> str:
    return HEAD + body


def error_of(text: str, path: str = "doc.dlm") -> DocumentError:
    with pytest.raises(DocumentError) as info:
        parse_text(text, path)
    return info.value


def problems_of(text: str, path: str = "doc.dlm") -> list[str]:
    """The ``path:line: message`` of every problem a document has, in the order reported."""
    with pytest.raises(DocumentProblems) as info:
        parse_text(text, path)
    return [str(problem) for problem in info.value.problems]


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
    "::preference::\n"
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


def test_tildes_do_not_open_a_code_block_so_a_fence_after_them_is_a_fence():
    sections = parse_text(
        doc("~~~~ python\n::preference::\n### Prompt\np\n### Chosen\nc\n### Rejected\nr\n")
    ).sections
    assert [(s.type, s.content) for s in sections] == [
        ("prose", "~~~~ python"),
        ("preference", "### Prompt\np\n### Chosen\nc\n### Rejected\nr"),
    ]


def test_any_line_starting_with_three_backticks_closes_a_code_block():
    body = "```\n```python\n::instruction::\n### Q\nq\n### A\na\n"
    sections = parse_text(doc(body)).sections
    assert [(s.type, s.line) for s in sections] == [("prose", 4), ("instruction", 6)]


def test_indented_backticks_do_not_open_a_code_block():
    sections = parse_text(doc("  ```\n::instruction::\n### Q\nq\n### A\na\n")).sections
    assert [(s.type, s.content) for s in sections] == [
        ("prose", "  ```"),
        ("instruction", "### Q\nq\n### A\na"),
    ]


def test_an_unterminated_code_block_is_an_error_naming_the_line_that_opened_it():
    err = error_of(doc("Intro.\n\n```python\nx = 1\n::instruction::\n"))
    assert str(err) == "doc.dlm:6: the code block opened at line 6 is never closed"
    assert err.line == 6
    assert err.hint == "close it with a line starting with ``` (until then every fence after it is text)"


def test_a_code_block_closes_only_on_the_same_fence_character():
    body = "```\n~~~\n::instruction::\n```\n::prose::\nafter\n"
    sections = parse_text(doc(body)).sections
    assert [(s.type, s.content) for s in sections] == [
        ("prose", "```\n~~~\n::instruction::\n```"),
        ("prose", "after"),
    ]


def test_a_heading_inside_a_code_block_in_an_answer_is_a_heading_as_in_dlm():
    body = "::instruction::\n### Q\nShow a .dlm pair.\n### A\n```markdown\n### Q\nhi\n### A\n::prose::\n```\n"
    (section,) = parse_text(doc(body)).sections
    assert instruction_pairs(section) == [("Show a .dlm pair.", "```markdown"), ("hi", "::prose::\n```")]


def test_a_fence_line_inside_a_code_block_in_an_answer_is_text():
    body = "::instruction::\n### Q\nq\n### A\n```\n::preference::\n```\n"
    (section,) = parse_text(doc(body)).sections
    assert instruction_pairs(section) == [("q", "```\n::preference::\n```")]


def test_instruction_pairs_refuses_a_section_of_another_type():
    with pytest.raises(ValueError, match="expected a section of type .instruction., got .prose."):
        instruction_pairs(Section("prose", "### Q\nq\n### A\na"))


def test_instruction_pairs_refuses_malformed_content_with_a_relative_line():
    with pytest.raises(ValueError) as info:
        instruction_pairs(Section("instruction", "### Q\nq"))
    assert str(info.value) == "question at line 1 has no `### A` answer"


# --------------------------------------------------------------------------
# Body errors


def test_an_empty_instruction_section_is_an_error_at_its_fence():
    err = error_of(doc("::instruction::\n\n"))
    assert str(err) == "doc.dlm:4: instruction section has no `### Q`"
    assert err.line == 4
    assert err.hint == ("each pair is a `### Q` line and its question, then a `### A` line and its answer")


def test_an_empty_preference_section_is_an_error_at_its_fence():
    err = error_of(doc("::preference::\n   \n::prose::\nx\n"))
    assert str(err) == "doc.dlm:4: preference section has no `### Prompt`"


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


def test_a_heading_with_other_words_is_not_a_heading():
    err = error_of(doc("::instruction::\n### Q\nq\n### Answer\n"))
    assert str(err) == "doc.dlm:5: question at line 5 has no `### A` answer"


def test_a_heading_with_leading_or_trailing_whitespace_is_a_heading():
    (section,) = parse_text(doc("::instruction::\n  ### Q\n  indented q  \n\t### A \n\ta  \n")).sections
    assert section.content == "  ### Q\n  indented q  \n\t### A \n\ta  "
    assert instruction_pairs(section) == [("indented q", "a")]


def test_q_and_a_texts_lose_their_indentation_and_trailing_spaces():
    (section,) = parse_text(doc("::instruction::\n### Q\n   What?   \n### A\n    code\n  more  \n")).sections
    assert instruction_pairs(section) == [("What?", "code\n  more")]
    (section,) = parse_text(
        doc("::preference::\n### Prompt\n p \n### Chosen\n\tc\t\n### Rejected\n r\n")
    ).sections
    assert preference_triples(section) == [("p", "c", "r")]


def test_a_heading_with_text_on_its_line_is_an_error():
    err = error_of(doc("::instruction::\n### Q What is it?\n### A\nx\n"))
    assert str(err) == (
        "doc.dlm:5: `### Q` at line 5 has text on its line: '### Q What is it?'; "
        "the heading must be alone on its line, its text on the lines below"
    )
    assert err.hint == "each pair is a `### Q` line and its question, then a `### A` line and its answer"
    err = error_of(doc("::preference::\n### Prompt\np\n### Chosen: yes\n### Rejected\nr\n"))
    assert str(err).startswith("doc.dlm:7: `### Chosen` at line 7 has text on its line: '### Chosen: yes'")


def test_a_heading_with_text_on_its_line_inside_a_code_block_is_text():
    (section,) = parse_text(doc("::instruction::\n### Q\nq\n### A\n```\n### Q What?\n```\n")).sections
    assert instruction_pairs(section) == [("q", "```\n### Q What?\n```")]


def test_a_probe_question_is_a_question():
    (section,) = parse_text(doc("::instruction::\n### Q !probe\nWhat?\n### A\nThat.\n")).sections
    assert section.content == "### Q !probe\nWhat?\n### A\nThat."
    assert instruction_pairs(section) == [("What?", "That.")]


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
# Fences: DLM's grammar, and what dlmstore refuses


@pytest.mark.parametrize(
    ("fence", "hint"),
    [
        ("::instuction::", "did you mean `::instruction::`? The fences dlmstore trains: "
         "::prose::, ::instruction::, ::preference::"),
        ("::preferance::", "did you mean `::preference::`? The fences dlmstore trains: "
         "::prose::, ::instruction::, ::preference::"),
        ("::INSTRUCTION::", "fence names are lower case: write `::instruction::`"),
        ("::note::", "the fences dlmstore trains: ::prose::, ::instruction::, ::preference::"),
    ],
)  # fmt: skip
def test_an_unknown_fence_is_an_error_with_what_to_write_instead(fence, hint):
    err = error_of(doc(f"Intro.\n{fence}\n### Q\nq\n### A\na\n"))
    assert str(err) == f"doc.dlm:5: unknown section fence '{fence}'"
    assert err.hint == hint


def test_a_fence_with_nothing_after_its_hash_is_an_error():
    err = error_of(doc("::instruction#::\n"))
    assert str(err) == "doc.dlm:4: fence '::instruction#::' has nothing after '#'"
    assert err.hint == "write `::instruction::`"


def test_a_fence_routed_to_an_invalid_adapter_name_is_an_error():
    err = error_of(doc("::instruction#Tone::\n"))
    assert (
        str(err)
        == "doc.dlm:4: fence '::instruction#Tone::' names adapter 'Tone', which is not an adapter name"
    )
    assert err.hint == "an adapter name is a lower-case letter then up to 31 of a-z, 0-9 and _"


def test_a_fence_routed_to_an_adapter_in_a_document_that_declares_none_is_an_error():
    err = error_of(doc("::instruction#tone::\n### Q\nq\n### A\na\n"))
    assert str(err) == (
        "doc.dlm:4: fence '::instruction#tone::' routes the section to adapter 'tone', but the document "
        "declares no training.adapters"
    )
    assert err.hint == "declare it (training.adapters: {tone: {}}), or write `::instruction::`"


@pytest.mark.parametrize(
    ("fence", "words"),
    [
        ('::image path="figures/a.png" alt="A chart"::', "image sections train vision-language models"),
        ('::image path="a.png"::', "image sections train vision-language models"),
        ('::audio path="clip.wav" transcript="Hello there."::', "audio sections train audio-language models"),
    ],
)
def test_a_media_section_is_parsed_then_refused_by_name(fence, words):
    media = fence[2:7]
    err = error_of(doc(f"{fence}\nA caption.\n"))
    assert str(err) == f"doc.dlm:4: `::{media} ...::` section: {words}, and dlmstore trains text models only"
    assert err.hint == "remove the section, or train this document with DocumentLanguageModel"


@pytest.mark.parametrize(
    ("fence", "message", "hint"),
    [
        ('::image alt="x"::', "fence '::image ...::' lacks attribute path", None),
        ('::audio path="a.wav"::', "fence '::audio ...::' lacks attribute transcript", None),
        ('::image path="a.png" size="2"::', "fence '::image ...::' has unknown attribute 'size'", "allowed: alt, path"),
        ('::audio path="a" transcript="t" alt="x"::', "fence '::audio ...::' has unknown attribute 'alt'",
         "allowed: path, transcript"),
        ('::image path="a.png" path="b.png"::', "fence '::image ...::' repeats attribute 'path'", None),
        ('::image path="bild-ü.png"::', "fence '::image ...::' attribute 'path' is not ASCII", None),
        ('::prose path="a"::', "fence '::prose ...::' does not take attributes", "write `::prose::`"),
        ('::poem path="a"::', "unknown section fence '::poem ...::'",
         "did you mean `::prose::`? The fences dlmstore trains: ::prose::, ::instruction::, ::preference::"),
    ],
)  # fmt: skip
def test_a_media_fence_with_bad_attributes_gets_dlms_error(fence, message, hint):
    err = error_of(doc(f"{fence}\n"))
    assert str(err) == f"doc.dlm:4: {message}"
    assert err.hint == hint


@pytest.mark.parametrize(
    ("fence", "hint"),
    [
        ("::image::", 'DLM writes it as `::image path="..."::`'),
        ("::audio::", 'DLM writes it as `::audio path="..." transcript="..."::`'),
    ],
)
def test_a_bare_media_fence_needs_its_attributes(fence, hint):
    err = error_of(doc(f"{fence}\n"))
    assert str(err) == f"doc.dlm:4: fence '{fence}' needs attributes"
    assert err.hint == hint


@pytest.mark.parametrize("line", ["  ::instruction::", "::instruction::  ", "\t::instruction::"])
def test_a_fence_with_spaces_around_it_is_an_error(line):
    err = error_of(doc(f"{line}\n### Q\nq\n### A\na\n"))
    assert str(err) == f"doc.dlm:4: fence line '{line}' has spaces around it"
    assert err.hint == "a fence is a whole line with nothing before or after it: write `::instruction::`"


def test_a_fence_with_spaces_inside_it_is_an_error():
    err = error_of(doc(":: prose ::\ntext\n"))
    assert str(err) == "doc.dlm:4: fence line ':: prose ::' has spaces inside it"
    assert err.hint == "write `::prose::`"


def test_text_between_double_colons_that_is_no_fence_stays_prose():
    body = "::std::vector::\nstd::string:: here\n:: hello world ::\nA::B::C\n"
    (section,) = parse_text(doc(body)).sections
    assert section == Section("prose", body.rstrip("\n"), line=4)


def test_a_refused_fence_skips_its_section_without_further_errors():
    body = '::image path="a.png"::\n### Chosen\nnot a valid section\n::instruction::\n### Q\nq\n### A\na\n'
    err = error_of(doc(body))
    assert not isinstance(err, DocumentProblems)
    assert err.line == 4


# --------------------------------------------------------------------------
# DLM's markers


HARVEST = '<!-- dlm-auto-harvest: source="run 3, probe 2" -->'
MINED = (
    '<!-- dlm-auto-mined: judge_name="sway" judge_score_chosen="0.9" judge_score_rejected="-1.5e-1" '
    'mined_at="2026-01-01T00:00:00Z" mined_run_id="3" -->'
)
SYNTH = (
    '<!-- dlm-auto-synth: synth_teacher="self" synth_strategy="extraction" '
    'synth_at="2026-01-01T00:00:00+00:00" source_section_id="0123456789abcdef" -->'
)
PAIR = "### Q\nq\n### A\na"
TRIPLE = "### Prompt\np\n### Chosen\nc\n### Rejected\nr"


@pytest.mark.parametrize(
    ("type", "markers", "content"),
    [
        ("instruction", [HARVEST], PAIR),
        ("instruction", [SYNTH], PAIR),
        ("instruction", [HARVEST, SYNTH], PAIR),
        ("preference", [HARVEST], TRIPLE),
        ("preference", [MINED], TRIPLE),
        ("preference", [HARVEST, MINED], TRIPLE),
    ],
)
def test_markers_on_the_first_lines_of_a_section_are_dropped_from_its_content(type, markers, content):
    marked = parse_text(doc(f"::{type}::\n" + "".join(f"{m}\n" for m in markers) + f"{content}\n"))
    plain = parse_text(doc(f"::{type}::\n{content}\n"))
    (section,) = marked.sections
    assert section.content == content
    assert section.line == 4
    assert section.section_id == plain.sections[0].section_id  # provenance is not identity


def test_a_marker_after_the_first_lines_is_content():
    err = error_of(doc(f"::instruction::\n\n{HARVEST}\n{PAIR}\n"))
    assert str(err) == "doc.dlm:6: text at line 6 comes before the first `### Q`"


def test_a_marker_for_another_section_type_is_content():
    err = error_of(doc(f"::instruction::\n{MINED}\n{PAIR}\n"))
    assert str(err) == "doc.dlm:5: text at line 5 comes before the first `### Q`"
    assert parse_text(doc(f"{HARVEST}\nprose\n")).sections[0].content == f"{HARVEST}\nprose"


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("<!-- dlm-auto-synth:garbage -->", "dlm-auto-synth marker is malformed"),
        ('<!-- dlm-auto-synth: synth_teacher="t" -->', "dlm-auto-synth marker lacks source_section_id, synth_at, synth_strategy"),
        (SYNTH.replace('synth_at="2026-01-01T00:00:00+00:00"', 'synth_at="yesterday"'),
         "dlm-auto-synth marker: synth_at is not an ISO-8601 time"),
        (SYNTH.replace("0123456789abcdef", "0123456789ABCDEF"),
         "dlm-auto-synth marker: source_section_id must be 16 lower-case hex digits"),
        (SYNTH.replace('synth_teacher="self"', 'synth_teacher="self" synth_teacher="x"'),
         "dlm-auto-synth marker repeats 'synth_teacher'"),
        (SYNTH.replace('synth_teacher="self"', 'teacher="self"'), "dlm-auto-synth marker has unknown attribute 'teacher'"),
    ],
)  # fmt: skip
def test_a_malformed_synth_marker_is_an_error_at_its_line(marker, message):
    err = error_of(doc(f"::instruction::\n{HARVEST}\n{marker}\n{PAIR}\n"))
    assert str(err) == f"doc.dlm:6: {message}"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('judge_score_chosen="0.9"', 'judge_score_chosen="high"'),
         "judge scores must be numbers, mined_run_id a whole number"),
        (('mined_run_id="3"', 'mined_run_id="3.5"'), "judge scores must be numbers, mined_run_id a whole number"),
        (('judge_score_chosen="0.9"', 'judge_score_chosen="inf"'),
         "judge scores must be finite and mined_run_id at least 1"),
        (('mined_run_id="3"', 'mined_run_id="0"'), "judge scores must be finite and mined_run_id at least 1"),
        (('mined_at="2026-01-01T00:00:00Z"', 'mined_at="soon"'), "mined_at is not an ISO-8601 time"),
    ],
)  # fmt: skip
def test_a_malformed_mined_marker_is_an_error_at_its_line(change, message):
    err = error_of(doc(f"::preference::\n{MINED.replace(*change)}\n{TRIPLE}\n"))
    assert str(err) == f"doc.dlm:5: dlm-auto-mined marker: {message}"


def test_a_malformed_mined_marker_names_the_allowed_attributes():
    err = error_of(doc('::preference::\n<!-- dlm-auto-mined: judge="x" -->\n' + TRIPLE + "\n"))
    assert str(err) == "doc.dlm:5: dlm-auto-mined marker has unknown attribute 'judge'"
    assert err.hint == "allowed: judge_name, judge_score_chosen, judge_score_rejected, mined_at, mined_run_id"


# --------------------------------------------------------------------------
# Every problem at once


def test_a_frontmatter_problem_and_a_fence_problem_are_reported_together():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  seed: x\n---\nIntro.\n::instuction::\n{PAIR}\n"
    assert problems_of(text) == [
        "doc.dlm:4: training.seed: must be a whole number, not 'x'",
        "doc.dlm:7: unknown section fence '::instuction::'",
    ]


def test_every_body_problem_is_reported_in_line_order():
    body = (
        "::instruction::\n"  # 4
        "### Q\n"
        "\n"
        "### A\n"
        "a\n"
        "::bogus::\n"  # 9
        "::preference::\n"  # 10
        "### Chosen\n"  # 11
        "c\n"
        "::image::\n"  # 13
        "```\n"  # 14
    )
    assert problems_of(doc(body)) == [
        "doc.dlm:5: `### Q` at line 5 has no text",
        "doc.dlm:9: unknown section fence '::bogus::'",
        "doc.dlm:11: `### Chosen` at line 11 has no `### Prompt` before it",
        "doc.dlm:13: fence '::image::' needs attributes",
        "doc.dlm:14: the code block opened at line 14 is never closed",
    ]


# --------------------------------------------------------------------------
# Round trip

_HEADING_LIKE = ("#", "`", "~")


def _plain_line(line: str) -> bool:
    stripped = line.strip()
    return not stripped.startswith(_HEADING_LIKE) and not (
        stripped.startswith("::") and stripped.endswith("::")
    )


# Zl and Zp (U+2028, U+2029) end a line in DLM's grammar (str.splitlines), as CR and LF do.
_line = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=30).filter(
    _plain_line
)
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
    assert instruction_pairs(section) == [(q.strip(), a.strip()) for q, a in pairs]


@settings(max_examples=100, deadline=None)
@given(triples=st.lists(st.tuples(_block, _block, _block), min_size=1, max_size=3))
def test_preference_triples_round_trip_through_a_document(triples):
    body = "::preference::\n" + "".join(
        f"### Prompt\n{p}\n### Chosen\n{c}\n### Rejected\n{r}\n" for p, c, r in triples
    )
    (section,) = parse_text(doc(body).replace("\n", "\r\n")).sections
    assert preference_triples(section) == [(p.strip(), c.strip(), r.strip()) for p, c, r in triples]

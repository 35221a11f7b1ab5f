"""Hostile frontmatter: every document costs bounded time and memory and fails with its line.

Alias bombs, deep nesting, huge numbers and values a YAML tag cannot hold
are refused by the loader (dlmstore.document.loading) while it composes,
each as one problem at its line; a rejected value is quoted by
``short_repr``, which reads no more of it than it prints. Figures are in
``bench/bench_hostile.py``; no test here times anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.document.frontmatter import short_repr
from dlmstore.document.loading import MAX_ALIAS_EXPANSION, MAX_NESTING, MAX_PROBLEMS, MAX_VALUES
from dlmstore.document.parser import parse_text
from dlmstore.errors import DocumentError, DocumentProblems

ULID = "01J9ZK3M4N5P6Q7R8S9T0VWXYZ"

GROWTH = (
    f"aliases grow this value by more than {MAX_ALIAS_EXPANSION:,} values and characters (a YAML alias bomb?)"
)


def doc(frontmatter: str) -> str:
    return f"---\ndlm_id: {ULID}\n{frontmatter}---\nSome prose.\n"


def error_of(text: str) -> str:
    with pytest.raises(DocumentError) as info:
        parse_text(text, "doc.dlm")
    assert not isinstance(info.value, DocumentProblems), info.value.reports()
    return str(info.value)


def sequence_bomb(levels: int = 9) -> str:
    """The issue's shape: one line, each list nine copies of the one before."""
    parts = ["&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    parts += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return f"system_prompt: [{', '.join(parts)}]\n"


# --------------------------------------------------------------------------
# Alias bombs and cycles


def test_a_sequence_alias_bomb_is_one_error_at_its_line() -> None:
    assert error_of(doc(sequence_bomb())) == f"doc.dlm:3: {GROWTH}"


def test_a_mapping_alias_bomb_under_a_known_key_is_one_error_at_the_value_that_explodes() -> None:
    lines = ["training:", "  adapters:", "    a0: &a0 {" + ", ".join(f"k{j}: lol" for j in range(9)) + "}"]
    lines += [
        f"    a{i}: &a{i} {{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(9)) + "}" for i in range(1, 9)
    ]
    assert error_of(doc("\n".join(lines) + "\n")) == f"doc.dlm:9: {GROWTH}"


def test_a_merge_key_bomb_is_refused_before_construction_expands_it() -> None:
    lines = ["x0: &a0 {" + ", ".join(f"k{j}: lol" for j in range(9)) + "}"]
    lines += [f"x{i}: &a{i} {{<<: [{', '.join([f'*a{i - 1}'] * 9)}]}}" for i in range(1, 9)]
    assert error_of(doc("\n".join(lines) + "\n")) == f"doc.dlm:7: {GROWTH}"


def test_an_alias_inside_the_value_it_names_is_an_error() -> None:
    assert error_of(doc("system_prompt: &a [x, *a]\n")) == (
        "doc.dlm:3: alias *a is used inside the value it names"
    )


def test_a_chain_of_aliases_nesting_deeper_than_the_limit_is_an_error() -> None:
    chain = "".join(f"k{i}: &a{i} [*a{i - 1}]\n" for i in range(1, MAX_NESTING + 2))
    message = error_of(doc(f"k0: &a0 [x]\n{chain}"))
    assert message.endswith(
        f"through aliases, the frontmatter nests values more than {MAX_NESTING} levels deep"
    )


def test_documents_sharing_values_through_anchors_aliases_and_merges_still_parse() -> None:
    text = doc(
        "training:\n"
        "  sources:\n"
        "    - &notes {path: notes, include: &globs ['**/*.md', '**/*.txt'], max_files: 3}\n"
        "    - <<: *notes\n"
        "      path: more\n"
        "    - {path: third, include: *globs}\n"
    )
    sources = parse_text(text).frontmatter.training.sources
    assert [(s.path, s.include, s.max_files) for s in sources] == [
        ("notes", ["**/*.md", "**/*.txt"], 3),
        ("more", ["**/*.md", "**/*.txt"], 3),
        ("third", ["**/*.md", "**/*.txt"], None),
    ]


def test_a_rejected_value_repeated_by_aliases_is_quoted_short() -> None:
    problems = error_of(doc(sequence_bomb(levels=4)))
    assert (
        problems == "doc.dlm:3: system_prompt: must be a string, not [['lol', 'lol', 'lol', 'lol', 'lol', ..."
    )


# --------------------------------------------------------------------------
# Size and nesting


@pytest.mark.parametrize(
    "value",
    [
        "[" * 500 + "]" * 500,
        "{a: " * 500 + "x" + "}" * 500,
        "\n" + "".join(" " * (2 * i + 2) + "-\n" for i in range(500)),
    ],
    ids=["flow lists", "flow mappings", "block lists"],
)
def test_nesting_500_levels_deep_is_an_error_not_a_recursion_error(value: str) -> None:
    assert error_of(doc(f"system_prompt: {value}\n")).endswith(
        f"the frontmatter nests values more than {MAX_NESTING} levels deep"
    )


def test_a_frontmatter_with_more_values_than_the_limit_is_an_error() -> None:
    items = ", ".join(["a"] * MAX_VALUES)
    assert error_of(doc(f"system_prompt: [{items}]\n")) == (
        f"doc.dlm:3: the frontmatter holds more than {MAX_VALUES:,} keys and values"
    )


def test_only_the_first_problems_are_listed_and_the_rest_counted() -> None:
    keys = "".join(f"k{i}: 1\n" for i in range(MAX_PROBLEMS + 10))
    with pytest.raises(DocumentProblems) as info:
        parse_text(doc(keys), "doc.dlm")
    reports = [message for message, _ in info.value.reports()]
    assert len(reports) == MAX_PROBLEMS + 1
    assert reports[0] == "doc.dlm:3: unknown key 'k0'"
    assert reports[-1] == (
        f"doc.dlm:{3 + MAX_PROBLEMS}: 10 more problems in the frontmatter from this line on "
        f"(only the first {MAX_PROBLEMS} are listed)"
    )


@pytest.mark.parametrize(
    "frontmatter",
    [
        sequence_bomb(),
        "system_prompt: [" + ",".join(["a"] * 30_000) + "]\n",
        "".join(f"k{i}: 1\n" for i in range(4_900)),
        "system_prompt: " + "[" * 30_000 + "]" * 30_000 + "\n",
    ],
    ids=["alias bomb", "64 KiB flow list", "4,900 unknown keys", "nesting 30,000 deep"],
)
def test_a_hostile_64_kib_document_parses_within_100_mb(frontmatter: str) -> None:
    import tracemalloc

    text = doc(frontmatter)
    assert len(text.encode()) <= 64 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(DocumentError):
            parse_text(text, "doc.dlm")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 * 1024 * 1024


# --------------------------------------------------------------------------
# Scalars a tag cannot hold, numbers too long to print


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("2001-02-30", "cannot read '2001-02-30' as timestamp: day is out of range for month"),
        ("!!int abc", "cannot read 'abc' as int: invalid literal for int() with base 10: 'abc'"),
        ("!!float abc", "cannot read 'abc' as float: could not convert string to float: 'abc'"),
        ("!!bool maybe", "cannot read 'maybe' as bool: not one of its values"),
        ("1" * 5000, "cannot read '111111111111111111111111111111111111... as int: "
         "Exceeds the limit (4300 digits) for integer string conversion: value has 5000 digits"),
    ],
)  # fmt: skip
def test_a_scalar_its_tag_cannot_hold_is_an_error_at_its_line(value: str, message: str) -> None:
    assert error_of(doc(f"base_model: {value}\n")) == f"doc.dlm:3: invalid YAML in frontmatter: {message}"


def test_a_number_too_long_to_print_is_quoted_by_its_length() -> None:
    assert error_of(doc(f"base_model: 0x{'f' * 5000}\n")) == (
        "doc.dlm:3: base_model: must be a string, not a number of about 6020 digits"
    )
    assert error_of(doc(f"dlm_version: 0x{'f' * 5000}\n")).startswith(
        "doc.dlm:3: dlm_version a number of about 6020 digits is newer than"
    )


@pytest.mark.parametrize(
    "value",
    [[], [1, (2,), {3}], {"a": None, "b": frozenset()}, "x" * 100, 1.5, -(10**39), set()],
    ids=repr,
)
def test_short_repr_is_repr_cut_to_forty_characters(value: object) -> None:
    text = repr(value)
    assert short_repr(value) == (text if len(text) <= 40 else text[:37] + "...")


def test_short_repr_of_a_list_containing_itself_stays_short() -> None:
    loop: list[object] = []
    loop.append(loop)
    assert short_repr(loop) == "[" * 37 + "..."


# --------------------------------------------------------------------------
# Through the CLI


def test_dlm_show_of_the_alias_bomb_is_one_error_line(tmp_path: Path) -> None:
    path = tmp_path / "bomb.dlm"
    path.write_text(doc(sequence_bomb()))
    result = CliRunner().invoke(cli, ["show", str(path)])
    assert result.exit_code == 1
    assert result.output == f"error: {path}:3: {GROWTH}\n"


def test_a_training_yaml_alias_bomb_or_deep_nesting_is_one_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "src" / ".dlm").mkdir(parents=True)
    (tmp_path / "src" / "a.txt").write_text("text\n")
    document = tmp_path / "doc.dlm"
    document.write_text(doc("training:\n  sources:\n    - path: src\n"))
    config = tmp_path / "src" / ".dlm" / "training.yaml"
    for body, problem in [
        (f"dlm_training_version: 1\ninclude: [{sequence_bomb()[16:-2]}]\n", GROWTH),
        ("dlm_training_version: 1\ninclude: " + "[" * 500 + "]" * 500 + "\n",
         f"the file nests values more than {MAX_NESTING} levels deep"),
    ]:  # fmt: skip
        config.write_text(body)
        result = CliRunner().invoke(cli, ["show", str(document)])
        assert result.exit_code == 1
        assert result.output == (
            f"error: training.sources 'src': {config}:2: {problem}\nhint: fix the file, or remove it\n"
        )

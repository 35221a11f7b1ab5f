"""Glob compilation and ``.dlm/ignore`` parsing/matching (dlmstore.sources.ignore)."""

from __future__ import annotations

import fnmatch
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlmstore.sources.ignore import (
    GlobSet,
    IgnoreRule,
    IgnoreRules,
    glob_regex,
    is_ignored,
    parse_ignore,
)


def matches(pattern: str, path: str) -> bool:
    return re.fullmatch(f"(?s:{glob_regex(pattern)})", path) is not None


# -- directive globs ---------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("**/*.py", "a.py", True),  # "**/" matches zero segments
        ("**/*.py", "pkg/sub/a.py", True),
        ("**/*.py", "a.pyc", False),
        ("**/*.py", "a/py", False),
        ("*.py", "a.py", True),
        ("*.py", "pkg/a.py", False),  # "*" never crosses "/"
        ("?.md", "a.md", True),
        ("?.md", "ab.md", False),
        ("?.md", "/.md", False),
        ("docs/**/*.md", "docs/a.md", True),
        ("docs/**/*.md", "docs/x/y/a.md", True),
        ("docs/**/*.md", "src/docs/a.md", False),
        ("build/**", "build/x", True),
        ("build/**", "build/x/y.o", True),
        ("build/**", "build", False),  # as in git: everything *inside* build
        ("**", "anything/at/all", True),
        ("**/**/x", "x", True),  # runs of "**" collapse
        ("a**b", "aXXb", True),  # "**" inside a segment is a plain "*"
        ("a**b", "a/b", False),
        ("*.py[cod]", "m.pyc", True),
        ("*.py[cod]", "m.pyx", False),
        ("[!a]*", "b.txt", True),
        ("[!a]*", "a.txt", False),
        ("[a-c].txt", "b.txt", True),
        ("[a-c].txt", "d.txt", False),
        ("[ab", "[ab", True),  # an unclosed bracket is literal
        ("\\*.txt", "*.txt", True),  # backslash escapes
        ("\\*.txt", "a.txt", False),
        ("a//b/", "a/b", True),  # empty segments are ignored
    ],
)
def test_glob_regex_matches_relative_paths_by_segment(pattern: str, path: str, expected: bool) -> None:
    assert matches(pattern, path) is expected


def test_glob_set_matches_when_any_pattern_does_and_uses_names_for_double_star_globs() -> None:
    globs = GlobSet.compile(["**/*.py", "**/*.md"])
    assert globs.name_matcher() is not None
    assert globs.matches("pkg/a.py", "a.py")
    assert globs.matches("README.md", "README.md")
    assert not globs.matches("pkg/a.txt", "a.txt")
    mixed = GlobSet.compile(["src/*.py", "**/*.md"])
    assert mixed.name_matcher() is None
    assert mixed.matches("src/a.py", "a.py")
    assert not mixed.matches("lib/a.py", "a.py")


def test_an_empty_glob_set_matches_nothing() -> None:
    globs = GlobSet.compile([])
    assert not globs.matches("a", "a")
    assert not globs.covers_dir("a")
    assert not globs.can_contain("a")


@pytest.mark.parametrize(
    ("patterns", "directory", "expected"),
    [
        (["**/*.py"], "any/dir", True),
        (["src/**/*.py"], "src", True),
        (["src/**/*.py"], "src/deep/er", True),
        (["src/**/*.py"], "docs", False),
        (["*.md"], "docs", False),  # only top-level files can match
        (["a/b/c.md"], "a", True),
        (["a/b/c.md"], "a/b", True),
        (["a/b/c.md"], "a/b/c", False),
        (["a/b/c.md"], "x", False),
        (["a/*/x/**"], "a/q/x/r/s", True),
        (["a/*/x/**"], "a/q/y", False),
        (["docs/**", "*.txt"], "docs", True),
    ],
)
def test_can_contain_tells_which_directories_may_hold_a_match(
    patterns: list[str], directory: str, expected: bool
) -> None:
    assert GlobSet.compile(patterns).can_contain(directory) is expected


@pytest.mark.parametrize(
    ("patterns", "directory", "expected"),
    [
        (["build/**"], "build", True),
        (["build/**"], "builder", False),
        (["build/**"], "x/build", False),
        (["**/node_modules/**"], "x/y/node_modules", True),
        (["**"], "anything", True),
        (["build/*"], "build", False),  # only direct children, not everything below
        (["*.log"], "logs.log", False),
    ],
)
def test_covers_dir_is_true_only_when_everything_below_matches(
    patterns: list[str], directory: str, expected: bool
) -> None:
    assert GlobSet.compile(patterns).covers_dir(directory) is expected


# -- ignore files --------------------------------------------------------------


def test_parse_ignore_reads_comments_negation_dir_only_and_anchoring() -> None:
    text = "\n".join(
        [
            "# a comment",
            "",
            "*.log",
            "!keep.log",
            "build/",
            "/top.txt",
            "docs/*.md",
            "\\#literal",
            "trailing   ",
            "kept\\ ",
        ]
    )
    assert parse_ignore(text) == [
        IgnoreRule("*.log", negated=False, dir_only=False, anchored=False),
        IgnoreRule("keep.log", negated=True, dir_only=False, anchored=False),
        IgnoreRule("build", negated=False, dir_only=True, anchored=False),
        IgnoreRule("top.txt", negated=False, dir_only=False, anchored=True),
        IgnoreRule("docs/*.md", negated=False, dir_only=False, anchored=True),
        IgnoreRule("\\#literal", negated=False, dir_only=False, anchored=False),
        IgnoreRule("trailing", negated=False, dir_only=False, anchored=False),
        IgnoreRule("kept\\ ", negated=False, dir_only=False, anchored=False),
    ]


def test_the_last_matching_rule_wins() -> None:
    rules = IgnoreRules.parse("*.log\n!keep.log\n")
    assert rules.verdict("a.log", "a.log", False) is True
    assert rules.verdict("x/keep.log", "keep.log", False) is False
    assert rules.verdict("a.txt", "a.txt", False) is None
    reordered = IgnoreRules.parse("!keep.log\n*.log\n")
    assert reordered.verdict("keep.log", "keep.log", False) is True


def test_a_trailing_slash_rule_matches_directories_only() -> None:
    rules = IgnoreRules.parse("build/\n")
    assert rules.verdict("build", "build", True) is True
    assert rules.verdict("x/build", "build", True) is True
    assert rules.verdict("build", "build", False) is None


def test_anchored_rules_match_from_the_ignore_files_directory_only() -> None:
    rules = IgnoreRules.parse("/top.txt\ndocs/*.md\n*.tmp\n")
    assert rules.verdict("top.txt", "top.txt", False) is True
    assert rules.verdict("sub/top.txt", "top.txt", False) is None
    assert rules.verdict("docs/a.md", "a.md", False) is True
    assert rules.verdict("x/docs/a.md", "a.md", False) is None
    assert rules.verdict("deep/er/a.tmp", "a.tmp", False) is True  # unanchored: any depth


def test_escapes_make_hash_and_trailing_space_literal() -> None:
    rules = IgnoreRules.parse("\\#notes\nspace\\ \n")
    assert rules.verdict("#notes", "#notes", False) is True
    assert rules.verdict("space ", "space ", False) is True
    assert rules.verdict("space", "space", False) is None


def test_deeper_ignore_files_override_shallower_ones() -> None:
    chain = (
        IgnoreRules.parse("*.txt\n"),
        IgnoreRules.parse("!keep.txt\n", base="sub"),
    )
    assert is_ignored(chain, "keep.txt", "keep.txt", False) is True
    assert is_ignored(chain, "sub/keep.txt", "keep.txt", False) is False
    assert is_ignored(chain, "sub/other.txt", "other.txt", False) is True
    assert is_ignored(chain, "sub/deeper/keep.txt", "keep.txt", False) is False
    assert is_ignored(chain, "a.md", "a.md", False) is False


def test_rules_of_a_nested_ignore_file_are_relative_to_its_directory() -> None:
    chain = (IgnoreRules.parse("/gen.txt\nout/\n", base="pkg/sub"),)
    assert is_ignored(chain, "pkg/sub/gen.txt", "gen.txt", False) is True
    assert is_ignored(chain, "pkg/sub/x/gen.txt", "gen.txt", False) is False
    assert is_ignored(chain, "pkg/sub/x/out", "out", True) is True


def test_simple_matchers_are_offered_only_for_name_only_rules_without_negation() -> None:
    assert IgnoreRules.parse("*.log\nbuild/\n").simple_matchers() is not None
    assert IgnoreRules.parse("*.log\n!keep.log\n").simple_matchers() is None
    assert IgnoreRules.parse("/top.txt\n").simple_matchers() is None


# -- property: the compiled regex agrees with a plain segment matcher -----------


def reference_match(pattern: str, path: str) -> bool:
    """Segment by segment, ``fnmatch`` within a segment, ``**`` across them."""
    pats: list[str] = []
    for seg in pattern.split("/"):
        if seg and not (seg == "**" and pats and pats[-1] == "**"):
            pats.append(seg)
    segs = path.split("/")

    def match(i: int, j: int) -> bool:
        if i == len(pats):
            return j == len(segs)
        if pats[i] == "**":
            if i == len(pats) - 1:  # trailing: one or more segments
                return len(segs) - j >= 1
            return any(match(i + 1, k) for k in range(j, len(segs) + 1))
        return j < len(segs) and fnmatch.fnmatchcase(segs[j], pats[i]) and match(i + 1, j + 1)

    return bool(pats) and match(0, 0)


PATTERN_TOKENS = ["a", "b", ".", "*", "?", "**", "/", "[ab]", "[!ab]", "[a-c]", "[", "]", "!"]
segments = st.text(alphabet="ab.c[]!-", min_size=1, max_size=4)
paths = st.lists(segments, min_size=1, max_size=5).map("/".join)
patterns = st.lists(st.sampled_from(PATTERN_TOKENS), min_size=1, max_size=8).map("".join)


@given(pattern=patterns, path=paths)
def test_compiled_globs_agree_with_a_reference_matcher(pattern: str, path: str) -> None:
    assert matches(pattern, path) is reference_match(pattern, path)


@given(pattern=patterns, path=paths)
def test_pruning_never_loses_a_match(pattern: str, path: str) -> None:
    globs = GlobSet.compile([pattern])
    parts = path.split("/")
    ancestors = ["/".join(parts[:i]) for i in range(1, len(parts))]
    if globs.matches(path, parts[-1]):
        assert all(globs.can_contain(d) for d in ancestors)
    if any(globs.covers_dir(d) for d in ancestors):
        assert globs.matches(path, parts[-1])

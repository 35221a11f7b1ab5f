"""DLM's globs and ``.dlm/ignore`` rules (dlmstore.sources.glob, dlmstore.sources.ignore)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlmstore.sources.glob import Globs, Predicate, match_all, name_test
from dlmstore.sources.ignore import IgnoreRule, parse_ignore, rule_predicate

# -- an independent reference: DLM's translation and ignore matching, written plainly --------


def reference_regex(pattern: str) -> re.Pattern[str]:
    """DLM's ``_compile_glob``: ``**`` (eating a following ``/``) -> ``.*``, ``*`` -> ``[^/]*``, ``?`` -> ``[^/]``."""
    out, i = "", 0
    while i < len(pattern):
        if pattern[i : i + 2] == "**":
            out += ".*"
            i += 3 if pattern[i + 2 : i + 3] == "/" else 2
        else:
            out += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
            i += 1
    return re.compile(out)


def reference_ignore(rule: IgnoreRule, path: str) -> bool:
    """DLM's ``ignore_parser.matches`` for a file."""
    regex = reference_regex(rule.pattern)
    parts = path.split("/")
    if not rule.dir_only:
        tails = [path] if rule.anchored else ["/".join(parts[i:]) for i in range(len(parts))]
        return any(regex.fullmatch(tail) for tail in tails)
    return not rule.anchored and any(regex.fullmatch(folder) for folder in parts[:-1])


def fast(predicate: Predicate, path: str) -> bool:
    """The walk's way: the directory's active name globs, then one name test."""
    directory, _, name = path.rpartition("/")
    test = name_test(predicate.active(directory))
    return test is not None and bool(test(name))


# -- globs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("**/*.py", "a.py", True),  # "**/" eats its "/": ".*[^/]*\.py"
        ("**/*.py", "pkg/sub/a.py", True),
        ("**/*.py", "a.pyc", False),
        ("*.py", "a.py", True),
        ("*.py", "pkg/a.py", False),  # "*" never crosses "/": top level only
        ("?.md", "a.md", True),
        ("?.md", "ab.md", False),
        ("build/**", "build/x/y.o", True),
        ("build/**", "build", False),
        ("build/**", "pkg/build/x", False),  # no "**" in front: top level only
        ("**/.env", "prod.env", True),  # ".*\.env": any path ending in ".env"
        ("**/id_rsa", "keys/my_id_rsa", True),
        ("**/secrets.*", "mysecrets.txt", True),
        ("**/__pycache__/**", "a/x__pycache__/m.pyc", True),
        ("**", "anything/at/all", True),
        ("a**b", "a/x/b", True),  # "**" anywhere is ".*"
        ("[ab].txt", "[ab].txt", True),  # no classes: literal
        ("[ab].txt", "a.txt", False),
        ("\\*.txt", "\\x.txt", True),  # no escapes: a literal backslash, then "*"
        ("**/*", "dir\nname/x", False),  # DLM's ".*" stops at a newline
        ("**/*", "dir/odd\nname", True),  # "[^/]*" does not
    ],
)
def test_globs_match_as_dlms_regexes_do(pattern: str, path: str, expected: bool) -> None:
    assert Globs([pattern]).exact(path) is expected
    if "\n" not in path:
        assert fast(Globs([pattern]), path) is expected


def test_a_glob_list_matches_when_any_glob_does_and_an_empty_one_matches_nothing() -> None:
    globs = Globs(["src/*.py", "**/*.md"])
    assert globs.exact("src/a.py") and fast(globs, "src/a.py")
    assert globs.exact("x/README.md") and fast(globs, "x/README.md")
    assert not globs.exact("lib/a.py") and not fast(globs, "lib/a.py")
    empty = Globs([])
    assert not empty.exact("a") and not fast(empty, "a")
    assert not empty.covers("a") and not empty.reaches("a")


def test_name_tests_take_the_cheapest_form_for_each_kind_of_name_glob() -> None:
    assert name_test([]) is None
    assert name_test([("*",)]) is match_all
    exact = name_test([tuple("Makefile")])
    assert exact is not None and exact("Makefile") and not exact("makefile")
    mixed = name_test(
        [tuple("*.pyc"), tuple("*.o"), tuple("id_*"), tuple("*secret*"), tuple("?.md"), tuple("LICENSE")]
    )
    assert mixed is not None
    for name in ("m.pyc", "x.o", "id_rsa", "my-secret.txt", "a.md", "LICENSE"):
        assert mixed(name), name
    for name in ("m.py", "o", "xid_rsa", "ab.md", "LICENSE.txt", "secre"):
        assert not mixed(name), name


@pytest.mark.parametrize(
    ("patterns", "directory", "expected"),
    [
        (["build/**"], "build", True),
        (["build/**"], "builder", False),
        (["build/**"], "x/build", False),
        (["**/node_modules/**"], "x/y/node_modules", True),
        (["**/node_modules/**"], "x/my_node_modules", True),  # ".*node_modules/.*"
        (["**"], "anything", True),
        (["build/*"], "build", False),  # only direct children
        (["**/*.log"], "logs", False),
    ],
)
def test_covers_is_true_only_when_everything_below_a_directory_matches(
    patterns: list[str], directory: str, expected: bool
) -> None:
    assert Globs(patterns).covers(directory) is expected


@pytest.mark.parametrize(
    ("patterns", "directory", "expected"),
    [
        (["**/*.py"], "any/dir", True),
        (["src/**/*.py"], "src", True),
        (["src/**/*.py"], "src/deep/er", True),
        (["src/**/*.py"], "docs", False),
        (["*.md"], "docs", False),  # only top-level files can match
        (["a/b/c.md"], "a/b", True),
        (["a/b/c.md"], "a/b/c", False),
        (["docs/**", "*.txt"], "docs", True),
    ],
)
def test_reaches_is_false_only_when_nothing_below_a_directory_can_match(
    patterns: list[str], directory: str, expected: bool
) -> None:
    assert Globs(patterns).reaches(directory) is expected


# -- ignore files ----------------------------------------------------------------------------


def test_parse_ignore_reads_dlms_grammar() -> None:
    text = "\n".join(
        [
            "# a comment",
            "   # an indented comment",
            "",
            "*.log",
            "!keep.log",
            "build/",
            "/top.txt",
            "docs/*.md",
            "!/gen/",
            "\\#literal",
            "trailing   ",
            "  leading",
        ]
    )
    rules, dropped = parse_ignore(text)
    assert rules == [
        IgnoreRule("*.log", negated=False, anchored=False, dir_only=False, line=4),
        IgnoreRule("keep.log", negated=True, anchored=False, dir_only=False, line=5),
        IgnoreRule("build", negated=False, anchored=False, dir_only=True, line=6),
        IgnoreRule("top.txt", negated=False, anchored=True, dir_only=False, line=7),
        IgnoreRule(
            "docs/*.md", negated=False, anchored=False, dir_only=False, line=8
        ),  # "/" inside: not anchored
        IgnoreRule("gen", negated=True, anchored=True, dir_only=True, line=9),
        IgnoreRule("\\#literal", negated=False, anchored=False, dir_only=False, line=10),
        IgnoreRule("trailing", negated=False, anchored=False, dir_only=False, line=11),
        IgnoreRule("  leading", negated=False, anchored=False, dir_only=False, line=12),
    ]
    assert dropped == []


def test_lines_that_leave_no_pattern_are_dropped_with_a_note() -> None:
    rules, dropped = parse_ignore("!\n/\n//\n!/\nok\n")
    assert [rule.pattern for rule in rules] == ["ok"]
    assert dropped == [
        "line 1: '!' with no pattern",
        "line 2: '/' with no pattern",
        "line 3: no pattern left",
        "line 4: '/' with no pattern",
    ]


@pytest.mark.parametrize(
    ("line", "path", "expected"),
    [
        ("*.log", "deep/er/a.log", True),  # unanchored: any part after a "/"
        ("docs/*.md", "x/docs/a.md", True),
        ("/top.txt", "top.txt", True),
        ("/top.txt", "sub/top.txt", False),
        ("build/", "a/build/x.py", True),  # a folder of the file is named build
        ("build/", "build", False),  # a file named build is no folder
        ("build", "build/x.py", False),  # without "/", only files are named
        ("/build/", "build/x.py", False),  # anchored and folder-only: DLM never matches
        ("a/b/", "a/b/c.txt", False),  # folder-only with "/" inside: never matches
        ("**/gen/", "x/src-gen/y", True),  # ".*gen" against each folder name
    ],
)
def test_ignore_rules_match_files_as_dlm_does(line: str, path: str, expected: bool) -> None:
    (rule,), _ = parse_ignore(line)
    predicate = rule_predicate(rule)
    assert predicate.exact(path) is expected
    assert fast(predicate, path) is expected


# -- properties: the fast path and the pruning answers agree with the reference ---------------

PATTERN_TOKENS = ["a", "b", ".", "*", "?", "**", "/", "ab", "[", "\\"]
segments = st.text(alphabet="ab.*?[\\", min_size=1, max_size=4)
paths = st.lists(segments, min_size=1, max_size=5).map("/".join)
patterns = st.lists(st.sampled_from(PATTERN_TOKENS), min_size=1, max_size=8).map("".join)


def ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


@given(pattern_list=st.lists(patterns, min_size=1, max_size=3), path=paths)
def test_globs_agree_with_the_reference_and_pruning_never_loses_a_match(
    pattern_list: list[str], path: str
) -> None:
    globs = Globs(pattern_list)
    expected = any(reference_regex(p).fullmatch(path) for p in pattern_list)
    assert globs.exact(path) is expected
    assert fast(globs, path) is expected
    for directory in ancestors(path):
        if expected:
            assert globs.reaches(directory)
        if globs.covers(directory):
            assert expected


@given(
    prefix=st.sampled_from(["", "!", "/", "!/"]),
    pattern=patterns,
    suffix=st.sampled_from(["", "/"]),
    path=paths,
)
def test_ignore_rules_agree_with_the_reference_and_pruning_never_loses_a_match(
    prefix: str, pattern: str, suffix: str, path: str
) -> None:
    rules, _ = parse_ignore(prefix + pattern + suffix)
    for rule in rules:
        predicate = rule_predicate(rule)
        expected = reference_ignore(rule, path)
        assert predicate.exact(path) is expected
        assert fast(predicate, path) is expected
        for directory in ancestors(path):
            if expected:
                assert predicate.reaches(directory)
            if predicate.covers(directory):
                assert expected

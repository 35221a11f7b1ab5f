"""Glob matching in linear time (dlmstore.sources.globmatch): the same answers as DLM's regexes.

The reference is DLM's translation run through Python's ``re`` on globs and
paths short enough for its backtracking to stay quick; the automaton must
agree with it on every one. The hostile glob of issue 16 then runs through
every place a glob is matched: name tests, directory tests, ``exact``, an
include list and a ``.dlm/ignore`` file, through ``dlm show``.
"""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from dlmstore.cli.main import cli
from dlmstore.sources.glob import Globs, name_test, tokenize
from dlmstore.sources.globmatch import (
    MAX_CACHED_STEPS,
    Automaton,
    backtracks_linearly,
    first_group,
    fullmatch,
    prefix_match,
    prefixes_regex,
    regex,
)
from dlmstore.sources.ignore import parse_ignore, rule_predicate

from .helpers import VALID_ID

#: A glob with many stars: ``re`` needs minutes on a 50-character name without a "b".
HOSTILE = "*a*a*a*a*a*a*a*a*a*a*a*b"

token = st.sampled_from(["a", "b", "/", "\n", ".", "*", "?", "**"])
token_list = st.lists(token, max_size=7).map(tuple)
text = st.text(alphabet="ab/\n.", max_size=12)


def reference(tokens: tuple[str, ...], dotall: bool = True) -> re.Pattern[str]:
    return re.compile(regex(tokens), re.S if dotall else 0)


@given(lists=st.lists(token_list, min_size=1, max_size=3), path=text, dotall=st.booleans())
def test_the_automaton_answers_as_the_regex_of_each_glob(
    lists: list[tuple[str, ...]], path: str, dotall: bool
) -> None:
    automaton = Automaton(lists, dotall=dotall)
    answers = [reference(tokens, dotall).fullmatch(path) is not None for tokens in lists]
    assert automaton.matches(path) is any(answers)
    assert automaton.first(path) == (answers.index(True) if any(answers) else None)


@given(lists=st.lists(token_list, min_size=1, max_size=3), path=text)
def test_the_automaton_knows_when_a_path_matches_a_prefix_of_a_glob(
    lists: list[tuple[str, ...]], path: str
) -> None:
    expected = any(re.fullmatch(prefixes_regex(tokens), path, re.S) for tokens in lists)
    assert Automaton(lists).alive(path) is expected


@given(tokens=token_list, path=text)
def test_matching_after_any_slash_is_matching_some_tail_of_the_path(
    tokens: tuple[str, ...], path: str
) -> None:
    parts = path.split("/")
    tails = ["/".join(parts[i:]) for i in range(len(parts))]
    expected = any(reference(tokens, dotall=False).fullmatch(tail) for tail in tails)
    assert Automaton([tokens], dotall=False, after_slash=True).matches(path) is expected


@given(lists=st.lists(token_list, max_size=4), path=text, dotall=st.booleans())
def test_fullmatch_prefix_match_and_first_group_agree_with_re_whichever_way_they_match(
    lists: list[tuple[str, ...]], path: str, dotall: bool
) -> None:
    test = fullmatch(lists, dotall=dotall)
    expected = any(reference(tokens, dotall).fullmatch(path) for tokens in lists)
    assert (test is not None and bool(test(path))) is expected
    prefix = prefix_match(lists)
    expected = any(re.fullmatch(prefixes_regex(tokens), path, re.S) for tokens in lists if tokens)
    assert (prefix is not None and bool(prefix(path))) is expected
    groups = [lists[i : i + 2] for i in range(0, len(lists), 2)]
    first = first_group(groups)
    if not groups:
        assert first is None
        return
    assert first is not None
    combined = "|".join("(" + "|".join(f"(?:{regex(t)})" for t in sorted(set(g))) + ")" for g in groups)
    want = re.fullmatch(combined, path, re.S)
    got = first(path)
    assert (got.lastindex if got is not None else None) == (want.lastindex if want is not None else None)


def test_a_glob_with_at_most_one_star_keeps_using_re() -> None:
    assert backtracks_linearly(tokenize("*.py")) and backtracks_linearly(tokenize("build/**"))
    assert not backtracks_linearly(tokenize("**/*.py"))
    assert isinstance(fullmatch([tokenize("*.py")]), type(re.compile("").fullmatch))


def test_a_full_step_cache_starts_afresh_without_changing_answers() -> None:
    automaton = Automaton([tokenize("*x*y*z")])
    names = [chr(0x4E00 + i) * 3 + "xyz" for i in range(MAX_CACHED_STEPS // 3 + 10)]
    assert all(automaton.matches(name) for name in names)
    assert not automaton.matches("xzy")


def test_the_hostile_glob_is_answered_at_every_place_a_glob_is_matched() -> None:
    name = "a" * 50
    test = name_test([tokenize(HOSTILE)])
    assert test is not None and not test(name) and test(name + "b")
    globs = Globs([HOSTILE, f"**/{HOSTILE}", f"{HOSTILE}/**"])
    assert not globs.exact(name) and globs.exact(f"x/{name}b")
    assert not globs.covers(name) and globs.reaches(name)
    for line in (HOSTILE, f"/{HOSTILE}", f"{HOSTILE}/", f"!{HOSTILE}"):
        (rule,), _ = parse_ignore(line)
        predicate = rule_predicate(rule)
        assert not predicate.exact(f"{name}/{name}")
        assert not predicate.covers(name)


def _tree(tmp_path: Path, include: str, ignore: str | None) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / ("a" * 50)).write_text("no b at the end\n")
    (src / ("a" * 50 + "b")).write_text("ends in b\n")
    (src / "notes.txt").write_text("notes\n")
    if ignore is not None:
        (src / ".dlm").mkdir()
        (src / ".dlm" / "ignore").write_text(ignore)
    doc = tmp_path / "doc.dlm"
    doc.write_text(
        f"---\ndlm_id: {VALID_ID}\ntraining:\n  sources:\n    - path: src\n      include: {include}\n---\nhi\n"
    )
    return doc


def _sources(doc: Path) -> int:
    import json

    result = CliRunner().invoke(cli, ["show", str(doc), "--json"])
    assert result.exit_code == 0, result.output
    return sum(source["files_included"] for source in json.loads(result.output)["sources"])


def test_a_hostile_ignore_line_beside_a_long_name_is_matched_as_dlm_does(tmp_path: Path) -> None:
    doc = _tree(tmp_path, "['**/*']", f"{HOSTILE}\n")
    assert _sources(doc) == 2  # "aaa...ab" ignored; "aaa...a" and notes.txt kept


def test_a_hostile_include_glob_beside_a_long_name_is_matched_as_dlm_does(tmp_path: Path) -> None:
    doc = _tree(tmp_path, f"['{HOSTILE}', '*.txt']", None)
    assert _sources(doc) == 2  # "aaa...ab" and notes.txt

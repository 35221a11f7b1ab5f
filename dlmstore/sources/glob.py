"""DocumentLanguageModel's path globs, split into directory and name tests.

The language is DLM's (``dlm.directives.safety._compile_glob``), carried
over exactly, quirks included. A glob is matched with ``fullmatch`` against
the whole POSIX path relative to its root, after this translation:

* ``**`` becomes ``.*``: any characters, ``/`` included; a ``/`` right after
  it is swallowed, so ``**/x`` is ``.*x`` and matches ``x``, ``a/b/x`` and
  also ``ax`` (``**/.env`` matches ``prod.env``; ``**/id_rsa`` matches
  ``my_id_rsa``);
* ``*`` becomes ``[^/]*`` and ``?`` becomes ``[^/]``;
* every other character is literal: there are no ``[...]`` classes and no
  escapes. A pattern without ``**`` matches at the top only (``*.md`` is
  ``README.md``, never ``docs/a.md``; ``build/**`` is the top-level
  ``build`` folder only).

Python's ``.`` does not match a newline, so DLM's ``**`` does not reach
across one; :meth:`Predicate.exact` keeps that, and the walk uses it for the
rare path with a newline in it.

Speed is the point of the rest of this module. Matching DLM's regexes one by
one against every path costs tens of microseconds per file (``.*`` at the
front of most default excludes backtracks over the whole path). A path is a
directory part and a name, and a glob's token list can be cut where the
path's last ``/`` falls: at a literal ``/`` (the part before must match the
directory, the part after the name) or inside a ``**`` (some prefix of the
directory must match what comes before it, some suffix of the name what
comes after). So a glob becomes a few *alternatives*: a test of the
directory, run once per directory, paired with a glob over names alone.
Most defaults (``**/*.pyc``) need no directory test at all, and the name
globs left in force in a directory compile into one name test:
``str.endswith`` over a tuple, a set lookup, or one regex for the rest.
These equivalences assume no newline, which is why such paths take
:meth:`Predicate.exact`.

Every test that is not a string method goes through
``dlmstore.sources.globmatch``, which answers as DLM's regex does but in
time linear in the path, even for a glob with many stars that would make
the regex backtrack for minutes.

The same token lists answer the two questions that let the walk skip a
directory unread (:meth:`Predicate.covers`, :meth:`Predicate.reaches`).
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dlmstore.sources.globmatch import Test, Tokens, fullmatch, prefix_match

#: The name glob that matches every name.
ANY_NAME: Tokens = ("*",)


def tokenize(pattern: str) -> Tokens:
    """The tokens of DLM glob ``pattern`` (``**`` swallows a ``/`` after it)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*" and pattern.startswith("*", i + 1):
            out.append("**")
            i += 2
            if pattern.startswith("/", i):
                i += 1
        else:
            out.append(c)
            i += 1
    return tuple(out)


def name_tokens(tokens: Iterable[str]) -> Tokens:
    """``tokens`` matched against a name (no ``/`` in it): ``**`` is ``*``, runs merged."""
    out: list[str] = []
    for token in tokens:
        token = "*" if token == "**" else token
        if not (token == "*" and out and out[-1] == "*"):
            out.append(token)
    return tuple(out)


def dir_tokens(tokens: Iterable[str]) -> Tokens:
    """``tokens`` with each run of stars merged (a run holding ``**`` is ``**``)."""
    out: list[str] = []
    for token in tokens:
        if token in ("*", "**") and out and out[-1] in ("*", "**"):
            out[-1] = "**" if "**" in (token, out[-1]) else "*"
        else:
            out.append(token)
    return tuple(out)


@dataclass(frozen=True)
class Alternatives:
    """A test of file paths as (directory test, name glob) pairs.

    Attributes:
        top: name globs for files directly in the base directory.
        always: name globs for files in every directory below the base.
        guarded: ``(directory glob, name glob)`` pairs: the name glob
            applies to files of directories (relative to the base, never
            ``""``) the directory glob fullmatches.
    """

    top: frozenset[Tokens]
    always: frozenset[Tokens]
    guarded: tuple[tuple[Tokens, Tokens], ...]


def split(tokens: Tokens) -> Alternatives:
    """Cut ``tokens`` at every place the last ``/`` of a path can fall."""
    top = frozenset([name_tokens(tokens)]) if "/" not in tokens else frozenset()
    always: set[Tokens] = set()
    guarded: set[tuple[Tokens, Tokens]] = set()
    for i, token in enumerate(tokens):
        if token not in ("/", "**") or "/" in tokens[i + 1 :]:
            continue
        if token == "/":  # the directory is tokens[:i], the name tokens[i+1:]
            head, name = dir_tokens(tokens[:i]), name_tokens(tokens[i + 1 :])
        else:  # a prefix of the directory is tokens[:i], a suffix of the name tokens[i+1:]
            head, name = dir_tokens((*tokens[:i], "**")), name_tokens(("*", *tokens[i + 1 :]))
        if head == ("**",):
            always.add(name)
        else:
            guarded.add((head, name))
    return Alternatives(top, frozenset(always), tuple(sorted(guarded)))


class Predicate(ABC):
    """A test of relative file paths that a walk can ask one directory at a time.

    Subclasses: :class:`Globs` (include/exclude lists, default excludes,
    training.yaml excludes) and the ``.dlm/ignore`` rules in
    ``dlmstore.sources.ignore``.
    """

    @abstractmethod
    def active(self, directory: str) -> frozenset[Tokens]:
        """The name globs that decide files directly in ``directory``
        (relative to the base, ``""`` for the base; no newline in it)."""

    @abstractmethod
    def covers(self, directory: str) -> bool:
        """True only if every path strictly below ``directory`` matches
        (newline-free paths; may answer False when unsure)."""

    @abstractmethod
    def reaches(self, directory: str) -> bool:
        """False only if no path strictly below ``directory`` matches
        (may answer True when unsure)."""

    @abstractmethod
    def exact(self, path: str) -> bool:
        """DLM's own answer for the file at relative ``path``, newline or not."""


class Alternated(Predicate):
    """A :class:`Predicate` over the union of several token lists."""

    def __init__(self, token_lists: Iterable[Tokens]) -> None:
        lists = tuple(dict.fromkeys(token_lists))
        self.token_lists = lists
        parts = [split(tokens) for tokens in lists]
        self.top = frozenset().union(*(p.top for p in parts))
        self.always = frozenset().union(*(p.always for p in parts))
        guarded = sorted({g for p in parts for g in p.guarded if g[1] not in self.always})
        self.guarded: tuple[tuple[Test, Tokens], ...] = tuple(
            (fullmatch([head]) or match_none, name) for head, name in guarded
        )
        self._screen = fullmatch(head for head, _ in guarded)
        # A directory is covered when a glob ends in "**" and what comes
        # before that matches a prefix of "directory/".
        covers = []
        for tokens in lists:
            stars = len(tokens)
            while stars and tokens[stars - 1] == "**":
                stars -= 1
            if stars < len(tokens):
                covers.append((*tokens[:stars], "**"))
        self._covers = fullmatch(covers)
        self._reach_all = any(tokens[:1] == ("**",) for tokens in lists)
        self._reaches = None if self._reach_all else prefix_match(lists)

    def active(self, directory: str) -> frozenset[Tokens]:
        if not directory:
            return self.top
        if self._screen is None or not self._screen(directory):
            return self.always
        return self.always.union(name for test, name in self.guarded if test(directory))

    def covers(self, directory: str) -> bool:
        return self._covers is not None and bool(self._covers(directory + "/"))

    def reaches(self, directory: str) -> bool:
        return self._reach_all or (self._reaches is not None and bool(self._reaches(directory + "/")))


class Globs(Alternated):
    """A list of DLM globs; a path matches when any of them does."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = tuple(patterns)
        super().__init__(tokenize(p) for p in self.patterns)
        # DLM's own regexes, without re.S: "**" stops at a newline.
        self._exact = fullmatch(self.token_lists, dotall=False)

    def exact(self, path: str) -> bool:
        return self._exact is not None and bool(self._exact(path))


#: A name test: truthy when the name matches.
NameTest = Callable[[str], object]


def name_test(names: Iterable[Tokens]) -> NameTest | None:
    """One fast test for a name matching any of the name globs ``names``.

    ``None`` when nothing can match; :func:`match_all` when everything does.
    Literal names become a set lookup, ``*<literal>`` an ``endswith`` (over
    the suffixes sharing the name's last two characters), ``<literal>*`` a
    ``startswith``, ``*<literal>*`` an ``in``; the rest one regex. A lone
    kind is tested by a C-level callable; a mix by one Python function.
    """
    names = set(names)
    if not names:
        return None
    if ANY_NAME in names:
        return match_all
    exact: set[str] = set()
    suffixes: list[str] = []
    prefixes: list[str] = []
    contains: list[str] = []
    other: list[Tokens] = []
    for tokens in sorted(names):
        inner = tokens[1:] if tokens[:1] == ("*",) else tokens
        inner = inner[:-1] if inner[-1:] == ("*",) else inner
        literal = "".join(inner)
        if any(t in ("*", "?") for t in inner):
            other.append(tokens)
        elif len(inner) == len(tokens):
            exact.add(literal)
        elif tokens[0] == "*" and tokens[-1] == "*":
            contains.append(literal)
        elif tokens[0] == "*":
            suffixes.append(literal)
        else:
            prefixes.append(literal)
    rx = fullmatch(other)
    if sum(map(bool, (exact, suffixes, prefixes, contains, other))) == 1:
        if exact:
            return frozenset(exact).__contains__
        if len(suffixes) == 1:
            return operator.methodcaller("endswith", suffixes[0])
        if prefixes:
            return operator.methodcaller("startswith", tuple(prefixes))
        if rx is not None:
            return rx
    # Suffixes by their last two characters (fewer if one is shorter): a name
    # is compared only with the suffixes it could end with.
    size = min(2, *(len(s) for s in suffixes)) if suffixes else 0
    table: dict[str, tuple[str, ...]] = {}
    for suffix in suffixes:
        table[suffix[-size:]] = (*table.get(suffix[-size:], ()), suffix)
    get = table.get
    whole = frozenset(exact)
    starts = tuple(prefixes)

    def test(name: str) -> bool:
        if name in whole:
            return True
        if size:
            group = get(name[-size:])
            if group is not None and name.endswith(group):
                return True
        if starts and name.startswith(starts):
            return True
        for literal in contains:
            if literal in name:
                return True
        return rx is not None and bool(rx(name))

    return test


def match_all(_: str) -> bool:
    """The name test that matches every name."""
    return True


def match_none(_: str) -> bool:
    """The test that matches nothing."""
    return False

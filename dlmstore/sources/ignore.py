"""Path globs and ``.dlm/ignore`` files, compiled to one regex per rule set.

Two pattern languages share one glob compiler:

* **Directive globs** (``include``/``exclude`` in a ``training.sources``
  entry) match the whole POSIX path relative to the directive root:
  ``*`` and ``?`` stay inside one path segment, ``[abc]``/``[!abc]`` are
  character classes (never matching ``/``), ``\\x`` is a literal ``x``, and a
  ``**`` segment matches any number of segments: ``**/*.py`` matches
  ``a.py`` and ``pkg/sub/a.py``, ``docs/**/*.md`` matches ``docs/a.md``.
  As in git, a *trailing* ``/**`` matches everything *inside* a directory
  (``build/**`` matches ``build/x`` but not ``build`` itself), and ``**``
  that is not a whole segment (``a**b``) is an ordinary ``*``.
* **Ignore files** (``.dlm/ignore``) are a gitignore subset: blank lines and
  ``#`` comments are skipped, ``!`` re-includes, a trailing ``/`` makes the
  rule match directories only, a leading ``/`` or a ``/`` in the middle
  anchors the pattern to the ignore file's directory, and a pattern without
  such a slash matches a name at any depth below it. The last matching rule
  of a file wins. Not supported: git's global and per-repository exclude
  files; only ``.dlm/ignore`` files inside the walked tree count.

Speed is the point of this module: the source walker asks "is this path
excluded?" tens of thousands of times per run, so every list of patterns is
compiled into a *single* regex and matched with one ``fullmatch`` call,
instead of one ``fnmatch`` per pattern per path. For ignore rules, "last
matching rule wins" is answered by the same single call: alternatives are
tried last rule first, each in its own capturing group, and
``match.lastindex`` names the winning rule. When every pattern only looks at
the final path segment (``**/*.py``, ``*.pyc``, ``node_modules/``), the
matcher is handed the bare name instead of the whole path, which keeps
backtracking short.

Directory pruning needs two more questions, both answered conservatively:
``GlobSet.can_contain`` says whether some path *below* a directory could
still match an include glob (``src/**/*.py`` never needs ``docs/``), and
``GlobSet.covers_dir`` says whether an exclude glob matches *everything*
below a directory (``build/**``), so the walker can skip it unread.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

_STAR = "[^/]*"
_ONE = "[^/]"
# Matches zero or more leading path segments, each ending in "/".
_ANY_DIRS = "(?:.*/)?"


def _class_regex(body: str) -> str:
    """Regex for the inside of a ``[...]`` class (``!`` already removed)."""
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        if i + 2 < n and body[i + 1] == "-":
            lo, hi = body[i], body[i + 2]
            if lo <= hi:  # like fnmatch, a reversed range matches nothing
                out.append(f"{re.escape(lo)}-{re.escape(hi)}")
            i += 3
        else:
            out.append(re.escape(body[i]))
            i += 1
    return "".join(out)


def segment_regex(segment: str) -> str:
    """Regex source for one path segment of a glob (no ``/`` inside)."""
    out: list[str] = []
    i, n = 0, len(segment)
    while i < n:
        c = segment[i]
        i += 1
        if c == "*":
            while i < n and segment[i] == "*":
                i += 1
            out.append(_STAR)
        elif c == "?":
            out.append(_ONE)
        elif c == "\\" and i < n:
            out.append(re.escape(segment[i]))
            i += 1
        elif c == "[":
            # Same bracket rules as fnmatch: "[!" negates, a "]" right after
            # the opening (or after "!") is literal, no closing "]" = literal "[".
            j = i
            if j < n and segment[j] == "!":
                j += 1
            if j < n and segment[j] == "]":
                j += 1
            while j < n and segment[j] != "]":
                j += 1
            if j >= n:
                out.append(re.escape(c))
                continue
            body = segment[i:j]
            i = j + 1
            if body.startswith("!"):
                out.append(f"[^/{_class_regex(body[1:])}]")
            else:
                inner = _class_regex(body)
                out.append(f"[{inner}]" if inner else "(?!)")
        else:
            out.append(re.escape(c))
    return "".join(out)


def split_glob(pattern: str) -> list[str]:
    """The glob's segments: empty ones dropped, runs of ``**`` collapsed."""
    segments: list[str] = []
    for segment in pattern.split("/"):
        if not segment or (segment == "**" and segments and segments[-1] == "**"):
            continue
        segments.append(segment)
    return segments


def glob_regex(pattern: str) -> str:
    """Regex source (for ``fullmatch``) of a glob over relative POSIX paths."""
    segments = split_glob(pattern)
    if not segments:
        return "(?!)"
    out: list[str] = []
    need_sep = False
    last = len(segments) - 1
    for index, segment in enumerate(segments):
        if segment == "**":
            if index == last:
                out.append("/.+" if need_sep else ".*")
            else:
                out.append("/" + _ANY_DIRS if need_sep else _ANY_DIRS)
                need_sep = False
            continue
        if need_sep:
            out.append("/")
        out.append(segment_regex(segment))
        need_sep = True
    return "".join(out)


def _basename_glob(pattern: str) -> str | None:
    """``X`` when ``pattern`` is ``**/X`` with ``X`` one ordinary segment."""
    segments = split_glob(pattern)
    if len(segments) == 2 and segments[0] == "**" and segments[1] != "**":
        return segments[1]
    return None


def _prefix_regex(segments: Sequence[str], tail: str = "") -> str:
    """Regex for directories that may hold a match of a glob.

    ``segments`` are the glob's segments before its first ``**`` (or all but
    the file name, when it has none). A directory qualifies when its leading
    segments match them one for one, as far as it goes; ``tail`` is allowed
    only once all of them matched.
    """
    regex = ""
    for segment in reversed(segments):
        inner = f"(?:/{regex})?" if regex else tail
        regex = segment_regex(segment) + inner
    return regex


@dataclass(frozen=True)
class GlobSet:
    """A list of directive globs compiled into one matcher.

    Call :meth:`matches` with a path relative to the directive root and the
    entry's name (its last segment); both are passed so that basename-only
    sets can skip the path.
    """

    patterns: tuple[str, ...]
    _match: Callable[[str], object] | None
    _on_name: bool
    _below: Callable[[str], object] | None
    _below_all: bool
    _covers: Callable[[str], object] | None

    @classmethod
    def compile(cls, patterns: Iterable[str]) -> GlobSet:
        pats = tuple(patterns)
        if not pats:
            return cls((), None, False, None, False, None)
        names = [_basename_glob(p) for p in pats]
        on_name = all(name is not None for name in names)
        if on_name:
            source = "|".join(segment_regex(name) for name in names if name is not None)
        else:
            source = "|".join(glob_regex(p) for p in pats)
        # Which directories may hold a match (for include pruning).
        below: list[str] = []
        below_all = False
        for pattern in pats:
            segments = split_glob(pattern)
            if "**" in segments:
                head = segments[: segments.index("**")]
                if not head:
                    below_all = True
                    break
                below.append(_prefix_regex(head, tail="(?:/.*)?"))
            elif len(segments) > 1:
                below.append(_prefix_regex(segments[:-1]))
        # Which directories are matched in full (for exclude pruning):
        # "P/**" covers every directory matching P, "**" covers them all.
        covers: list[str] = []
        for pattern in pats:
            segments = split_glob(pattern)
            if segments == ["**"]:
                covers = [".*"]
                break
            if len(segments) > 1 and segments[-1] == "**":
                covers.append(glob_regex("/".join(segments[:-1])))
        return cls(
            pats,
            re.compile(f"(?s:{source})").fullmatch,
            on_name,
            re.compile(f"(?s:{'|'.join(below)})").fullmatch if below else None,
            below_all,
            re.compile(f"(?s:{'|'.join(covers)})").fullmatch if covers else None,
        )

    def matches(self, path: str, name: str) -> bool:
        """Whether some glob matches ``path`` (whose last segment is ``name``)."""
        if self._match is None:
            return False
        return self._match(name if self._on_name else path) is not None

    def name_matcher(self) -> Callable[[str], object] | None:
        """A ``fullmatch`` over bare names, when every glob is ``**/<name glob>``.

        Lets a hot loop test a name without building the path; ``None`` when
        the set needs whole paths (or is empty).
        """
        return self._match if self._on_name else None

    def path_matcher(self) -> Callable[[str], object] | None:
        """A ``fullmatch`` over whole relative paths, for a set that needs them.

        ``None`` when :meth:`name_matcher` serves instead (or the set is empty).
        """
        return None if self._on_name else self._match

    def can_contain(self, dirpath: str) -> bool:
        """Whether some path strictly below directory ``dirpath`` may match."""
        if self._below_all:
            return True
        return self._below is not None and self._below(dirpath) is not None

    def covers_dir(self, dirpath: str) -> bool:
        """Whether every path strictly below directory ``dirpath`` matches."""
        return self._covers is not None and self._covers(dirpath) is not None


@dataclass(frozen=True)
class IgnoreRule:
    """One parsed line of an ignore file."""

    pattern: str  # as written, minus "!" and the trailing "/"
    negated: bool
    dir_only: bool
    anchored: bool


def parse_ignore(text: str) -> list[IgnoreRule]:
    """Parse gitignore-subset ``text`` into rules, in file order."""
    rules: list[IgnoreRule] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\") and len(raw) > len(line):
            line += " "  # an escaped trailing space is kept, as in git
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        if negated:
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line
        line = line.lstrip("/")
        if not line:
            continue
        rules.append(IgnoreRule(line, negated, dir_only, anchored))
    return rules


@dataclass(frozen=True)
class IgnoreRules:
    """The compiled rules of one ignore file (or of the built-in defaults).

    ``base`` is the directory holding the ignore file, relative to the walk
    root ("" for the root itself); :meth:`verdict` takes paths relative to
    ``base``.
    """

    base: str
    rules: tuple[IgnoreRule, ...]
    _files: Callable[[str], re.Match[str] | None] | None
    _dirs: Callable[[str], re.Match[str] | None] | None
    _file_negated: tuple[bool, ...]
    _dir_negated: tuple[bool, ...]
    _on_name: bool
    _simple: bool

    @classmethod
    def compile(cls, rules: Iterable[IgnoreRule], base: str = "") -> IgnoreRules:
        rules = tuple(rules)
        on_name = not any(rule.anchored for rule in rules)

        def build(
            selected: list[IgnoreRule],
        ) -> tuple[Callable[[str], re.Match[str] | None] | None, tuple[bool, ...]]:
            if not selected:
                return None, ()
            alternatives = []
            for rule in reversed(selected):  # the first alternative that matches wins
                if on_name or rule.anchored:
                    regex = glob_regex(rule.pattern)
                else:
                    regex = _ANY_DIRS + glob_regex(rule.pattern)
                alternatives.append(f"({regex})")
            negated = (False,) + tuple(rule.negated for rule in reversed(selected))
            return re.compile(f"(?s:{'|'.join(alternatives)})").fullmatch, negated

        files, file_negated = build([r for r in rules if not r.dir_only])
        dirs, dir_negated = build(list(rules))
        simple = on_name and not any(rule.negated for rule in rules)
        return cls(base, rules, files, dirs, file_negated, dir_negated, on_name, simple)

    @classmethod
    def parse(cls, text: str, base: str = "") -> IgnoreRules:
        """Compile the rules of ignore-file ``text`` found in directory ``base``."""
        return cls.compile(parse_ignore(text), base)

    def simple_matchers(
        self,
    ) -> tuple[Callable[[str], object] | None, Callable[[str], object] | None] | None:
        """``fullmatch`` over names for files and for directories, or ``None``.

        Given only when every rule looks at names alone and none re-includes,
        so that any match means "ignored" (the built-in defaults qualify).
        """
        return (self._files, self._dirs) if self._simple else None

    def verdict(self, path: str, name: str, is_dir: bool) -> bool | None:
        """``True`` if ignored, ``False`` if re-included, ``None`` if no rule matches.

        ``path`` is relative to :attr:`base`; ``name`` is its last segment.
        """
        match_ = self._dirs if is_dir else self._files
        if match_ is None:
            return None
        found = match_(name if self._on_name else path)
        if found is None:
            return None
        negated = self._dir_negated if is_dir else self._file_negated
        return not negated[found.lastindex or 0]


def is_ignored(chain: Sequence[IgnoreRules], path: str, name: str, is_dir: bool) -> bool:
    """Whether ``path`` (relative to the walk root) is ignored by ``chain``.

    ``chain`` runs from the shallowest rule set to the deepest; deeper ones
    decide first, and within one set the last matching rule wins. Sets whose
    ``base`` is not above ``path`` do not apply.
    """
    for rules in reversed(chain):
        base = rules.base
        if base and not path.startswith(base + "/"):
            continue
        verdict = rules.verdict(path[len(base) + 1 :] if base else path, name, is_dir)
        if verdict is not None:
            return verdict
    return False

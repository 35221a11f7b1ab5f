"""``.dlm/ignore`` files: DocumentLanguageModel's gitignore subset.

A ``.dlm/ignore`` applies to the files below the directory holding the
``.dlm/`` folder (its *anchor*), with paths relative to that anchor. The
grammar and matching are DLM's (``dlm.directives.ignore_parser``), quirks
included:

* lines are split as ``str.splitlines`` does; trailing whitespace is cut;
  blank lines and lines starting with ``#`` (after leading whitespace) are
  skipped;
* ``!`` first negates (re-includes), then a leading ``/`` anchors the
  pattern to the anchor directory, then a trailing ``/`` makes it
  directory-only; a line that leaves an empty pattern is dropped, with a
  warning;
* the pattern is a DLM glob (``dlmstore.sources.glob``): ``**`` any
  characters, ``*`` and ``?`` within a path segment, everything else
  literal;
* an unanchored pattern matches the whole path or any part of it that starts
  after a ``/`` (``docs/*.md`` matches ``x/docs/a.md``); an anchored one only
  the whole path;
* a directory-only pattern matches a file when one of the file's folders,
  relative to the anchor, is named by it (``build/`` matches
  ``a/build/x.py``), and only when unanchored: ``/build/`` matches nothing,
  and neither does a directory-only pattern with a ``/`` inside;
* a pattern without a trailing ``/`` names files, never a folder's contents
  (``build`` does not match ``build/x.py``).

Which rule wins, and how ignore files combine with the other filters, is
``dlmstore.sources.rules``' business: the last matching rule decides, and a
``!`` rule can re-include a file that any other filter excluded.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlmstore.sources.glob import ANY_NAME, Alternated, Predicate, match_none, name_tokens, tokenize
from dlmstore.sources.globmatch import Automaton, Tokens, fullmatch


@dataclass(frozen=True)
class IgnoreRule:
    """One rule of an ignore file.

    Attributes:
        pattern: the glob, without ``!``, the leading ``/`` and the trailing ``/``.
        negated: ``!``: a match re-includes the file.
        anchored: a leading ``/``: matched against the whole path only.
        dir_only: a trailing ``/``: matched against the file's folders.
        line: the 1-based line of the file it came from.
    """

    pattern: str
    negated: bool
    anchored: bool
    dir_only: bool
    line: int


def parse_ignore(text: str) -> tuple[list[IgnoreRule], list[str]]:
    """The rules of ignore-file ``text``, and a note for each line dropped.

    ``text`` is the decoded file with line endings normalised to ``\\n``.
    A dropped line note reads ``line 3: '!' with no pattern``.
    """
    rules: list[IgnoreRule] = []
    dropped: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if not line or line.lstrip().startswith("#"):
            continue
        negated = line.startswith("!")
        line = line[1:] if negated else line
        if not line:
            dropped.append(f"line {number}: '!' with no pattern")
            continue
        anchored = line.startswith("/")
        line = line[1:] if anchored else line
        if not line:
            dropped.append(f"line {number}: '/' with no pattern")
            continue
        dir_only = line.endswith("/")
        line = line[:-1] if dir_only else line
        if not line:
            dropped.append(f"line {number}: no pattern left")
            continue
        rules.append(IgnoreRule(line, negated, anchored, dir_only, number))
    return rules, dropped


def rule_predicate(rule: IgnoreRule) -> Predicate:
    """The paths (relative to the rule's anchor) that ``rule`` matches."""
    tokens = tokenize(rule.pattern)
    if not rule.dir_only:
        return _PathRule(tokens, rule.anchored)
    if rule.anchored or "/" in tokens:
        return _Nothing()
    return _FolderRule(tokens)


class _PathRule(Alternated):
    """A rule without a trailing ``/``: the path, or for an unanchored rule
    any part of it after a ``/``, matches the glob."""

    def __init__(self, tokens: Tokens, anchored: bool) -> None:
        super().__init__([tokens] if anchored else [tokens, ("**", "/", *tokens)])
        self.anchored = anchored
        # The whole path, or (unanchored) any part of it after a "/", in one
        # pass; DLM's regex without re.S: "**" stops at a newline.
        self._exact = Automaton([tokens], dotall=False, after_slash=not anchored).matches

    def exact(self, path: str) -> bool:
        return self._exact(path)


class _FolderRule(Predicate):
    """An unanchored directory-only rule: one of the file's folders
    (relative to the anchor) is named by the glob."""

    def __init__(self, tokens: Tokens) -> None:
        # A folder name with a newline would need DLM's "**" to stop there;
        # the walk sends such paths to exact(), so dotall is safe here.
        self._folder = fullmatch([name_tokens(tokens)]) or match_none
        self._exact = fullmatch([tokens], dotall=False) or match_none
        self._all: frozenset[Tokens] = frozenset([ANY_NAME])

    def _any_folder(self, directory: str) -> bool:
        # DLM's "(.*/)?glob(/.*)?": the glob cannot match a "/", so it names
        # one whole folder of the path.
        return any(self._folder(folder) for folder in directory.split("/"))

    def active(self, directory: str) -> frozenset[Tokens]:
        if directory and self._any_folder(directory):
            return self._all
        return frozenset()

    def covers(self, directory: str) -> bool:
        return self._any_folder(directory)

    def reaches(self, directory: str) -> bool:
        return True

    def exact(self, path: str) -> bool:
        folders = path.split("/")[:-1]
        return any(self._exact(folder) for folder in folders)


class _Nothing(Predicate):
    """A rule DLM never matches to a file (``/build/``, ``a/b/``)."""

    def active(self, directory: str) -> frozenset[Tokens]:
        return frozenset()

    def covers(self, directory: str) -> bool:
        return False

    def reaches(self, directory: str) -> bool:
        return False

    def exact(self, path: str) -> bool:
        return False

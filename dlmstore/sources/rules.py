"""Which files of a directive survive: DLM's merge of every filter, per directory.

For each file, with paths relative to the directive root unless said
otherwise, DocumentLanguageModel (``dlm.directives.merge``) decides:

1. **include**: the nearest ``.dlm/training.yaml`` above the file with a
   non-empty ``include`` supplies the globs, else the directive does; the
   file must match one;
2. **excluded** starts false and becomes true when the directive's
   ``exclude`` matches, when the default excludes match (unless the
   directive sets ``default_excludes: false`` or the nearest
   ``training.yaml`` sets ``exclude_defaults: false``), or when a
   ``training.yaml``'s ``exclude`` matches the path relative to its anchor;
3. then every ``.dlm/ignore`` rule above the file, shallowest file first and
   in file order, sets excluded to "not negated" when it matches (relative
   to its anchor): the last matching rule wins, and a ``!`` rule re-includes
   a file the excludes or the defaults had dropped.

A file is read when it matches an include and is not excluded.

:class:`Scope` holds those filters for one directory (a ``.dlm/`` folder
opens a new scope below its anchor). :meth:`Scope.tests` turns them into
name tests for the files of one directory (``dlmstore.sources.glob``),
compiled once per distinct set; :meth:`Scope.included_exactly` is the
decision above written out per path, for the rare path holding a newline;
:meth:`Scope.may_skip` says when no file below a directory can be read, so
the walk need not list it (``dlmstore.sources.walk`` still checks that no
``.dlm/`` folder hides below before it skips).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlmstore.sources.defaults import DEFAULT_EXCLUDES
from dlmstore.sources.glob import Globs, NameTest, Predicate, match_all, name_test
from dlmstore.sources.globmatch import GroupMatch, Tokens, first_group
from dlmstore.sources.ignore import rule_predicate

if TYPE_CHECKING:
    from dlmstore.document.frontmatter import SourceDirective
    from dlmstore.sources.config import DlmFolder

_NONE: frozenset[Tokens] = frozenset()


def _never(_: str) -> bool:
    return False


@dataclass(frozen=True)
class DirTests:
    """The name tests for the files of one directory.

    A file with name ``n`` is kept when ``include`` is ``None`` or matches
    it, and then: when ``ignore`` is set and matches, ``not
    ignore_negated[match.lastindex]`` says excluded; otherwise ``exclude``
    (``None``: nothing) says excluded.
    """

    include: NameTest | None
    exclude: NameTest | None
    ignore: Callable[[str], GroupMatch | None] | None
    ignore_negated: tuple[bool, ...]

    def keeps(self, name: str) -> bool:
        """Whether a file named ``name`` in the directory is kept."""
        if self.include is not None and not self.include(name):
            return False
        if self.ignore is not None:
            found = self.ignore(name)
            if found is not None:
                return self.ignore_negated[found.lastindex or 0]
        return self.exclude is None or not self.exclude(name)


def _relative(path: str, base: str) -> str:
    """``path`` relative to ``base`` (both relative to the root; ``path`` at or below ``base``)."""
    if not base:
        return path
    return path[len(base) + 1 :]


class Scope:
    """The filters in force in one directory and below it, up to the next ``.dlm/``.

    Attributes:
        directive: the directive being walked.
        include: the include globs (relative to the directive root).
        defaults: whether the default excludes apply.
        root_exclude: the directive's excludes and (when they apply) the
            defaults as one glob list, or ``None`` when both are empty.
        anchored: ``(anchor, globs)`` of each ``training.yaml`` exclude above,
            relative to its anchor.
        ignores: ``(anchor, predicate, negated)`` for each ignore rule above,
            in the order DLM applies them.
        negations: whether any ignore rule is a ``!`` rule.
    """

    def __init__(
        self,
        directive: SourceDirective,
        *,
        include: Globs,
        defaults: bool,
        anchored: tuple[tuple[str, Predicate], ...],
        ignores: tuple[tuple[str, Predicate, bool], ...],
        cache: dict[object, DirTests],
    ) -> None:
        self.directive = directive
        self.include = include
        self.defaults = defaults
        patterns = (*directive.exclude, *(DEFAULT_EXCLUDES if defaults else ()))
        self.root_exclude = _root_excludes(patterns) if patterns else None
        self.anchored = anchored
        self.ignores = ignores
        self.negations = any(negated for _, _, negated in ignores)
        self._plain = not anchored and not ignores
        self._cache = cache

    @classmethod
    def root(cls, directive: SourceDirective) -> Scope:
        """The filters of ``directive`` before any ``.dlm/`` folder."""
        return cls(
            directive,
            include=Globs(directive.include),
            defaults=directive.default_excludes,
            anchored=(),
            ignores=(),
            cache={},
        )

    def enter(self, folder: DlmFolder) -> Scope:
        """The filters below ``folder``'s anchor."""
        config = folder.config
        include, defaults, anchored = self.include, self.defaults, self.anchored
        if config is not None:
            if config.include:
                include = Globs(config.include)
            # The nearest training.yaml decides; a directive's "false" stays false.
            defaults = self.directive.default_excludes and config.exclude_defaults
            if config.exclude:
                anchored = (*anchored, (folder.anchor, Globs(config.exclude)))
        ignores = self.ignores + tuple(
            (folder.anchor, rule_predicate(rule), rule.negated) for rule in folder.rules
        )
        return Scope(
            self.directive,
            include=include,
            defaults=defaults,
            anchored=anchored,
            ignores=ignores,
            cache=self._cache,
        )

    def tests(self, directory: str) -> DirTests:
        """The name tests for files directly in ``directory`` (no newline in it)."""
        include = self.include.active(directory)
        exclude = self.root_exclude.active(directory) if self.root_exclude is not None else _NONE
        ignored: tuple[tuple[bool, frozenset[Tokens]], ...] = ()
        if not self._plain:
            found = [exclude]
            found.extend(p.active(_relative(directory, base)) for base, p in self.anchored)
            if self.negations:
                ignored = tuple(
                    (negated, p.active(_relative(directory, base))) for base, p, negated in self.ignores
                )
            else:  # without "!" rules an ignore match is one more exclude
                found.extend(p.active(_relative(directory, base)) for base, p, _ in self.ignores)
            exclude = frozenset().union(*found)
        key = (include, exclude, ignored)
        tests = self._cache.get(key)
        if tests is None:
            tests = self._cache[key] = _compile(include, exclude, ignored)
        return tests

    def may_skip(self, directory: str) -> bool:
        """Whether no file below ``directory`` can be read under these filters.

        True when no include glob can match below it, or when an exclude,
        default or ignore rule covers all of it and no ``!`` rule can reach
        into it. ``.dlm/`` folders below it are not known here: the caller
        checks there are none.
        """
        if not self.include.reaches(directory):
            return True
        if self.negations and any(
            negated and p.reaches(_relative(directory, base)) for base, p, negated in self.ignores
        ):
            return False
        if self.root_exclude is not None and self.root_exclude.covers(directory):
            return True
        if self._plain:
            return False
        return any(p.covers(_relative(directory, base)) for base, p in self.anchored) or any(
            p.covers(_relative(directory, base)) for base, p, _ in self.ignores
        )

    def included_exactly(self, path: str) -> bool:
        """DLM's decision for the file at ``path``, rule by rule (any path)."""
        if not self.include.exact(path):
            return False
        excluded = self.root_exclude is not None and self.root_exclude.exact(path)
        excluded = excluded or any(p.exact(_relative(path, base)) for base, p in self.anchored)
        for base, p, negated in self.ignores:
            if p.exact(_relative(path, base)):
                excluded = not negated
        return not excluded


@functools.lru_cache(maxsize=32)
def _root_excludes(patterns: tuple[str, ...]) -> Globs:
    """The directive's excludes and the defaults, compiled once per distinct list."""
    return Globs(patterns)


def _compile(
    include: frozenset[Tokens],
    exclude: frozenset[Tokens],
    ignored: tuple[tuple[bool, frozenset[Tokens]], ...],
) -> DirTests:
    inc = name_test(include)
    exc = name_test(exclude)
    negated: list[bool] = [False]
    groups = []
    for is_negated, names in reversed(ignored):  # the last rule that matches wins
        if names:
            groups.append(names)
            negated.append(is_negated)
    ignore = first_group(groups)
    return DirTests(
        include=_never if inc is None else (None if inc is match_all else inc),
        exclude=exc,
        ignore=ignore,
        ignore_negated=tuple(negated),
    )

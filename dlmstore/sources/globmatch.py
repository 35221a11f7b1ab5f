"""Matching DLM glob tokens in time linear in the path, whatever the glob.

DLM translates a glob to a regex (:func:`regex`) and Python's ``re``
backtracks: a glob with *k* stars can take about *n*\\ :sup:`k` steps on an
*n*-character path, so a one-line ``.dlm/ignore`` holding
``*a*a*a*a*a*a*a*a*a*a*a*b`` stalls a walk for minutes on one 50-character
file name. Each test built here answers exactly as the DLM regex would, in
one of two ways:

* **Through ``re``** when every token list in it has at most one star
  (``*`` or ``**``) that can backtrack (:func:`backtracks_linearly`): the
  engine then backtracks over a single star, at most *n* positions each
  checked against the *m* tokens, so *n·m* steps. Nearly
  every real glob (``**/*.pyc`` is split by ``dlmstore.sources.glob`` into a
  directory test ``**`` and the name glob ``*.pyc``) takes this path and
  keeps ``re``'s speed.
* **Through a small automaton** (:class:`Automaton`) otherwise: the glob's
  NFA, one state per token position, run as a set of positions (a bit
  mask) and turned lazily into a DFA whose steps are cached per
  ``(state, character)``. A cached step is one dictionary lookup; a new one
  costs one pass over the positions. So a match costs at most *n·m* steps
  the first time and *n* after, never more; the cache is capped and
  cleared when full, which changes no answer.

The token semantics are the regexes', spelled out once in
:meth:`Automaton._step`: a literal token matches itself, ``?`` one
character other than ``/``, ``*`` any run of such characters, ``**`` any
run at all, except that with ``dotall=False`` (DLM's regex without
``re.S``) ``**`` does not cross a newline. A tests-only comparison of the
two ways on random globs and paths (``tests/test_globmatch.py``) pins that
they agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

#: A glob as tokens: one literal character each, or ``*`` (``[^/]*``), ``?``
#: (``[^/]``) or ``**`` (``.*``). DLM globs have no escapes, so a literal
#: ``*`` or ``?`` never occurs.
Tokens = tuple[str, ...]

#: A test of a whole string: truthy when it matches.
Test = Callable[[str], object]

_REGEX = {"**": ".*", "*": "[^/]*", "?": "[^/]"}
_STARS = ("*", "**")

#: Cached DFA steps an automaton keeps before starting its cache afresh.
MAX_CACHED_STEPS = 65_536


def regex(tokens: Iterable[str]) -> str:
    """Regex source of ``tokens`` for ``fullmatch``: DLM's translation."""
    return "".join(_REGEX.get(token) or re.escape(token) for token in tokens)


def prefixes_regex(tokens: Tokens) -> str:
    """Regex of every string a token-prefix of ``tokens`` matches."""
    out = ""
    for token in reversed(tokens):
        out = f"(?:{regex([token])}{out})?"
    return out


def backtracks_linearly(tokens: Tokens, *, dotall: bool = True) -> bool:
    """Whether ``re`` matches ``regex(tokens)`` in *n·m* steps: at most one star that can backtrack.

    With ``re.S`` a ``.*`` at the very end never backtracks: tried greedily,
    it takes the rest of the string and the fullmatch is made, so trailing
    ``**`` tokens are not counted (``**/__pycache__/**`` has one star that
    counts).
    """
    end = len(tokens)
    while dotall and end and tokens[end - 1] == "**":
        end -= 1
    return sum(token in _STARS for token in tokens[:end]) <= 1


class GroupMatch(Protocol):
    """What :func:`first_group` answers: ``re.Match`` or the automaton's stand-in."""

    @property
    def lastindex(self) -> int | None:
        """The 1-based number of the first group that matched."""


@dataclass(frozen=True)
class _Group:
    lastindex: int


class Automaton:
    """A lazily built DFA deciding which of several token lists fullmatch a string.

    Args:
        token_lists: the globs, as token lists, in priority order.
        dotall: whether ``**`` crosses a newline (``re.S``).
        after_slash: also try every list on each part of the string after a
            ``/``, as an unanchored ignore rule is matched.
    """

    def __init__(
        self, token_lists: Iterable[Tokens], *, dotall: bool = True, after_slash: bool = False
    ) -> None:
        tokens: list[str | None] = []
        starts = 0
        accepts: list[int] = []
        for token_list in token_lists:
            starts |= 1 << len(tokens)
            tokens.extend(token_list)
            accepts.append(len(tokens))
            tokens.append(None)  # the list's accepting position: no token to match
        # closure[p]: p and every position after it that stars matching
        # nothing lead to.
        closure = [0] * (len(tokens) + 1)
        for position in reversed(range(len(tokens))):
            closure[position] = 1 << position
            if tokens[position] in _STARS:
                closure[position] |= closure[position + 1]
        self._tokens = tokens
        self._closure = closure
        self._dotall = dotall
        self._after_slash = after_slash
        self._start = 0
        for position in range(len(tokens)):
            if starts >> position & 1:
                self._start |= closure[position]
        self._accepts = tuple(1 << position for position in accepts)
        self._accept_mask = sum(self._accepts)
        self._clear()

    def _clear(self) -> None:
        self._ids: dict[int, int] = {0: 0, self._start: 1}
        self._masks = [0, self._start]
        self._rows: list[dict[str, int]] = [{}, {}]
        self._cached = 0

    def _step(self, mask: int, char: str) -> int:
        """The positions reached from ``mask`` by reading ``char``."""
        tokens, closure = self._tokens, self._closure
        out = 0
        while mask:
            low = mask & -mask
            mask ^= low
            position = low.bit_length() - 1
            token = tokens[position]
            if token is None:
                continue
            if token == "**":
                if self._dotall or char != "\n":
                    out |= closure[position]
            elif token == "*":
                if char != "/":
                    out |= closure[position]
            elif token == "?":
                if char != "/":
                    out |= closure[position + 1]
            elif token == char:
                out |= closure[position + 1]
        if self._after_slash and char == "/":
            out |= self._start
        return out

    def run(self, text: str) -> int:
        """The set of positions (a bit mask) reached after reading ``text``; 0 when none."""
        rows, ids, masks = self._rows, self._ids, self._masks
        state = 1
        for char in text:
            following = rows[state].get(char)
            if following is None:
                if self._cached >= MAX_CACHED_STEPS:
                    mask = masks[state]
                    self._clear()
                    rows, ids, masks = self._rows, self._ids, self._masks
                    state = ids.setdefault(mask, len(masks))
                    if state == len(masks):
                        masks.append(mask)
                        rows.append({})
                target = self._step(masks[state], char)
                following = ids.get(target)
                if following is None:
                    following = ids[target] = len(masks)
                    masks.append(target)
                    rows.append({})
                rows[state][char] = following
                self._cached += 1
            if not following and not self._after_slash:
                return 0  # nothing can match any more
            state = following
        return masks[state]

    def matches(self, text: str) -> bool:
        """Whether any token list fullmatches ``text``."""
        return bool(self.run(text) & self._accept_mask)

    def first(self, text: str) -> int | None:
        """The 0-based index of the first token list that fullmatches ``text``."""
        reached = self.run(text) & self._accept_mask
        if not reached:
            return None
        return next(index for index, bit in enumerate(self._accepts) if reached & bit)

    def alive(self, text: str) -> bool:
        """Whether ``text`` fullmatches some token-prefix of some list."""
        return self.run(text) != 0


def fullmatch(token_lists: Iterable[Tokens], *, dotall: bool = True) -> Test | None:
    """A test of whether any of ``token_lists`` fullmatches a string; ``None`` for none.

    ``re`` where each list backtracks linearly, the automaton for the rest.
    """
    lists = sorted(set(token_lists))
    if not lists:
        return None
    easy = [tokens for tokens in lists if backtracks_linearly(tokens, dotall=dotall)]
    hard = [tokens for tokens in lists if not backtracks_linearly(tokens, dotall=dotall)]
    rx = None
    if easy:
        rx = re.compile("|".join(f"(?:{regex(t)})" for t in easy), re.S if dotall else 0).fullmatch
    if not hard:
        assert rx is not None
        return rx
    automaton = Automaton(hard, dotall=dotall).matches
    if rx is None:
        return automaton
    both = rx

    def test(text: str) -> bool:
        return both(text) is not None or automaton(text)

    return test


def prefix_match(token_lists: Iterable[Tokens]) -> Test | None:
    """A test of whether a string fullmatches a token-prefix of any of ``token_lists`` (``re.S``)."""
    lists = sorted({tokens for tokens in token_lists if tokens})
    if not lists:
        return None
    if all(backtracks_linearly(tokens) for tokens in lists):
        return re.compile("|".join(f"(?:{prefixes_regex(t)})" for t in lists), re.S).fullmatch
    return Automaton(lists).alive


def first_group(groups: Sequence[Iterable[Tokens]]) -> Callable[[str], GroupMatch | None] | None:
    """A test answering which group (1-based ``lastindex``) holds the first list that fullmatches.

    The answer ``re`` gives for ``(A|B)|(C)``: groups are tried in order.
    ``None`` when there are no groups.
    """
    ordered = [sorted(set(group)) for group in groups]
    if not ordered:
        return None
    if all(backtracks_linearly(tokens) for group in ordered for tokens in group):
        return re.compile(
            "|".join("(" + "|".join(f"(?:{regex(t)})" for t in group) + ")" for group in ordered), re.S
        ).fullmatch
    lists: list[Tokens] = []
    owner: list[_Group] = []
    for number, group in enumerate(ordered, start=1):
        lists.extend(group)
        owner.extend([_Group(number)] * len(group))
    automaton = Automaton(lists)

    def test(text: str) -> GroupMatch | None:
        index = automaton.first(text)
        return None if index is None else owner[index]

    return test

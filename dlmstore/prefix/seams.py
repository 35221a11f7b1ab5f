"""When may a text be tokenized in pieces cut after a special token?

The L1 cache rests on one identity: for a cut ``c`` right after an
occurrence of a boundary token ``b``,

    bare(text) == bare(text[:c]) + bare(text[c:])

where ``bare`` is the tokenizer's ``input_ids`` with
``add_special_tokens=False``. This module decides, for one tokenizer, which
special tokens make that identity hold, and refuses (with a reason) when no
token does. The argument, from how a `tokenizers` pipeline works:

1. Added tokens with ``normalized=False`` are found first, on the raw text,
   leftmost-longest. Every such match is an isolated piece; the text between
   matches is normalized, pre-tokenized and split by the model **per
   piece**. So if the tokenizer matches ``b`` exactly where we cut, both
   sides of the cut are the same pieces whether encoded together or apart.
2. The tokenizer matches ``b`` where we cut unless: ``b`` is matched after
   normalization (``normalized=True``), swallows whitespace
   (``lstrip``/``rstrip``), matches only as a whole word (``single_word``),
   starts or ends with whitespace, lies inside another added token, or can
   be overlapped by another added token starting earlier. A ``single_word``
   token right after the cut also sees ``b``'s last character in one
   encoding and the start of the text in the other. Such ``b`` are dropped.
3. A piece can still depend on its position in the whole text: the
   Metaspace pre-tokenizer with ``prepend_scheme="first"`` (the SentencePiece
   "legacy=False" behaviour of Llama-style tokenizers) adds "▁" only to the
   piece at offset 0, so a suffix encoded alone would gain one. That, and
   ``split_special_tokens=True`` (special tokens become plain text), turn
   L1 off for the whole tokenizer.
4. ``add_special_tokens=True`` must only wrap the text in fixed tokens
   (``full(t) == head + bare(t) + tail`` for every ``t``, e.g. a BOS head or
   an EOS tail). The cache then adds ``head`` once in front and ``tail`` once
   at the end, so a BOS is never duplicated at a cut.

Each rule is checked statically on the tokenizer's JSON, then **probed**:
every boundary token is cut around a set of awkward neighbours (spaces,
newlines, combining marks that NFC would fuse with the token's last
character, "▁", other added tokens, the token itself), and any difference
between cut and whole encodings turns L1 off with that example as the
reason. Static rules give readable reasons; probes catch what the rules
did not foresee.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

_log = logging.getLogger(__name__)

#: Encodes many texts with or without special tokens, as ``input_ids`` lists.
EncodeMany = Callable[[Sequence[str], bool], list[list[int]]]

# Text put right after a cut: whitespace the pre-tokenizer may merge, marks
# NFC would compose with a preceding ">" (U+0338) or letter (U+0301), the
# SentencePiece space marker, digits, punctuation, contractions, CJK.
_RIGHT = (
    "",
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    " \n",
    "a",
    " a",
    "A b",
    "Hello world",
    " hello",
    "\u0301x",
    "\u0338",
    "\u2581x",
    "é",
    "中文",
    "12",
    "'s",
    "!!",
    ".",
    "<",
    ">",
)
# Text put before the boundary token.
_LEFT = ("", "Hi", "a ", "x\n", " ")
# Tokens probed with every left/right pair; the rest get a lighter grid.
_RICH = 6
_LIGHT_RIGHT = ("", " a", "\n", "x", "\u2581x", "\u0338")


@dataclass(frozen=True)
class SeamPlan:
    """What probing a tokenizer decided.

    Attributes:
        boundary_tokens: special tokens after which text may be cut, longest
            first; empty when L1 is off.
        head: ids that ``add_special_tokens=True`` puts before the text.
        tail: ids that ``add_special_tokens=True`` puts after the text.
        dropped: ``(token, reason)`` for candidates that are unsafe cuts.
        l1_disabled_reason: why L1 is off, ``None`` when it is on.
    """

    boundary_tokens: tuple[str, ...]
    head: tuple[int, ...]
    tail: tuple[int, ...]
    dropped: tuple[tuple[str, str], ...]
    l1_disabled_reason: str | None


def _off(reason: str, dropped: Sequence[tuple[str, str]] = ()) -> SeamPlan:
    return SeamPlan((), (), (), tuple(dropped), reason)


def plan_seams(
    tokenizer: Any,
    backend: dict[str, Any] | None,
    encode_many: EncodeMany,
    special_tokens: Sequence[str] | None,
) -> SeamPlan:
    """Choose boundary tokens for ``tokenizer`` and probe that cutting after them is exact.

    Args:
        tokenizer: the wrapped tokenizer; ``tokenizer(texts, add_special_tokens=...)``
            is the reference every probe is compared with.
        backend: the parsed ``tokenizer.json`` of its `tokenizers` backend, or
            ``None`` for a tokenizer without one (L1 is then off).
        encode_many: the encoder the cache will use (checked equal to the
            reference by the caller).
        special_tokens: the tokens to cut after; ``None`` means every added
            token marked special.

    Raises:
        ValueError: a token in ``special_tokens`` is not an added token of
            this tokenizer (text around a plain string can merge across it).
    """
    if backend is None:
        return _off("the tokenizer has no `tokenizers` backend whose special-token handling can be checked")
    added: list[dict[str, Any]] = list(backend.get("added_tokens") or [])
    by_content = {str(t["content"]): t for t in added}
    if special_tokens is None:
        candidates = [str(t["content"]) for t in added if t.get("special")]
    else:
        candidates = list(dict.fromkeys(special_tokens))
        unknown = [c for c in candidates if c not in by_content]
        if unknown:
            raise ValueError(
                f"{unknown[0]!r} is not an added token of this tokenizer, so text around it "
                "can merge across it; pass only added tokens as special_tokens"
            )
    if getattr(tokenizer, "split_special_tokens", False):
        return _off(
            "split_special_tokens=True: special tokens are tokenized as plain text, so they are no seams"
        )
    reason = _pre_tokenizer_reason(backend.get("pre_tokenizer"))
    if reason is not None:
        return _off(reason)
    if not candidates:
        return _off("no special tokens to cut after")

    dropped: list[tuple[str, str]] = []
    boundaries: list[str] = []
    conflicts = _Conflicts(added)
    for content in candidates:
        why = _token_reason(by_content[content], conflicts)
        if why is None:
            boundaries.append(content)
        else:
            dropped.append((content, why))
            log = _log.warning if special_tokens is not None else _log.info
            log("prefix cache: not cutting after %r: %s", content, why)
    if not boundaries:
        first, why = dropped[0]
        return _off(f"no special token is a safe cut ({first!r}: {why})", dropped)

    wrap = _wrap(tokenizer, boundaries[0])
    if isinstance(wrap, str):
        return _off(wrap, dropped)
    failure = _probe_cuts(encode_many, boundaries, [str(t["content"]) for t in added], tokenizer)
    if failure is not None:
        return _off(failure, dropped)
    ordered = tuple(sorted(boundaries, key=len, reverse=True))
    return SeamPlan(ordered, wrap[0], wrap[1], tuple(dropped), None)


def _pre_tokenizer_reason(node: Any) -> str | None:
    """Why the pre-tokenizer makes a piece depend on its offset in the whole text."""
    if not isinstance(node, dict):
        return None
    if node.get("type") == "Sequence":
        for child in node.get("pretokenizers") or []:
            reason = _pre_tokenizer_reason(child)
            if reason is not None:
                return reason
        return None
    if node.get("type") == "Metaspace":
        # Old serializations carry add_prefix_space instead of prepend_scheme.
        scheme = node.get("prepend_scheme", "always" if node.get("add_prefix_space", True) else "never")
        if scheme == "first":
            return (
                'the Metaspace pre-tokenizer has prepend_scheme="first": it adds "▁" only at the '
                "start of the whole text, so a suffix tokenized on its own would gain one"
            )
    return None


class _Conflicts:
    """Added tokens that could take the match away from a boundary token."""

    def __init__(self, added: Sequence[dict[str, Any]]) -> None:
        # Only tokens matched on the raw text compete with a raw-text match.
        raw = [t for t in added if not t.get("normalized")]
        self.raw_contents = [str(t["content"]) for t in raw]
        self.joined = "\0".join(self.raw_contents)
        self.single_word = any(t.get("single_word") for t in raw)
        # proper suffix -> the tokens ending with it
        self.suffixes: dict[str, set[str]] = {}
        for content in self.raw_contents:
            for i in range(1, len(content)):
                self.suffixes.setdefault(content[i:], set()).add(content)


def _token_reason(token: dict[str, Any], conflicts: _Conflicts) -> str | None:
    """Why cutting right after ``token`` could change the tokens; ``None`` when it cannot."""
    content = str(token["content"])
    if token.get("normalized"):
        return "it is matched after normalization (normalized=True), so its match can depend on the text after it"
    if token.get("lstrip") or token.get("rstrip"):
        return "it swallows neighbouring whitespace (lstrip/rstrip), so its match extends across the cut"
    if token.get("single_word"):
        return "it matches only as a whole word (single_word=True), so its match depends on the text after it"
    if not content or content[0].isspace() or content[-1].isspace() or "\0" in content:
        return "it starts or ends with whitespace"
    if conflicts.joined.count(content) > 1:
        container = next(c for c in conflicts.raw_contents if content in c and c != content)
        return f"it occurs inside the added token {container!r}"
    for i in range(1, len(content)):
        owners = conflicts.suffixes.get(content[:i], set()) - {content}
        if owners:
            return f"the added token {min(owners)!r} can overlap its start and be matched instead"
    if conflicts.single_word and (content[-1].isalnum() or content[-1] == "_"):
        return "a single_word added token right after it would see a word character in one encoding only"
    return None


def _reference(tokenizer: Any, texts: Sequence[str], add_special_tokens: bool) -> list[list[int]]:
    ids = tokenizer(list(texts), add_special_tokens=add_special_tokens)["input_ids"]
    return [list(row) for row in ids]


def _wrap(tokenizer: Any, boundary: str) -> tuple[tuple[int, ...], tuple[int, ...]] | str:
    """``(head, tail)`` with ``full(t) == head + bare(t) + tail``, or why there is none."""
    samples = ["", "Hello world", f"a{boundary} b", " x\n", boundary, "\u2581y"]
    full = _reference(tokenizer, samples, True)
    bare = _reference(tokenizer, samples, False)
    if bare[0]:
        return "the empty text encodes to tokens even without special tokens"
    around = full[0]
    for cut in range(len(around) + 1):
        head, tail = around[:cut], around[cut:]
        if all(f == head + b + tail for f, b in zip(full, bare, strict=True)):
            return tuple(head), tuple(tail)
    return "add_special_tokens=True does more than put fixed tokens around the text"


def _probe_cuts(
    encode_many: EncodeMany, boundaries: Sequence[str], added: Sequence[str], tokenizer: Any
) -> str | None:
    """The first cut whose pieces do not tokenize like the whole text, or ``None``."""
    in_template = str(getattr(tokenizer, "chat_template", None) or "")
    # Tokens the chat template writes are the ones that matter most: probe them in depth.
    rich = sorted(boundaries, key=lambda b: b not in in_template)[:_RICH]
    neighbours = tuple(f"{t} x" for t in added[:8])
    cases: list[list[str]] = []
    for b in boundaries:
        if b in rich:
            rights = _RIGHT + neighbours + (f"{b}y", f" {b}")
            cases.extend([left + b, right] for left in _LEFT for right in rights)
        else:
            cases.extend(["a" + b, right] for right in _LIGHT_RIGHT)
    # Several cuts in one text, as in a chat.
    first, last = boundaries[0], boundaries[-1]
    cases.append([first, f"system\nBe brief.{last}", f"\n{first}", f"user\nHi!{last}", "\n"])
    cases.append([first, first, f" {last}", "\u0338z"])
    pieces = [piece for case in cases for piece in case]
    piece_ids = encode_many(pieces, False)
    whole_ids = encode_many(["".join(case) for case in cases], False)
    at = 0
    for case, whole in zip(cases, whole_ids, strict=True):
        joined = [i for ids in piece_ids[at : at + len(case)] for i in ids]
        at += len(case)
        if joined != whole:
            return f"cutting {''.join(case)!r} after its special tokens changes its tokens"
    return None

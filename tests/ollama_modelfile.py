"""Ollama's Modelfile parser, ported line for line from its Go source, to check what dlm writes.

The reader is Ollama's ``parser/parser.go`` (``ParseFile``, ``parseRuneForState``,
``unquote`` and the character classes below it) and the part of
``Modelfile.CreateRequest`` that turns commands into what a model runs
with (``template``, ``system``, parameters). It is a test's reader, kept
apart from dlm's writer (``dlmstore.export.modelfile``) on purpose: the
writer is checked against the other program's reading, never against its
own idea of the format (HOUSE_STYLE 19).

Go facts the port keeps:

* the file is decoded as UTF-8 with a leading byte-order mark dropped
  (``unicode.BOMOverride``); a byte that is not UTF-8 reads as U+FFFD;
* ``strconv.IsPrint`` keeps letters, marks, numbers, punctuation, symbols
  and the ASCII space: any other rune is dropped from a value unless it is
  a space, tab, CR or LF arriving as a state change (those are written raw);
* ``strings.TrimSpace`` trims Unicode white space (``unicode.IsSpace``).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field

STATE_NIL, STATE_NAME, STATE_VALUE, STATE_PARAMETER, STATE_MESSAGE, STATE_COMMENT = range(6)
COMMANDS = ("from", "license", "template", "system", "adapter", "draft", "renderer", "parser", "parameter",
            "message", "requires")  # fmt: skip
#: Go's unicode.IsSpace: '\t', '\n', '\v', '\f', '\r', ' ', U+0085, U+00A0 and the White_Space runes.
GO_SPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


class ParseError(Exception):
    """What ``ParseFile`` returns as its error (a ParserError, io.ErrUnexpectedEOF, errMissingFrom)."""


@dataclass
class Command:
    name: str
    args: str


@dataclass
class Parsed:
    """What ``ollama create`` takes from the commands (``CreateRequest``)."""

    commands: list[Command]
    model: str | None = None
    template: str | None = None
    system: str | None = None
    parameters: dict[str, list[str]] = field(default_factory=dict)


def is_print(r: str) -> bool:
    """strconv.IsPrint: categories L, M, N, P, S, and U+0020."""
    return r == " " or unicodedata.category(r)[0] in "LMNPS"


def is_alpha(r: str) -> bool:
    return "a" <= r <= "z" or "A" <= r <= "Z"


def is_number(r: str) -> bool:
    return "0" <= r <= "9"


def is_space(r: str) -> bool:
    return r in (" ", "\t")


def is_newline(r: str) -> bool:
    return r in ("\r", "\n")


def trim_space(s: str) -> str:
    """strings.TrimSpace."""
    start, end = 0, len(s)
    while start < end and s[start] in GO_SPACE:
        start += 1
    while end > start and s[end - 1] in GO_SPACE:
        end -= 1
    return s[start:end]


def unquote(s: str) -> tuple[str, bool]:
    # Go slices bytes; every quote is one byte, so slicing the runes of these ASCII ends is the same.
    if len(s) >= 3 and s[:3] == '"""':
        if len(s) >= 6 and s[-3:] == '"""':
            return s[3:-3], True
        return "", False
    if len(s) >= 1 and s[0] == '"':
        if len(s) >= 2 and s[-1] == '"':
            return s[1:-1], True
        return "", False
    return s, True


def _is_valid_command(cmd: str) -> bool:
    return cmd.lower() in COMMANDS


def _parse_rune_for_state(r: str, cs: int) -> tuple[int, str]:
    """parseRuneForState: the next state and the rune to keep ("" for Go's 0)."""
    if cs == STATE_NIL:
        if r == "#":
            return STATE_COMMENT, ""
        if is_space(r) or is_newline(r):
            return STATE_NIL, ""
        return STATE_NAME, r
    if cs == STATE_NAME:
        if is_alpha(r):
            return STATE_NAME, r
        if is_space(r):
            return STATE_VALUE, ""
        raise ParseError('command must be one of "from", "license", ...')
    if cs == STATE_VALUE:
        if is_newline(r) or is_space(r):
            return STATE_NIL, r
        return STATE_VALUE, r
    if cs == STATE_PARAMETER:
        if is_alpha(r) or is_number(r) or r == "_":
            return STATE_PARAMETER, r
        if is_space(r):
            return STATE_VALUE, ""
        raise ParseError("unexpected EOF")
    if cs == STATE_MESSAGE:
        if is_alpha(r):
            return STATE_MESSAGE, r
        if is_space(r):
            return STATE_VALUE, ""
        raise ParseError("unexpected EOF")
    if cs == STATE_COMMENT:
        if is_newline(r):
            return STATE_NIL, ""
        return STATE_COMMENT, ""
    raise ParseError("")


def parse_file(data: bytes) -> list[Command]:
    """ParseFile: the commands of a Modelfile's bytes."""
    text = data.decode("utf-8", errors="replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    commands: list[Command] = []
    cmd = Command("", "")
    curr = STATE_NIL
    b: list[str] = []
    role = ""
    for r in text:
        nxt, r = _parse_rune_for_state(r, curr)
        if nxt != curr:
            if curr == STATE_NAME:
                if not _is_valid_command("".join(b)):
                    raise ParseError("command must be one of ...")
                s = "".join(b).lower()
                if s == "from":
                    cmd.name = "model"
                elif s == "parameter":
                    nxt = STATE_PARAMETER
                elif s == "message":
                    nxt = STATE_MESSAGE
                    cmd.name = s
                else:
                    cmd.name = s
            elif curr == STATE_PARAMETER:
                cmd.name = "".join(b)
            elif curr == STATE_MESSAGE:
                if "".join(b) not in ("system", "user", "assistant"):
                    raise ParseError("message role must be one of ...")
                role = "".join(b)
            elif curr == STATE_VALUE:
                s, ok = unquote(trim_space("".join(b)))
                if not ok or is_space(r):
                    b.append(r)
                    continue
                if role:
                    s = role + ": " + s
                    role = ""
                commands.append(Command(cmd.name, s))
            b = []
            curr = nxt
        if r and is_print(r):
            b.append(r)
    if curr == STATE_VALUE:
        s, ok = unquote(trim_space("".join(b)))
        if not ok:
            raise ParseError("unexpected EOF")
        if role:
            s = role + ": " + s
        commands.append(Command(cmd.name, s))
    elif curr not in (STATE_COMMENT, STATE_NIL):
        raise ParseError("unexpected EOF")
    if not any(c.name == "model" for c in commands):
        raise ParseError("no FROM line")
    return commands


def create_request(data: bytes) -> Parsed:
    """What ``ollama create`` builds from the file: the model, template, system and parameters."""
    commands = parse_file(data)
    parsed = Parsed(commands)
    for c in commands:
        if c.name == "model":
            parsed.model = c.args
        elif c.name == "template":
            parsed.template = c.args
        elif c.name == "system":
            parsed.system = c.args
        elif c.name not in ("license", "adapter", "draft", "renderer", "parser", "requires", "message"):
            parsed.parameters.setdefault(c.name, []).append(c.args)
    return parsed

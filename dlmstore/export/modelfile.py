"""Ollama's Modelfile, written so that Ollama reads back every value byte for byte.

A Modelfile has no escapes. Ollama's parser (``parser/parser.go``,
``ParseFile``) reads a command's value up to the end of its line, trims
Unicode white space from both ends, and takes off one pair of ``"`` or
``\"\"\"`` around it; inside the quotes a line break does not end the value.
Whatever is between the quotes is the value, verbatim: ``\\"`` is a
backslash and a quote, ``\\n`` a backslash and an n. So a value is written
the way Ollama's own ``quote()`` writes it (``ollama show --modelfile``):

* bare, when it has no line break and no white space at either end;
* ``"value"`` when it has, and holds no ``"``;
* ``\"\"\"value\"\"\"`` when it has, and holds a ``"``.

Two of ``quote()``'s bare cases do not read back, and are quoted here
instead: a value starting with ``"`` (the parser would take it for an
opening quote) and one with a CR or a tab at an end (``quote()`` looks for
spaces and LF only). Some values cannot be written at all, and are refused
with one error naming the field, never written for Ollama to change:

* one that must be quoted (it has a line break) with a line ending in
  ``\"\"\"`` (the parser ends the value there);
* one holding a character the parser drops: it keeps only what Go's
  ``strconv.IsPrint`` calls printable (letters, marks, numbers,
  punctuation, symbols, the space), and the tab, CR and LF. A control
  character, a format character such as U+200D ZERO WIDTH JOINER or
  U+FEFF, a space other than U+0020 (U+00A0, U+2028) or a private-use or
  unassigned code point would silently vanish.

The tests read what is written with a port of Ollama's parser
(``tests/ollama_modelfile.py``) and get every value back byte for byte.

Comments (``#`` lines, the header) are not values: a line break or an
unprintable character in one is written escaped, so it cannot end the
comment and start a command.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from dlmstore.errors import ExportError

#: What Ollama's parser keeps in a value besides printable characters (written raw at a state
#: change); of what it keeps, the white space it trims from a bare value's ends.
_KEPT_SPACE = frozenset(" \t\r\n")


def _printable(char: str) -> bool:
    """Go's strconv.IsPrint: letters, marks, numbers, punctuation, symbols and the ASCII space."""
    return char == " " or unicodedata.category(char)[0] in "LMNPS"


def dropped_character(value: str) -> tuple[int, str] | None:
    """The first character of ``value`` Ollama's parser drops, with its index; None when there is none."""
    for index, char in enumerate(value):
        if char not in _KEPT_SPACE and not _printable(char):
            return index, char
    return None


def quote(value: str, *, field: str, hint: str) -> str:
    """``value`` as a Modelfile value Ollama's parser reads back exactly (see the module docstring).

    Args:
        value: the text.
        field: what it is, for the error (``system_prompt``, ``the stop string '<|im_end|>'``).
        hint: what to do when it cannot be written.

    Raises:
        ExportError: the value holds a character Ollama's parser drops, or a
            line ending in ``\"\"\"`` where it must be quoted.
    """
    dropped = dropped_character(value)
    if dropped is not None:
        index, char = dropped
        raise ExportError(
            f"{field} holds {describe(char)} at character {index + 1}, which an Ollama Modelfile cannot "
            "carry (Ollama's parser drops it)",
            hint=hint,
        )
    multiline = "\n" in value or "\r" in value
    padded = value[:1] in _KEPT_SPACE or value[-1:] in _KEPT_SPACE
    if not multiline and not padded and not value.startswith('"'):
        return value
    if '"' not in value:
        return f'"{value}"'
    if _ends_a_line_with_triple_quote(value):
        raise ExportError(
            f'{field} holds a line that ends with \'"""\', which an Ollama Modelfile cannot carry '
            "(Ollama's parser ends the value there)",
            hint=hint,
        )
    return f'"""{value}"""'


def _ends_a_line_with_triple_quote(value: str) -> bool:
    """Whether a line of ``value`` (trailing white space aside) ends with three quotes.

    Inside ``\"\"\"…\"\"\"`` Ollama's parser tries to close the value at each
    line break, and closes it where the text so far, trimmed, ends with
    ``\"\"\"``; a value with no line break, or whose lines do not end so,
    reads back whole.
    """
    return any(
        char in "\r\n" and value[:index].rstrip(" \t\r\n").endswith('"""') for index, char in enumerate(value)
    )


def describe(char: str) -> str:
    """``U+200D (ZERO WIDTH JOINER)``: a character named for a person."""
    name = unicodedata.name(char, "")
    code = f"U+{ord(char):04X}"
    return f"{code} ({name})" if name else code


def comment(text: str) -> str:
    """A ``#`` line of ``text``: line breaks and unprintable characters escaped, so it stays one comment."""
    out = "".join(
        char if char.isprintable() else char.encode("unicode_escape", "backslashreplace").decode("ascii")
        for char in text
    )
    return f"# {out}" if out else "#"


@dataclass(frozen=True)
class ModelfileSettings:
    """What a Modelfile says besides its template.

    Attributes:
        gguf: the model file, relative to the Modelfile.
        header: comment lines (without ``#``) saying what was exported.
        stops: the stop strings.
        temperature: sampling temperature.
        top_p: nucleus sampling.
        num_ctx: the context window.
        system: the system prompt, verbatim; None (or "", which the template carries) for no SYSTEM line.
    """

    gguf: str
    header: list[str]
    stops: list[str]
    temperature: float
    top_p: float
    num_ctx: int
    system: str | None


#: What to do when a value cannot be written.
HINT = "export for llama-server (--target llama-server), which takes the model's own chat template"


def modelfile_text(template: str, settings: ModelfileSettings, *, where: str) -> str:
    """The Modelfile ``ollama create NAME -f Modelfile`` reads; ``template`` is Ollama's Go template.

    Raises:
        ExportError: a value Ollama cannot carry (the system prompt, the template, a stop string).
    """
    lines = [comment(line) for line in settings.header]
    lines += ["", f"FROM {quote('./' + settings.gguf, field=f'{where}: the model file name', hint=HINT)}", ""]
    lines += [f"TEMPLATE {quote(template, field=f'{where}: the chat template', hint=HINT)}", ""]
    lines += [
        f"PARAMETER stop {quote(stop, field=f'{where}: the stop string {stop!r}', hint=HINT)}"
        for stop in settings.stops
    ]
    lines += [
        f"PARAMETER temperature {settings.temperature:g}",
        f"PARAMETER top_p {settings.top_p:g}",
        f"PARAMETER num_ctx {settings.num_ctx}",
    ]
    if settings.system:
        hint = "change system_prompt, or " + HINT
        lines += ["", f"SYSTEM {quote(settings.system, field=f'{where}: system_prompt', hint=hint)}"]
    return "\n".join(lines) + "\n"

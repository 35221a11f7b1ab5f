"""Parse a ``.dlm`` document: YAML frontmatter, then Markdown sections.

A document looks like::

    ---
    dlm_id: 01J9ZK3M4N5P6Q7R8S9T0VWXYZ
    ---
    Prose before any fence is a prose section.

    ::instruction::
    ### Q
    What is a .dlm file?
    ### A
    Markdown with YAML frontmatter.

Design choices, and why:

* **Lines are the unit.** The text is decoded strictly as UTF-8 (a leading
  BOM is dropped), line endings are normalised to ``\\n`` and split on
  ``\\n`` only (not ``str.splitlines``, which also splits on form feeds and
  U+2028 and would shift line numbers). Every error names ``path:line``.
* **The frontmatter is its own module.** This module only finds the two
  ``---`` fences; :func:`dlmstore.document.frontmatter.load_frontmatter` parses the
  YAML between them and reports errors at file lines (it is told the block
  starts at line 2).
* **Structure is never inside code.** Fence lines (``::instruction::``) and
  ``### Q``-style headings inside a fenced code block (CommonMark rules:
  three or more backticks or tildes, closed by a run of the same character
  at least as long) are plain text, so documents can quote documents.
* **One splitting routine.** :func:`_split_groups` turns an instruction or
  preference section's content into its Q/A pairs or prompt/chosen/rejected
  triples. ``parse_document`` runs it once per section so structural errors
  carry file and line; :func:`instruction_pairs` and
  :func:`preference_triples` re-run it on the stored content, which gives
  the same answer because a section always starts outside a code block.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dlmstore.document.frontmatter import Frontmatter, load_frontmatter
from dlmstore.document.sections import SECTION_TYPES, Section, normalise_newlines
from dlmstore.errors import DocumentError

FRONTMATTER_FENCE = "---"

#: Fence line (after stripping surrounding whitespace) -> section type.
FENCES = {f"::{t}::": t for t in SECTION_TYPES}

#: The headings each structured section cycles through, in order.
HEADINGS = {
    "instruction": ("### Q", "### A"),
    "preference": ("### Prompt", "### Chosen", "### Rejected"),
}

# How messages name a group and a missing part: "question at line 5 has no
# `### A` answer", "prompt at line 9 has no `### Rejected` response".
_GROUP_NOUN = {"instruction": "question", "preference": "prompt"}
_PART_NOUN = {
    "### Q": "question",
    "### A": "answer",
    "### Prompt": "prompt",
    "### Chosen": "response",
    "### Rejected": "response",
}

_STRUCTURE_HINT = {
    "instruction": "each pair is a `### Q` line and its question, then a `### A` line and its answer",
    "preference": "each triple is a `### Prompt`, a `### Chosen` and a `### Rejected` line, "
    "each followed by its text",
}

_CODE_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


@dataclass(frozen=True)
class Document:
    """A parsed, validated .dlm document.

    Attributes:
        path: absolute path of the .dlm file.
        frontmatter: the validated frontmatter.
        sections: the in-body sections, in document order (empty prose
            dropped).
        sha256: sha256 hex of the file's bytes, as read.
    """

    path: Path
    frontmatter: Frontmatter
    sections: tuple[Section, ...]
    sha256: str

    @property
    def dlm_id(self) -> str:
        """The document's ULID."""
        return self.frontmatter.dlm_id

    @property
    def base_model(self) -> str:
        """The base model name from the frontmatter."""
        return self.frontmatter.base_model

    @property
    def directory(self) -> Path:
        """The folder holding the document (relative sources resolve here)."""
        return self.path.parent


def parse_document(path: str | os.PathLike[str]) -> Document:
    """Read and parse the .dlm file at ``path``.

    Args:
        path: the file to read; error messages name it exactly as given.

    Returns:
        The parsed :class:`Document`.

    Raises:
        DocumentError: the file is missing, unreadable, not UTF-8, or not a
            valid .dlm document.
    """
    shown = os.fspath(path)
    try:
        data = Path(shown).read_bytes()
    except FileNotFoundError:
        raise DocumentError(shown, "no such file", hint=f"run `dlm init {shown}` to create one") from None
    except IsADirectoryError:
        raise DocumentError(shown, "is a directory, not a .dlm file") from None
    except OSError as exc:
        raise DocumentError(shown, f"cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(
            shown,
            f"not UTF-8 text (invalid byte 0x{data[exc.start]:02x} at offset {exc.start})",
            hint="save the file as UTF-8",
        ) from None
    return _parse(text, shown, hashlib.sha256(data).hexdigest())


def parse_text(text: str, path: str = "<string>") -> Document:
    """Parse a .dlm document held in a string.

    Args:
        text: the document text.
        path: the name error messages use, and (made absolute) ``Document.path``.

    Returns:
        The parsed :class:`Document`; ``sha256`` is over ``text`` as UTF-8.

    Raises:
        DocumentError: the text is not a valid .dlm document.
    """
    return _parse(text, path, hashlib.sha256(text.encode("utf-8")).hexdigest())


def instruction_pairs(section: Section) -> list[tuple[str, str]]:
    """The ``(question, answer)`` pairs of an instruction section, in order.

    Raises:
        ValueError: ``section`` is not a well-formed instruction section
            (line numbers in the message count from its first content line).
    """
    return [(q, a) for q, a in _groups(section, "instruction")]


def preference_triples(section: Section) -> list[tuple[str, str, str]]:
    """The ``(prompt, chosen, rejected)`` triples of a preference section, in order.

    Raises:
        ValueError: ``section`` is not a well-formed preference section
            (line numbers in the message count from its first content line).
    """
    return [(p, c, r) for p, c, r in _groups(section, "preference")]


def _groups(section: Section, type: str) -> list[tuple[str, ...]]:
    if section.type != type:
        raise ValueError(f"expected a section of type {type!r}, got {section.type!r}")
    try:
        return _split_groups(type, section.content.split("\n"), first_line=1)
    except _StructureError as exc:
        raise ValueError(exc.message) from None


# --------------------------------------------------------------------------
# Whole document


def _parse(text: str, shown: str, sha256: str) -> Document:
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = normalise_newlines(text).split("\n")
    if lines[0] != FRONTMATTER_FENCE:
        raise DocumentError(
            shown,
            "no frontmatter: a .dlm file starts with a '---' line",
            line=1,
            hint=f"run `dlm init {shown}` to create a document with frontmatter",
        )
    try:
        close = lines.index(FRONTMATTER_FENCE, 1)
    except ValueError:
        raise DocumentError(
            shown,
            "frontmatter is not closed: no '---' line after the one at line 1",
            line=1,
            hint="end the frontmatter with a line that is exactly '---'",
        ) from None
    # The YAML starts on file line 2, right after the opening fence.
    frontmatter = load_frontmatter("\n".join(lines[1:close]), path=shown, first_line=2)
    sections = tuple(_body_sections(lines[close + 1 :], close + 2, shown))
    return Document(
        path=Path(os.path.abspath(shown)),
        frontmatter=frontmatter,
        sections=sections,
        sha256=sha256,
    )


# --------------------------------------------------------------------------
# Body


class _StructureError(Exception):
    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


def _code_fences(lines: list[str]) -> Iterator[bool]:
    """For each line: True when it is code-block text or a code fence line.

    CommonMark fenced code blocks: an opening fence is up to three spaces
    then at least three backticks or tildes (a backtick fence's info string
    may not contain a backtick); the block closes at a line of the same
    character, at least as long, followed only by spaces. An unclosed block
    runs to the end.
    """
    open_char, open_len = "", 0
    for line in lines:
        match = _CODE_FENCE.match(line)
        if open_char:
            if (
                match
                and match.group(1)[0] == open_char
                and len(match.group(1)) >= open_len
                and not match.group(2).strip()
            ):
                open_char, open_len = "", 0
            yield True
        elif match and not (match.group(1)[0] == "`" and "`" in match.group(2)):
            open_char, open_len = match.group(1)[0], len(match.group(1))
            yield True
        else:
            yield False


def _strip_blank(lines: list[str], first_line: int) -> tuple[list[str], int]:
    """Drop leading and trailing blank lines; return them and the new first line."""
    start, end = 0, len(lines)
    while start < end and not lines[start].strip():
        start += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return lines[start:end], first_line + start


def _body_sections(lines: list[str], first_line: int, shown: str) -> Iterator[Section]:
    """Split the body (starting at file line ``first_line``) into sections."""
    type, fence_line, start, chunk = "prose", None, first_line, []
    for offset, (line, in_code) in enumerate(zip(lines, _code_fences(lines), strict=True)):
        fence = None if in_code else FENCES.get(line.strip())
        if fence is None:
            chunk.append(line)
            continue
        section = _finish(type, fence_line, chunk, start, shown)
        if section is not None:
            yield section
        line_no = first_line + offset
        type, fence_line, start, chunk = fence, line_no, line_no + 1, []
    section = _finish(type, fence_line, chunk, start, shown)
    if section is not None:
        yield section


def _finish(
    type: str, fence_line: int | None, chunk: list[str], first_line: int, shown: str
) -> Section | None:  # fence_line is never None for instruction/preference
    """Build one section from its lines (``chunk[0]`` is at ``first_line``).

    ``fence_line`` is ``None`` for the prose before the first fence; that
    section's line is its first line with content.
    """
    body, content_line = _strip_blank(chunk, first_line)
    if type == "prose":
        if not body:
            return None
        line = content_line if fence_line is None else fence_line
        return Section("prose", "\n".join(body), line=line)
    if not body:
        raise DocumentError(
            shown,
            f"{type} section at line {fence_line} is empty",
            line=fence_line,
            hint=_STRUCTURE_HINT[type],
        )
    try:
        _split_groups(type, body, content_line)
    except _StructureError as exc:
        raise DocumentError(shown, exc.message, line=exc.line, hint=_STRUCTURE_HINT[type]) from None
    return Section(type, "\n".join(body), line=fence_line)


def _split_groups(type: str, lines: list[str], first_line: int) -> list[tuple[str, ...]]:
    """Split a structured section's lines into heading groups.

    Args:
        type: ``instruction`` or ``preference``.
        lines: the section content, one string per line.
        first_line: the line number of ``lines[0]``, for messages.

    Returns:
        One tuple per group (``(q, a)`` or ``(prompt, chosen, rejected)``),
        each text stripped of leading and trailing blank lines.

    Raises:
        _StructureError: text before the first heading, a heading out of
            order, an incomplete group, an empty part, or no group at all.
    """
    cycle = HEADINGS[type]
    noun = _GROUP_NOUN[type]
    groups: list[tuple[str, ...]] = []
    parts: list[str] = []  # texts of the current group's finished parts
    group_line = 0  # line of the current group's first heading
    heading, heading_line = "", 0  # the heading of the part being read
    text: list[str] = []  # that part's lines so far

    def close_part(heading: str, heading_line: int, text: list[str]) -> None:
        body, _ = _strip_blank(text, 0)
        if not body:
            raise _StructureError(f"`{heading}` at line {heading_line} has no text", heading_line)
        parts.append("\n".join(body))
        if len(parts) == len(cycle):
            groups.append(tuple(parts))
            parts.clear()

    for offset, (line, in_code) in enumerate(zip(lines, _code_fences(lines), strict=True)):
        line_no = first_line + offset
        found = None if in_code else line.rstrip(" \t")
        if found not in cycle:
            if not heading and line.strip():
                raise _StructureError(f"text at line {line_no} comes before the first `{cycle[0]}`", line_no)
            text.append(line)
            continue
        if heading:
            close_part(heading, heading_line, text)
        expected = cycle[len(parts)]
        if found != expected:
            if found == cycle[0]:
                raise _StructureError(
                    f"{noun} at line {group_line} has no `{expected}` {_PART_NOUN[expected]}",
                    group_line,
                )
            if expected == cycle[0]:
                raise _StructureError(f"`{found}` at line {line_no} has no `{cycle[0]}` before it", line_no)
            raise _StructureError(
                f"`{found}` at line {line_no} is out of order: expected `{expected}`", line_no
            )
        if found == cycle[0]:
            group_line = line_no
        heading, heading_line, text = found, line_no, []
    if not heading:
        raise _StructureError(f"{type} section has no `{cycle[0]}`", first_line)
    close_part(heading, heading_line, text)
    if parts:
        missing = cycle[len(parts)]
        raise _StructureError(
            f"{noun} at line {group_line} has no `{missing}` {_PART_NOUN[missing]}", group_line
        )
    return groups

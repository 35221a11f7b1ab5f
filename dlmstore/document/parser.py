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
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dlmstore.document.fences import FenceProblem, read_fence, strip_markers
from dlmstore.document.sections import Section, normalise_newlines
from dlmstore.errors import DocumentError, DocumentProblems
from dlmstore.store.regular_files import NotRegularFileError, read_regular

if TYPE_CHECKING:
    # pydantic's models (about 0.1 s to import and build) load when a frontmatter is
    # validated, not with this module: the modules that only split bodies into rows, and
    # a warm `dlm tokenize` answered from its snapshot (dlmstore.corpus.snapshot), never need them.
    from dlmstore.document.frontmatter import Frontmatter

FRONTMATTER_FENCE = "---"

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


@dataclass(frozen=True)
class Document:
    """A parsed, validated .dlm document.

    Attributes:
        path: absolute path of the .dlm file.
        frontmatter: the validated frontmatter.
        sections: the in-body sections, in document order (empty prose
            dropped).
        sha256: sha256 hex of the file's bytes, as read.
        adapter: for the view one named adapter trains on
            (``dlmstore.document.adapter_routing.scoped``), its name; else ``None``.
    """

    path: Path
    frontmatter: Frontmatter
    sections: tuple[Section, ...]
    sha256: str
    adapter: str | None = None

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
    data = document_bytes(shown)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(
            shown,
            f"not UTF-8 text (invalid byte 0x{data[exc.start]:02x} at offset {exc.start})",
            hint="save the file as UTF-8",
        ) from None
    return _parse(text, shown, hashlib.sha256(data).hexdigest())


def document_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the document file at ``path`` (a symlink is followed).

    Read through :func:`~dlmstore.store.regular_files.read_regular`: a path
    naming a FIFO, socket or device is refused by its kind before it is
    opened, so a FIFO with no writer never hangs a command.

    Raises:
        DocumentError: the file is missing, is not a regular file, or cannot
            be read; the message names ``path`` as given.
    """
    shown = os.fspath(path)
    try:
        return read_regular(shown)
    except FileNotFoundError:
        raise DocumentError(shown, "no such file", hint=f"run `dlm init {shown}` to create one") from None
    except NotRegularFileError as exc:
        if stat.S_ISDIR(exc.mode):
            raise DocumentError(shown, "is a directory, not a .dlm file") from None
        raise DocumentError(
            shown, f"is {exc.strerror}", hint="a .dlm document is read from a regular file: save it to one"
        ) from None
    except OSError as exc:
        raise DocumentError(shown, f"cannot read: {exc.strerror or exc}") from None


#: A frontmatter line that is ``dlm_id:`` and a ULID, quoted or not, perhaps with a comment.
_ID_LINE = re.compile(r"""dlm_id:[ \t]*(["']?)([0-9A-Za-z]{26})\1[ \t]*(?:#.*)?""")


def declared_id(data: bytes) -> str | None:
    """The ``dlm_id`` the document's bytes declare on a ``dlm_id:`` line of their frontmatter,
    read without YAML; ``None`` when they declare it no such plain way, or more than once.

    A hint, never a validation: it names the store in which a snapshot of these
    very bytes may lie (``dlmstore.corpus.snapshot.unparsed``), taken when they
    were parsed in full; a document with no such snapshot is parsed in full.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    lines = normalise_newlines(text.removeprefix("\ufeff")).split("\n")
    if lines[0] != FRONTMATTER_FENCE or FRONTMATTER_FENCE not in lines[1:]:
        return None
    close = lines.index(FRONTMATTER_FENCE, 1)
    found = [match[2] for line in lines[1:close] if (match := _ID_LINE.fullmatch(line))]
    return found[0] if len(found) == 1 else None


def body_sections(data: bytes, path: str) -> tuple[Section, ...]:
    """The in-body sections of a document's bytes, as :func:`parse_document` finds them, without
    validating the frontmatter (bytes a pass snapshot vouches for: ``dlm show`` from the snapshot).

    Raises:
        DocumentError: the bytes are no .dlm document, or the body is malformed (``path`` named).
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DocumentError(path, "not UTF-8 text", hint="save the file as UTF-8") from None
    lines = normalise_newlines(text.removeprefix("\ufeff")).split("\n")
    if lines[0] != FRONTMATTER_FENCE or FRONTMATTER_FENCE not in lines[1:]:
        raise DocumentError(path, "no frontmatter between two '---' lines", line=1)
    close = lines.index(FRONTMATTER_FENCE, 1)
    problems: list[DocumentError] = []
    sections = _body_sections(lines[close + 1 :], close + 2, path, problems)
    if problems:
        raise DocumentProblems.of(problems)
    return tuple(sections)


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
        return _split_groups(type, section.content, first_line=1)
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
    from dlmstore.document.loading import load_frontmatter

    problems: list[DocumentError] = []
    frontmatter = None
    try:
        # The YAML starts on file line 2, right after the opening fence.
        frontmatter = load_frontmatter("\n".join(lines[1:close]), path=shown, first_line=2)
    except DocumentProblems as exc:
        problems.extend(exc.problems)
    except DocumentError as exc:
        problems.append(exc)
    sections = _body_sections(lines[close + 1 :], close + 2, shown, problems)
    if frontmatter is not None and any(section.adapter is not None for section in sections):
        from dlmstore.document.fences import route_problems

        problems.extend(route_problems(frontmatter, sections, shown))
    if problems:
        raise DocumentProblems.of(problems)
    assert frontmatter is not None
    return Document(
        path=Path(os.path.abspath(shown)),
        frontmatter=frontmatter,
        sections=tuple(sections),
        sha256=sha256,
    )


# --------------------------------------------------------------------------
# Body


class _StructureError(Exception):
    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


def _strip_blank(lines: list[str], first_line: int) -> tuple[list[str], int]:
    """Drop leading and trailing blank lines; return them and the new first line."""
    start, end = 0, len(lines)
    while start < end and not lines[start].strip():
        start += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return lines[start:end], first_line + start


def _body_sections(
    lines: list[str], first_line: int, shown: str, problems: list[DocumentError]
) -> list[Section]:
    """Split the body (starting at file line ``first_line``) into sections.

    DLM's rules: a line starting with three backticks opens or closes a code
    block, inside which fence lines are text; a fence line outside one
    starts a new section; a code block still open at the end is an error.
    Problems are appended to ``problems`` and parsing goes on, so one run
    reports them all; a section whose fence is refused is skipped.
    """
    sections: list[Section] = []
    type: str | None = "prose"
    adapter: str | None = None
    fence_line: int | None = None
    start, chunk = first_line, []
    code_open: int | None = None  # line of the ``` that opened the current code block
    for offset, line in enumerate(lines):
        line_no = first_line + offset
        if line.startswith("```"):
            code_open = None if code_open is not None else line_no
            chunk.append(line)
            continue
        if code_open is not None:
            chunk.append(line)
            continue
        try:
            fence = read_fence(line)
        except FenceProblem as exc:
            problems.append(DocumentError(shown, exc.message, line=line_no, hint=exc.hint))
            fence = None
            refused = True
        else:
            refused = False
        if fence is None and not refused:
            chunk.append(line)
            continue
        _finish(type, fence_line, chunk, start, shown, sections, problems, adapter)
        type = fence.type if fence is not None else None
        adapter = fence.adapter if fence is not None else None
        fence_line, start, chunk = line_no, line_no + 1, []
    if code_open is not None:
        problems.append(
            DocumentError(
                shown,
                f"the code block opened at line {code_open} is never closed",
                line=code_open,
                hint="close it with a line starting with ``` (until then every fence after it is text)",
            )
        )
    _finish(type, fence_line, chunk, start, shown, sections, problems, adapter)
    return sections


def _finish(
    type: str | None,
    fence_line: int | None,
    chunk: list[str],
    first_line: int,
    shown: str,
    sections: list[Section],
    problems: list[DocumentError],
    adapter: str | None = None,
) -> None:
    """Append the section made of ``chunk`` (``chunk[0]`` is at ``first_line``), routed to ``adapter``.

    ``type`` is ``None`` after a refused fence (nothing is appended);
    ``fence_line`` is ``None`` for the prose before the first fence, whose
    line is then its first line with content.
    """
    if type is None:
        return
    if type != "prose":
        try:
            markers = strip_markers(type, chunk)
        except FenceProblem as exc:
            problems.append(DocumentError(shown, exc.message, line=first_line + exc.index, hint=exc.hint))
            return
        chunk, first_line = chunk[markers:], first_line + markers
    body, content_line = _strip_blank(chunk, first_line)
    if not body and fence_line is not None:
        content_line = fence_line  # an empty section: its blank lines may run past the file's end
    if type == "prose":
        if body:
            line = content_line if fence_line is None else fence_line
            sections.append(Section("prose", "\n".join(body), line=line, adapter=adapter))
        return
    content = "\n".join(body)
    try:
        _split_groups(type, content, content_line)
    except _StructureError as exc:
        problems.append(DocumentError(shown, exc.message, line=exc.line, hint=_STRUCTURE_HINT[type]))
        return
    sections.append(Section(type, content, line=fence_line, adapter=adapter))


def _split_groups(type: str, content: str, first_line: int) -> list[tuple[str, ...]]:
    """Split a structured section's content into heading groups, as DLM does.

    DLM's grammar: a heading is a line that is exactly ``### Q`` (``### A``,
    ``### Prompt``...) once surrounding whitespace is stripped, code blocks
    or not; ``### Q !probe`` is a ``### Q``; each part's text runs to the
    next heading and is stripped of surrounding whitespace. Lines are split
    as ``str.splitlines`` splits them, as in DLM. One rule is dlmstore's
    own: a heading with text after it on its line (``### Q What is it?``)
    outside a code block is an error, where DLM would make the line part of
    the previous answer.

    Args:
        type: ``instruction`` or ``preference``.
        content: the section content.
        first_line: the file line of the content's first line, for messages.

    Returns:
        One tuple per group (``(q, a)`` or ``(prompt, chosen, rejected)``).

    Raises:
        _StructureError: text before the first heading, a heading out of
            order, an incomplete group, an empty part, no group at all, or
            a heading with text on its line.
    """
    cycle = HEADINGS[type]
    lines = content.splitlines()
    if type == "instruction":
        lines = [cycle[0] if line.strip() == "### Q !probe" else line for line in lines]
    _check_heading_lines(cycle, lines, first_line)
    noun = _GROUP_NOUN[type]
    groups: list[tuple[str, ...]] = []
    i, n = 0, len(lines)
    while True:
        while i < n and not lines[i].strip():
            i += 1
        if i >= n:
            break
        group_line = first_line + i
        parts: list[str] = []
        for heading in cycle:
            found = lines[i].strip() if i < n else None
            if found != heading:
                if found is None or (found == cycle[0] and parts):
                    raise _StructureError(
                        f"{noun} at line {group_line} has no `{heading}` {_PART_NOUN[heading]}", group_line
                    )
                if not parts and found not in cycle:
                    raise _StructureError(
                        f"text at line {first_line + i} comes before the first `{cycle[0]}`", first_line + i
                    )
                if not parts:
                    raise _StructureError(
                        f"`{found}` at line {first_line + i} has no `{cycle[0]}` before it", first_line + i
                    )
                raise _StructureError(
                    f"`{found}` at line {first_line + i} is out of order: expected `{heading}`",
                    first_line + i,
                )
            heading_line = first_line + i
            i += 1
            text: list[str] = []
            while i < n and lines[i].strip() not in cycle:
                text.append(lines[i])
                i += 1
            part = "\n".join(text).strip()
            if not part:
                raise _StructureError(f"`{heading}` at line {heading_line} has no text", heading_line)
            parts.append(part)
        groups.append(tuple(parts))
    if not groups:
        raise _StructureError(f"{type} section has no `{cycle[0]}`", first_line)
    return groups


def _check_heading_lines(cycle: tuple[str, ...], lines: list[str], first_line: int) -> None:
    """Refuse ``### Q What is it?``: a heading with text on its line, outside code."""
    in_code = False
    for offset, line in enumerate(lines):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        stripped = line.strip()
        for heading in cycle:
            rest = stripped[len(heading) :]
            if stripped.startswith(heading) and rest and rest[0] in " \t:.-)" and rest.strip(" \t:.-)"):
                raise _StructureError(
                    f"`{heading}` at line {first_line + offset} has text on its line: "
                    f"'{stripped}'; the heading must be alone on its line, its text on the lines below",
                    first_line + offset,
                )

"""Sections: the typed pieces a .dlm document is made of.

A section is one of ``prose``, ``instruction`` or ``preference`` plus its
text. In-body sections come from the document's Markdown; directive-sourced
sections come from ``training.sources`` (one prose section per file, see
``dlmstore.sources``). Both are the same :class:`Section`, so everything
downstream (rows, the tokenized cache) has one code path.

Identity is content-addressed: ``section_id = sha256(type + "\\n" +
content)[:16]`` with line endings normalised to ``\\n`` first, so the same text
gives the same id on every platform. ``digest`` keeps the full hash for keys
that must not rely on a 64-bit prefix (row keys).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

SECTION_TYPES = ("prose", "instruction", "preference")


def normalise_newlines(text: str) -> str:
    """Return ``text`` with CRLF and lone CR line endings turned into LF."""
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


def section_digest(type: str, content: str) -> str:
    """Full sha256 hex of ``type + "\\n" + content`` (content already normalised)."""
    return hashlib.sha256(f"{type}\n{content}".encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Section:
    """One typed piece of training material.

    Attributes:
        type: ``prose``, ``instruction`` or ``preference``.
        content: the section text with newlines normalised to ``\\n``.
        line: 1-based line in the .dlm file where the section starts, or
            ``None`` for a directive-sourced section.
        source: the file's path relative to its directive root, for
            directive-sourced sections; ``None`` for in-body ones.
        digest: full sha256 hex of ``type + "\\n" + content``; computed when
            not given (callers that already hashed the bytes pass it in).
    """

    type: str
    content: str
    line: int | None = None
    source: str | None = None
    digest: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.digest:
            object.__setattr__(self, "digest", section_digest(self.type, self.content))

    @property
    def section_id(self) -> str:
        """The 16-hex-digit id of this section."""
        return self.digest[:16]

"""Sections: the typed pieces a .dlm document is made of.

A section is one of ``prose``, ``instruction`` or ``preference`` plus its
text. In-body sections come from the document's Markdown; directive-sourced
sections come from ``training.sources`` (one prose section per file, see
``dlmstore.sources.expand``). Both are the same :class:`Section`, so everything
downstream (rows, the tokenized cache) has one code path.

Identity is content-addressed: ``section_id = sha256(type + "\\n" +
content)[:16]`` with line endings normalised to ``\\n`` first, so the same text
gives the same id on every platform. ``digest`` keeps the full hash for keys
that must not rely on a 64-bit prefix (row keys).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

SECTION_TYPES = ("prose", "instruction", "preference")


def normalise_newlines(text: str) -> str:
    """Return ``text`` with CRLF and lone CR line endings turned into LF."""
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


def section_digest(type: str, content: str) -> str:
    """Full sha256 hex of ``type + "\\n" + content`` (content already normalised)."""
    return hashlib.sha256(f"{type}\n{content}".encode()).hexdigest()


class Section:
    """One typed piece of training material (immutable).

    Attributes:
        type: ``prose``, ``instruction`` or ``preference``.
        content: the section text with newlines normalised to ``\\n``.
        line: 1-based line in the .dlm file where the section starts, or
            ``None`` for a directive-sourced section.
        source: the file's path relative to its directive root, for
            directive-sourced sections; ``None`` for in-body ones.
        adapter: the named adapter a routed fence sends it to
            (``::instruction#tone::``), or ``None`` (``dlmstore.document.adapter_routing``).
        digest: full sha256 hex of ``type + "\\n" + content``; computed when
            not given (callers that already hashed the bytes pass it in).

    A directive-sourced section whose file is known unchanged (a stat check,
    see ``dlmstore.sources.read``) is built with ``digest`` and a ``load``
    callable instead of ``content``: its text is read only if something
    asks for it (a cache miss), and ``load`` must verify that what it reads
    still has that digest. Such a section may also carry ``text_key``, the
    key of its text row as first of its digest in a document
    (``dlmstore.document.rows.text_row_key(digest)``), read from the same
    record instead of hashed again.

    Immutable by convention: nothing assigns to a section after
    construction (the lazily loaded text is cached once). There is no
    ``__setattr__`` guard: a corpus builds one section per source file on
    every pass, and a guarded constructor (``object.__setattr__`` per field)
    cost twice as much.
    """

    __slots__ = ("type", "line", "source", "digest", "text_key", "adapter", "_content", "_load")

    type: str
    adapter: str | None
    line: int | None
    source: str | None
    digest: str
    text_key: str | None
    _content: str | None
    _load: Callable[[], str] | None

    def __init__(
        self,
        type: str,
        content: str | None = None,
        line: int | None = None,
        source: str | None = None,
        digest: str = "",
        *,
        load: Callable[[], str] | None = None,
        text_key: str | None = None,
        adapter: str | None = None,
    ) -> None:
        if content is None and (load is None or not digest):
            raise ValueError("a section needs its content, or a digest and a loader")
        self.type = type
        self.line = line
        self.source = source
        self._content = content
        self._load = load
        self.digest = digest or section_digest(type, content or "")
        self.text_key = text_key
        self.adapter = adapter

    @property
    def content(self) -> str:
        """The section text (read on first use for a lazily loaded section)."""
        content = self._content
        if content is None:
            assert self._load is not None  # guaranteed by __init__
            content = self._content = self._load()
        return content

    @property
    def section_id(self) -> str:
        """The 16-hex-digit id of this section."""
        return self.digest[:16]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Section):
            return NotImplemented
        return (self.type, self.digest, self.line, self.source, self.adapter) == (
            other.type, other.digest, other.line, other.source, other.adapter,
        )  # fmt: skip

    def __hash__(self) -> int:
        return hash((self.type, self.digest, self.line, self.source, self.adapter))

    def __repr__(self) -> str:
        text = self._content if self._content is not None else "<not loaded>"
        shown = text if len(text) <= 40 else text[:37] + "..."
        return (
            f"Section(type={self.type!r}, content={shown!r}, line={self.line!r}, "
            f"source={self.source!r}, section_id={self.section_id!r})"
        )

"""A document's corpus: its in-body sections plus its directive-sourced ones.

This is the single place that combines ``dlmstore.document.parser`` (the body) and
``dlmstore.sources.expand`` (``training.sources``), so ``dlm show``, ``dlm
tokenize`` and ``dlm train`` all see the same sections and rows in the same
order: in-body sections first, then each directive's files in sorted order.

It is also where the size of one row is bounded (``rows.MAX_ROW_BYTES``,
4 MiB: the tokenizer's memory grows by about 200 bytes per byte of a row).
Source files over it are skipped by the default ``max_bytes_per_file``; an
in-body row over it (a 30 MB prose section, one enormous answer) is an
error naming its line, before anything is tokenized, rather than a process
killed for memory halfway through.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from dlmstore.document.parser import Document
from dlmstore.document.rows import MAX_ROW_BYTES, Row, document_rows, section_rows, text_bytes
from dlmstore.document.sections import Section
from dlmstore.errors import DocumentError
from dlmstore.sources.expand import SourceExpansion, expand_sources
from dlmstore.sources.statcache import StatCache


@dataclass(frozen=True)
class Corpus:
    """Everything a document trains on."""

    document: Document
    sections: tuple[Section, ...]
    expansion: SourceExpansion
    #: Rows that belong to no section, after the sections' rows: the history rows a train run
    #: replays or measures retention on (``dlmstore.replay.run_plan``), tokenized through the same pass.
    extra: tuple[Row, ...] = ()

    @property
    def body_sections(self) -> tuple[Section, ...]:
        return self.document.sections

    @property
    def source_sections(self) -> tuple[Section, ...]:
        return self.expansion.sections

    def rows(self) -> list[Row]:
        """The training rows of every section, with distinct row keys."""
        return list(self._rows)

    @cached_property
    def _rows(self) -> tuple[Row, ...]:
        # Made once: the pass, the duplicate search and the signing all ask (a row key is a
        # sha256 each: some 0.1 s for the 13,342 files of the stdlib).
        return (*document_rows(self.sections), *self.extra)

    @classmethod
    def of_rows(cls, document: Document, rows: tuple[Row, ...]) -> Corpus:
        """A corpus of ``rows`` alone, under ``document``'s settings (no section, no source)."""
        return cls(document, (), SourceExpansion((), (), ()), rows)


def load_corpus(document: Document, *, stat_cache: StatCache | None = None) -> Corpus:
    """Expand ``document``'s ``training.sources`` and combine with its body.

    With a ``stat_cache``, source files proven unchanged are not read (their
    text loads only if a cache miss needs it).

    Raises:
        DocumentError: an in-body row holds more than ``MAX_ROW_BYTES`` of text.
        SourceError: a ``training.sources`` directive cannot be expanded.
    """
    _check_body_rows(document)
    training = document.frontmatter.training
    expansion = expand_sources(
        training.sources,
        doc_dir=document.directory,
        policy=training.sources_policy,
        document=document.path,
        stat_cache=stat_cache,
    )
    return Corpus(document, document.sections + expansion.sections, expansion)


_ROW_NAMES = {"text": "this prose section", "messages": "question/answer pair", "preference": "triple"}


def _check_body_rows(document: Document) -> None:
    """Refuse an in-body row over ``MAX_ROW_BYTES`` (UTF-8 is at most 4 bytes a character,
    so only sections over a quarter of the limit in characters are measured)."""
    for section in document.sections:
        if len(section.content) * 4 <= MAX_ROW_BYTES:
            continue
        for row in section_rows(section):
            size = text_bytes(row.data)
            if size <= MAX_ROW_BYTES:
                continue
            what = _ROW_NAMES.get(row.kind, "row")
            if row.kind != "text":
                what = f"{what} {row.index + 1} of this {section.type} section"
            raise DocumentError(
                document.path,
                f"{what} is one training row of {size / 2**20:.1f} MiB; a row may hold at most "
                f"{MAX_ROW_BYTES >> 20} MiB (tokenizing takes about 200 bytes of memory per byte of a row)",
                line=section.line,
                hint=(
                    "split it into smaller sections (a ::prose:: fence line starts a new one)"
                    if row.kind == "text"
                    else "shorten it"
                )
                + "; training reads only the first sequence_len tokens of a row anyway",
            )

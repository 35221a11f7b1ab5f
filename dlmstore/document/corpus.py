"""A document's corpus: its in-body sections plus its directive-sourced ones.

This is the single place that combines ``dlmstore.document.parser`` (the body) and
``dlmstore.sources.expand`` (``training.sources``), so ``dlm show``, ``dlm
tokenize`` and ``dlm train`` all see the same sections and rows in the same
order: in-body sections first, then each directive's files in sorted order.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlmstore.document.parser import Document
from dlmstore.document.rows import Row, document_rows
from dlmstore.document.sections import Section
from dlmstore.sources.expand import SourceExpansion, expand_sources
from dlmstore.sources.statcache import StatCache


@dataclass(frozen=True)
class Corpus:
    """Everything a document trains on."""

    document: Document
    sections: tuple[Section, ...]
    expansion: SourceExpansion

    @property
    def body_sections(self) -> tuple[Section, ...]:
        return self.document.sections

    @property
    def source_sections(self) -> tuple[Section, ...]:
        return self.expansion.sections

    def rows(self) -> list[Row]:
        """The training rows of every section, with distinct row keys."""
        return document_rows(self.sections)


def load_corpus(document: Document, *, stat_cache: StatCache | None = None) -> Corpus:
    """Expand ``document``'s ``training.sources`` and combine with its body.

    With a ``stat_cache``, source files proven unchanged are not read (their
    text loads only if a cache miss needs it).
    """
    training = document.frontmatter.training
    expansion = expand_sources(
        training.sources,
        doc_dir=document.directory,
        policy=training.sources_policy,
        document=document.path,
        stat_cache=stat_cache,
    )
    return Corpus(document, document.sections + expansion.sections, expansion)

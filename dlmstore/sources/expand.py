"""Expand ``training.sources`` directives into prose sections, one per file.

:func:`expand_sources` is the entry point: for each directive in turn it
walks the tree (:mod:`dlmstore.sources.walk`: which files belong, in sorted
order, with what was excluded) and reads the chosen files
(:mod:`dlmstore.sources.read`: one ``Section(type="prose", content="#
source: <relpath>\\n\\n<text>", source=<relpath>)`` each, with the content
checks). :class:`SourceProvenance` adds up what each step left out.

Output order is deterministic: directives in frontmatter order, then files
in DocumentLanguageModel's order (its paths sorted as ``Path`` objects,
folder by folder: ``a/b.py`` before ``a-b.py`` before ``a.py``).

Relative directive paths start at the document's directory, or at its
parent when the document is kept in a ``.dlm/`` folder
(``corpus/.dlm/corpus.dlm`` anchors at ``corpus/``), as in DLM; the strict
policy confines paths to that same directory.

Size: a directive without ``max_bytes_per_file`` skips files over
:data:`~dlmstore.sources.defaults.DEFAULT_MAX_BYTES_PER_FILE` (4 MiB),
counted as ``skipped_too_large`` and reported in a warning with the way to
raise it; one set on the directive is used as written.

Speed: ``bench/bench_sources.py`` expands the CPython stdlib (~13K ``.py``
files) and prints the time per included file against an ``os.walk`` +
``fnmatch`` + ``read()`` loop written the obvious way. See the two modules
for where the time goes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dlmstore.document.sections import Section
from dlmstore.plural import plural
from dlmstore.sources.defaults import DEFAULT_MAX_BYTES_PER_FILE
from dlmstore.sources.proof import ProofBuilder, SourceProof
from dlmstore.sources.provenance import SourceProvenance as SourceProvenance  # where it was defined before
from dlmstore.sources.read import read_files
from dlmstore.sources.roots import anchor_dir
from dlmstore.sources.statcache import StatCache
from dlmstore.sources.walk import walk_directive

if TYPE_CHECKING:
    from dlmstore.document.frontmatter import SourceDirective

POLICIES = ("permissive", "strict")


@dataclass(frozen=True)
class SourceExpansion:
    """Sections from all directives, in directive then path order.

    ``proof`` (with a stat cache, for a tree whose walk and reads a stat
    check can vouch for, and no warnings) lets a later run prove the same
    expansion without doing it (``dlmstore.sources.proof``).
    """

    sections: tuple[Section, ...]
    provenance: tuple[SourceProvenance, ...]
    warnings: tuple[str, ...]  # one line each, meant for stderr
    proof: SourceProof | None = None


def expand_sources(
    directives: Sequence[SourceDirective],
    *,
    doc_dir: Path,
    policy: str = "permissive",
    document: Path | None = None,
    stat_cache: StatCache | None = None,
) -> SourceExpansion:
    """Expand ``directives`` (relative to ``doc_dir``) into prose sections.

    ``doc_dir`` is the .dlm file's directory; when it is a ``.dlm`` folder,
    its parent is used instead (relative paths and the strict policy).

    ``document`` is the .dlm file itself: a directive whose walk reaches it
    (``path: .``) skips it, counted as excluded, so a document never trains
    on its own source text.

    ``stat_cache`` (``dlmstore.sources.statcache``) lets files whose stat fields
    prove them unchanged skip the read: their sections carry the recorded
    digest and load their text only when asked.

    Raises:
        SourceError: a directive path does not exist; (``strict`` policy)
            it or a symlinked file below it resolves outside ``doc_dir``; a
            ``.dlm/training.yaml`` or ``.dlm/ignore`` is unreadable or
            malformed.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, not {policy!r}")
    doc_dir = anchor_dir(doc_dir)
    doc_root = os.path.realpath(doc_dir)
    itself = os.path.realpath(document) if document is not None else None
    sections: list[Section] = []
    provenance: list[SourceProvenance] = []
    warnings: list[str] = []
    proof = ProofBuilder() if stat_cache is not None else None
    for directive in directives:
        label = f"training.sources '{directive.path}'"
        walked = walk_directive(
            directive, label=label, doc_dir=doc_dir, doc_root=doc_root, policy=policy, document=itself,
            stamp_dirs=proof is not None,
        )  # fmt: skip
        cap = directive.max_bytes_per_file
        read = read_files(
            walked.files,
            label=label,
            max_bytes_per_file=DEFAULT_MAX_BYTES_PER_FILE if cap is None else cap,
            max_files=directive.max_files,
            stat_cache=stat_cache,
            strict=policy == "strict",
        )
        sections.extend(read.sections)
        warnings.extend(walked.warnings)
        warnings.extend(read.warnings)
        if proof is not None and stat_cache is not None and proof.provable:
            examined = walked.files[: len(walked.files) - read.skipped_max_files]
            proof.add(walked.listed, stat_cache.current_of(examined))
        if cap is None and read.skipped_too_large:
            warnings.append(_too_large_warning(label, read.skipped_too_large))
        provenance.append(
            SourceProvenance(
                directive=directive.path,
                root=walked.root,
                files_included=len(read.sections),
                bytes_included=read.bytes_included,
                skipped_binary=read.skipped_binary,
                skipped_encoding=read.skipped_encoding,
                skipped_too_large=read.skipped_too_large,
                skipped_max_files=read.skipped_max_files,
                skipped_outside=walked.skipped_outside,
                excluded=walked.excluded,
                excluded_dirs=walked.excluded_dirs,
                excluded_not_included=walked.not_included,
            )
        )
    found = proof.proof() if proof is not None and not warnings else None
    return SourceExpansion(tuple(sections), tuple(provenance), tuple(warnings), found)


def _too_large_warning(label: str, count: int) -> str:
    """The line that says files were left out by the default size cap, and how to read them."""
    return (
        f"{label}: skipped {plural(count, 'file')} over {DEFAULT_MAX_BYTES_PER_FILE >> 20} MiB, the default "
        "max_bytes_per_file; set max_bytes_per_file on the directive to read larger files "
        "(tokenizing takes about 200 bytes of memory per byte of the largest file)"
    )

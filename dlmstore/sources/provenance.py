"""What one ``training.sources`` directive contributed and what it left out (``dlm show``'s sources).

Its own module, beside the expansion that counts it (``dlmstore.sources.expand``),
because ``dlm show`` answered from a pass snapshot reports the counts the snapshot
kept and imports nothing of the walk.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceProvenance:
    """What one directive contributed and what it left out, with why.

    Attributes:
        directive: the path as written in the frontmatter.
        root: the resolved absolute path that was walked.
        files_included: files that became sections.
        bytes_included: their total size in bytes, as read from disk.
        skipped_binary: files with a NUL byte in the first KiB.
        skipped_encoding: files (or file names) that are not valid UTF-8.
        skipped_too_large: files over ``max_bytes_per_file`` (the directive's,
            or the 4 MiB default).
        skipped_max_files: files past ``max_files`` in path order (not read).
        skipped_outside: symlinked files resolving outside the document's
            directory and the directive root (permissive policy).
        excluded: files rejected by include/exclude globs, default excludes,
            ``.dlm/training.yaml`` or ``.dlm/ignore`` files.
        excluded_dirs: directories not descended into (nothing below them
            could be read, or they are symlinked); their files are not counted.
        excluded_not_included: of ``excluded``, files no ``include`` glob matched (the
            rest: ``exclude`` globs, the default excludes, ``.dlm/training.yaml``'s
            excludes and ``.dlm/ignore`` rules, and the document itself).
    """

    directive: str
    root: str
    files_included: int
    bytes_included: int
    skipped_binary: int
    skipped_encoding: int
    skipped_too_large: int
    skipped_max_files: int
    skipped_outside: int
    excluded: int
    excluded_dirs: int
    excluded_not_included: int = 0


__all__ = ["SourceProvenance"]

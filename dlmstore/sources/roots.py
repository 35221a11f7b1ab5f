"""Where a document's ``training.sources`` start: its anchor folder and each directive's root.

Kept apart from the walk (``dlmstore.sources.walk``) and the ``.dlm/``
folder's configuration (``dlmstore.sources.config``, pydantic models and
YAML) because a warm ``dlm tokenize`` or ``dlm show`` answered from the
pass snapshot (``dlmstore.corpus.snapshot``) needs these paths and nothing
else of the sources: resolving them is a few ``stat`` and ``realpath``
calls, importing the rest about 0.1 s.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The folder of DLM's per-tree configuration (``.dlm/training.yaml``, ``.dlm/ignore``),
#: and the folder a document may be kept in (see :func:`anchor_dir`).
DLM_FOLDER = ".dlm"


def anchor_dir(doc_dir: Path) -> Path:
    """Where a document's relative source paths start: its directory, or the
    parent of a ``.dlm/`` folder it is kept in."""
    doc_dir = Path(os.path.expanduser(doc_dir))
    if os.path.basename(os.path.abspath(doc_dir)) == DLM_FOLDER:
        return Path(os.path.dirname(os.path.abspath(doc_dir)))
    return doc_dir


def source_root(path: str, doc_dir: Path) -> str | None:
    """The real path a directive's ``path`` names from ``doc_dir``; ``None`` when nothing is there."""
    given = os.path.join(os.path.expanduser(doc_dir), os.path.expanduser(path))
    if not os.path.exists(given):
        return None
    return os.path.realpath(given)


__all__ = ["DLM_FOLDER", "anchor_dir", "source_root"]

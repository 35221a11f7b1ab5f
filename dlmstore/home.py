"""Where dlm keeps its files: one function resolves the home directory.

Layout under the home::

    <home>/
      store/<dlm_id>/        one store per document id
        store.db             all metadata (SQLite, WAL)
        ...                  blob folders beside it (token blobs, adapters, shards)
      bases/<name>/          base models converted once for fast loading

``$DLM_HOME`` wins; otherwise the platform's user data directory
(``~/.local/share/dlm`` on Linux).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def dlm_home() -> Path:
    """The dlm home directory (not created)."""
    override = os.environ.get("DLM_HOME")
    if override:
        return Path(override).expanduser().absolute()
    import platformdirs

    return Path(platformdirs.user_data_dir("dlm")).absolute()


def store_dir(dlm_id: str) -> Path:
    """The directory of the store for document id ``dlm_id`` (not created)."""
    return dlm_home() / "store" / dlm_id


def bases_dir() -> Path:
    """The directory holding converted base models (not created)."""
    return dlm_home() / "bases"


@contextmanager
def home_at(path: str | os.PathLike[str] | None) -> Iterator[None]:
    """``$DLM_HOME`` set to ``path`` for the block, then as it was (``None``: left alone).

    ``dlm unpack --home`` and ``dlm verify --retrain``'s scratch home use it,
    so a command run in-process (the tests' ``CliRunner``) changes no other
    command's home.
    """
    if path is None:
        yield
        return
    previous = os.environ.get("DLM_HOME")
    os.environ["DLM_HOME"] = str(Path(path).expanduser().absolute())
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("DLM_HOME", None)
        else:
            os.environ["DLM_HOME"] = previous

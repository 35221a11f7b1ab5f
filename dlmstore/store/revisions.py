"""store.db's schema revisions, in order: what opening a store compares against.

``REVISIONS`` lists every Alembic revision in ``dlmstore.migrations``
(``migrations/versions/``) in order, and a test checks it against that
script directory, so opening an up-to-date store compares one string and
never imports alembic, SQLAlchemy or the migrations.

The migrations sit above the store: their Alembic environment imports the
schema (:mod:`dlmstore.store.schema`) to compare it with the database. The
store runs them only when a database is behind, by handing Alembic their
folder (:data:`MIGRATIONS_PACKAGE`, found by name, never imported here), so
the two packages do not import each other.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

REVISIONS = (
    "0001",
    "0002",
    "0003",
    "0004",
    "0005",
    "0006",
    "0007",
    "0008",
    "0009",
    "0010",
    "0011",
    "0012",
    "0013",
    "0014",
    "0015",
    "0016",
    "0017",
    "0018",
    "0019",
    "0020",
)
HEAD_REVISION = REVISIONS[-1]

#: The package holding the Alembic environment and the numbered revisions.
MIGRATIONS_PACKAGE = "dlmstore.migrations"


def script_location() -> Path:
    """The folder of :data:`MIGRATIONS_PACKAGE` (Alembic's ``script_location``)."""
    spec = importlib.util.find_spec(MIGRATIONS_PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"{MIGRATIONS_PACKAGE} is not installed beside dlmstore")
    return Path(spec.origin).parent

"""Alembic environment and numbered revisions for store.db (installed as dlmstore.migrations).

The ordered list of revisions lives below, in :mod:`dlmstore.store.revisions`
(a test checks it against this script directory), so opening an up-to-date
store compares one string and never imports alembic, SQLAlchemy or this
package. The names are kept here for the revisions' readers.
"""

from dlmstore.store.revisions import HEAD_REVISION, REVISIONS

__all__ = ["HEAD_REVISION", "REVISIONS"]

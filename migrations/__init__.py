"""Alembic environment and numbered revisions for store.db (installed as dlmstore.migrations).

``REVISIONS`` lists every revision in order (a test checks it against the
script directory), so opening an up-to-date store compares one string and
never imports alembic or SQLAlchemy.
"""

REVISIONS = ("0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009", "0010")
HEAD_REVISION = REVISIONS[-1]

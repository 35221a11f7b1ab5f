"""Alembic environment for store.db.

Users never run alembic themselves: ``dlmstore.store.database`` opens a store and
calls ``command.upgrade`` programmatically, handing over its own connection
in ``config.attributes["connection"]``. Developers can still run alembic
against a database by setting ``sqlalchemy.url`` on the config.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from dlmstore.store.schema import metadata

config = context.config


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=True,  # SQLite changes columns by copying tables
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    # Only the `alembic` command line gets here (dlmstore passes a connection).
    url = config.get_main_option("sqlalchemy.url")
    if url is None:
        raise SystemExit("set sqlalchemy.url in alembic.ini, or run migrations through dlmstore")
    engine = create_engine(url)
    with engine.begin() as conn:
        _run(conn)

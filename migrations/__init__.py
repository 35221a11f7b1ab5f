"""Alembic environment and numbered revisions for store.db (installed as dlmstore.migrations)."""

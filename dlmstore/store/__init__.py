"""The store: ``<home>/store/<dlm_id>/store.db`` and the files beside it.

* :mod:`.database` — open (and migrate) a store; plain ``sqlite3`` connections
* :mod:`.schema` — the tables as SQLAlchemy Core models (schema and migrations only)
* :mod:`.runs` — one row per ``dlm tokenize`` / ``dlm train``
* :mod:`.metrics` — tokenization events, training steps, ``dlm metrics``
* :mod:`.atomic` — temp -> fsync -> rename writes of files and directories
* :mod:`.digests` — ``sha256:`` digests of files
"""

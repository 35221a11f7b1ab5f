"""dlmstore: a local-first store for LLM training data.

The package is a library first; the `dlm` command (``dlmstore.cli``) is a
thin click layer over it. Importing ``dlmstore`` is cheap on purpose: heavy
dependencies (sqlalchemy, alembic, torch, transformers) are imported inside
the functions that need them.
"""

__version__ = "0.1.0"

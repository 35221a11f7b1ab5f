"""The defaults of a directive: DocumentLanguageModel's excludes, and dlmstore's size cap.

Applied to every file of a ``training.sources`` directive, matched against
its path relative to the directive root with DLM's glob semantics
(``dlmstore.sources.glob``), unless the directive sets ``default_excludes:
false`` or the nearest ``.dlm/training.yaml`` sets ``exclude_defaults:
false``. They are DLM's exactly (``dlm.directives.defaults``), so a DLM
document trains the same files here; read them with those semantics in
mind:

* a pattern without ``**`` is top-level only: ``node_modules/**``,
  ``build/**`` or ``.git/**`` skip those folders at the directive root, not
  ``pkg/node_modules/``; ``.env`` and ``.env.*`` likewise;
* ``**/X`` matches any path *ending* in ``X``: ``**/.env`` also skips
  ``prod.env``, ``**/id_rsa`` also ``my_id_rsa``, ``**/secrets.*`` also
  ``mysecrets.txt``, ``**/package-lock.json`` also ``old-package-lock.json``;
* ``.dlm/**`` and ``**/.dlm/**`` keep DLM's own configuration folders (and a
  document kept in one) out of the training text.

The size cap is dlmstore's own: :data:`DEFAULT_MAX_BYTES_PER_FILE` applies
when a directive sets no ``max_bytes_per_file``, where DLM reads files of
any size (see the constant for why).
"""

from __future__ import annotations

from dlmstore.document.rows import MAX_ROW_BYTES

#: ``max_bytes_per_file`` when a directive sets none (dlmstore's, not DLM's:
#: DLM reads files of any size). A file is one training row, and one row's
#: tokenizing memory grows by about 140-300 bytes per byte of text
#: (``MAX_ROW_BYTES``): skipping larger files keeps ``dlm tokenize`` and
#: ``dlm train`` under 2 GB. Skipped files are counted (``skipped_too_large``)
#: and reported with a hint; a directive that sets ``max_bytes_per_file``
#: reads up to its own limit, and the memory that takes.
DEFAULT_MAX_BYTES_PER_FILE = MAX_ROW_BYTES

#: DLM's ``DEFAULT_EXCLUDES``, in its order.
DEFAULT_EXCLUDES: tuple[str, ...] = (
    # version control
    ".git/**", ".hg/**", ".svn/**",
    # secrets and local configuration (best effort, not a security boundary)
    ".env", ".env.*", "**/.env", "**/.env.*", "**/id_rsa", "**/id_ed25519",
    "**/*.pem", "**/*.key", "**/secrets.*",
    # Python
    "**/__pycache__/**", "**/*.pyc", "**/*.pyo", ".venv/**", "venv/**", ".tox/**",
    # Node / JS
    "node_modules/**", "**/*.min.js", "**/*.min.css", "**/*.map",
    # compiled output (Rust, Go, Java, C, C++)
    "target/**", "**/*.rlib", "**/*.class", "**/*.jar", "**/*.o", "**/*.so", "**/*.dylib", "**/*.dll",
    # build trees
    "build/**", "dist/**", "__generated__/**", "generated/**",
    # lock files
    "**/package-lock.json", "**/yarn.lock", "**/pnpm-lock.yaml", "**/Cargo.lock", "**/uv.lock",
    "**/poetry.lock", "**/Pipfile.lock",
    # archives and binaries (DLM reads images through its blob store; here
    # they are skipped as binary when read)
    "**/*.ico", "**/*.pdf", "**/*.zip", "**/*.tar", "**/*.gz", "**/*.xz", "**/*.bz2", "**/*.7z",
    "**/*.wasm",
    # DLM's own configuration folders
    ".dlm/**", "**/.dlm/**",
)  # fmt: skip

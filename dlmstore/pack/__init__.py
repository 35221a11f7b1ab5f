"""``.dlm.pack``: a document and its store in one file, checked member by member.

* :mod:`~dlmstore.pack.layout`: the member names, the format version and the reader's caps.
* :mod:`~dlmstore.pack.archive`: the deterministic tar + zstd stream, written and read.
* :mod:`~dlmstore.pack.checksums`: ``CHECKSUMS.sha256``, written and checked.
* :mod:`~dlmstore.pack.manifest`: ``PACK_HEADER.json`` and ``manifest.json``.
* :mod:`~dlmstore.pack.snapshot`: a consistent copy of store.db and its high-water mark.
* :mod:`~dlmstore.pack.writer`: ``dlm pack``.
* :mod:`~dlmstore.pack.install`: ``dlm unpack``.
* :mod:`~dlmstore.pack.dlm_layout`: packs written by DocumentLanguageModel.
* :mod:`~dlmstore.pack.signing` and :mod:`~dlmstore.pack.verification`: ``dlm verify``.
"""

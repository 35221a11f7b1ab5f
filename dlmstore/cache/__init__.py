"""The tokenized cache: rows -> tokens, computed once per content and tokenizer.

* :mod:`.tokenize` — the tokenize pass (``dlm tokenize``), exactly as TRL tokenizes
* :mod:`.trl_encoding` — rows to ids as TRL computes them, straight from the Rust backend where equal
* :mod:`.snapshot` — answer a warm count from the last all-hits pass, proven by ``stat``
* :mod:`.entries` — lookup, store and LRU eviction of cache entries in SQL
* :mod:`.segments` — append-only token files with checksummed entries
* :mod:`.fingerprint` — a tokenizer's identity from its files
* :mod:`.admin` — ``dlm cache show|prune|clear|verify``
"""

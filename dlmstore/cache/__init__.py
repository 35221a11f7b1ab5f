"""The tokenized cache: rows -> tokens, computed once per content and tokenizer.

* :mod:`.tokenize` — the tokenize pass (``dlm tokenize``), exactly as TRL tokenizes
* :mod:`.entries` — lookup, store and LRU eviction of cache entries in SQL
* :mod:`.packs` — append-only token files with checksummed entries
* :mod:`.fingerprint` — a tokenizer's identity from its files
* :mod:`.admin` — ``dlm cache show|prune|clear|verify``
"""

"""``training.sources``: directives that pull whole folders into a document.

Which files a directive reads, and in which order, is DocumentLanguageModel's
behaviour, carried over exactly.

* :mod:`.expand` — :func:`~.expand.expand_sources`, the entry point: walk
  each directive, read what it chose, add up the provenance
* :mod:`.walk` — the sorted walk that decides which files belong, skipping
  folders nothing below which could be read
* :mod:`.rules` — DLM's merge of every filter into one decision per file
* :mod:`.glob` — DLM's globs, split into directory and name tests
* :mod:`.defaults` — DLM's default exclude list
* :mod:`.config` — ``.dlm/training.yaml`` and ``.dlm/ignore`` files in the tree
* :mod:`.ignore` — the ``.dlm/ignore`` grammar and its matching
* :mod:`.read` — read the chosen files into prose sections (binary and
  encoding checks, size limits, lazy loads of files the stat cache trusts)
* :mod:`.statcache` — skip re-reading files a stat check proves unchanged
* :mod:`.proof` — prove a whole tree unchanged (a stat per folder and file)
"""

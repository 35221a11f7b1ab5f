"""``training.sources``: directives that pull whole folders into a document.

* :mod:`.expand` — :func:`~.expand.expand_sources`, the entry point: walk
  each directive, read what it chose, add up the provenance
* :mod:`.walk` — the sorted, pruned walk that decides which files belong,
  its filters being named matchers
* :mod:`.read` — read the chosen files into prose sections (binary and
  encoding checks, size limits, lazy loads of files the stat cache trusts)
* :mod:`.ignore` — globs and ``.dlm/ignore`` rules
* :mod:`.statcache` — skip re-reading files a stat check proves unchanged
"""

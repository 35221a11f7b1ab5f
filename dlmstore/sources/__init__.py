"""``training.sources``: directives that pull whole folders into a document.

* :mod:`.walk` — expand a directive: the sorted, pruned walk that decides
  which files belong
* :mod:`.ignore` — globs and ``.dlm/ignore`` rules
* :mod:`.statcache` — skip re-reading files a stat check proves unchanged
"""

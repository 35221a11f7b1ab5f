"""The .dlm document: parse it, validate its frontmatter, turn it into rows.

* :mod:`.parser` — frontmatter + Markdown body -> :class:`~.parser.Document`
* :mod:`.frontmatter` — the validated frontmatter models (unknown keys are errors)
* :mod:`.sections` — :class:`~.sections.Section` and ``section_id``
* :mod:`.corpus` — a document's body plus its ``training.sources``, as one list
* :mod:`.rows` — sections -> training rows with content-addressed ``row_key``
* :mod:`.show` — ``dlm show``; :mod:`.init` — ``dlm init``
"""

"""The .dlm document (DocumentLanguageModel's format): parse it, validate it, turn it into rows.

* :mod:`.parser` — frontmatter + Markdown body -> :class:`~.parser.Document`
* :mod:`.fences` — fence lines and DLM's section markers
* :mod:`.frontmatter` — the validated frontmatter models (unknown keys are errors)
* :mod:`.loading` — YAML text -> frontmatter, every problem at its line
* :mod:`.versions` — DLM's schema versions and the upgrades between them
* :mod:`.sections` — :class:`~.sections.Section` and ``section_id``
* :mod:`.corpus` — a document's body plus its ``training.sources``, as one list
* :mod:`.rows` — sections -> training rows with content-addressed ``row_key``
* :mod:`.show` — ``dlm show``; :mod:`.init` — ``dlm init``; :mod:`.migrate` — ``dlm migrate``
"""

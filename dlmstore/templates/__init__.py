"""The template gallery: starter documents for ``dlm init PATH --template NAME``.

Each template is a pair of files in ``gallery/`` sharing a stem: the
``.dlm`` document (frontmatter, prose, instruction pairs with ``### Q !probe``
questions) and its ``.meta.yaml`` (name, title, one-line summary, tags, the
recommended base, prompts to try after training). They ship as package data.
:mod:`.listing` reads the gallery (``dlm templates list``) and
:mod:`.instantiate` writes one as a new document with a fresh ``dlm_id``.
"""

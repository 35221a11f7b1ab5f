"""``dlm init PATH --template NAME``: a gallery template written as a new document.

The template's text is kept byte for byte (its comments, its layout) but
for two frontmatter lines: ``dlm_id`` gets a fresh ULID, as every ``dlm
init`` mints one, so two documents made from one template never share a
store; and ``base_model`` is replaced when the caller names another base.
DLM's ``dlm init --template`` keeps the template's base and ignores
``--base``; here a base you name wins, since it is the one choice you made
on purpose, and the gallery's documents are written to train on any
causal LM with a chat template.
"""

from __future__ import annotations

import re
from pathlib import Path

from dlmstore.document.init import InitResult, write_new_document, yaml_scalar
from dlmstore.errors import TemplateError
from dlmstore.ulid import new_ulid

from .listing import load_template


def init_from_template(path: str | Path, name: str, *, base_model: str | None = None) -> InitResult:
    """Write the gallery template ``name`` at ``path`` with a fresh ``dlm_id``, and create its store.

    Args:
        path: the new document; never overwritten.
        name: a template of the gallery (``dlm templates list``).
        base_model: a base to write instead of the template's recommended one.

    Raises:
        TemplateError: no template is called ``name``.
        DocumentError: ``path`` exists or cannot be written.
        BaseModelError: the base is not an accepted name.
    """
    info, text = load_template(name)
    dlm_id = new_ulid()
    text = _set_key(text, "dlm_id", dlm_id, name)
    base = info.recommended_base
    if base_model is not None:
        base = base_model
        text = _set_key(text, "base_model", yaml_scalar(base_model), name)
    return write_new_document(path, text, dlm_id=dlm_id, base_model=base, template=name)


def _set_key(text: str, key: str, value: str, name: str) -> str:
    """``text`` with its frontmatter's top-level ``key:`` line set to ``value``, nothing else changed."""
    head, sep, body = text.partition("\n---\n")
    pattern = re.compile(rf"^{key}:[^\n]*$", re.M)
    if not text.startswith("---\n") or not sep or len(pattern.findall(head)) != 1:
        raise TemplateError(f"template {name!r}: its frontmatter has no single top-level `{key}:` line")
    return pattern.sub(lambda _: f"{key}: {value}", head) + sep + body

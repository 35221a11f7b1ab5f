"""Named adapters: which sections train which adapter (DLM's routing table).

A document that declares ``training.adapters`` trains one LoRA adapter per
name, each on the sections routed to it:

* untagged prose (``::prose::``, or text before the first fence) and every
  section a ``training.sources`` directive reads train every adapter: the
  shared vocabulary of the domain;
* a section whose fence names an adapter (``::prose#tone::``,
  ``::instruction#tone::``, ``::preference#tone::``) trains only that one;
* untagged instruction and preference sections train the first-declared
  adapter, so a one-adapter document keeps its shape when a second is added.

A routed fence in a document that declares no adapters, or one naming an
adapter the document does not declare, is an error at parse time naming
the declared ones (:func:`route_problems`).

:func:`scoped` is the document one adapter trains on: its sections, and
training settings whose LoRA knobs are that adapter's block. Everything
downstream of parsing (the tokenize pass, dedup, the split, the run's
lock) sees an ordinary one-adapter document.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dlmstore.errors import DocumentError

if TYPE_CHECKING:
    from dlmstore.document.frontmatter import Frontmatter
    from dlmstore.document.parser import Document
    from dlmstore.document.sections import Section

#: The training settings each ``training.adapters`` block sets for its adapter.
ADAPTER_KNOBS = ("adapter", "lora_r", "lora_alpha", "lora_dropout", "target_modules", "learning_rate")


def adapter_names(document: Document) -> tuple[str, ...]:
    """The declared adapter names in declaration order; empty for a one-adapter document."""
    return tuple(document.frontmatter.training.adapters or ())


def routes_to(section: Section, name: str, names: Sequence[str]) -> bool:
    """Whether ``section`` trains adapter ``name`` of the declared ``names`` (DLM's routing table)."""
    if section.adapter is not None:
        return section.adapter == name
    return section.type == "prose" or name == names[0]


def routed_sections(document: Document, name: str) -> tuple[Section, ...]:
    """The in-body sections adapter ``name`` trains on, in document order."""
    names = adapter_names(document)
    return tuple(s for s in document.sections if routes_to(s, name, names))


def scoped(document: Document, name: str) -> Document:
    """The document adapter ``name`` trains on: its routed sections, and its block's LoRA settings.

    The replay history is per document, not per adapter, so a named
    adapter trains without replay (one history would mix the adapters' rows).

    Raises:
        ValueError: ``name`` is not declared (callers check it first).
    """
    training = document.frontmatter.training
    if training.adapters is None or name not in training.adapters:
        raise ValueError(f"adapter {name!r} is not declared in training.adapters")
    block = training.adapters[name]
    own = training.model_copy(
        update={
            **{knob: getattr(block, knob) for knob in ADAPTER_KNOBS},
            "adapters": None,
            "gate": type(training.gate)(),
            "replay": training.replay.model_copy(update={"enabled": False}),
        }
    )
    frontmatter = document.frontmatter.model_copy(update={"training": own})
    return dataclasses.replace(
        document, frontmatter=frontmatter, sections=routed_sections(document, name), adapter=name
    )


def route_problems(frontmatter: Frontmatter, sections: Sequence[Section], shown: str) -> list[DocumentError]:
    """One error per routed fence that names no declared adapter (all of them when none is declared)."""
    declared = tuple(frontmatter.training.adapters or ())
    problems = []
    for section in sections:
        name = section.adapter
        if name is None or name in declared:
            continue
        fence = f"::{section.type}#{name}::"
        if not declared:
            problems.append(
                DocumentError(
                    shown,
                    f"fence '{fence}' routes the section to adapter '{name}', but the document declares no "
                    "training.adapters",
                    line=section.line,
                    hint=f"declare it (training.adapters: {{{name}: {{}}}}), or write `::{section.type}::`",
                )
            )
        else:
            problems.append(
                DocumentError(
                    shown,
                    f"fence '{fence}' routes the section to adapter '{name}', which training.adapters does not "
                    f"declare (declared: {', '.join(declared)})",
                    line=section.line,
                    hint=f"use one of the declared names, or add {name} to training.adapters",
                )
            )
    return problems

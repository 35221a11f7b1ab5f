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
the declared ones (:func:`dlmstore.document.fences.route_problems`).

:func:`scoped` is the document one adapter trains on: its sections, and
training settings whose LoRA knobs are that adapter's block. Everything
downstream of parsing (the tokenize pass, dedup, the split, the run's
lock) sees an ordinary one-adapter document.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dlmstore.errors import AdapterChoiceError

if TYPE_CHECKING:
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


def chosen_adapter(
    document: Document, adapter: str | None, *, command: str, routed: bool = False
) -> str | None:
    """The named adapter ``command`` uses: ``adapter`` (``--adapter NAME``), checked against the
    document; ``None`` for a one-adapter document, or when ``routed`` (a gate chooses).

    Raises:
        AdapterChoiceError: ``adapter`` names an adapter the document does not declare (or it
            declares none), or the document declares several and none is chosen.
    """
    names = adapter_names(document)
    shown = document.path.name
    if adapter is not None and not names:
        raise AdapterChoiceError(
            f"{shown}: --adapter {adapter}: the document declares no named adapters (training.adapters), "
            "so it has one adapter",
            hint=f"leave out --adapter: `{command}` uses the document's adapter",
        )
    if adapter is not None and adapter not in names:
        raise AdapterChoiceError(
            f"{shown}: --adapter {adapter}: no such adapter (declared: {', '.join(names)})",
            hint="name one of the declared adapters",
        )
    if adapter is None and names and not routed:
        raise AdapterChoiceError(
            f"{shown} declares named adapters ({', '.join(names)}): `{command}` needs --adapter NAME",
            hint=f"e.g. `{command} {shown} --adapter {names[0]}`",
        )
    return adapter

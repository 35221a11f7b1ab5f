"""The prompts a gate trains on: one per routed section, labelled by its adapter.

DLM's orchestrator (``dlm.train.gate.orchestrator.probes_from_sections``)
takes one supervising prompt from each section whose fence names an
adapter, and we take the same ones:

* an instruction section (``::instruction#tone::``): its first question;
* a preference section: its first triple's prompt;
* a prose section (``::prose#tone::``): its first 2,048 characters.

An untagged section gives none: it trains one adapter or all of them (the
routing table, ``dlmstore.document.adapter_routing``), but says nothing about
which adapter a prompt belongs to. Sections from ``training.sources`` are
never tagged, so they give none either, as in DLM. A prompt is labelled by
its adapter's position in ``training.adapters``, the gate's output order.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlmstore.document.parser import Document, instruction_pairs, preference_triples
from dlmstore.document.sections import Section

#: How much of a prose section conditions the gate: a stable prefix is all it needs (DLM's figure).
PROSE_PROMPT_CHARS = 2048


@dataclass(frozen=True)
class GatePrompts:
    """The gate's training set, before embedding.

    Attributes:
        names: the declared adapters in ``training.adapters`` order: the
            gate's outputs (empty for a document without named adapters).
        prompts: one prompt text per routed section, in document order.
        labels: for each prompt, the index in ``names`` of the adapter its
            section is routed to.
    """

    names: tuple[str, ...]
    prompts: tuple[str, ...]
    labels: tuple[int, ...]

    def counts(self) -> dict[str, int]:
        """How many prompts each adapter has, in ``names`` order (0 for one with none)."""
        found = dict.fromkeys(self.names, 0)
        for label in self.labels:
            found[self.names[label]] += 1
        return found


def gate_prompts(document: Document) -> GatePrompts:
    """The prompt of each routed in-body section of ``document`` and its adapter's index.

    A section routed to a name that is not declared gives nothing (parsing
    refuses such a document first; DLM drops it the same way).
    """
    names = tuple(document.frontmatter.training.adapters or ())
    index = {name: i for i, name in enumerate(names)}
    prompts: list[str] = []
    labels: list[int] = []
    for section in document.sections:
        if section.adapter is None or section.adapter not in index:
            continue
        prompt = section_prompt(section)
        if prompt is None:
            continue
        prompts.append(prompt)
        labels.append(index[section.adapter])
    return GatePrompts(names, tuple(prompts), tuple(labels))


def section_prompt(section: Section) -> str | None:
    """The text of ``section`` that stands for it when the gate learns where it goes, or ``None``."""
    if section.type == "instruction":
        pairs = instruction_pairs(section)
        return pairs[0][0] if pairs else None
    if section.type == "preference":
        triples = preference_triples(section)
        return triples[0][0] if triples else None
    return section.content[:PROSE_PROMPT_CHARS]

"""The probes: the questions a run asks the base and the adapter, with the document's answers.

DLM's rule (``dlm.eval.probes.extract_probes``), up to ``k = 3``:

1. the ``### Q !probe`` pairs of the document's instruction sections, in
   document order (the first three when there are more);
2. when fewer than three are marked, the rest sampled from the other
   ``### Q`` / ``### A`` pairs: those whose question is not already a
   probe's, ordered by ``sha256(f"{seed}\\0{question}")`` (hex) and taken
   from the top. The sample is a pure function of the seed and the
   questions, so every run asks the same ones.

A probe's question is the prompt and its answer the reference. Probes are
trained on like any pair (DLM does), and the ``!probe`` pairs are never
held out for validation (:mod:`dlmstore.eval.split`). Each probe is known
by its row's key, which is how store.db records its scores.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from dlmstore.document.rows import document_rows
from dlmstore.document.sections import Section

#: DLM's ``k``: the most probes a run asks.
PROBE_COUNT = 3
_MARKED = "### Q !probe"
_HEADINGS = ("### Q", _MARKED)


@dataclass(frozen=True)
class Probe:
    """One question and the document's answer to it.

    Attributes:
        row_key: the key of the Q/A row it is.
        question: the prompt.
        reference: the document's answer.
        marked: whether the pair is marked ``### Q !probe`` (else sampled).
        retained: an earlier version of the document held it and this one
            does not (the replay history's): asked to measure what was kept.
    """

    row_key: str
    question: str
    reference: str
    marked: bool
    retained: bool = False


def marked_flags(section: Section) -> list[bool]:
    """For each pair of an instruction section, in order, whether its heading is ``### Q !probe``.

    A heading is a line that is exactly ``### Q`` (or ``### Q !probe``) once
    stripped, code blocks or not, as the parser reads them
    (``dlmstore.document.parser``), so the n-th heading is the n-th pair's.
    """
    return [line.strip() == _MARKED for line in section.content.splitlines() if line.strip() in _HEADINGS]


def document_probes(sections: Iterable[Section]) -> list[Probe]:
    """Every Q/A pair of the in-body ``sections`` as a candidate probe, in document order."""
    sections = list(sections)
    flags = {
        section.section_id: marked_flags(section) for section in sections if section.type == "instruction"
    }
    return [
        Probe(
            row.row_key,
            row.data["messages"][0]["content"],
            row.data["messages"][1]["content"],
            flags[row.section_id][row.index],
        )
        for row in document_rows(sections)
        if row.kind == "messages"
    ]


def marked_keys(sections: Iterable[Section]) -> frozenset[str]:
    """The row keys of every ``### Q !probe`` pair (the rows validation never holds out)."""
    return frozenset(probe.row_key for probe in document_probes(sections) if probe.marked)


def extract_probes(sections: Iterable[Section], *, seed: int, k: int = PROBE_COUNT) -> list[Probe]:
    """The run's probes by DLM's rule (see the module docstring)."""
    candidates = document_probes(sections)
    marked = [probe for probe in candidates if probe.marked]
    if len(marked) >= k:
        return marked[:k]
    asked = {probe.question for probe in marked}
    rest = [probe for probe in candidates if not probe.marked and probe.question not in asked]
    rest.sort(key=lambda probe: hashlib.sha256(f"{seed}\x00{probe.question}".encode()).hexdigest())
    return [*marked, *rest[: k - len(marked)]]

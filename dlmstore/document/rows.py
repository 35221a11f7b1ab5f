"""Training rows: what each section turns into, and each row's content key.

The rows are DLM's, exactly: a prose section is one ``text`` row, its
content stripped of surrounding whitespace (a source file's section too:
``# source: <relpath>`` header, blank line, file text); each ``### Q`` /
``### A`` pair of an instruction section is one ``messages`` row, a user
then an assistant message; each prompt/chosen/rejected triple of a
preference section is one ``preference`` row. The document's
``system_prompt`` is not part of any row (DLM uses it only when the model
is exported or prompted; ``dlm prompt`` does the same).

Row keys are content addresses with a scheme prefix::

    row_key = "sha256:" + sha256("row-v2\\n{digest}\\n{kind}\\n{index}\\n{occurrence}\\n{payload}")

* ``digest`` is the section's full sha256 (already covers type and text).
* ``index`` is the row's position inside its section, so two pairs of one
  section never share a key, even when their texts are equal.
* ``occurrence`` counts earlier sections with the same digest in the same
  document, so duplicated sections still give distinct rows, while a
  section's keys do not move when unrelated sections are inserted before it.
* ``payload`` is empty for ``text`` rows: the digest already covers the
  text, and hashing it again would double the cost for a 13K-file source.
  For ``messages`` and ``preference`` rows it is the canonical JSON of the
  row data.

A preference row is cached as four token arrays (its *parts*), each under
a key derived from the row key (``dlmstore.cache.preferences``).

Keys depend on nothing outside the section, so editing a frontmatter key
(``export``, ``system_prompt``) never changes them. Bump the scheme when the
row shape or the key recipe changes: ``row-v2`` strips prose rows and drops
the system message that ``row-v1`` put in instruction rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from hashlib import sha256
from typing import Any

from dlmstore.document.parser import instruction_pairs, preference_triples
from dlmstore.document.sections import Section

ROW_KEY_SCHEME = "row-v2"

#: The most text one row may hold, in UTF-8 bytes. The fast tokenizer keeps
#: per-byte alignments and per-token structures while it encodes: about 140
#: bytes of memory per byte of code or English prose, up to about 300 for
#: text of one token per byte (CJK, emoji), so a 57 MB row needs 8 GB
#: (``bench/bench_hostile_io.py``). At 4 MiB the worst row measured peaks
#: at 1.4 GB for the whole ``dlm tokenize`` process, and the tokenize pass
#: batches rows up to this many bytes, so a pass stays under 2 GB whatever
#: the file sizes. Training sees only the first ``sequence_len`` tokens of a
#: row (TRL truncates), a few KiB of text, so the limit costs little
#: training signal. Source files over it are skipped by the default
#: ``max_bytes_per_file`` (``dlmstore.sources.defaults``); an in-body row
#: over it is an error (``dlmstore.corpus.assemble``).
MAX_ROW_BYTES = 4 * 1024 * 1024

ROW_KINDS = ("text", "messages", "preference")


class Row:
    """One training example (immutable).

    Attributes:
        row_key: ``"sha256:" + 64 hex``; see the module docstring.
        section_id: the id of the section the row comes from.
        index: the row's position inside its section (0-based).
        kind: ``text``, ``messages`` or ``preference``.
        data: ``{"text": ...}``, ``{"messages": [{"role", "content"}, ...]}``
            or ``{"prompt", "chosen", "rejected"}``.

    A ``text`` row made from a lazily loaded section (a source file a stat
    check proved unchanged) builds ``data`` only when asked, so a pass whose
    rows all hit the cache never reads those files.

    Immutable by convention, like :class:`~dlmstore.document.sections.Section`
    (and for the same reason: one row per source file on every pass).
    """

    __slots__ = ("row_key", "section_id", "index", "kind", "_data", "_section")

    row_key: str
    section_id: str
    index: int
    kind: str
    _data: dict[str, Any] | None
    _section: Section | None

    def __init__(
        self,
        row_key: str,
        section_id: str,
        index: int,
        kind: str,
        data: dict[str, Any] | None = None,
        *,
        section: Section | None = None,
    ) -> None:
        if data is None and section is None:
            raise ValueError("a row needs its data or the section that holds its text")
        self.row_key = row_key
        self.section_id = section_id
        self.index = index
        self.kind = kind
        self._data = data
        self._section = section

    @property
    def data(self) -> dict[str, Any]:
        if self._data is not None:
            return self._data
        assert self._section is not None  # guaranteed by __init__
        return {"text": self._section.content.strip()}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Row):
            return NotImplemented
        return (self.row_key, self.section_id, self.index, self.kind, self.data) == (
            other.row_key, other.section_id, other.index, other.kind, other.data,
        )  # fmt: skip

    def __hash__(self) -> int:
        return hash(self.row_key)

    def __repr__(self) -> str:
        return f"Row(row_key={self.row_key!r}, section_id={self.section_id!r}, index={self.index}, kind={self.kind!r})"


def text_bytes(data: object) -> int:
    """UTF-8 bytes of every string in ``data`` (a row's ``data``): what the tokenizer is given."""
    if isinstance(data, str):
        return len(data) if data.isascii() else len(data.encode("utf-8", "surrogatepass"))
    if isinstance(data, dict):
        return sum(text_bytes(value) for value in data.values())
    if isinstance(data, list | tuple):
        return sum(text_bytes(value) for value in data)
    return 0


def canonical_json(data: dict[str, Any]) -> str:
    """Key-sorted, compact, non-ASCII-preserving JSON: the bytes a key covers."""
    return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def row_key(section: Section, kind: str, index: int, occurrence: int, data: dict[str, Any]) -> str:
    """The content key of one row (see the module docstring for the recipe)."""
    payload = "" if kind == "text" else canonical_json(data)
    return _key(section.digest, kind, index, occurrence, payload)


def text_row_key(digest: str, occurrence: int = 0) -> str:
    """The key of the one ``text`` row of a prose section whose digest is ``digest``.

    What a source file's row is keyed by, from the digest ``source_stats``
    recorded for it (``dlm report`` counts tokens per source folder this way).
    """
    return _key(digest, "text", 0, occurrence, "")


def _text_key(section: Section, occurrence: int) -> str:
    """The key of a prose section's one row: the one its record kept when it is the first of its digest."""
    if not occurrence and section.text_key:
        return section.text_key
    return _key(section.digest, "text", 0, occurrence, "")


def _key(digest: str, kind: str, index: int, occurrence: int, payload: str) -> str:
    material = f"{ROW_KEY_SCHEME}\n{digest}\n{kind}\n{index}\n{occurrence}\n{payload}"
    return "sha256:" + sha256(material.encode("utf-8")).hexdigest()


def section_rows(section: Section, *, occurrence: int = 0) -> list[Row]:
    """The training rows of one section, in order.

    Args:
        section: a well-formed section (as produced by ``dlmstore.document.parser``
            or ``dlmstore.sources.read``).
        occurrence: how many earlier sections of the same document share
            this section's digest (see :func:`document_rows`).

    Returns:
        One row for a prose section, one per pair or triple otherwise.

    Raises:
        ValueError: unknown section type, or a malformed structured section.
    """
    datas: list[dict[str, Any]]
    if section.type == "prose":
        # The digest covers the text, so the key needs no content: keep it lazy.
        return [Row(_text_key(section, occurrence), section.section_id, 0, "text", section=section)]
    elif section.type == "instruction":
        kind = "messages"
        datas = [
            {
                "messages": [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": answer},
                ]
            }
            for question, answer in instruction_pairs(section)
        ]
    elif section.type == "preference":
        kind = "preference"
        datas = [
            {"prompt": prompt, "chosen": chosen, "rejected": rejected}
            for prompt, chosen, rejected in preference_triples(section)
        ]
    else:
        raise ValueError(f"unknown section type {section.type!r}")
    return [
        Row(
            row_key=row_key(section, kind, index, occurrence, data),
            section_id=section.section_id,
            index=index,
            kind=kind,
            data=data,
        )
        for index, data in enumerate(datas)
    ]


def row_counts(sections: Iterable[Section]) -> dict[str, int]:
    """How many rows of each kind :func:`document_rows` would give, without building them.

    A prose section is one ``text`` row whatever its text, so a source file
    costs nothing here (no row key is hashed, no text is loaded): ``dlm
    show`` counts 100,000 files' rows this way.
    """
    counts = dict.fromkeys(ROW_KINDS, 0)
    for section in sections:
        if section.type == "prose":
            counts["text"] += 1
        else:
            for row in section_rows(section):
                counts[row.kind] += 1
    return counts


def document_rows(sections: Iterable[Section]) -> list[Row]:
    """The rows of a sequence of sections, in order, with distinct keys.

    Each section's ``occurrence`` is the number of earlier sections with the
    same digest, so repeated sections yield distinct rows.
    """
    seen: dict[str, int] = {}
    rows: list[Row] = []
    append = rows.append
    for section in sections:
        digest = section.digest
        occurrence = seen.get(digest, 0)
        seen[digest] = occurrence + 1
        if section.type == "prose":  # section_rows' prose case, inline: one per source file
            append(Row(_text_key(section, occurrence), digest[:16], 0, "text", section=section))
        else:
            rows.extend(section_rows(section, occurrence=occurrence))
    return rows

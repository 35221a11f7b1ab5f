"""Tag weights: ``.dlm/training.yaml`` ``metadata:`` tags source rows, ``weights:`` repeats them.

DocumentLanguageModel's rule (``dlm.data.weighted_rows``), matched:

* a source file's row is tagged with the ``metadata`` of every
  ``.dlm/training.yaml`` from its directive root down to its folder, the
  nearest one winning per key; in-body rows, and the file of a directive
  naming one file (DLM looks for no ``.dlm/`` folder there), have no tags;
* the ``weights`` of every ``training.yaml`` a directive walk reads are
  merged into one map, shallower folders first so a deeper one wins per
  ``(tag, value)`` (DLM merges them in discovery order; here the order is
  written down: directive order, then folder depth, then folder path);
* a row's weight is the product of ``weights[tag][value]`` over its tags
  (a tag or value with no weight counts 1);
* the integer part of the weight is the number of copies, the fractional
  part the chance of one more copy, drawn from
  ``sha256("{seed}:{row_key}")`` (DLM hashes the section id with BLAKE2b:
  the row key is as stable and tells two rows of one section apart), so
  the same seed and rows repeat the same rows on every machine; a weight
  of 0 drops the row.

Where this does better than DLM: DLM repeats rows before the validation
split, so copies of one row can land on both sides of it; here the split is
made on the distinct rows and only the training side is repeated, so
validation loss never scores a row the run trained on. A repeated row is
the same token ids (from the same cache entry, tokenized once), listed once
more.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlmstore.document.rows import section_rows

if TYPE_CHECKING:
    from dlmstore.corpus.assemble import Corpus
    from dlmstore.corpus.pass_result import TokenizedRows
    from dlmstore.sources.config import TrainingConfig


@dataclass(frozen=True)
class WeightCount:
    """What one ``(tag, value)`` weight did to the rows tagged with it.

    Attributes:
        tag: the metadata key.
        value: its value.
        weight: the weight ``weights:`` gives it.
        rows: rows tagged with it.
        added: copies it added (rows of weight above 1).
        dropped: rows it dropped (weight 0, or a fractional draw that failed).
    """

    tag: str
    value: str
    weight: float
    rows: int
    added: int
    dropped: int


@dataclass(frozen=True)
class RowWeights:
    """The weight of each tagged row, and the merged ``weights`` map."""

    weights: Mapping[str, Mapping[str, float]]
    tags: Mapping[str, Mapping[str, str]]  # row_key -> its tags (source rows with any)

    def weight(self, row_key: str) -> float:
        """The product of the weights of ``row_key``'s tags (1 for an untagged row)."""
        weight = 1.0
        for tag, value in self.tags.get(row_key, {}).items():
            weight *= self.weights.get(tag, {}).get(value, 1.0)
        return weight

    def copies(self, row_key: str, seed: int) -> int:
        """How many times ``row_key`` trains: the integer part, plus one drawn for the fraction."""
        weight = self.weight(row_key)
        if not weight > 0:
            return 0
        whole = int(weight)
        fraction = weight - whole
        return whole + (1 if fraction > 0 and draw(seed, row_key) < fraction else 0)

    def counts(self, row_keys: Sequence[str], seed: int) -> tuple[WeightCount, ...]:
        """Per ``(tag, value)`` with a weight: its rows among ``row_keys``, copies added and rows dropped."""
        found: dict[tuple[str, str], list[int]] = {}
        for key in row_keys:
            tags = self.tags.get(key)
            if not tags:
                continue
            extra = self.copies(key, seed) - 1
            for tag, value in tags.items():
                if value in self.weights.get(tag, {}):
                    entry = found.setdefault((tag, value), [0, 0, 0])
                    entry[0] += 1
                    entry[1] += max(extra, 0)
                    entry[2] += 1 if extra < 0 else 0
        return tuple(
            WeightCount(tag, value, self.weights[tag][value], *found[(tag, value)])
            for tag, value in sorted(found)
        )


def draw(seed: int, row_key: str) -> float:
    """A number in [0, 1) fixed by ``seed`` and ``row_key`` on every machine."""
    digest = hashlib.sha256(f"{seed}:{row_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / float(1 << 64)


def row_weights(corpus: Corpus) -> RowWeights | None:
    """The tags and weights of ``corpus``'s source rows; ``None`` when no ``training.yaml`` sets ``weights``.

    Raises:
        SourceError: a ``training.yaml`` on the way is unreadable or malformed.
    """
    from dlmstore.sources.config import load_folder

    expansion = corpus.expansion
    configs: dict[str, TrainingConfig | None] = {}

    def config(root: str, anchor: str, label: str) -> TrainingConfig | None:
        path = os.path.join(root, anchor) if anchor else root
        if path not in configs:
            configs[path] = (
                load_folder(path, anchor, label=label).config
                if os.path.isdir(os.path.join(path, ".dlm"))
                else None
            )
        return configs[path]

    merged: dict[tuple[int, int, str], Mapping[str, Mapping[str, float]]] = {}
    tags: dict[str, dict[str, str]] = {}
    start = 0
    for number, provenance in enumerate(expansion.provenance):
        sections = expansion.sections[start : start + provenance.files_included]
        start += provenance.files_included
        root = provenance.root
        label = f"training.sources '{provenance.directive}'"
        if not os.path.isdir(root):  # a directive naming one file reads no .dlm/ folder, as in DLM
            continue
        for section in sections:
            folder = os.path.dirname(section.source or "")
            anchors = [""]
            parts = folder.split("/") if folder else []
            anchors += ["/".join(parts[: i + 1]) for i in range(len(parts))]
            found: dict[str, str] = {}
            for depth, anchor in enumerate(anchors):  # root first, so the nearest wins per key
                cfg = config(root, anchor, label)
                if cfg is None:
                    continue
                found.update(cfg.metadata)
                if cfg.weights:
                    merged[(number, depth, anchor)] = cfg.weights
            if found:
                for row in section_rows(section):
                    tags[row.row_key] = found
    weights: dict[str, dict[str, float]] = {}
    for key in sorted(merged):
        for tag, values in merged[key].items():
            weights.setdefault(tag, {}).update(values)
    if not any(weights.values()):
        return None
    return RowWeights(weights, tags)


def weighed_split(
    corpus: Corpus | None, train: TokenizedRows, val: TokenizedRows, seed: int
) -> tuple[TokenizedRows, TokenizedRows]:
    """The training rows repeated by their weights, and the held-out rows less those weighed to no copy.

    A row that would not train (weight 0, or a fraction drawn to no copy)
    is not scored in validation either, as in DLM, where it is gone before
    the split; a held-out row is never repeated.
    """
    weights = None if corpus is None else row_weights(corpus)
    if weights is None:
        return train, val
    return repeat_rows(train, weights, seed), repeat_rows(val, weights, seed, once=True)


def repeat_rows(rows: TokenizedRows, weights: RowWeights, seed: int, *, once: bool = False) -> TokenizedRows:
    """``rows`` with each row listed as many times as its weight says (dropped at 0), in order.

    With ``once``, a row is kept once or dropped, never repeated. The copies
    share the row's token ids: nothing is tokenized again.
    """
    counts = [weights.copies(key, seed) for key in rows.row_keys]
    if once:
        counts = [min(count, 1) for count in counts]
    if all(count == 1 for count in counts):
        return rows
    return rows.take([index for index, count in enumerate(counts) for _ in range(count)])

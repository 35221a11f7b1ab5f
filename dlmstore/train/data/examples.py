"""Training examples as tensors straight from the token arrays: the SFT phase's dataset.

Every source is a map-style dataset whose items are ``{"input_ids",
"labels"}`` int64 arrays in the Hugging Face convention (labels aligned
with the inputs; the model shifts them; ``-100`` is not trained):

* :class:`RowExamples` - the document's rows (prose, instructions,
  sources) from the tokenize pass, cut to ``sequence_len``; every token is
  a target, as TRL's SFT trains them;
* :class:`PackedWindows` - a pretrain dataset as windows of
  ``sequence_len`` tokens over its memory-mapped shards
  (:class:`~dlmstore.datasets.MemoryMappedDataset` with packing): the
  first token of each document inside a window is not a target, so no
  loss crosses a document boundary, and a window holding more than one
  document carries ``position_ids`` that start again at 0 with each
  document (the packing's ``doc_ids``, as positions), so no attention
  crosses one either (see :class:`Collator`);
* :class:`SftExamples` - an SFT dataset's conversations, cut to
  ``sequence_len``, with the stored assistant-only loss mask.

:func:`validation_examples` is the val split the same way: the document's
held-out rows (``dlmstore.eval.split``) as :class:`RowExamples`, and the
``val`` split of each token dataset the run trains on (its first
:data:`VAL_ITEMS_PER_DATASET` items at most, evenly spaced), batched by the
same :class:`Collator`.

:func:`training_examples` mixes several by weight
(:class:`~dlmstore.datasets.MixtureDataset`; the document's rows weigh 1)
and tags each item with its source and position, which the collator
(:class:`Collator`) strips and counts: what each rank trained on, per
source, without a Python object per token. Items are views of the memory
maps until the collator pads them into the batch tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from dlmstore.datasets.formats import MASK_DTYPE, TokenFile, sft_names, token_dtype
from dlmstore.datasets.read.mixture import MixtureDataset
from dlmstore.datasets.read.mmap_dataset import MemoryMappedDataset
from dlmstore.datasets.read.packing import IGNORE_INDEX

Item = dict[str, Any]

#: The batch key holding its count of real (unpadded) tokens, which the
#: trainer takes off before the model sees the batch.
TOKENS_KEY = "dlm_tokens"


class RowExamples(Dataset[Item]):
    """The document's tokenized rows, each cut to ``sequence_len`` tokens, all tokens trained."""

    def __init__(self, rows: Any, sequence_len: int) -> None:
        self.rows = rows
        self.sequence_len = sequence_len

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Item:
        ids = self.rows.input_ids(index)[: self.sequence_len].astype(np.int64)
        return {"input_ids": ids, "labels": ids}


class PackedWindows(Dataset[Item]):
    """Windows of ``sequence_len`` tokens from a pretrain dataset's split, no loss across documents."""

    def __init__(self, root: str | Path, split: str, sequence_len: int) -> None:
        self.windows = MemoryMappedDataset(
            Path(root) / split, seq_len=sequence_len, file_pattern="shard_*.bin", pack_sequences=True
        )

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> Item:
        item = self.windows[index]  # inputs w[:-1], labels w[1:] with -100 where a document starts
        last = np.int64(self.windows.window(index)[-1])
        ids = np.append(item["input_ids"].numpy(), last)
        labels = np.concatenate(([IGNORE_INDEX], item["labels"].numpy()))
        starts = np.flatnonzero(labels == IGNORE_INDEX)  # 0 and each document's first token
        if len(starts) == 1:  # one document: the model's own positions
            return {"input_ids": ids, "labels": labels}
        spans = np.diff(np.append(starts, len(ids)))
        positions = np.arange(len(ids), dtype=np.int64) - np.repeat(starts, spans)
        return {"input_ids": ids, "labels": labels, "position_ids": positions}


class SftExamples(Dataset[Item]):
    """An SFT dataset's conversations, cut to ``sequence_len``, targets where the stored mask says."""

    def __init__(self, root: str | Path, split: str, sequence_len: int, dtype: str) -> None:
        names = sft_names(split)
        root = Path(root)
        self.tokens = TokenFile(root / names["tokens"], token_dtype(dtype))
        self.mask = TokenFile(root / names["loss_mask"], MASK_DTYPE, expected_count=len(self.tokens))
        self.offsets = np.append(
            np.asarray(TokenFile(root / names["offsets"]).array, dtype=np.int64), len(self.tokens)
        )
        self.sequence_len = sequence_len

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> Item:
        start = int(self.offsets[index])
        end = min(int(self.offsets[index + 1]), start + self.sequence_len)
        ids = self.tokens.array[start:end].astype(np.int64)
        trained = self.mask.array[start:end].astype(bool)
        return {"input_ids": ids, "labels": np.where(trained, ids, IGNORE_INDEX)}


class TaggedMixture(MixtureDataset):
    """A :class:`MixtureDataset` whose items say which source and position they came from."""

    def __getitem__(self, index: int) -> Item:
        source, item = self.source_of(index)
        return {**self.datasets[source][item], "source": source, "sample": index}


class Tagged(Dataset[Item]):
    """One source alone, its items tagged like a mixture's (source 0)."""

    def __init__(self, dataset: Dataset[Item]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Item:
        return {**self.dataset[index], "source": 0, "sample": index}


def open_examples(inputs: Sequence[Any], sequence_len: int) -> list[Dataset[Item]]:
    """One dataset per checked :class:`~dlmstore.train.data.inputs.DatasetInput`."""
    out: list[Dataset[Item]] = []
    for item in inputs:
        if item.kind == "pretrain":
            out.append(PackedWindows(item.folder(), item.split, sequence_len))
        else:
            out.append(SftExamples(item.folder(), item.split, sequence_len, item.token_dtype))
    return out


def training_examples(
    rows: Any, inputs: Sequence[Any], *, sequence_len: int, seed: int
) -> tuple[Dataset[Item], list[str]]:
    """The SFT phase's dataset and the name of each source (``document`` first when it has rows).

    One source is used as it is; several are mixed by weight with
    ``seed`` (the mixture's epoch ``e`` is a pure function of the seed and
    ``e``, so a resumed run draws the same items).
    """
    sources: list[Dataset[Item]] = []
    names: list[str] = []
    weights: list[float] = []
    if rows is not None and len(rows):
        sources.append(RowExamples(rows, sequence_len))
        names.append("document")
        weights.append(1.0)
    for item, dataset in zip(inputs, open_examples(inputs, sequence_len), strict=True):
        sources.append(dataset)
        names.append(item.path)
        weights.append(item.weight)
    if len(sources) == 1:
        return Tagged(sources[0]), names
    return TaggedMixture(sources, weights=weights, seed=seed), names


#: The most items of one token dataset's ``val`` split a run evaluates (evenly spaced over the split).
VAL_ITEMS_PER_DATASET = 32


class Spaced(Dataset[Item]):
    """At most ``count`` items of ``dataset``, evenly spaced (all of them when it has no more)."""

    def __init__(self, dataset: Dataset[Item], count: int) -> None:
        self.dataset = dataset
        size = len(dataset)  # type: ignore[arg-type]
        self.positions = list(range(size)) if size <= count else [i * size // count for i in range(count)]

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, index: int) -> Item:
        return self.dataset[self.positions[index]]


def held_out(rows: Any, seed: int, always_train: frozenset[str]) -> tuple[Any, Any]:
    """The rows that train and the rows held out for validation (``dlmstore.eval.split``), each in order.

    When the split would hold out every row, none is held out: the document
    trains on all its rows and has no val split.
    """
    from dlmstore.corpus.dedup import kept_rows
    from dlmstore.eval.split import split_rows

    split = split_rows(rows.row_keys, seed, always_train=always_train)
    if not split.val or not split.train:
        return rows, kept_rows(rows, set(rows.row_keys))
    keys = rows.row_keys
    return kept_rows(rows, {keys[i] for i in split.val}), kept_rows(rows, {keys[i] for i in split.train})


def validation_examples(
    val_rows: Any, inputs: Sequence[Any], *, sequence_len: int
) -> tuple[Dataset[Item], int] | None:
    """The val split as one dataset of tagged items and its number of sources; None when it is empty.

    The document's val rows come first, then each token dataset's ``val``
    split (for a dataset trained on its ``train`` split that has one).
    """
    from dlmstore.datasets.meta import load_meta

    sources: list[Dataset[Item]] = []
    if val_rows is not None and len(val_rows):
        sources.append(RowExamples(val_rows, sequence_len))
    for item in inputs:
        if item.split != "train" or not load_meta(item.folder()).files_of("val", "tokens"):
            continue
        if item.kind == "pretrain":
            dataset: Dataset[Item] = PackedWindows(item.folder(), "val", sequence_len)
        else:
            dataset = SftExamples(item.folder(), "val", sequence_len, item.token_dtype)
        if len(dataset):  # type: ignore[arg-type]
            sources.append(Spaced(dataset, VAL_ITEMS_PER_DATASET))
    if not sources:
        return None
    return Chained(sources), len(sources)


class Chained(Dataset[Item]):
    """Several datasets one after another, each item tagged with its source and position."""

    def __init__(self, sources: Sequence[Dataset[Item]]) -> None:
        self.sources = list(sources)
        self.starts = np.cumsum([0, *(len(source) for source in self.sources)])  # type: ignore[arg-type]

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: int) -> Item:
        source = int(np.searchsorted(self.starts, index, side="right")) - 1
        return {**self.sources[source][index - int(self.starts[source])], "source": source, "sample": index}


class Collator:
    """Pads a batch (TRL's language-model collator) after taking off and counting the tags.

    ``samples`` lists the positions this process trained on, in order;
    ``source_samples`` / ``source_tokens`` count items and tokens per source;
    each batch carries its count of real tokens under :data:`TOKENS_KEY`.

    A batch holding a packed window of several documents is given
    ``position_ids`` (the items' own, ``0, 1, ...`` for the others,
    padding continuing its row's count) and no ``attention_mask``:
    transformers then reads each restart of the positions as a new
    sequence and masks attention block by block (its packed-sequence
    mask; the model must run without a KV cache, as training does). Right
    padding needs no mask in a causal model: no real token attends to a
    later one, and padding is never a target. Other batches keep TRL's
    padding and mask.
    """

    def __init__(self, pad_token_id: int, sources: int) -> None:
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        self.pad = DataCollatorForLanguageModeling(pad_token_id=pad_token_id)
        self.samples: list[int] = []
        self.source_samples = [0] * sources
        self.source_tokens = [0] * sources

    def __call__(self, items: list[Item]) -> dict[str, torch.Tensor]:
        plain = []
        for item in items:
            source = int(item["source"])
            self.samples.append(int(item["sample"]))
            self.source_samples[source] += 1
            self.source_tokens[source] += len(item["input_ids"])
            plain.append({"input_ids": item["input_ids"], "labels": item["labels"]})
        batch: dict[str, torch.Tensor] = self.pad(plain)
        batch[TOKENS_KEY] = torch.tensor(sum(len(item["input_ids"]) for item in plain))
        if any("position_ids" in item for item in items):
            width = batch["input_ids"].shape[1]
            positions = torch.arange(width, dtype=torch.int64).repeat(len(items), 1)
            for row, item in enumerate(items):
                if "position_ids" in item:
                    own = torch.from_numpy(item["position_ids"])
                    positions[row, : len(own)] = own
                    positions[row, len(own) :] += own[-1] + 1 - len(own)
            del batch["attention_mask"]
            batch["position_ids"] = positions
        return batch

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps, so a resumed run counts on from there."""
        return {
            "samples": list(self.samples),
            "source_samples": list(self.source_samples),
            "source_tokens": list(self.source_tokens),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.samples = [int(v) for v in state["samples"]]
        self.source_samples = [int(v) for v in state["source_samples"]]
        self.source_tokens = [int(v) for v in state["source_tokens"]]


def pad_token_id(tokenizer: Any) -> int:
    """The id batches are padded with: the tokenizer's pad token, else its end of sequence, else 0."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return int(pad if pad is not None else 0)

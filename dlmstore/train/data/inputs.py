"""Token datasets as training input: which ones a run trains on, and the checks before it does.

A document names them in ``training.datasets`` (a dlmstore extension:
``[{path, weight, split}]``, paths relative to the document's folder) and
the command line adds more (``dlm train DOC --dataset DIR[:WEIGHT]``,
relative to the working directory). Each is a folder ``dlm data build``
wrote; :func:`check_dataset_input` reads its ``meta.json`` and refuses,
before any model loads, what cannot train correctly:

* a folder without ``meta.json``, or one whose meta.json says ``built:
  false`` (the build did not finish);
* a dataset built by another tokenizer than the base model's (its token ids
  mean other text);
* a token dtype that cannot hold the base's vocabulary;
* a split the dataset does not have;
* windows longer than the model's context (``sequence_len`` above the
  base's ``max_position_embeddings``);
* files that are not what meta.json lists: the one checker behind ``dlm
  data validate`` (:func:`dlmstore.datasets.validate.check_dataset`, deep)
  runs on the whole dataset. Every listed file must be a regular file
  (a FIFO, device, socket or a symlink to one is refused by its kind from
  ``stat``, never opened for reading) of the recorded size and sha256; no
  unlisted shard may lie beside them; each ``.docs.npy`` must be int64
  document starts, increasing, inside its shard; every token id must be
  below the training tokenizer's vocabulary (an id past the embedding
  would otherwise end the run in an ``IndexError`` mid-training).

The meta.json sha256 the run records (``run_datasets``, the lock) names
every byte of the dataset only because those checks hold: meta.json lists
each file's sha256, and the files are read and hashed here, every run.
That costs one read of the data the run maps anyway, hashed on every core
(``bench/bench_dataset_checks.py`` prints it beside a training step; see
docs/datasets.md). A "verified at" record keyed on size and times would
skip that read, but it cannot see bit rot or a write that keeps them, so a
run verifies instead of trusting one.

A dataset in object storage (``path: s3://bucket/prefix``, ``--dataset
s3://bucket/prefix[:WEIGHT]``) is read through this node's cache
(:func:`dlmstore.objstore.node_cache.local_copy`): downloaded once, every
file verified against meta.json as it arrives, then checked here as a
local folder is. The run records the URL as the dataset's path and the
same meta.json sha256 a local copy has, so the lock and ``run_datasets``
cannot tell the two apart except by where they were read. Under
``--nproc``/``--nnodes`` rank 0 checks; every other rank takes its own
node's copy (:func:`local_inputs`) before the model loads.

What passes is a :class:`DatasetInput`: the dataset's identity and what
the run records about it in ``run_datasets``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmstore.errors import DatasetError, ObjectStoreError, TrainingError
from dlmstore.objstore.uri import is_object_uri


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset a run was asked to train on, before it is opened."""

    path: Path | str  # a local folder, or an s3:// URL (text)
    weight: float
    split: str
    origin: str  # "training.datasets[i]" or "--dataset"


@dataclass(frozen=True)
class DatasetInput:
    """A checked dataset input: what it is, and its identity for the lock and ``run_datasets``."""

    path: str
    kind: str  # pretrain | sft
    name: str
    split: str
    weight: float
    meta_sha256: str
    tokenizer_sha256: str
    token_dtype: str
    tokens: int  # tokens in the split
    eos_token_id: int | None
    local: str | None = None  # for an s3:// path: this node's copy (the node cache), which readers map

    def folder(self) -> str:
        """The folder the readers map: the dataset's own, or this node's copy of one in a bucket."""
        return self.path if self.local is None else self.local

    def identity(self) -> dict[str, Any]:
        """What the lock records: path, split, weight and the meta.json sha256."""
        return {
            "path": self.path,
            "split": self.split,
            "weight": self.weight,
            "meta_sha256": self.meta_sha256,
        }


def parse_dataset_option(text: str) -> tuple[str, float]:
    """``DIR[:WEIGHT]`` -> ``(DIR, WEIGHT)``; a suffix that is no positive number is part of the path.

    Raises:
        TrainingError: an empty path, or a weight that is zero, negative or not finite.
    """
    path, weight = text, 1.0
    head, sep, tail = text.rpartition(":")
    if sep and head:
        try:
            number = float(tail)
        except ValueError:
            number = None
        if number is not None:
            if not math.isfinite(number) or number <= 0:
                raise TrainingError(
                    f"--dataset {text}: the weight must be a positive number, not {tail}",
                    hint="write --dataset DIR:WEIGHT, e.g. --dataset data/wiki:2",
                )
            path, weight = head, number
    if not path:
        raise TrainingError("--dataset needs a dataset folder", hint="write --dataset DIR[:WEIGHT]")
    return path, weight


def dataset_specs(document: Any, options: Sequence[str] = ()) -> list[DatasetSpec]:
    """The datasets of ``training.datasets`` (relative to the document) then of ``--dataset`` (relative to cwd).

    Raises:
        TrainingError: an option is malformed, or one dataset split is named twice.
    """
    specs = [
        DatasetSpec(
            path=_object_url(entry.path, f"{document.path}: training.datasets[{index}]")
            if is_object_uri(entry.path)
            else (document.directory / entry.path).resolve(),
            weight=float(entry.weight),
            split=entry.split,
            origin=f"training.datasets[{index}]",
        )
        for index, entry in enumerate(document.frontmatter.training.datasets)
    ]
    for option in options:
        path, weight = parse_dataset_option(option)
        specs.append(
            DatasetSpec(
                path=_object_url(path, "--dataset") if is_object_uri(path) else Path(path).resolve(),
                weight=weight,
                split="train",
                origin="--dataset",
            )
        )
    seen: dict[tuple[Path | str, str], str] = {}
    for spec in specs:
        key = (spec.path, spec.split)
        if key in seen:
            raise TrainingError(
                f"{document.path}: dataset {spec.path} ({spec.split}) is named twice, "
                f"by {seen[key]} and {spec.origin}",
                hint="name each dataset once; its weight sets how often it is drawn",
            )
        seen[key] = spec.origin
    return specs


def check_dataset_input(
    spec: DatasetSpec, *, tokenizer_sha256: str, vocab_size: int, sequence_len: int, context_len: int | None
) -> DatasetInput:
    """Open ``spec``'s meta.json and refuse what cannot train (see the module docstring).

    Raises:
        TrainingError: with the dataset's path and what to do.
    """
    from dlmstore.datasets.formats import check_dtype_fits
    from dlmstore.datasets.meta import META_NAME, load_meta
    from dlmstore.store.digests import file_sha256

    where = f"{spec.origin} {spec.path}"
    local: Path | None = None
    if isinstance(spec.path, str):  # an s3:// URL: this node's verified copy, then the same checks
        from dlmstore.objstore.node_cache import local_copy
        from dlmstore.objstore.uri import ObjectURI

        local = local_copy(ObjectURI.parse(spec.path), where=spec.origin).path
        folder = local
    else:
        folder = spec.path
    if not folder.is_dir():
        raise TrainingError(
            f"{where}: no such dataset folder",
            hint="build one with `dlm data build pretrain|sft ... --out DIR`",
        )
    if not (folder / META_NAME).is_file():
        raise TrainingError(
            f"{where}: no {META_NAME}, so this is not a finished dataset",
            hint="build it with `dlm data build` (meta.json is written last, when every file is complete)",
        )
    try:
        meta = load_meta(folder)
    except DatasetError as exc:
        raise TrainingError(f"{where}: {exc.message}", hint=exc.hint) from None
    if not meta.built:
        raise TrainingError(
            f"{where}: {META_NAME} says built: false (the build did not finish)",
            hint="rerun the `dlm data build` command that made it",
        )
    if meta.tokenizer_sha256 != tokenizer_sha256:
        raise TrainingError(
            f"{where}: built with tokenizer {meta.tokenizer_sha256} ({meta.raw.get('tokenizer_name')}), "
            f"but the base model's tokenizer is {tokenizer_sha256}",
            hint="rebuild the dataset with the base model's tokenizer (token ids differ between tokenizers)",
        )
    try:
        check_dtype_fits(meta.token_dtype, vocab_size, where=folder / META_NAME)
    except DatasetError as exc:
        raise TrainingError(
            f"{where}: token dtype {meta.token_dtype} cannot hold the base's vocabulary of {vocab_size}",
            hint=exc.hint,
        ) from None
    files = meta.files_of(spec.split, "tokens")
    if not files:
        raise TrainingError(
            f"{where}: the dataset has no {spec.split} split",
            hint="train on a split it has (split: train or val)",
        )
    if context_len is not None and sequence_len > context_len:
        raise TrainingError(
            f"{where}: windows of sequence_len {sequence_len} tokens are longer than the base model's "
            f"context of {context_len} tokens",
            hint=f"set training.sequence_len to {context_len} or less",
        )
    verify_dataset(spec, tokenizer_sha256=tokenizer_sha256, vocab_size=vocab_size, folder=folder)
    return DatasetInput(
        path=str(spec.path),
        kind=meta.kind,
        name=meta.name,
        split=spec.split,
        weight=spec.weight,
        meta_sha256=file_sha256(folder / META_NAME),
        tokenizer_sha256=meta.tokenizer_sha256,
        token_dtype=meta.token_dtype,
        tokens=sum(f.token_count for f in files),
        eos_token_id=meta.raw.get("eos_token_id"),
        local=None if local is None else str(local),
    )


def verify_dataset(
    spec: DatasetSpec, *, tokenizer_sha256: str, vocab_size: int, folder: Path | None = None
) -> None:
    """Every file of ``spec``'s dataset as its meta.json records it, every token id in the vocabulary.

    ``folder`` is where it is read (this node's copy of a dataset in a bucket); ``spec.path`` by default.

    Raises:
        TrainingError: naming the dataset and the first problem found (the
            hint says how to list every one).
    """
    from dlmstore.datasets.validate import check_dataset
    from dlmstore.plural import plural

    where = Path(spec.path) if folder is None else folder
    report = check_dataset(where, tokenizer_sha256=tokenizer_sha256, vocab_size=vocab_size)
    if report.problems:
        more = len(report.problems) - 1
        raise TrainingError(
            f"{spec.origin} {spec.path}: {report.problems[0]}"
            + (f" (and {plural(more, 'more problem')})" if more else ""),
            hint=f"`dlm data validate {spec.path}` lists every problem; rebuild the dataset with `dlm data build`",
        )


def local_inputs(inputs: Sequence[DatasetInput]) -> list[DatasetInput]:
    """``inputs`` as this node reads them: each one in a bucket through this node's cache.

    What every rank but 0 calls on the inputs rank 0 checked: rank 0's copy
    is on rank 0's disk, so each node takes its own (the first of its ranks
    to ask downloads; the others wait for it). Local folders are left as
    they are.

    Raises:
        ObjectStoreError: the copy cannot be made (see ``local_copy``).
        TrainingError: the dataset's meta.json at its URL is no longer the
            one rank 0 checked.
    """
    from dlmstore.objstore.node_cache import local_copy
    from dlmstore.objstore.uri import ObjectURI

    out = []
    for item in inputs:
        if not is_object_uri(item.path):
            out.append(item)
            continue
        copy = local_copy(ObjectURI.parse(item.path))
        if copy.meta_sha256 != item.meta_sha256:
            raise TrainingError(
                f"{item.path}: its meta.json is {copy.meta_sha256} now, not the {item.meta_sha256} rank 0 "
                "checked (the dataset was rebuilt there during the run)",
                hint="run the training again once the dataset stays put",
            )
        out.append(dataclasses.replace(item, local=str(copy.path)))
    return out


def _object_url(text: str, where: str) -> str:
    """An ``s3://`` dataset path as its canonical URL.

    Raises:
        ObjectStoreError: it is malformed (``where`` says who gave it).
    """
    from dlmstore.objstore.uri import ObjectURI

    try:
        return str(ObjectURI.parse(text))
    except ObjectStoreError as exc:
        raise ObjectStoreError(f"{where}: {exc.message}", hint=exc.hint) from None


def inputs_sha256(inputs: Sequence[DatasetInput]) -> str:
    """One digest over the inputs' identities, in order (what a checkpoint must share with its resume)."""
    text = json.dumps([item.identity() for item in inputs], sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def context_length(model_folder: Path) -> int | None:
    """The base's ``max_position_embeddings`` from its config.json (None when it has none)."""
    from dlmstore.store.regular_files import load_json

    try:
        config = load_json((model_folder / "config.json").read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None

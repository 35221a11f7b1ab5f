"""``build_pretrain_cache``: a stream of texts -> train/val token shards.

The corpus is never materialised: texts are pulled from the iterable in
batches of ``batch_docs``, tokenized together (the tokenizer's batch call
is where the time goes), routed, and appended to the current shard of
their split through a streaming writer. Memory is one batch plus one
document index, whatever the corpus size.

Layout of ``out_dir``::

    meta.json                     written last; see docs/datasets.md
    train/shard_00000.bin         little-endian uint16 (or uint32) tokens
    train/shard_00000.docs.npy    int64 positions in the shard where documents start
    val/...

Each document is its tokens followed by ``eos_token_id``. Split rule: a
document goes whole to ``val`` when its draw is below ``val_frac``
(default ``val_tokens / (train_tokens + val_tokens)``), else to ``train``,
so no document is ever split between the two. A split stops taking
documents once it holds its token budget (checked at document
boundaries, so the last document may overshoot); documents drawn for a
full split are skipped and counted, and reading stops once every budget
is met. Sources that come with their own splits (wikitext) pass
``val_texts`` instead and skip the draw. The draw and the budgets are
pure functions of a document's position and the seed
(:mod:`.routing`), so ``engine=RayEngine(...)`` (:mod:`.ray_build`)
writes the same bytes from any number of workers.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from dlmstore import __version__
from dlmstore.datasets.build.encoding import TextEncoder, as_encoder
from dlmstore.datasets.build.engines import Engine, engine_session
from dlmstore.datasets.build.local import LocatedInput
from dlmstore.datasets.build.output import (
    BuildResult,
    Clock,
    DriverBytes,
    ProgressFn,
    batched,
    buffer_shuffle,
    claim_out_dir,
    prepare_out_dir,
    remove_build_dir,
    remove_stale,
    split_totals,
    text_of,
)
from dlmstore.datasets.build.routing import DRAW_RULE_TEXT, PretrainRouter, draw_splits
from dlmstore.datasets.build.writers import BackgroundCommits, ShardedSplitWriter
from dlmstore.datasets.formats import MIB, SPLITS, TOKEN_DTYPES, check_dtype_fits, choose_token_dtype
from dlmstore.datasets.meta import FORMAT, FileEntry, write_meta
from dlmstore.errors import DatasetError

DEFAULT_SHARD_BYTES = 128 * MIB
DEFAULT_BATCH_DOCS = 512


def build_pretrain_cache(
    texts: Iterable[str],
    out_dir: str | os.PathLike[str],
    *,
    tokenizer: Any,
    train_tokens: int | None = None,
    val_tokens: int | None = None,
    val_frac: float | None = None,
    val_texts: Iterable[str] | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    seed: int = 42,
    shuffle_buffer: int | None = None,
    token_dtype: str | None = None,
    eos_token: str | None = None,
    name: str | None = None,
    config: str | None = None,
    streaming: bool = False,
    source: dict[str, Any] | None = None,
    tokenizer_name: str | None = None,
    tokenizer_sha256: str | None = None,
    batch_docs: int = DEFAULT_BATCH_DOCS,
    progress: ProgressFn | None = None,
    engine: Engine | None = None,
    force: bool = False,
) -> BuildResult:
    """Tokenize ``texts`` into train/val shards under ``out_dir``; returns what was written.

    Args:
        texts: documents, one string each, read once in order; a
            :class:`~.local.LocatedInput` lets a Ray build's workers read
            its files by range instead (not with ``shuffle_buffer`` or
            ``val_texts``).
        tokenizer: a loaded Hugging Face tokenizer (or a ``TextEncoder``).
        train_tokens, val_tokens: token budgets (``None``: no limit).
        val_frac: probability that a document goes to val; defaults to
            the budgets' ratio. Ignored when ``val_texts`` is given.
        val_texts: the source's own validation documents.
        shard_bytes: target size of a shard; shards hold
            ``shard_bytes // itemsize`` tokens.
        seed: seeds the split draws and the shuffle buffer.
        shuffle_buffer: shuffle the stream with a buffer of this many
            documents first (``None``: keep the input order).
        token_dtype: ``uint16``/``uint32``; default: the smallest that fits.
        eos_token: the end-of-document token; default the tokenizer's EOS.
        name, config, streaming, source: recorded in meta.json.
        tokenizer_name, tokenizer_sha256: recorded identity (the sha256
            is computed from the tokenizer when not given).
        batch_docs: documents per tokenizer call (local engine).
        progress: called with documents and tokens read so far.
        engine: where to build (an :class:`~.engines.Engine`, e.g.
            :class:`~.ray_build.RayEngine`); ``None``: in this process.
            The output is byte-identical either way.
        force: write into a folder that is not a dataset dlm wrote,
            replacing the dataset files there (see
            :func:`~.output.claim_out_dir`; without it such a folder is refused).

    Raises:
        DatasetError: empty input, a non-text document, a dtype that
            cannot hold the vocabulary, no split rule, or an ``out_dir``
            that is not dlm's (:func:`~.output.claim_out_dir`).
    """
    encoder = as_encoder(tokenizer, tokenizer_sha256)
    dtype_name = token_dtype or choose_token_dtype(encoder.vocab_size)
    check_dtype_fits(dtype_name, encoder.vocab_size, where=f"token dtype for {Path(out_dir)}")
    dtype = TOKEN_DTYPES[dtype_name]
    eos_text = eos_token or encoder.eos_token()
    eos_id = encoder.token_id(eos_text, what="the end-of-document token")
    shard_tokens = shard_bytes // dtype.itemsize
    if shard_tokens < 1:
        raise DatasetError(f"shard_bytes={shard_bytes} holds no {dtype_name} token")
    if val_texts is None:
        val_frac = _val_frac(val_frac, train_tokens, val_tokens)
        split_rule = (
            f"per document: val when its draw (draw_rule) is below {val_frac:.6g}, else train; "
            "documents are never split between train and val; a full split skips its documents"
        )
    else:
        split_rule = "the source's own train and validation splits"
    spec = PretrainSpec(
        name=name or Path(out_dir).name,
        encoder=encoder,
        dtype_name=dtype_name,
        eos_id=eos_id,
        shard_tokens=shard_tokens,
        val_frac=val_frac if val_frac is not None else 0.0,
        budgets={"train": train_tokens, "val": val_tokens},
        seed=seed,
        meta={
            "format": FORMAT,
            "kind": "pretrain",
            "built": True,
            "dataset_name": name or Path(out_dir).name,
            "dataset_config": config,
            "source": source or {},
            "streaming": streaming,
            "split_rule": split_rule,
            "draw_rule": DRAW_RULE_TEXT,
            "seed": seed,
            "shuffle_buffer": shuffle_buffer,
            "val_frac": val_frac,
            "token_dtype": dtype_name,
            "byte_order": "little",
            "tokenizer_name": tokenizer_name or encoder.name,
            "tokenizer_sha256": encoder.tokenizer_sha256,
            "vocab_size": encoder.vocab_size,
            "special_token_ids": {**encoder.special_token_ids(), "eos": eos_id},
            "eos_token": eos_text,
            "eos_token_id": eos_id,
            "doc_boundaries": "every document is followed by eos_token_id; "
            "shard_NNNNN.docs.npy lists (int64) the positions in the shard where a document starts",
            "shard_bytes": shard_bytes,
            "shard_tokens": shard_tokens,
            "budgets": {"train_tokens": train_tokens, "val_tokens": val_tokens},
            "dlmstore_version": __version__,
        },
    )
    claim_out_dir(out_dir, force=force)  # a folder that is not dlm's is refused before Ray is reached
    with engine_session(engine):  # connected before the output directory is touched
        out = prepare_out_dir(out_dir, force=force)
        clock = Clock(spec.name, progress)
        stop = dict.fromkeys(SPLITS, False)
        labelled = _labelled(texts, val_texts, shuffle_buffer, seed, stop)
        driver: DriverBytes | None = None
        if engine is None:
            entries, router = _build_local(spec, labelled, stop, out, clock, batch_docs)
        else:
            # Files the workers can read by range, in input order: a shuffle buffer or a
            # source's own splits need the documents in order on one process, the driver.
            by_range = isinstance(texts, LocatedInput) and not shuffle_buffer and val_texts is None
            located = texts if by_range and isinstance(texts, LocatedInput) else None
            entries, router, driver = engine.build_pretrain(spec, labelled, stop, out, clock, located)
        seen = router.read
        if not any(router.docs.values()):
            what = (
                "the input yielded no documents"
                if seen == 0
                else "the one document was empty"
                if seen == 1
                else f"all {seen:,} documents were empty"
            )
            raise DatasetError(
                f"no documents to build {spec.name} from: {what}",
                hint="check the input path / source; empty texts are skipped",
            )
        for split in SPLITS:
            keep = {Path(e.path).name for e in entries if e.split == split}
            remove_stale(out / split, keep)
        clock.tick(seen, sum(router.held.values()), final=True)
        totals = {
            f"{s}_{k}": getattr(split_totals(entries, s), k) for s in SPLITS for k in ("tokens", "docs")
        }
        meta = {**spec.meta, "totals": {**totals, **router.counts()}}
        meta["files"] = [dataclasses.asdict(e) for e in entries]
        write_meta(out, meta)
        remove_build_dir(out)
        return BuildResult(
            path=str(out.resolve()),
            kind="pretrain",
            name=spec.name,
            token_dtype=dtype_name,
            vocab_size=encoder.vocab_size,
            tokenizer_sha256=encoder.tokenizer_sha256,
            seed=seed,
            splits={s: split_totals(entries, s) for s in SPLITS},
            skipped=router.counts(),
            seconds=clock.seconds,
            driver_bytes=driver,
        )


@dataclass(frozen=True)
class PretrainSpec:
    """A pretrain build's settings, resolved and checked, as both engines need them."""

    name: str
    encoder: TextEncoder
    dtype_name: str
    eos_id: int
    shard_tokens: int
    val_frac: float
    budgets: dict[str, int | None]
    seed: int
    meta: dict[str, Any]  # meta.json without totals and files

    @property
    def dtype(self) -> np.dtype[Any]:
        return TOKEN_DTYPES[self.dtype_name]


def _build_local(
    spec: PretrainSpec,
    labelled: Iterator[tuple[str, str | None]],
    stop: dict[str, bool],
    out: Path,
    clock: Clock,
    batch_docs: int,
) -> tuple[list[FileEntry], PretrainRouter]:
    """The local engine: tokenize batches in this process, stream them into shards."""
    commits = BackgroundCommits()
    writers = {s: ShardedSplitWriter(out / s, s, spec.dtype, spec.shard_tokens, s, commits) for s in SPLITS}
    router = PretrainRouter(spec.budgets)
    position = 0  # of the next drawn document
    try:
        for batch in batched(labelled, batch_docs):
            ids_list = spec.encoder.encode_texts([text for text, _ in batch])
            lengths = np.fromiter(map(len, ids_list), dtype=np.int64, count=len(ids_list))
            pending: dict[str, list[list[int]]] = {s: [] for s in SPLITS}
            for start, end, fixed_split in runs([split for _, split in batch]):
                if fixed_split is None:
                    drawn = draw_splits(spec.seed, position, end - start, spec.val_frac)
                    position += end - start
                    for index in router.route(lengths[start:end], drawn):
                        pending["val" if drawn[index] else "train"].append(ids_list[start + index])
                else:
                    for index in router.route_fixed(lengths[start:end], fixed_split):
                        pending[fixed_split].append(ids_list[start + index])
            for split, docs in pending.items():
                if docs:
                    writers[split].add(*concat_docs(docs, spec.eos_id, spec.dtype))
                stop[split] = router.full(split)
            clock.tick(router.read, sum(w.tokens for w in writers.values()))
            if router.stopped:
                break
        entries = [entry for s in SPLITS for entry in writers[s].close()]
        commits.wait()  # every shard durable before meta.json says the build is complete
    except BaseException:
        for writer in writers.values():
            writer.abort()
        commits.drain()
        raise
    return entries, router


def runs(labels: list[str | None]) -> Iterator[tuple[int, int, str | None]]:
    """``(start, end, label)`` of each run of equal consecutive labels."""
    start = 0
    for index in range(1, len(labels) + 1):
        if index == len(labels) or labels[index] != labels[start]:
            yield start, index, labels[start]
            start = index


def _val_frac(val_frac: float | None, train_tokens: int | None, val_tokens: int | None) -> float:
    if val_frac is None:
        if train_tokens is None or val_tokens is None:
            raise DatasetError(
                "a pretrain build needs a split rule: val_frac, or both train_tokens and val_tokens",
                hint="pass --val-frac, or --train-tokens and --val-tokens",
            )
        total = train_tokens + val_tokens
        val_frac = val_tokens / total if total else 0.0
    if not 0.0 <= val_frac < 1.0:
        raise DatasetError(f"val_frac must be in [0, 1), not {val_frac}")
    return val_frac


def _labelled(
    texts: Iterable[str],
    val_texts: Iterable[str] | None,
    shuffle_buffer: int | None,
    seed: int,
    stop: dict[str, bool],
) -> Iterator[tuple[str, str | None]]:
    """``(text, split)`` pairs; ``split`` is ``None`` when the draw decides.

    ``stop`` is updated by the caller: a source's own split stops being
    read once its budget is met, so a big train split is not read to the end.
    """

    def checked(items: Iterable[str], split: str | None) -> Iterator[tuple[str, str | None]]:
        if shuffle_buffer:
            items = buffer_shuffle(items, shuffle_buffer, seed)
        for index, item in enumerate(items):
            if split is not None and stop[split]:
                return
            yield text_of(item, index), split

    if val_texts is None:
        return checked(texts, None)
    return chain(checked(texts, "train"), checked(val_texts, "val"))


def _full(tokens: int, budget: int | None) -> bool:
    return budget is not None and tokens >= budget


def concat_docs(
    docs: list[list[int]], eos_id: int, dtype: np.dtype[Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The documents back to back, each followed by EOS, and where each starts."""
    lengths = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
    ends = np.cumsum(lengths + 1) - 1
    tokens = np.empty(int(ends[-1]) + 1, dtype=dtype)
    keep = np.ones(len(tokens), dtype=bool)
    keep[ends] = False
    tokens[keep] = np.fromiter(chain.from_iterable(docs), dtype=dtype, count=int(lengths.sum()))
    tokens[ends] = eos_id
    return tokens, ends - lengths

"""``build_sft_cache``: conversations -> per-split tokens, offsets and loss mask.

Layout of ``out_dir``::

    meta.json
    train_tokens.bin   every example's tokens back to back (uint16/uint32, little-endian)
    train_idx.npy      int64 start offset of each example in train_tokens.bin
                       (its length is the next offset, or the file end, minus it)
    train_mask.bin     uint8, one per token: 1 where the token is a training target
    val_tokens.bin, val_idx.npy, val_mask.bin

Examples are tokenized with the tokenizer's chat format (:mod:`.chat`):
the mask is 1 exactly on the content of assistant turns and their closing
EOT, built from the message structure. An example goes whole to ``val``
when its draw (:mod:`.routing`: a pure function of its position in the
input, skipped examples counted, and the seed) is below ``val_frac``. Examples with no
messages or no assistant turn teach nothing; they are skipped and counted
in ``meta.json`` (``totals.skipped_*``), not an error. Tokens and masks
are streamed to disk as examples arrive; only the offsets (8 bytes per
example) are held until the end.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from dlmstore import __version__
from dlmstore.datasets.build.chat import ChatEncoding, ChatFormat, chat_format_for, check_messages
from dlmstore.datasets.build.encoding import TextEncoder, as_encoder
from dlmstore.datasets.build.engines import Engine, engine_session
from dlmstore.datasets.build.local import LocatedInput
from dlmstore.datasets.build.output import (
    BuildResult,
    Clock,
    DriverBytes,
    ProgressFn,
    batched,
    claim_out_dir,
    prepare_out_dir,
    remove_build_dir,
    split_totals,
)
from dlmstore.datasets.build.routing import DRAW_RULE_TEXT, draw_splits
from dlmstore.datasets.build.writers import StreamingFile, write_npy
from dlmstore.datasets.formats import (
    OFFSET_DTYPE,
    SPLITS,
    TOKEN_DTYPES,
    check_dtype_fits,
    choose_token_dtype,
    sft_names,
)
from dlmstore.datasets.meta import FORMAT, FileEntry, write_meta
from dlmstore.errors import DatasetError

DEFAULT_VAL_FRAC = 0.10
DEFAULT_BATCH_EXAMPLES = 256


def build_sft_cache(
    examples: Iterable[Any],
    out_dir: str | os.PathLike[str],
    *,
    tokenizer: Any,
    val_frac: float = DEFAULT_VAL_FRAC,
    seed: int = 42,
    chat_format: str | ChatFormat = "auto",
    token_dtype: str | None = None,
    name: str | None = None,
    config: str | None = None,
    streaming: bool = False,
    source: dict[str, Any] | None = None,
    tokenizer_name: str | None = None,
    tokenizer_sha256: str | None = None,
    batch_examples: int = DEFAULT_BATCH_EXAMPLES,
    progress: ProgressFn | None = None,
    engine: Engine | None = None,
    force: bool = False,
) -> BuildResult:
    """Tokenize conversations into ``out_dir``; returns what was written.

    Args:
        examples: conversations, each a list of ``{"role", "content"}``
            messages (or ``{"messages": [...]}``), read once in order; a
            :class:`~.local.LocatedInput` (``text_field=None``) lets a Ray
            build's workers read its records by range instead.
        tokenizer: a loaded Hugging Face tokenizer (or a ``TextEncoder``).
        val_frac: probability that an example goes to val.
        seed: seeds the split draws.
        chat_format: ``auto`` (from the tokenizer's chat template), a
            preset name, or a :class:`ChatFormat`.
        token_dtype, name, config, streaming, source, tokenizer_name,
        tokenizer_sha256: as for :func:`build_pretrain_cache`.
        batch_examples, progress, engine, force: as ``batch_docs``,
            ``progress``, ``engine`` and ``force`` of :func:`build_pretrain_cache`.

    Raises:
        DatasetError: a malformed example (its position named), no usable
            example, a dtype that cannot hold the vocabulary, or an
            ``out_dir`` that is not dlm's (:func:`~.output.claim_out_dir`).
    """
    if not 0.0 <= val_frac < 1.0:
        raise DatasetError(f"val_frac must be in [0, 1), not {val_frac}")
    encoder = as_encoder(tokenizer, tokenizer_sha256)
    fmt = (
        chat_format
        if isinstance(chat_format, ChatFormat)
        else chat_format_for(encoder.tokenizer, chat_format)
    )
    chat = ChatEncoding.build(fmt, encoder)
    dtype_name = token_dtype or choose_token_dtype(encoder.vocab_size)
    check_dtype_fits(dtype_name, encoder.vocab_size, where=f"token dtype for {Path(out_dir)}")
    dtype = TOKEN_DTYPES[dtype_name]
    name = name or Path(out_dir).name
    claim_out_dir(out_dir, force=force)  # a folder that is not dlm's is refused before Ray is reached
    with engine_session(engine):  # connected before the output directory is touched
        out = prepare_out_dir(out_dir, force=force)
        names = {s: sft_names(s) for s in SPLITS}
        filled = dict.fromkeys(SPLITS, 0)
        counts = {"skipped_empty": 0, "skipped_no_assistant": 0}
        clock = Clock(name, progress)
        seen = 0
        driver: DriverBytes | None = None
        if engine is not None:
            located = examples if isinstance(examples, LocatedInput) else None
            entries, counts, offset_counts, filled, seen, driver = engine.build_sft(
                examples, out, chat, encoder, dtype_name, val_frac, seed, clock, name, located
            )
        else:
            files = {
                s: {role: StreamingFile(out / names[s][role]) for role in ("tokens", "loss_mask")}
                for s in SPLITS
            }
            offsets: dict[str, list[int]] = {s: [] for s in SPLITS}
            try:
                for batch in batched(examples, batch_examples):
                    to_val = draw_splits(seed, seen, len(batch), val_frac)
                    for index, encoded in enumerate(encode_examples(chat, encoder, batch, seen)):
                        if isinstance(encoded, str):
                            counts[encoded] += 1
                            continue
                        ids, mask = encoded
                        split = "val" if to_val[index] else "train"
                        offsets[split].append(filled[split])
                        filled[split] += len(ids)
                        files[split]["tokens"].write(ids.astype(dtype))
                        files[split]["loss_mask"].write(mask)
                    seen += len(batch)
                    clock.tick(seen, sum(filled.values()))
                check_some(sum(map(len, offsets.values())), name, seen)
                entries = [e for s in SPLITS for e in commit_split(out, s, files[s], offsets[s], filled[s])]
            except BaseException:
                for pair in files.values():
                    for handle in pair.values():
                        handle.abort()
                raise
            offset_counts = {s: len(offsets[s]) for s in SPLITS}
        clock.tick(seen, sum(filled.values()), final=True)
        totals = {
            "train_examples": offset_counts["train"],
            "val_examples": offset_counts["val"],
            "train_tokens": filled["train"],
            "val_tokens": filled["val"],
            **counts,
        }
        meta = {
            "format": FORMAT,
            "kind": "sft",
            "built": True,
            "dataset_name": name,
            "dataset_config": config,
            "source": source or {},
            "streaming": streaming,
            "seed": seed,
            "val_frac": val_frac,
            "split_rule": f"per example: val when its draw (draw_rule) is below {val_frac:.6g}, else train",
            "draw_rule": DRAW_RULE_TEXT,
            "token_dtype": dtype_name,
            "byte_order": "little",
            "tokenizer_name": tokenizer_name or encoder.name,
            "tokenizer_sha256": encoder.tokenizer_sha256,
            "vocab_size": encoder.vocab_size,
            "chat_format": dataclasses.asdict(fmt),
            "special_token_ids": {**encoder.special_token_ids(), **chat.special_token_ids()},
            "eot_id": chat.eot_id,
            "loss_mask": "uint8 per token: 1 on the content and closing EOT of assistant turns",
            "totals": totals,
            "files": [dataclasses.asdict(e) for e in entries],
            "dlmstore_version": __version__,
        }
        write_meta(out, meta)
        remove_build_dir(out)
        return BuildResult(
            path=str(out.resolve()),
            kind="sft",
            name=name,
            token_dtype=dtype_name,
            vocab_size=encoder.vocab_size,
            tokenizer_sha256=encoder.tokenizer_sha256,
            seed=seed,
            splits={s: split_totals(entries, s) for s in SPLITS},
            skipped=counts,
            seconds=clock.seconds,
            driver_bytes=driver,
        )


def encode_examples(
    chat: ChatEncoding, encoder: TextEncoder, examples: list[Any], first: int
) -> list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | str]:
    """``(ids, mask)`` of each example, or why it is skipped (a ``totals`` key).

    ``first`` is the position of ``examples[0]`` in the input, for error messages.
    """
    results: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | str] = []
    kept = []
    for index, example in enumerate(examples, start=first):
        messages = check_messages(example, index)
        if messages is None:
            empty = not example or (isinstance(example, dict) and not example.get("messages"))
            results.append("skipped_empty" if empty else "skipped_no_assistant")
        else:
            kept.append((len(results), messages, chat.turns(messages, index)))
            results.append("")
    encoded = iter(encoder.encode_contents([content for _, _, turns in kept for _, content in turns]))
    for slot, messages, turns in kept:
        results[slot] = chat.assemble(messages, turns, [next(encoded) for _ in turns])
    return results


def check_some(kept: int, name: str, seen: int) -> None:
    """The error for a build that found no usable example among ``seen``."""
    if not kept:
        raise DatasetError(
            f"no examples to build {name} from: "
            + ("the input yielded none" if seen == 0 else f"none of {seen} has an assistant turn"),
            hint="each example needs at least one assistant message; check the input path / source",
        )


def commit_split(
    out: Path, split: str, files: dict[str, StreamingFile], offsets: list[int], tokens: int
) -> list[FileEntry]:
    names = sft_names(split)
    examples = len(offsets)
    entries = []
    for role in ("tokens", "loss_mask"):
        handle = files[role]
        sha = handle.commit()
        entries.append(
            FileEntry(
                split=split,
                role=role,
                path=names[role],
                shard_index=0,
                token_offset=0,
                token_count=tokens,
                doc_count=examples,
                bytes=handle.bytes,
                sha256=sha,
            )
        )
    size, sha = write_npy(out / names["offsets"], np.asarray(offsets, dtype=OFFSET_DTYPE))
    entries.append(
        FileEntry(
            split=split,
            role="offsets",
            path=names["offsets"],
            shard_index=0,
            token_offset=0,
            token_count=0,
            doc_count=examples,
            bytes=size,
            sha256=sha,
        )
    )
    return entries

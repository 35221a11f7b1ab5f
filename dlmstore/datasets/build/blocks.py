"""Blocks: the unit of work of a parallel build, and the files workers write.

A parallel build (:mod:`.ray_build`) cuts the input into blocks of
consecutive documents. Phase 1 tokenizes each block on some worker and
writes its tokens to a *spill file* under ``<out>/.build/blocks/``; phase
2 (the driver) routes documents with the pure rules of :mod:`.routing` and
turns token counts into prefix sums, so every block knows where its
documents land; phase 3 writes each output file (a pretrain shard, an SFT
split) on some worker, at its final name, from the spill files it covers.
No step reads every token except SFT's phase 3 (one file per split).

A spill file is named by a hash of what it depends on (the block's texts,
the tokenizer, the dtype, the chat format), written atomically, and is an
uncompressed ``.npz``: loading it checks every member's CRC-32, so a file
that loads is complete and unaltered. A rerun after an interruption
loads the blocks it finds instead of tokenizing them again. The
``.build`` directory is deleted once ``meta.json`` is written.

Functions here use numpy and the tokenizer only; Ray calls them from
:mod:`.ray_build`.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from dlmstore.datasets.build.chat import ChatEncoding
from dlmstore.datasets.build.encoding import DataEncoder, TextEncoder
from dlmstore.datasets.build.output import BUILD_DIR
from dlmstore.datasets.build.writers import StreamingFile, npy_bytes
from dlmstore.datasets.formats import MASK_DTYPE, OFFSET_DTYPE, TOKEN_DTYPES, doc_index_name, shard_name
from dlmstore.datasets.meta import FileEntry
from dlmstore.objstore.uri import ObjectURI, is_object_uri
from dlmstore.store.atomic import write_bytes_atomic

SKIP_CODES = {"": 0, "skipped_empty": 1, "skipped_no_assistant": 2}
#: A spill object larger than this is not a spill this build wrote (a block is ~1 MiB of input).
MAX_SPILL_OBJECT = 1 << 32


def block_key(header: dict[str, Any], items: list[Any]) -> str:
    """The spill file name of a block: a hash of its settings and its documents."""
    digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    for item in items:
        data = (
            item.encode("utf-8")
            if isinstance(item, str)
            else json.dumps(item, sort_keys=True, default=repr).encode()
        )
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:32]


def spill_path(out: Path, key: str) -> Path:
    return out / BUILD_DIR / "blocks" / f"{key}.npz"


def spill_object(url: str, key: str) -> str:
    """The spill object of a block, for a build whose tasks upload their files under ``url``:
    ``<url>/.build/blocks/<key>.npz``, beside the marker of an unfinished upload."""
    return ObjectURI.parse(url).url(f"{BUILD_DIR}/blocks/{key}.npz")


def save_spill(path: Path | str, **arrays: np.ndarray[Any, Any]) -> None:
    """Write a spill file, or (``path`` an ``s3://`` URL) store it as that object, whole or not at all."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    if isinstance(path, str) and is_object_uri(path):
        from dlmstore.objstore.transfer import put_bytes

        put_bytes(*_object(path), buffer.getvalue())
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, buffer.getvalue())


def load_spill(path: Path | str) -> dict[str, np.ndarray[Any, Any]] | None:
    """A spill file's (or spill object's) arrays; ``None`` when it is missing, cut short or damaged.

    An object is read whole and loaded as a file is, every member's CRC-32
    checked, so a spill object that loads is complete and unaltered too.
    """
    source: Path | io.BytesIO
    if isinstance(path, str) and is_object_uri(path):
        from dlmstore.objstore.transfer import read_object

        data = read_object(*_object(path), limit=MAX_SPILL_OBJECT)
        if data is None:
            return None
        source = io.BytesIO(data)
    else:
        source = Path(path)
    try:
        with np.load(source, allow_pickle=False) as arrays:
            return {name: arrays[name] for name in arrays.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return None


def _object(url: str) -> tuple[ObjectURI, str]:
    """``s3://bucket/a/b/name`` as the prefix ``s3://bucket/a/b`` and the name ``name``."""
    prefix, _, name = url.rpartition("/")
    return ObjectURI.parse(prefix), name


def encode_pretrain_block(
    encoder: TextEncoder | DataEncoder, texts: list[str], path: Path | str, dtype_name: str
) -> np.ndarray[Any, Any]:
    """Tokenize a block into its spill file (unless a complete one exists); returns token counts."""
    done = load_spill(path)
    if done is not None:
        return done["lengths"]
    ids = encoder.encode_texts(texts)
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    tokens = np.fromiter(chain.from_iterable(ids), dtype=TOKEN_DTYPES[dtype_name], count=int(lengths.sum()))
    save_spill(path, lengths=lengths, tokens=tokens)
    return lengths


def encode_sft_block(
    chat: ChatEncoding,
    encoder: TextEncoder,
    examples: list[Any],
    first: int,
    path: Path | str,
    dtype_name: str,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Tokenize a block of conversations into its spill file; returns ``(lengths, skip codes)``."""
    from dlmstore.datasets.build.sft import encode_examples

    done = load_spill(path)
    if done is not None:
        return done["lengths"], done["skipped"]
    encoded = encode_examples(chat, encoder, examples, first)
    pairs = [e for e in encoded if not isinstance(e, str)]
    lengths = np.asarray([0 if isinstance(e, str) else len(e[0]) for e in encoded], dtype=np.int64)
    skipped = np.asarray([SKIP_CODES[e] if isinstance(e, str) else 0 for e in encoded], dtype=np.int8)
    dtype = TOKEN_DTYPES[dtype_name]
    tokens = np.concatenate([ids.astype(dtype) for ids, _ in pairs]) if pairs else np.zeros(0, dtype)
    mask = np.concatenate([m for _, m in pairs]) if pairs else np.zeros(0, MASK_DTYPE)
    save_spill(path, lengths=lengths, skipped=skipped, tokens=tokens, mask=mask.astype(MASK_DTYPE))
    return lengths, skipped


@dataclass(frozen=True)
class BlockShare:
    """The documents one block gives one split, and where they land in it.

    Attributes:
        path: the block's spill file (or object, an ``s3://`` URL).
        taken: ``np.packbits`` of which of its ``count`` documents the split takes.
        count: documents in the block.
        offset: position in the split's token stream of its first token.
        tokens: tokens it gives the split (EOS included for pretrain).
    """

    path: str
    taken: bytes
    count: int
    offset: int
    tokens: int

    def mask(self) -> np.ndarray[Any, Any]:
        bits = np.frombuffer(self.taken, dtype=np.uint8)
        return np.unpackbits(bits, count=self.count).astype(bool)


def share_of(path: Path | str, taken: np.ndarray[Any, Any], offset: int, tokens: int) -> BlockShare:
    return BlockShare(str(path), np.packbits(taken).tobytes(), len(taken), offset, tokens)


def _spill(share: BlockShare) -> dict[str, np.ndarray[Any, Any]]:
    data = load_spill(share.path)
    if data is None:
        raise FileNotFoundError(f"spill file {share.path} is missing or damaged")
    return data


def taken_documents(
    tokens: np.ndarray[Any, Any], lengths: np.ndarray[Any, Any], taken: np.ndarray[Any, Any], eos_id: int
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The taken documents back to back, each followed by EOS, and where each starts."""
    starts_in = np.cumsum(lengths) - lengths
    size = lengths[taken]
    source = starts_in[taken]
    out_len = size + 1
    out_starts = np.cumsum(out_len) - out_len
    total = int(out_len.sum())
    result = np.empty(total, dtype=tokens.dtype)
    eos_at = out_starts + size
    body = np.ones(total, dtype=bool)
    body[eos_at] = False
    gather = np.repeat(source - out_starts, out_len) + np.arange(total)
    result[body] = tokens[gather[body]]
    result[eos_at] = eos_id
    return result, out_starts


def write_pretrain_shard(
    out: Path, split: str, index: int, lo: int, hi: int, shares: list[BlockShare], eos_id: int
) -> list[FileEntry]:
    """Write shard ``index`` of ``split`` (tokens ``lo .. hi - 1`` of the split) and its index."""
    pieces = []
    starts = []
    for share in shares:
        data = _spill(share)
        docs, doc_starts = taken_documents(data["tokens"], data["lengths"], share.mask(), eos_id)
        a, b = max(lo, share.offset) - share.offset, min(hi, share.offset + share.tokens) - share.offset
        pieces.append(docs[a:b])
        inside = doc_starts[(doc_starts >= a) & (doc_starts < b)]
        starts.append(inside + (share.offset - lo))
    directory = out / split
    directory.mkdir(parents=True, exist_ok=True)
    with StreamingFile(directory / shard_name(index)) as shard:
        for piece in pieces:
            shard.write(piece)
        sha = shard.commit()
    where = np.concatenate(starts).astype(OFFSET_DTYPE) if starts else np.zeros(0, dtype=OFFSET_DTYPE)
    index_data = npy_bytes(where)
    write_bytes_atomic(directory / doc_index_name(index), index_data)
    return [
        FileEntry(
            split, "tokens", f"{split}/{shard_name(index)}", index, lo, hi - lo, len(where), shard.bytes, sha
        ),
        FileEntry(
            split,
            "doc_index",
            f"{split}/{doc_index_name(index)}",
            index,
            lo,
            0,
            len(where),
            len(index_data),
            "sha256:" + hashlib.sha256(index_data).hexdigest(),
        ),
    ]


def write_sft_split(out: Path, split: str, shares: list[BlockShare]) -> list[FileEntry]:
    """Write one SFT split's tokens, mask and offsets from the blocks' spill files."""
    from dlmstore.datasets.build.sft import commit_split
    from dlmstore.datasets.formats import sft_names

    names = sft_names(split)
    files = {role: StreamingFile(out / names[role]) for role in ("tokens", "loss_mask")}
    offsets: list[np.ndarray[Any, Any]] = []
    filled = 0
    try:
        for share in shares:
            data = _spill(share)
            lengths = data["lengths"][data["skipped"] == 0]
            taken = share.mask()[data["skipped"] == 0]
            per_token = np.repeat(taken, lengths)
            files["tokens"].write(data["tokens"][per_token])
            files["loss_mask"].write(data["mask"][per_token])
            size = lengths[taken]
            offsets.append(filled + np.cumsum(size) - size)
            filled += int(size.sum())
        where = np.concatenate(offsets).tolist() if offsets else []
        return commit_split(out, split, files, where, filled)
    except BaseException:
        for handle in files.values():
            handle.abort()
        raise

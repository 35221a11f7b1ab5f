"""``check_dataset``: the one checker behind ``dlm data validate`` and the tests.

It reads a dataset directory the way a reader would and reports every
problem it finds (rather than stopping at the first), then prints the
exact reader configuration to use. Checks, cheapest first:

* ``meta.json`` exists, parses, has every field, and its dtype can hold
  its vocabulary; the tokenizer matches the caller's, when given;
* every listed file exists with the recorded size, a whole number of
  tokens and the recorded token count; no unlisted shard lies beside them;
* pretrain: shards numbered 0..n-1 with consistent ``token_offset``;
  each document index is sorted int64 positions inside its shard, as many
  as ``doc_count``; split totals agree with ``meta.json``;
* SFT: offsets start at 0 and increase inside the tokens file; the mask
  has one 0/1 byte per token;
* ``deep`` (default): every sha256; every token id below the vocabulary
  size (and below ``vocab_size`` when the caller trains with one); the
  token before each document start is EOS; every SFT example trains at
  least one token.

The deep checks read every byte once: one pass per file, in 1 MiB chunks
read into a buffer (no mapping, so resident memory stays flat), each chunk
hashed and, for a tokens or mask file, reduced to its largest value while
it is in the CPU cache (ids below the vocabulary, mask bytes 0 or 1). The
files are read by a pool of threads, one file at a time each: hashlib and
numpy's reductions release the GIL, so the pass runs at the speed of the
disk or of sha256 on every core. ``dlm train`` runs this check on each
dataset before the model loads (:mod:`dlmstore.train.data.inputs`);
``bench/bench_dataset_checks.py`` measures it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dlmstore.datasets.formats import (
    MASK_DTYPE,
    OFFSET_DTYPE,
    SPLITS,
    TokenFile,
    sft_names,
    token_dtype,
)
from dlmstore.datasets.meta import META_NAME, DatasetMeta, FileEntry, check_tokenizer, load_meta
from dlmstore.errors import DatasetError
from dlmstore.objstore.uri import is_object_uri
from dlmstore.plural import plural
from dlmstore.progress import Task
from dlmstore.store.regular_files import file_kind, open_regular

#: Bytes read, hashed and reduced at a time: small enough to stay in the CPU cache between the two.
CHUNK = 1 << 20


@dataclass(frozen=True)
class ReaderConfig:
    """How to train on the dataset: with ``dlm train``, another trainer's flags, or Python.

    Attributes:
        train: The ``dlm train`` command that mixes it into a document's training.
        flags: Command-line flags that point another trainer (KempnerForge-style) at the dataset.
        python: A Python snippet that opens it.
    """

    train: str
    flags: str
    python: str


@dataclass(frozen=True)
class ValidationReport:
    """What ``dlm data validate --json`` prints; ``ok`` is false when ``problems`` is not empty.

    Attributes:
        path: The dataset folder.
        ok: True when no problem was found.
        problems: Each problem, one line each.
        kind: ``pretrain`` or ``sft``; null when meta.json cannot be read.
        name: The dataset's name; null when meta.json cannot be read.
        token_dtype: ``uint16`` or ``uint32``; null when meta.json cannot be read.
        vocab_size: Vocabulary size of its tokenizer; null when unknown.
        tokenizer_sha256: Fingerprint of the tokenizer that built it; null when unknown.
        totals: Counts per split as checked (``train_tokens``, ``val_tokens``, ...).
        files_checked: Files checked.
        deep: Whether every sha256 and token id was checked (not ``--quick``).
        reader: How to read the dataset; null when it has problems.
        notes: What passes but is worth knowing, one line each (an empty val split: nothing to
            measure a val loss on).
    """

    path: str
    ok: bool
    problems: list[str]
    kind: str | None
    name: str | None
    token_dtype: str | None
    vocab_size: int | None
    tokenizer_sha256: str | None
    totals: dict[str, int]
    files_checked: int
    deep: bool
    reader: ReaderConfig | None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FileDigest:
    """What one pass over a file found: its sha256 and, for a tokens or mask file, its largest value."""

    sha256: str
    top: int | None  # None: not a tokens/mask file, or an empty one


def check_dataset(
    path: str | os.PathLike[str],
    *,
    tokenizer_sha256: str | None = None,
    deep: bool = True,
    vocab_size: int | None = None,
) -> ValidationReport:
    """Check the dataset in ``path``; never raises for a problem of the dataset itself.

    Args:
        path: the dataset folder (the one holding meta.json), or ``s3://bucket/prefix``: this
            node's copy of it (downloaded through the node cache, every file verified as it
            arrives) is checked, and the report names the URL.
        tokenizer_sha256: the tokenizer in use; another one is a problem.
        deep: also read every byte (sha256, token ids, EOS, mask); ``False`` is ``--quick``.
        vocab_size: the vocabulary of the tokenizer in use, when smaller than
            the recorded one: ids must be below both.
    """
    if isinstance(path, str) and is_object_uri(path):
        return _check_remote(path, tokenizer_sha256=tokenizer_sha256, deep=deep, vocab_size=vocab_size)
    root = Path(path).resolve()
    problems: list[str] = []
    try:
        meta = load_meta(root)
    except DatasetError as exc:
        return _report(root, [exc.message], None, 0, deep)
    if not meta.built:
        return _report(root, [f"{root / META_NAME} marks {meta.name} as not built"], meta, 0, deep)
    try:
        check_tokenizer(meta, tokenizer_sha256)
    except DatasetError as exc:
        problems.append(exc.message)
    files: dict[str, TokenFile] = {}
    for entry in meta.files:
        token_file = _open_entry(root, meta, entry, problems)
        if token_file is not None:
            files[entry.path] = token_file
    tops: dict[str, int | None] = {}
    if deep:
        listed = [entry for entry in meta.files if entry.path in files]
        digests = digest_files(
            [(files[e.path], e.role in ("tokens", "loss_mask")) for e in listed],
            task=f"verifying {root.name}",
        )
        for entry, digest in zip(listed, digests, strict=True):
            path = files[entry.path].path
            if isinstance(digest, OSError):
                problems.append(f"cannot read {path}: {digest.strerror}")
                del files[entry.path]
            else:
                if digest.sha256 != entry.sha256:
                    problems.append(f"{path}: sha256 differs from {META_NAME} (the file changed)")
                tops[entry.path] = digest.top
    _check_strays(root, meta, problems)
    limit = meta.vocab_size if vocab_size is None else min(vocab_size, meta.vocab_size)
    if meta.kind == "pretrain":
        _check_pretrain(root, meta, files, problems, tops if deep else None, limit)
    else:
        _check_sft(root, meta, files, problems, tops if deep else None, limit)
    return _report(root, problems, meta, len(files), deep)


def digest_files(
    files: Sequence[tuple[TokenFile, bool]], *, task: str, threads: int | None = None
) -> list[FileDigest | OSError]:
    """One pass over each file, several files at once: ``(file, find its largest value)`` -> digest.

    A file that cannot be read (gone, no permission, swapped for a FIFO
    since it was checked) gives its ``OSError`` instead of a digest. The
    files done are reported as progress ``task``; ``threads`` defaults to
    one per core this process may run on.
    """
    if not files:
        return []
    if threads is None:
        try:
            threads = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not Linux
            threads = os.cpu_count() or 1
    digests: list[FileDigest | OSError] = []
    with (
        Task(task, total=len(files), unit="files") as progress,
        ThreadPoolExecutor(min(threads, len(files)), thread_name_prefix="dlm-verify") as pool,
    ):
        for digest in pool.map(lambda job: _digest(*job), files):
            digests.append(digest)
            progress.advance()
    return digests


def _digest(token_file: TokenFile, find_top: bool) -> FileDigest | OSError:
    """sha256 of the whole file and, with ``find_top``, the largest element after its header."""
    digest = hashlib.sha256()
    top: int | None = None
    skip = token_file.offset  # a .npy header is hashed, not reduced
    itemsize = token_file.dtype.itemsize
    buffer = memoryview(bytearray(CHUNK))
    try:
        fd, _ = open_regular(token_file.path)  # non-blocking, fstat-checked: a swapped-in FIFO never hangs
        with open(fd, "rb", buffering=0) as handle:
            while filled := _fill(handle, buffer):
                chunk = buffer[:filled]
                digest.update(chunk)
                if find_top:
                    body = chunk[min(skip, filled) :]
                    skip = max(skip - filled, 0)
                    body = body[: len(body) - len(body) % itemsize]
                    if len(body):
                        value = int(np.frombuffer(body, dtype=token_file.dtype).max())
                        top = value if top is None else max(top, value)
    except OSError as exc:
        return exc
    return FileDigest(sha256="sha256:" + digest.hexdigest(), top=top)


def _fill(handle: Any, buffer: memoryview) -> int:
    """Read into ``buffer`` until it is full or the file ends (so chunks hold whole items)."""
    filled = 0
    while filled < len(buffer):
        count = handle.readinto(buffer[filled:])
        if not count:
            break
        filled += count
    return filled


def _check_remote(
    url: str, *, tokenizer_sha256: str | None, deep: bool, vocab_size: int | None
) -> ValidationReport:
    """:func:`check_dataset` of this node's copy of the dataset at ``url``, reported under the URL.

    The copy comes through the node cache
    (:func:`dlmstore.objstore.node_cache.local_copy`), which verifies every
    file against meta.json as it arrives: a damaged or swapped object is
    refused there, by its URL, as an :class:`~dlmstore.errors.ObjectStoreError`.
    """
    import dataclasses

    from dlmstore.objstore.node_cache import local_copy
    from dlmstore.objstore.uri import ObjectURI

    uri = ObjectURI.parse(url)
    copy = local_copy(uri)
    report = check_dataset(copy.path, tokenizer_sha256=tokenizer_sha256, deep=deep, vocab_size=vocab_size)
    local, remote = str(copy.path), str(uri)
    reader = report.reader
    if reader is not None:  # dlm train reads the URL; other trainers map this node's copy
        reader = dataclasses.replace(reader, train=reader.train.replace(local, remote))
    return dataclasses.replace(
        report,
        path=remote,
        problems=[problem.replace(local, remote) for problem in report.problems],
        reader=reader,
    )


def _report(
    root: Path, problems: list[str], meta: DatasetMeta | None, checked: int, deep: bool
) -> ValidationReport:
    built = meta if meta is not None and meta.built else None
    return ValidationReport(
        path=str(root),
        ok=not problems,
        problems=problems,
        kind=meta.kind if meta else None,
        name=meta.name if meta else None,
        token_dtype=built.token_dtype if built else None,
        vocab_size=built.vocab_size if built else None,
        tokenizer_sha256=built.tokenizer_sha256 if built else None,
        totals=dict(meta.raw.get("totals") or {}) if meta else {},
        files_checked=checked,
        deep=deep,
        reader=reader_config(root, built) if built and not problems else None,
        notes=_notes(meta) if meta else [],
    )


def _notes(meta: DatasetMeta) -> list[str]:
    """An empty val split passes (a dataset may be all train), but is said."""
    totals = meta.raw.get("totals") or {}
    unit = "tokens" if meta.kind == "pretrain" else "examples"
    if totals.get(f"val_{unit}", 0) == 0 and f"val_{unit}" in totals:
        return [
            f"the val split is empty (0 {unit}): nothing to measure a val loss on; rebuild with a larger "
            "--val-frac to hold some out"
        ]
    return []


def _open_entry(root: Path, meta: DatasetMeta, entry: FileEntry, problems: list[str]) -> TokenFile | None:
    path = root / entry.path
    dtype: Any = {"tokens": token_dtype(meta.token_dtype), "loss_mask": MASK_DTYPE}.get(entry.role)
    expected = entry.token_count if entry.role in ("tokens", "loss_mask") else None
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO would hang the reads below
            problems.append(f"{path} is {file_kind(st.st_mode)}, not a regular file")
            return None
        size = st.st_size
        token_file = TokenFile(path, dtype, expected_count=expected)
    except FileNotFoundError:
        problems.append(f"{path} is listed in {META_NAME} but missing")
        return None
    except DatasetError as exc:
        problems.append(exc.message)
        return None
    if size != entry.bytes:
        problems.append(f"{path} has {size} bytes but {META_NAME} records {entry.bytes}")
        return None
    return token_file


def _check_strays(root: Path, meta: DatasetMeta, problems: list[str]) -> None:
    listed = {(root / f.path).resolve() for f in meta.files}
    candidates: list[Path] = []
    for split in SPLITS:
        candidates.extend((root / split).glob("shard_*"))
        candidates.extend(root.glob(f"{split}_*"))
    for path in sorted(candidates):
        if not path.is_dir() and path.resolve() not in listed:  # a stray FIFO too: readers refuse it
            problems.append(f"{path} is not listed in {META_NAME} (left over from another build?)")


def _check_pretrain(
    root: Path,
    meta: DatasetMeta,
    files: dict[str, TokenFile],
    problems: list[str],
    tops: dict[str, int | None] | None,
    limit: int,
) -> None:
    eos = meta.raw.get("eos_token_id")
    for split in SPLITS:
        shards = meta.files_of(split, "tokens")
        indexes = {f.shard_index: f for f in meta.files_of(split, "doc_index")}
        offset = tokens = docs = 0
        previous_last: int | None = None
        for position, entry in enumerate(shards):
            where = root / entry.path
            if entry.shard_index != position or entry.token_offset != offset:
                problems.append(
                    f"{where}: shard index/offset {entry.shard_index}/{entry.token_offset}, "
                    f"expected {position}/{offset}"
                )
            offset += entry.token_count
            tokens += entry.token_count
            docs += entry.doc_count
            shard = files.get(entry.path)
            index_entry = indexes.get(entry.shard_index)
            if index_entry is None:
                problems.append(f"{where} has no document index in {META_NAME}")
                continue
            index = files.get(index_entry.path)
            if shard is None or index is None:
                continue
            starts = index.array
            if index.dtype != OFFSET_DTYPE or len(starts) != entry.doc_count:
                problems.append(
                    f"{index.path}: expected {entry.doc_count} int64 document starts, "
                    f"found {len(starts)} {index.dtype}"
                )
                continue
            if len(starts) and (np.any(np.diff(starts) <= 0) or starts[0] < 0 or starts[-1] >= len(shard)):
                problems.append(
                    f"{index.path}: document starts are not increasing positions inside the shard"
                )
                continue
            if tops is not None:
                _check_top(shard, tops.get(entry.path), limit, problems)
                before = np.asarray(starts[starts > 0]) - 1
                ends_ok = bool(np.all(shard.array[before] == eos)) if len(before) else True
                if len(starts) and starts[0] == 0 and previous_last is not None:
                    ends_ok = ends_ok and previous_last == eos
                if not ends_ok:
                    problems.append(f"{shard.path}: a document start does not follow an EOS ({eos})")
                previous_last = int(shard.array[-1]) if len(shard) else previous_last
                shard.release()
        totals = meta.raw.get("totals", {})
        if totals.get(f"{split}_tokens") != tokens or totals.get(f"{split}_docs") != docs:
            problems.append(
                f"{root / META_NAME}: {split} totals {totals.get(f'{split}_tokens')} tokens / "
                f"{totals.get(f'{split}_docs')} docs, but its shards hold {tokens} / {docs}"
            )


def _check_sft(
    root: Path,
    meta: DatasetMeta,
    files: dict[str, TokenFile],
    problems: list[str],
    tops: dict[str, int | None] | None,
    limit: int,
) -> None:
    for split in SPLITS:
        names = sft_names(split)
        tokens, offsets, mask = (files.get(names[role]) for role in ("tokens", "offsets", "loss_mask"))
        for role, found in (("tokens", tokens), ("offsets", offsets), ("loss_mask", mask)):
            if found is None and not any(f.path == names[role] for f in meta.files):
                problems.append(f"{root / names[role]} is not listed in {META_NAME}")
        if tokens is None or offsets is None or mask is None:
            continue
        starts = offsets.array
        if offsets.dtype != OFFSET_DTYPE:
            problems.append(f"{offsets.path} holds {offsets.dtype}, not int64 offsets")
            continue
        if len(starts) and (starts[0] != 0 or np.any(np.diff(starts) <= 0) or starts[-1] >= len(tokens)):
            problems.append(f"{offsets.path}: offsets do not increase from 0 inside {len(tokens)} tokens")
            continue
        if len(starts) == 0 and len(tokens):
            problems.append(f"{offsets.path} lists no example but {tokens.path.name} holds tokens")
        if meta.raw.get("totals", {}).get(f"{split}_examples") != len(starts):
            problems.append(
                f"{root / META_NAME}: {split}_examples disagrees with {offsets.path.name} "
                f"({len(starts)} offsets)"
            )
        if tops is not None and len(tokens):
            _check_top(tokens, tops.get(names["tokens"]), limit, problems)
            if (tops.get(names["loss_mask"]) or 0) > 1:
                problems.append(f"{mask.path} holds values other than 0 and 1")
            elif len(starts):
                trained = np.maximum.reduceat(mask.array, starts)  # per example: any token trained
                if np.any(trained == 0):
                    problems.append(
                        f"{mask.path}: no token trained in {plural(int(np.sum(trained == 0)), 'example')}"
                    )
                mask.release()


def _check_top(token_file: TokenFile, top: int | None, limit: int, problems: list[str]) -> None:
    """A token file's largest id (from its digest) must be below the vocabulary."""
    if top is not None and top >= limit:
        problems.append(f"{token_file.path}: token id {top} is not below the vocabulary size {limit}")


def reader_config(root: Path, meta: DatasetMeta) -> ReaderConfig:
    """The flags and the Python snippet that read this dataset correctly."""
    raw = meta.raw
    common = (
        f"--data.token_dtype={meta.token_dtype} --data.vocab_size={meta.vocab_size} "
        f"--data.tokenizer_sha256={meta.tokenizer_sha256}"
    )
    if meta.kind == "pretrain":
        train = root / "train"
        flags = (
            f"--data.dataset_path={train} --data.file_pattern='shard_*.bin' "
            f"--data.eos_token_id={raw['eos_token_id']} {common}"
        )
        python = (
            "from dlmstore.datasets import MemoryMappedDataset, PretrainTokenStreamDataset\n"
            f"train = PretrainTokenStreamDataset({str(train)!r}, T=T, device=device,\n"
            f"    tokenizer_sha256={meta.tokenizer_sha256!r})  # x, y = train.get_batch(B=B, generator=g)\n"
            f"windows = MemoryMappedDataset({str(train)!r}, seq_len=T + 1, file_pattern='shard_*.bin',\n"
            "    pack_sequences=True)  # dtype and document boundaries come from meta.json\n"
        )
    else:
        names = sft_names("train")
        flags = (
            f"--data.tokens_path={root / names['tokens']} --data.idx_path={root / names['offsets']} "
            f"--data.mask_path={root / names['loss_mask']} --data.eot_id={raw['eot_id']} {common}"
        )
        python = (
            "from dlmstore.datasets import SFTExampleDataset\n"
            f"train = SFTExampleDataset({str(root / names['tokens'])!r}, {str(root / names['offsets'])!r},\n"
            f"    T=T, device=device, eot_id={raw['eot_id']}, tokenizer_sha256={meta.tokenizer_sha256!r})\n"
            "# x, y, y_masked = train.get_batch(B=B, generator=g)\n"
        )
    command = f"dlm train DOC --dataset {root}   # or training.datasets: [{{path: {root}}}] in DOC"
    return ReaderConfig(train=command, flags=flags, python=python)

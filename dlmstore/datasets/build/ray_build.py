"""Building a dataset on Ray: the same bytes as the local engine, from many workers.

**The driver plans and commits; the workers read.** Given a local input
(:class:`~.local.LocatedInput`: ``dlm data build --from PATH``), the driver
cuts it into pieces from each file's size alone (:meth:`~.local.LocatedInput.pieces`)
and never reads a byte of it:

1. *count*: a task per piece counts its documents (JSONL lines, a Parquet
   footer's row groups; text files are one document each, counted by no
   one); the driver takes prefix sums, so every range knows the position
   of its first document in the input (:func:`~.local.ranges_of`);
2. *tokenize*: a task per range reads it where it lives (a path every
   node mounts, or an ``s3://`` object by ranged GETs with this task's own
   client), tokenizes it into a spill file (:mod:`.blocks`) and
   returns its documents' token counts, at most two ranges per worker in
   flight;
3. *route*: the driver takes those counts *in range order* and routes
   every document with :mod:`.routing`, exactly as the local engine does,
   which is why the output does not depend on which worker finished first
   or how many there were; prefix sums of the routed counts give each
   range its offset in its split;
4. *write*: a task per pretrain shard (or SFT split file) writes it at its
   final name from the spill files it covers and returns its size and
   sha256; the driver then writes ``meta.json`` and the recipe registers
   the dataset in one transaction. No task opens ``store.db``.

What crosses the driver is each range's descriptor (a file name, a byte
range, four integers), 1 to 4 bytes of token count per document back, the
written files' entries and the tokenizer once, compressed:
:class:`~.output.Traffic` counts it and the result reports it
(:class:`~.output.DriverBytes`).

An input that only exists as a stream (a hub dataset, a shuffle buffer, a
source's own train and validation splits, a transform that reads across
documents) is read by the driver in order and cut into blocks of
``block_docs`` documents whose text travels to the workers through Ray's
object store; everything from step 2 on is the same.

Ray retries a task whose worker died (``max_retries``); spill files and
shards are written atomically under names that do not depend on the
attempt, so a retry rewrites the same bytes. A build that fails leaves
its finished spill files: rerunning the command loads them instead of
tokenizing again. A spill file is named by what it depends on: a range's
descriptor and its file's size and modification time (or a block's
text), the tokenizer, the dtype, the text field or chat format.

:class:`RayEngine` is the :class:`~.engines.Engine` a builder receives to
run here. The builders never import this module; it imports what it needs
of them one way (:mod:`.sft`'s ``check_some``, :mod:`.pretrain`'s spec
type). Ray is imported in :mod:`.ray_local` and here, inside functions;
without it, :func:`~.ray_local.ray_session` says how to install it.
"""

from __future__ import annotations

import math
import os
import pickle
import zlib
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dlmstore.datasets.build.blocks import (
    SKIP_CODES,
    BlockShare,
    block_key,
    encode_pretrain_block,
    encode_sft_block,
    load_spill,
    share_of,
    spill_object,
    spill_path,
    write_pretrain_shard,
    write_sft_split,
)
from dlmstore.datasets.build.chat import ChatEncoding
from dlmstore.datasets.build.encoding import TextEncoder
from dlmstore.datasets.build.engines import DEFAULT_BLOCK_DOCS
from dlmstore.datasets.build.local import (
    DEFAULT_RANGE_BYTES,
    LocatedInput,
    Range,
    count_piece,
    range_records,
    range_texts,
    ranges_of,
)
from dlmstore.datasets.build.output import Clock, DriverBytes, Traffic, batched
from dlmstore.datasets.build.ray_local import import_ray, ray_session
from dlmstore.datasets.build.routing import PretrainRouter, draw_splits
from dlmstore.datasets.formats import SPLITS
from dlmstore.datasets.meta import META_NAME, FileEntry
from dlmstore.errors import DatasetError, DlmError

if TYPE_CHECKING:
    from dlmstore.datasets.build.pretrain import PretrainSpec

__all__ = ["RayEngine", "import_ray", "ray_session"]

MAX_RETRIES = 3
_cache: dict[str, Any] = {}  # per worker process: the tokenizer, deserialised once


@dataclass(frozen=True)
class RayEngine:
    """Build on Ray: an :class:`~.engines.Engine` run by this module's functions.

    Args:
        address: the cluster (``host:port`` of its head, ``ray://...`` or
            ``auto``); ``None``: the ``RAY_ADDRESS`` environment variable,
            else a local Ray started for the build and stopped after.
        workers: the CPUs of the local Ray started for the build, so
            at most that many tasks run at once; on a Ray already
            running (a cluster), the build keeps ``2 * workers`` tasks in
            flight and Ray runs as many as it has CPUs for (default: the
            CPUs of the cluster).
        block_docs: documents per tokenizing task when the driver reads
            the input, and Parquet rows per task (whole row groups) when
            the workers do; the output does not depend on it.
        range_bytes: bytes of input per task when the workers read it
            (a JSONL byte range, a run of text files); the output does not
            depend on it.
        upload_to: ``s3://bucket/prefix`` when the tasks store what they
            write there themselves (``dlm data build --engine ray --out
            s3://...``): spill files as objects under ``.build/blocks/``,
            shards and split files at their final keys (see :func:`_write_uploaded`);
            the folder the builder passes then receives nothing from them.
    """

    address: str | None = None
    workers: int | None = None
    block_docs: int = DEFAULT_BLOCK_DOCS
    range_bytes: int = DEFAULT_RANGE_BYTES
    upload_to: str | None = None

    def resolved_address(self) -> str | None:
        return self.address or os.environ.get("RAY_ADDRESS") or None

    def session(self) -> AbstractContextManager[tuple[Any, int]]:
        """:func:`~.ray_local.ray_session`: Ray connected (or started) for the builds inside."""
        return ray_session(self.resolved_address(), self.workers)

    def build_pretrain(
        self,
        spec: PretrainSpec,
        labelled: Iterator[tuple[str, str | None]],
        stop: dict[str, bool],
        out: Path,
        clock: Clock,
        located: LocatedInput | None = None,
    ) -> tuple[list[FileEntry], PretrainRouter, DriverBytes]:
        """:func:`build_pretrain_on_ray` on this engine."""
        return build_pretrain_on_ray(spec, labelled, stop, out, clock, self, located)

    def build_sft(
        self,
        examples: Iterable[Any],
        out: Path,
        chat: ChatEncoding,
        encoder: TextEncoder,
        dtype_name: str,
        val_frac: float,
        seed: int,
        clock: Clock,
        name: str,
        located: LocatedInput | None = None,
    ) -> tuple[list[FileEntry], dict[str, int], dict[str, int], dict[str, int], int, DriverBytes]:
        """:func:`build_sft_on_ray` on this engine."""
        return build_sft_on_ray(
            examples, out, chat, encoder, dtype_name, val_frac, seed, clock, self, name, located
        )


def _encoder(holder: list[Any]) -> Any:
    """The build's tokenizer, fetched from the object store (compressed) once per worker process and build.

    It travels inside a list so Ray passes the reference instead of
    deserialising the tokenizer for every task; the cache keeps the last
    build's only (workers outlive builds).

    Ray runs one task per CPU, so each task tokenizes on one thread. The
    Rust tokenizer's batch call runs on its thread pool (rayon), sized
    once per process from ``RAYON_NUM_THREADS``: a pool of one thread, set
    up before the worker's first batch, tokenized 4-19% more tokens per
    CPU-second than ``TOKENIZERS_PARALLELISM=false``'s loop on the calling
    thread, in four paired runs on a 2-core machine. Ray starts a job's
    own worker processes, so the first batch in a worker is this build's.
    Both are set here, in the worker, rather than with a Ray
    ``runtime_env``, for which Ray starts fresh workers (~3 s a build).
    """
    key = holder[0].hex()
    if key not in _cache:
        import ray

        os.environ["RAYON_NUM_THREADS"] = "1"
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        _cache.clear()
        _cache[key] = pickle.loads(zlib.decompress(ray.get(holder[0])))
    return _cache[key]


def _put_tokenizer(ray: Any, encoder: Any, traffic: Traffic) -> Any:
    """The tokenizer into Ray's object store, compressed: a third of its size through the driver.

    SmolLM2's is 1.56 MB pickled (its vocabulary and merges as JSON text)
    and 0.57 MB after zlib (0.1 s here, 5 ms to inflate in each worker).
    Pickled by Ray's cloudpickle, so an encoder class Ray pickles by value
    travels too.
    """
    return traffic.put(ray, zlib.compress(ray.cloudpickle.dumps(encoder, protocol=5)), tokenizer=True)


def _encode_pretrain_task(holder: list[Any], texts: list[str], path: str, dtype_name: str) -> Any:
    return _counts(encode_pretrain_block(_encoder(holder), texts, path, dtype_name))


def _encode_range_task(holder: list[Any], part: Range, text_field: str, path: str, dtype_name: str) -> Any:
    """Tokenize a range of the input this task reads itself (unless its spill file is complete)."""
    done = load_spill(path)
    if done is not None:
        return _counts(done["lengths"])
    texts = range_texts(part, text_field)
    return _counts(encode_pretrain_block(_encoder(holder), texts, path, dtype_name))


def _encode_sft_task(
    holder: list[Any],
    chat: ChatEncoding,
    examples: list[Any],
    first: int,
    path: str,
    dtype_name: str,
) -> Any:
    lengths, skipped = encode_sft_block(chat, _encoder(holder), examples, first, path, dtype_name)
    return _counts(lengths), skipped


def _encode_sft_range_task(
    holder: list[Any], chat: ChatEncoding, part: Range, path: str, dtype_name: str
) -> Any:
    """Tokenize the conversations of a range this task reads itself (dolly-style records converted)."""
    done = load_spill(path)
    if done is not None:
        return _counts(done["lengths"]), done["skipped"]
    from dlmstore.datasets.build.catalog import dolly_messages

    examples = [dolly_messages(record) for record in range_records(part)]
    return _encode_sft_task(holder, chat, examples, part.position, path, dtype_name)


def _counts(lengths: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Token counts as they travel back to the driver, in the smallest unsigned type that holds
    the range's: 1, 2 or 4 bytes a document (2 for documents under 65 536 tokens)."""
    lengths = np.asarray(lengths)
    top = int(lengths.max()) if len(lengths) else 0
    return lengths.astype(np.uint8 if top < 1 << 8 else np.uint16 if top < 1 << 16 else np.uint32)


def _spills(out: Path, engine: RayEngine) -> Callable[[str], str]:
    """Where the spill file of a block keyed ``key`` goes: under ``out``, or an object under ``upload_to``."""
    if engine.upload_to is None:
        return lambda key: str(spill_path(out, key))
    url = engine.upload_to
    return lambda key: spill_object(url, key)


def _write_uploaded(url: str, write: Callable[..., list[FileEntry]], *args: Any) -> list[FileEntry]:
    """Run ``write`` (a shard's or an SFT split's) into a folder of this worker, then upload what it wrote.

    Each file goes whole to its final key under ``url``
    (:func:`~dlmstore.objstore.transfer.put_files`: one PUT, or a
    multipart upload above its threshold), its size and sha256 checked
    against the entry ``write`` returned as it is read, so the object is the
    bytes the entry records or is not there. The folder is removed either way.
    """
    import tempfile

    from dlmstore.objstore.transfer import LocalFile, put_files
    from dlmstore.objstore.uri import ObjectURI

    with tempfile.TemporaryDirectory(prefix="dlm-shard-") as folder:
        entries = write(Path(folder), *args)
        files = [LocalFile(e.path, Path(folder) / e.path, e.bytes, e.sha256) for e in entries]
        put_files(ObjectURI.parse(url), files)
    return entries


def _writing(ray: Any, write: Callable[..., list[FileEntry]], out: Path, engine: RayEngine) -> Any:
    """Submit ``write(out, *args)`` as a task; with ``upload_to``, its worker uploads the files instead."""
    if engine.upload_to is None:
        task = ray.remote(write).options(num_cpus=1, max_retries=MAX_RETRIES)
        return lambda *args: task.remote(out, *args)
    from dlmstore.objstore.transfer import abort_incomplete, delete_names
    from dlmstore.objstore.uri import ObjectURI

    # Before a shard is replaced: an earlier meta.json goes (no reader takes it over new
    # shards) and a killed build's multipart uploads are aborted; the driver stores the
    # new meta.json last (dlmstore.datasets.publish.commit_uploaded).
    url = engine.upload_to
    delete_names(ObjectURI.parse(url), [META_NAME])
    abort_incomplete(ObjectURI.parse(url))
    uploading = ray.remote(_write_uploaded).options(num_cpus=1, max_retries=MAX_RETRIES)
    return lambda *args: uploading.remote(url, write, *args)


def _in_order(
    ray: Any,
    submissions: Iterator[tuple[Any, Any]],
    window: int,
    clock: Clock,
    seen: Callable[[], tuple[int, int]],
) -> Iterator[tuple[Any, Any]]:
    """``(info, result)`` of submitted tasks in submission order, ``window`` at most in flight.

    Pulls a new submission whenever one is taken, so a consumer that stops
    iterating stops reading the input. Task failures become :class:`DatasetError`.
    """
    pending: deque[tuple[Any, Any]] = deque()
    try:
        while True:
            while len(pending) < window:
                item = next(submissions, None)
                if item is None:
                    break
                pending.append(item)
            if not pending:
                return
            info, ref = pending[0]
            while True:
                ready, _ = ray.wait([ref], timeout=1.0)
                if ready:
                    break
                clock.tick(*seen())
            pending.popleft()
            yield info, _get(ray, ref)
    finally:
        # Tasks no longer wanted (a budget was met, the build failed or was
        # stopped) are waited for, so none is still writing a spill file when
        # the build directory is removed, and a stopped build keeps their blocks
        # for its rerun. Each is one block. They are not cancelled: ray.cancel
        # racing a task's own completion aborts the driver in Ray's core
        # ("Check failed: it != submissible_tasks_.end()", exit status 1 and a
        # stack dump instead of the one line of a Ctrl-C; ray-project/ray#54846).
        refs = [ref for _, ref in pending]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=300)


def _get(ray: Any, ref: Any) -> Any:
    """``ray.get``, with a task's own :class:`DlmError` re-raised as itself."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, DlmError):
            raise cause from None
        raise DatasetError(
            f"a Ray task of the build failed: {cause or exc}",
            hint="rerun the command: blocks already tokenized are kept and not redone",
        ) from None
    except ray.exceptions.RayError as exc:
        raise DatasetError(
            f"the Ray build failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            hint="rerun the command: blocks already tokenized are kept and not redone",
        ) from None


def _blocks(
    labelled: Iterable[tuple[Any, str | None]], block_docs: int
) -> Iterator[tuple[str | None, list[Any]]]:
    """Runs of at most ``block_docs`` consecutive documents with the same label."""
    label: str | None = None
    block: list[Any] = []
    for item, split in labelled:
        if block and (split != label or len(block) == block_docs):
            yield label, block
            block = []
        label = split
        block.append(item)
    if block:
        yield label, block


def _write_all(ray: Any, tasks: list[Any], traffic: Traffic) -> list[FileEntry]:
    return [entry for ref in tasks for entry in traffic.got(_get(ray, ref))]


def _counted(
    ray: Any, located: LocatedInput, engine: RayEngine, workers: int, clock: Clock, traffic: Traffic
) -> list[Range]:
    """Round 1: the input cut into pieces (a ``stat`` per file), their documents counted by tasks, in order.

    Text files are one document each and counted by no one; a JSONL range
    is read by a task that counts its lines; a Parquet file's footer is
    read for its row groups.
    """
    pieces = located.pieces(engine.range_bytes)
    traffic.input = sum({f.path: f.size for p in pieces for f in p.files}.values())
    count = ray.remote(count_piece).options(num_cpus=1, max_retries=MAX_RETRIES)
    counts = [[len(p.files)] if p.kind == "text" else [] for p in pieces]

    def submissions() -> Iterator[tuple[int, Any]]:
        for index, piece in enumerate(pieces):
            if piece.kind != "text":
                traffic.send(piece)
                yield index, count.remote(piece)

    for index, found in _in_order(ray, submissions(), 4 * workers, clock, lambda: (0, 0)):
        counts[index] = traffic.got(found)
    return ranges_of(pieces, counts, engine.block_docs)


def build_pretrain_on_ray(
    spec: PretrainSpec,
    labelled: Iterator[tuple[str, str | None]],
    stop: dict[str, bool],
    out: Path,
    clock: Clock,
    engine: RayEngine,
    located: LocatedInput | None = None,
) -> tuple[list[FileEntry], PretrainRouter, DriverBytes]:
    """Tokenize and write a pretrain dataset with Ray tasks; returns its files, routing and driver traffic.

    ``located``: the workers read the input by range (``labelled`` is then
    never read); ``None``: the driver reads ``labelled`` in order.
    """
    with engine.session() as (ray, workers):
        traffic = Traffic("driver" if located is None else "workers")
        submissions: Iterator[tuple[Any, Any]]
        if located is None:
            holder = [_put_tokenizer(ray, spec.encoder.for_data(), traffic)]
            submissions = _pretrain_blocks(ray, holder, labelled, spec, _spills(out, engine), engine, traffic)
        else:
            assert located.text_field is not None
            ranges = _counted(ray, located, engine, workers, clock, traffic)
            holder = [_put_tokenizer(ray, spec.encoder.for_data(), traffic)]
            submissions = _pretrain_ranges(
                ray, holder, ranges, located.text_field, spec, _spills(out, engine), traffic
            )
        shares, router = _route_pretrain(ray, submissions, spec, stop, clock, workers, traffic)
        write = _writing(ray, write_pretrain_shard, out, engine)
        return _write_pretrain(ray, out, write, shares, router, spec, traffic), router, traffic.result()


def _pretrain_header(spec: PretrainSpec) -> dict[str, Any]:
    return {"kind": "pretrain", "tokenizer": spec.encoder.tokenizer_sha256, "dtype": spec.dtype_name}


def _pretrain_blocks(
    ray: Any,
    holder: list[Any],
    labelled: Iterator[tuple[str, str | None]],
    spec: PretrainSpec,
    spill: Callable[[str], str],
    engine: RayEngine,
    traffic: Traffic,
) -> Iterator[tuple[Any, Any]]:
    """Tokenizing tasks of blocks of documents the driver read, their text sent with them."""
    encode = ray.remote(_encode_pretrain_task).options(num_cpus=1, max_retries=MAX_RETRIES)
    header = _pretrain_header(spec)
    for label, texts in _blocks(labelled, engine.block_docs):
        path = spill(block_key(header, texts))
        traffic.relayed(texts)
        traffic.send(path, spec.dtype_name)
        yield (label, len(texts), path), encode.remote(holder, texts, path, spec.dtype_name)


def _pretrain_ranges(
    ray: Any,
    holder: list[Any],
    ranges: list[Range],
    text_field: str,
    spec: PretrainSpec,
    spill: Callable[[str], str],
    traffic: Traffic,
) -> Iterator[tuple[Any, Any]]:
    """Tokenizing tasks of ranges of the input, each read by its task; a spill file named by its descriptor."""
    encode = ray.remote(_encode_range_task).options(num_cpus=1, max_retries=MAX_RETRIES)
    header = {**_pretrain_header(spec), "text_field": text_field, "reader": "range/1"}
    for part in ranges:
        path = spill(block_key(header, [asdict(part)]))
        traffic.send(part, text_field, path, spec.dtype_name)
        yield (None, part.count, path), encode.remote(holder, part, text_field, path, spec.dtype_name)


def _route_pretrain(
    ray: Any,
    submissions: Iterator[tuple[Any, Any]],
    spec: PretrainSpec,
    stop: dict[str, bool],
    clock: Clock,
    workers: int,
    traffic: Traffic,
) -> tuple[dict[str, list[BlockShare]], PretrainRouter]:
    """Every document routed in input order, from its block's or range's token counts as they arrive."""
    router = PretrainRouter(spec.budgets)
    shares: dict[str, list[BlockShare]] = {s: [] for s in SPLITS}
    position = 0
    done = {"docs": 0, "tokens": 0}
    progress = lambda: (done["docs"], done["tokens"])  # noqa: E731
    for (label, count, path), lengths in _in_order(ray, submissions, 2 * workers, clock, progress):
        traffic.got(lengths)
        done["docs"] += count
        done["tokens"] += int(lengths.sum())
        held = dict(router.held)
        if label is None:
            drawn = draw_splits(spec.seed, position, count, spec.val_frac)
            position += count
            taken = router.route(lengths, drawn)
            splits = np.where(drawn, "val", "train")
        else:
            taken = router.route_fixed(lengths, label)
            splits = np.full(count, label)
        for split in SPLITS:
            mask = np.zeros(count, dtype=bool)
            mask[taken] = True
            mask &= splits == split
            if mask.any():
                shares[split].append(share_of(path, mask, held[split], router.held[split] - held[split]))
            stop[split] = router.full(split)
        clock.tick(done["docs"], done["tokens"])
        if router.stopped:
            break
    return shares, router


def _write_pretrain(
    ray: Any,
    out: Path,
    write: Any,
    shares: dict[str, list[BlockShare]],
    router: PretrainRouter,
    spec: PretrainSpec,
    traffic: Traffic,
) -> list[FileEntry]:
    """Round 4: a task per shard writes it from the spill files it covers (``write``: :func:`_writing`'s)."""
    tasks = []
    for split in SPLITS:
        total, size = router.held[split], spec.shard_tokens
        starts = [share.offset for share in shares[split]]  # increasing: shares are in input order
        for index in range(math.ceil(total / size)):
            lo, hi = index * size, min(total, (index + 1) * size)
            covering = shares[split][max(0, bisect_right(starts, lo) - 1) : bisect_left(starts, hi)]
            traffic.send(out, split, index, lo, hi, covering, spec.eos_id)
            tasks.append(write(split, index, lo, hi, covering, spec.eos_id))
    return _write_all(ray, tasks, traffic)


def build_sft_on_ray(
    examples: Iterable[Any],
    out: Path,
    chat: ChatEncoding,
    encoder: TextEncoder,
    dtype_name: str,
    val_frac: float,
    seed: int,
    clock: Clock,
    engine: RayEngine,
    name: str,
    located: LocatedInput | None = None,
) -> tuple[list[FileEntry], dict[str, int], dict[str, int], dict[str, int], int, DriverBytes]:
    """Tokenize and write an SFT dataset with Ray tasks.

    ``located``: the workers read the input's records by range (``examples``
    is then never read); ``None``: the driver reads ``examples`` in order.

    Returns:
        ``(files, skip counts, examples per split, tokens per split, examples read, driver traffic)``.
    """
    from dlmstore.datasets.build.sft import check_some

    with engine.session() as (ray, workers):
        traffic = Traffic("driver" if located is None else "workers")
        ranges = None if located is None else _counted(ray, located, engine, workers, clock, traffic)
        write = _writing(ray, write_sft_split, out, engine)
        spill = _spills(out, engine)
        holder = [_put_tokenizer(ray, encoder, traffic)]
        header = {
            "kind": "sft",
            "tokenizer": encoder.tokenizer_sha256,
            "dtype": dtype_name,
            "chat": asdict(chat),
        }
        seen = {"docs": 0, "tokens": 0}

        def blocks() -> Iterator[tuple[Any, Any]]:
            encode = ray.remote(_encode_sft_task).options(num_cpus=1, max_retries=MAX_RETRIES)
            first = 0
            for block in batched(examples, engine.block_docs):
                path = spill(block_key(header, block))
                traffic.relayed(block)
                traffic.send(chat, first, path, dtype_name)
                yield (
                    (first, len(block), path),
                    encode.remote(holder, chat, block, first, path, dtype_name),
                )
                first += len(block)

        def read_by_workers(ranges: list[Range]) -> Iterator[tuple[Any, Any]]:
            encode = ray.remote(_encode_sft_range_task).options(num_cpus=1, max_retries=MAX_RETRIES)
            keyed = {**header, "reader": "range/1", "records": "dolly_messages"}
            for part in ranges:
                path = spill(block_key(keyed, [asdict(part)]))
                traffic.send(chat, part, path, dtype_name)
                yield (
                    (part.position, part.count, path),
                    encode.remote(holder, chat, part, path, dtype_name),
                )

        skip_counts = {reason: 0 for reason in SKIP_CODES if reason}
        shares: dict[str, list[BlockShare]] = {s: [] for s in SPLITS}
        filled = dict.fromkeys(SPLITS, 0)
        kept = dict.fromkeys(SPLITS, 0)
        progress = lambda: (seen["docs"], seen["tokens"])  # noqa: E731
        submissions = blocks() if ranges is None else read_by_workers(ranges)
        for (first, count, path), (lengths, skipped) in _in_order(
            ray, submissions, 2 * workers, clock, progress
        ):
            traffic.got((lengths, skipped))
            seen["docs"] += count
            seen["tokens"] += int(lengths.sum())
            for reason, code in SKIP_CODES.items():
                if reason:
                    skip_counts[reason] += int((skipped == code).sum())
            to_val = draw_splits(seed, first, count, val_frac)
            for split in SPLITS:
                mask = (skipped == 0) & (to_val if split == "val" else ~to_val)
                if mask.any():
                    tokens = int(lengths[mask].sum())
                    shares[split].append(share_of(path, mask, filled[split], tokens))
                    filled[split] += tokens
                    kept[split] += int(mask.sum())
            clock.tick(seen["docs"], seen["tokens"])
        check_some(sum(kept.values()), name, seen["docs"])
        tasks = []
        for split in SPLITS:
            traffic.send(out, split, shares[split])
            tasks.append(write(split, shares[split]))
        entries = _write_all(ray, tasks, traffic)
        return entries, skip_counts, kept, filled, seen["docs"], traffic.result()

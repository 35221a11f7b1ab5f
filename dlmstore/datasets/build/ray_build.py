"""Building a dataset on Ray: the same bytes as the local engine, from many workers.

The driver (the ``dlm`` process) reads the input in order and cuts it into
blocks (:mod:`.blocks`). Ray tasks tokenize the blocks into spill files,
at most two per worker in flight (so the driver never holds more than
that many blocks); the driver takes their token counts *in block order*
and routes every document with :mod:`.routing`, exactly as the local
engine does, which is why the output does not depend on which worker
finished first or how many there were. Prefix sums of the routed counts
give each block its offset in its split; a second round of tasks writes
every pretrain shard (or SFT split file) at its final name and returns its
size and sha256. The driver then writes ``meta.json``; the recipe
registers the dataset in one transaction after that.

Ray retries a task whose worker died (``max_retries``); spill files and
shards are written atomically under names that do not depend on the
attempt, so a retry rewrites the same bytes. A build that fails leaves
its finished spill files: rerunning the command loads them instead of
tokenizing again.

:class:`RayEngine` is the :class:`~.engines.Engine` a builder receives to
run here: its methods are :func:`ray_session`, :func:`build_pretrain_on_ray`
and :func:`build_sft_on_ray`. The builders never import this module; it
imports what it needs of them one way (:mod:`.sft`'s ``check_some``,
:mod:`.pretrain`'s spec type). Ray is
imported here and nowhere else, inside functions (:func:`import_ray`);
without it, :func:`ray_session` says how to install it.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import threading
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dlmstore.datasets.build.blocks import (
    BlockShare,
    block_key,
    encode_pretrain_block,
    encode_sft_block,
    share_of,
    spill_path,
    write_pretrain_shard,
    write_sft_split,
)
from dlmstore.datasets.build.chat import ChatEncoding
from dlmstore.datasets.build.encoding import TextEncoder
from dlmstore.datasets.build.engines import DEFAULT_BLOCK_DOCS
from dlmstore.datasets.build.output import Clock, batched
from dlmstore.datasets.build.ray_local import ctrl_c_held, descendants, release, signals_kept, start_reaper
from dlmstore.datasets.build.routing import PretrainRouter, draw_splits
from dlmstore.datasets.formats import SPLITS
from dlmstore.datasets.meta import FileEntry
from dlmstore.errors import DatasetError, DlmError, Terminated

if TYPE_CHECKING:
    from dlmstore.datasets.build.pretrain import PretrainSpec

INSTALL_HINT = "pip install 'dlmstore[ray]'"
#: How long connecting to a cluster may take before it is reported as unreachable, unless
#: :data:`CONNECT_TIMEOUT_ENV` says otherwise.
CONNECT_TIMEOUT_S = 25.0
#: The environment variable that sets the connect timeout in seconds (a slow cluster, a quick test).
CONNECT_TIMEOUT_ENV = "DLM_RAY_CONNECT_TIMEOUT"
PROBE_TIMEOUT_S = 5.0
MAX_RETRIES = 3

_cache: dict[str, Any] = {}  # per worker process: the tokenizer, deserialised once


def connect_timeout() -> float:
    """Seconds connecting may take: :data:`CONNECT_TIMEOUT_ENV` when set, else :data:`CONNECT_TIMEOUT_S`.

    Raises:
        DatasetError: the variable is not a positive number of seconds.
    """
    value = os.environ.get(CONNECT_TIMEOUT_ENV, "").strip()
    if not value:
        return CONNECT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise DatasetError(
            f"{CONNECT_TIMEOUT_ENV}={value!r} is not a number of seconds above 0",
            hint=f"set it to e.g. 60, or unset it for {CONNECT_TIMEOUT_S:.0f} s",
        )
    return seconds


def import_ray() -> Any:
    """The ``ray`` module, or the error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise DatasetError(
            "--engine ray needs Ray, which is not installed", hint=f"install it: {INSTALL_HINT}"
        ) from None
    return ray


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
        block_docs: documents per tokenizing task; the output does not
            depend on it.
    """

    address: str | None = None
    workers: int | None = None
    block_docs: int = DEFAULT_BLOCK_DOCS

    def resolved_address(self) -> str | None:
        return self.address or os.environ.get("RAY_ADDRESS") or None

    def session(self) -> AbstractContextManager[tuple[Any, int]]:
        """:func:`ray_session`: Ray connected (or started) for the builds inside."""
        return ray_session(self)

    def build_pretrain(
        self,
        spec: PretrainSpec,
        labelled: Iterator[tuple[str, str | None]],
        stop: dict[str, bool],
        out: Path,
        clock: Clock,
    ) -> tuple[list[FileEntry], PretrainRouter]:
        """:func:`build_pretrain_on_ray` on this engine."""
        return build_pretrain_on_ray(spec, labelled, stop, out, clock, self)

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
    ) -> tuple[list[FileEntry], dict[str, int], dict[str, int], dict[str, int], int]:
        """:func:`build_sft_on_ray` on this engine."""
        return build_sft_on_ray(examples, out, chat, encoder, dtype_name, val_frac, seed, clock, self, name)


@contextmanager
def ray_session(engine: RayEngine) -> Iterator[tuple[Any, int]]:
    """Ray, connected, and how many tasks to run at once.

    Connects to ``engine``'s address (or ``RAY_ADDRESS``), else starts a
    local Ray with ``workers`` CPUs and stops it afterwards. A Ray already
    initialised in this process (a test, a notebook) is used as it is.

    Ray does not keep the process's signals, nor outlive it
    (:mod:`.ray_local`): the SIGTERM and SIGINT handlers ``ray.init``
    replaces are put back, so SIGTERM ends a build as Ctrl-C does (the
    build stops, Ray is shut down, the CLI prints one ``error:`` line), and
    a local Ray's processes are handed to a reaper that kills any still
    running once this process ends, however it ends.

    Raises:
        DatasetError: Ray is not installed, or the cluster cannot be
            reached within :func:`connect_timeout` seconds, or that is not a number.
        Terminated: SIGTERM came while ``ray.init`` had Ray's own handler in place.
    """
    ray = import_ray()
    if ray.is_initialized():
        yield ray, engine.workers or _cluster_cpus(ray)
        return
    address = engine.resolved_address()
    before = descendants(os.getpid()) if address is None else set()
    reaper = None
    # Ray is shut down however this ends, from the moment ray.init starts, and what a local
    # ray.init started is reaped even when it was stopped before the reaper was handed it (a
    # SIGTERM while it starts: its dashboard and runtime-env agents outlived the build by a minute).
    try:
        try:
            with signals_kept(), ctrl_c_held():
                if address is None:
                    ray.init(
                        address="local",
                        num_cpus=engine.workers or os.cpu_count() or 1,
                        include_dashboard=False,
                        logging_level=logging.WARNING,
                    )
                else:
                    _connect(ray, address)
        except SystemExit as exc:  # what Ray's own SIGTERM handler raises, in place while ray.init runs
            if exc.code != signal.SIGTERM:
                raise
            raise Terminated(signal.SIGTERM) from None
        if address is None:
            reaper = start_reaper(before)
        yield ray, engine.workers or _cluster_cpus(ray)
    finally:
        with signals_kept():
            ray.shutdown()
        if reaper is None and address is None:
            reaper = start_reaper(before)
        if reaper is not None:
            release(reaper)


def _cluster_cpus(ray: Any) -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _connect(ray: Any, address: str) -> None:
    """``ray.init(address)``, bounded in time: a cluster that does not answer is an error, not a hang."""
    timeout = connect_timeout()
    hint = (
        "check --ray-address / RAY_ADDRESS (the head node's host:port, e.g. 10.0.0.5:6379), "
        "or leave both unset to run a local Ray"
    )
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if host and port.isdigit():
        try:
            socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
        except OSError as exc:
            raise DatasetError(
                f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}", hint=hint
            ) from None
    outcome: dict[str, BaseException | None] = {}

    def init() -> None:
        try:
            ray.init(address=address, logging_level=logging.WARNING)
            outcome["error"] = None
        except BaseException as exc:  # reported by the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=init, name="dlm-ray-connect", daemon=True)
    thread.start()
    thread.join(timeout)
    if "error" not in outcome:
        raise DatasetError(f"the Ray cluster at {address} did not answer within {timeout:g} s", hint=hint)
    if outcome["error"] is not None:
        raise DatasetError(f"cannot connect to the Ray cluster at {address}: {outcome['error']}", hint=hint)


def _encoder(holder: list[Any]) -> Any:
    """The build's tokenizer, fetched from the object store once per worker process and build.

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
        _cache[key] = ray.get(holder[0])
    return _cache[key]


def _encode_pretrain_task(holder: list[Any], texts: list[str], path: str, dtype_name: str) -> Any:
    return encode_pretrain_block(_encoder(holder), texts, Path(path), dtype_name)


def _encode_sft_task(
    holder: list[Any],
    chat: ChatEncoding,
    examples: list[Any],
    first: int,
    path: str,
    dtype_name: str,
) -> Any:
    return encode_sft_block(chat, _encoder(holder), examples, first, Path(path), dtype_name)


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


def _write_all(ray: Any, tasks: list[Any]) -> list[FileEntry]:
    return [entry for ref in tasks for entry in _get(ray, ref)]


def build_pretrain_on_ray(
    spec: PretrainSpec,
    labelled: Iterator[tuple[str, str | None]],
    stop: dict[str, bool],
    out: Path,
    clock: Clock,
    engine: RayEngine,
) -> tuple[list[FileEntry], PretrainRouter]:
    """Tokenize and write a pretrain dataset with Ray tasks; returns its files and routing."""
    with ray_session(engine) as (ray, workers):
        encode = ray.remote(_encode_pretrain_task).options(num_cpus=1, max_retries=MAX_RETRIES)
        write = ray.remote(write_pretrain_shard).options(num_cpus=1, max_retries=MAX_RETRIES)
        holder = [ray.put(spec.encoder.for_data())]  # no transformers import in the workers
        key = spec.encoder.tokenizer_sha256
        header = {"kind": "pretrain", "tokenizer": key, "dtype": spec.dtype_name}
        done = {"docs": 0, "tokens": 0}

        def submissions() -> Iterator[tuple[Any, Any]]:
            for label, texts in _blocks(labelled, engine.block_docs):
                path = spill_path(out, block_key(header, texts))
                yield (label, len(texts), path), encode.remote(holder, texts, str(path), spec.dtype_name)

        router = PretrainRouter(spec.budgets)
        shares: dict[str, list[BlockShare]] = {s: [] for s in SPLITS}
        position = 0
        progress = lambda: (done["docs"], done["tokens"])  # noqa: E731
        for (label, count, path), lengths in _in_order(ray, submissions(), 2 * workers, clock, progress):
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
        tasks = []
        for split in SPLITS:
            total, size = router.held[split], spec.shard_tokens
            starts = [share.offset for share in shares[split]]  # increasing: shares are in block order
            for index in range(math.ceil(total / size)):
                lo, hi = index * size, min(total, (index + 1) * size)
                covering = shares[split][max(0, bisect_right(starts, lo) - 1) : bisect_left(starts, hi)]
                tasks.append(write.remote(out, split, index, lo, hi, covering, spec.eos_id))
        return _write_all(ray, tasks), router


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
) -> tuple[list[FileEntry], dict[str, int], dict[str, int], dict[str, int], int]:
    """Tokenize and write an SFT dataset with Ray tasks.

    Returns:
        ``(files, skip counts, examples per split, tokens per split, examples read)``.
    """
    from dataclasses import asdict

    from dlmstore.datasets.build.blocks import SKIP_CODES
    from dlmstore.datasets.build.sft import check_some

    with ray_session(engine) as (ray, workers):
        encode = ray.remote(_encode_sft_task).options(num_cpus=1, max_retries=MAX_RETRIES)
        write = ray.remote(write_sft_split).options(num_cpus=1, max_retries=MAX_RETRIES)
        holder = [ray.put(encoder)]
        key = encoder.tokenizer_sha256
        header = {"kind": "sft", "tokenizer": key, "dtype": dtype_name, "chat": asdict(chat)}
        seen = {"docs": 0, "tokens": 0}

        def submissions() -> Iterator[tuple[Any, Any]]:
            first = 0
            for block in batched(examples, engine.block_docs):
                path = spill_path(out, block_key(header, block))
                yield (
                    (first, len(block), path),
                    encode.remote(holder, chat, block, first, str(path), dtype_name),
                )
                first += len(block)

        skip_counts = {reason: 0 for reason in SKIP_CODES if reason}
        shares: dict[str, list[BlockShare]] = {s: [] for s in SPLITS}
        filled = dict.fromkeys(SPLITS, 0)
        kept = dict.fromkeys(SPLITS, 0)
        progress = lambda: (seen["docs"], seen["tokens"])  # noqa: E731
        for (first, count, path), (lengths, skipped) in _in_order(
            ray, submissions(), 2 * workers, clock, progress
        ):
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
        entries = _write_all(ray, [write.remote(out, split, shares[split]) for split in SPLITS])
        return entries, skip_counts, kept, filled, seen["docs"]

"""The tokenize pass: a document's rows -> token arrays, through the cache.

What it produces is exactly what TRL's ``SFTTrainer`` would produce by
itself (``trl.data_utils._tokenize`` after its EOS step), so training on
pre-tokenized rows is the same training:

* ``messages`` rows -> ``apply_chat_template(messages, tokenize=True,
  return_dict=True, add_generation_prompt=False)``, i.e. the rendered chat
  encoded without adding special tokens;
* ``text`` rows -> ``eos_token`` appended unless already there, then
  ``tokenizer(text=...)``;
* ``preference`` rows -> four token arrays each, from which TRL's
  ``DPOTrainer`` and ``ORPOTrainer`` build their inputs
  (``dlmstore.cache.preferences``, which also gives their cache keys). They
  are returned apart (``PassResult.preferences``): ``rows`` holds text and
  messages rows only, what SFT trains on.

Every row goes through the cache, in-body rows included: they are cheap to
tokenize, but one code path means one set of guarantees (and one parity
test). ``--no-cache`` (or ``training.cache.enabled: false``) bypasses it
without touching entries.

Speed: on all hits the tokenizer is never loaded (its identity comes from
hashing its files), the lookup is one SQL query, and the tokens are views of
memory-mapped segments, concatenated once into the output arrays. A pass that
does not materialize (``dlm tokenize``) reads no entry's bytes at all: it
needs only the token counts the manifest holds (see ``TokenCache.lookup``
for when the CRC-32 is checked). On misses, identical contents are
tokenized once, and the misses are encoded in batches through the fast
tokenizer (Rust, all cores), each at most 256 rows and 4 MiB of text, which
bounds the tokenizer's memory; text rows go straight to the Rust
``encode_batch_fast`` (``dlmstore.cache.trl_encoding``), and the next batch encodes on
threads while this one's segment is written (``dlmstore.cache.encoders``: on
several cores, each thread encodes chunks of a batch by itself). No
per-token Python objects are kept: rows are numpy arrays, the result is
``values`` + ``offsets`` (Arrow's list layout).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlmstore.cache.trl_encoding import backend_encodes_alone, encode_rows
from dlmstore.document.rows import MAX_ROW_BYTES, text_bytes
from dlmstore.plural import plural
from dlmstore.prefix.stats import PrefixCacheStats
from dlmstore.store.events import DedupEvent, TokenizationEvent

if TYPE_CHECKING:
    # What a pass that tokenizes needs is imported by tokenize_pass: a warm pass answered
    # from its snapshot (tokenize_document) imports none of it (tests/test_pass_snapshots.py).
    from pathlib import Path

    import numpy as np

    from dlmstore.corpus.assemble import Corpus
    from dlmstore.corpus.pass_result import PassResult, TokenizedRows
    from dlmstore.corpus.signatures import Signing
    from dlmstore.corpus.snapshot import PassSnapshot
    from dlmstore.document.rows import Row
    from dlmstore.store.database import Store


_log = logging.getLogger(__name__)

BATCH_ROWS = 256
#: A batch also stops at this much text (a larger row goes alone): the fast
#: tokenizer holds about 200 bytes per byte of a batch while it encodes it,
#: so 256 rows of 4 MiB would need 200 GB. See ``rows.MAX_ROW_BYTES``.
BATCH_BYTES = MAX_ROW_BYTES
#: After a batch of at least this much text, freed memory is given back.
TRIM_AFTER_BYTES = 1 << 20
#: On several threads each encodes chunks of a batch of at most this many
#: rows and bytes of text (a larger row alone): small enough that the
#: threads finish a batch together, large enough that a call's overhead is
#: nothing. The text being encoded at once stays within ``BATCH_BYTES``.
CHUNK_ROWS = 32
CHUNK_BYTES = 1 << 20


def tokenize_pass(
    store: Store,
    corpus: Corpus,
    *,
    run_id: int,
    tokenizer_sha256: str,
    load_tokenizer: Callable[[], Any],
    use_cache: bool,
    cache_mode: str,
    max_bytes: int,
    materialize: bool = True,
    load_text_tokenizer: Callable[[], Any | None] | None = None,
    share: bool = False,
    signer: Signing | None = None,
) -> PassResult:
    """Tokenize every row of ``corpus``, reading and filling the cache.

    A preference row counts as one hit when all its parts are cached, else
    as one miss (and all its missing parts are tokenized).

    Args:
        store: the document's store (entries and segments live there).
        corpus: the document's rows come from here.
        run_id: the run this pass belongs to (its entries are protected
            from eviction).
        tokenizer_sha256: the tokenizer's fingerprint (part of every key).
        load_tokenizer: called only when some row misses.
        use_cache: ``False`` bypasses the cache entirely (no reads, no writes).
        cache_mode: ``on``, ``off`` or ``bypassed``, recorded in the event.
        max_bytes: the cache's size limit (``training.cache.max_bytes``).
        materialize: build the concatenated token arrays (for training);
            without it a warm pass only verifies and counts, and never
            imports numpy.
        load_text_tokenizer: when every miss is a text row, tried before
            ``load_tokenizer``: a tokenizer that encodes text rows only
            (``dlmstore.cache.rust_tokenizer``), or ``None`` when there is none.
        share: before the tokenizer, take the entries other stores of the
            home hold for the rows that missed (``dlmstore.cache.share``);
            they count as hits, and ``event.cache_shared`` says how many.
        signer: signs the text rows to encode on the threads that encode
            them (``dlmstore.corpus.dedup.signing``), for the duplicate
            search that follows the pass.

    Progress: the ``tokenizing`` task (``dlmstore.progress``), in rows
    (the summary counts the tokens, split as SFT and preference tokens).
    """
    from dlmstore.cache.encoders import pipelined, tokenizer_threads
    from dlmstore.cache.entries import TokenCache, cache_bytes, evict
    from dlmstore.cache.preferences import PARTS, TokenizedPreferences, encode_preferences, part_keys
    from dlmstore.cache.segments import as_array, token_dtype
    from dlmstore.cache.share import take_shared
    from dlmstore.corpus.pass_result import PassResult
    from dlmstore.progress import Task

    start = time.perf_counter()
    sequence_len = corpus.document.frontmatter.training.sequence_len
    all_rows = corpus.rows()
    rows = [row for row in all_rows if row.kind != "preference"]
    preferences = [row for row in all_rows if row.kind == "preference"]
    parts = {row.row_key: part_keys(row.row_key) for row in preferences}
    total = len(rows) + len(preferences)
    arrays: dict[str, np.ndarray] = {}
    lengths: dict[str, int] = {}  # tokens of every entry found or tokenized, by key
    damaged: tuple[str, ...] = ()
    entry_ids: list[int] = []
    changes = None
    cache = TokenCache(store, tokenizer_sha256=tokenizer_sha256, sequence_len=sequence_len)
    if use_cache:
        # Entry bytes are read, and their CRC-32 checked, only when the
        # tokens are used (materialize): a pass that only counts reads none.
        found = cache.lookup(
            [row.row_key for row in rows] + [k for keys in parts.values() for k in keys],
            run_id=run_id,
            verify=materialize,
        )
        damaged = found.damaged
        lengths.update(found.counts)
        entry_ids, changes = found.ids, found.changes
        for key, (data, dtype) in found.tokens.items():
            arrays[key] = as_array(data, dtype)
    missing = [row for row in rows if row.row_key not in lengths]
    missing_preferences = [row for row in preferences if not all(k in lengths for k in parts[row.row_key])]
    shared_rows = 0
    if use_cache and share and (missing or missing_preferences):
        # Tokens another store of the home made under the same keys: linked or
        # copied in and registered here, checked against their CRC-32 first.
        taken = take_shared(
            store,
            [row.row_key for row in missing]
            + [k for row in missing_preferences for k in parts[row.row_key] if k not in lengths],
            tokenizer_sha256=tokenizer_sha256,
            sequence_len=sequence_len,
            run_id=run_id,
        )
        if taken.counts:
            lengths.update(taken.counts)
            entry_ids += taken.ids
            if materialize:
                for key, (data, dtype) in taken.tokens.items():
                    arrays[key] = as_array(data, dtype)
            before = len(missing) + len(missing_preferences)
            missing = [row for row in missing if row.row_key not in lengths]
            missing_preferences = [
                row for row in missing_preferences if not all(k in lengths for k in parts[row.row_key])
            ]
            shared_rows = before - len(missing) - len(missing_preferences)
    hits = total - len(missing) - len(missing_preferences)
    _log.debug(
        "tokenize pass: %s, %d found in the cache, %d to tokenize%s",
        plural(total, "row"), hits, total - hits, "" if use_cache else " (cache bypassed)",
    )  # fmt: skip
    task = Task("tokenizing", total=total, unit="rows")
    task.update(hits)
    prefix = None
    if missing or missing_preferences:
        tokenizer = None
        if (
            load_text_tokenizer is not None
            and not missing_preferences
            and all(r.kind == "text" for r in missing)
        ):
            tokenizer = load_text_tokenizer()
        if tokenizer is None:
            tokenizer = load_tokenizer()
        segment_dtype = token_dtype(len(tokenizer))
        if any(row.kind == "messages" for row in missing):
            from dlmstore.prefix import PrefixCachedTokenizer

            prefix = PrefixCachedTokenizer(tokenizer, fingerprint=tokenizer_sha256)
        todo = missing + missing_preferences

        def encode(batch: list[Row], nbytes: int) -> dict[str, np.ndarray]:
            """The new entries of one batch or chunk (runs on an encoding thread; see ``encoders.pipelined``)."""
            texts = [row for row in batch if row.kind != "preference"]
            triples = [row for row in batch if row.kind == "preference"]
            fresh = {
                row.row_key: ids
                for row, ids in zip(
                    texts, encode_rows(tokenizer, texts, prefix=prefix, dtype=segment_dtype), strict=True
                )
            }
            for row, encoded in zip(triples, encode_preferences(tokenizer, triples), strict=True):
                for part, key in zip(PARTS, parts[row.row_key], strict=True):
                    if key not in lengths:  # a part already cached is kept as it is
                        fresh[key] = encoded[part].astype(segment_dtype)
            if signer is not None:
                signer.sign_rows(texts)
            if nbytes >= TRIM_AFTER_BYTES:
                _give_back_freed_memory()
            return fresh

        # Several threads only where nothing but the Rust backend is called
        # (see dlmstore.cache.encoders); the segment layout is the same either way.
        threads = 1
        if (
            not missing_preferences
            and all(r.kind == "text" for r in missing)
            and backend_encodes_alone(tokenizer)
        ):
            threads = tokenizer_threads()
        _log.debug("tokenize pass: encoding on %s", plural(threads, "thread"))
        if signer is not None:
            signer.expect(todo)
        done = 0
        encoded = pipelined(_batches(todo), encode, threads=threads, chunks=_chunks, budget=BATCH_BYTES)
        for batch, fresh in encoded:
            if use_cache:
                entry_ids += cache.store_many(list(fresh.items()), run_id=run_id, dtype=segment_dtype)
            if materialize:
                arrays.update(fresh)
            lengths.update((key, len(ids)) for key, ids in fresh.items())
            done += len(batch)
            task.update(hits + done)
    evicted = 0
    if use_cache:
        evicted = evict(store, max_bytes=max_bytes, protect_run_id=run_id).entries
    cache.close()
    task.finish()
    tokenized = _concatenate(rows, arrays) if materialize else None
    tokenized_preferences = None
    if materialize:
        tokenized_preferences = TokenizedPreferences.of(
            str(corpus.document.path), preferences, _section_lines(corpus, all_rows, preferences), arrays
        )
    seconds = time.perf_counter() - start
    misses = total - hits
    event = TokenizationEvent(
        total_sections=len(corpus.sections),
        total_rows=total,
        cache_hits=hits,
        cache_misses=misses,
        total_tokenize_seconds=round(seconds, 4),
        cache_bytes_after=cache_bytes(store),
        cache_mode=cache_mode,
        hit_rate=TokenizationEvent.rate(hits, misses),
        cache_shared=shared_rows,
    )
    warnings: tuple[str, ...] = ()
    if damaged:
        warnings = (
            f"{plural(len(damaged), 'cache entry', 'cache entries')} pointed at missing or damaged token "
            f"files; {'its row was' if len(damaged) == 1 else 'their rows were'} re-tokenized "
            "(`dlm cache verify` checks the rest)",
        )
    prefix_stats = None if prefix is None else prefix.stats()
    conversation_keys = [
        keys[PARTS.index(part)] for keys in parts.values() for part in ("chosen", "rejected")
    ]
    preference_tokens = sum(lengths[key] for key in conversation_keys)
    complete = use_cache and len(entry_ids) == len(lengths)
    return PassResult(
        event, tokenized, sum(lengths[row.row_key] for row in rows), len(preferences), preference_tokens,
        tokenized_preferences, len(damaged), evicted, tokenizer_sha256, warnings, prefix_stats,
        entry_ids if complete else None, changes,
    )  # fmt: skip


def _section_lines(corpus: Corpus, all_rows: Sequence[Row], wanted: Sequence[Row]) -> list[int | None]:
    """The line of the section each of ``wanted`` (a subsequence of ``all_rows``) comes from.

    Rows come section by section, each section's first row having index 0,
    so walking both in step pairs every row with its section (the section
    id alone would not tell two identical sections apart).
    """
    sections = iter(corpus.sections)
    keys = {row.row_key for row in wanted}
    lines: list[int | None] = []
    line: int | None = None
    for row in all_rows:
        if row.index == 0:
            section = next(sections, None)  # none for rows of no section (Corpus.extra), which come last
            line = None if section is None else section.line
        if row.row_key in keys:
            lines.append(line)
    return lines


def _batches(rows: Sequence[Row]) -> Iterator[tuple[list[Row], int]]:
    """``rows`` in order, in runs of at most ``BATCH_ROWS`` rows and ``BATCH_BYTES`` of
    text (a larger row alone), each with its bytes of text."""
    return _runs(rows, BATCH_ROWS, BATCH_BYTES)


def _chunks(batch: Sequence[Row]) -> Iterator[tuple[list[Row], int]]:
    """A batch in runs of at most ``CHUNK_ROWS`` rows and ``CHUNK_BYTES`` of text, for several threads."""
    return _runs(batch, CHUNK_ROWS, CHUNK_BYTES)


def _runs(rows: Sequence[Row], most_rows: int, most_bytes: int) -> Iterator[tuple[list[Row], int]]:
    batch: list[Row] = []
    size = 0
    for row in rows:
        nbytes = text_bytes(row.data)
        if batch and (len(batch) == most_rows or size + nbytes > most_bytes):
            yield batch, size
            batch, size = [], 0
        batch.append(row)
        size += nbytes
    if batch:
        yield batch, size


def _give_back_freed_memory() -> None:
    """Return the tokenizer's freed working memory to the system (glibc's ``malloc_trim``).

    The fast tokenizer frees its transient memory after each batch, but
    glibc keeps freed pages in its per-thread arenas, so the next batch's
    peak comes on top of them: trimming after each large batch lowered the
    peak of a 16-file, 57 MB tree by about 0.25 GB (``bench/bench_hostile_io.py``).
    Elsewhere (macOS, musl) there is nothing to call and nothing is done.
    """
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own symbols: glibc's, where it is
    except (OSError, AttributeError):
        return
    trim(0)


def _concatenate(rows: Sequence[Row], arrays: dict[str, np.ndarray]) -> TokenizedRows:
    import numpy as np

    from dlmstore.corpus.pass_result import TokenizedRows

    parts = [arrays[row.row_key] for row in rows]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    if parts:
        np.cumsum([len(p) for p in parts], out=offsets[1:])
    dtype = np.result_type(*[p.dtype for p in parts]) if parts else np.dtype(np.uint16)
    values = np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype=dtype)
    return TokenizedRows(tuple(row.row_key for row in rows), tuple(row.kind for row in rows), offsets, values)


@dataclass(frozen=True)
class TokenizeSummary:
    """The JSON shape of ``dlm tokenize --json``.

    Attributes:
        run_id: The run recorded for this pass (see ``dlm metrics``).
        dlm_id: The document id.
        path: The document (as given).
        tokenizer_sha256: Fingerprint of the tokenizer used (part of every cache key).
        sequence_len: Tokens per row at most (``training.sequence_len``).
        tokens: Tokens of the text and conversation rows.
        preference_rows: Preference rows (prompt, chosen, rejected) tokenized.
        preference_tokens: Tokens of the preference rows' chosen and rejected conversations.
        tokenization: The pass's numbers, as recorded in the store.
        damaged_entries: Cache entries whose token files were missing or damaged, tokenized again.
        evicted_entries: Entries evicted to keep the cache under ``training.cache.max_bytes``.
        warnings: Warnings about the pass (also printed on stderr).
        prefix_cache: The prefix cache's counters when conversations went through the tokenizer;
            null when none did.
        dedup: The duplicate clusters among the text rows (``dlm show`` lists them); null when the
            pass was answered from a snapshot whose run recorded none.
    """

    run_id: int
    dlm_id: str
    path: str
    tokenizer_sha256: str
    sequence_len: int
    tokens: int  # of the text and messages rows
    preference_rows: int
    preference_tokens: int  # of the preference rows' chosen and rejected conversations
    tokenization: TokenizationEvent
    damaged_entries: int
    evicted_entries: int
    warnings: list[str]
    prefix_cache: PrefixCacheStats | None
    dedup: DedupEvent | None = None


def tokenize_document(
    path: str, *, no_cache: bool = False, materialize: bool = True, no_share: bool = False
) -> tuple[TokenizeSummary, TokenizedRows | None]:
    """Run the tokenize pass for the document at ``path`` as a recorded run.

    With ``materialize=False`` (what ``dlm tokenize`` uses) the token
    arrays are not built and ``None`` is returned in their place. With
    ``no_share`` (``--no-share``) rows this store misses are tokenized here
    even when another store of the home holds their tokens.

    Raises:
        DocumentError, SourceError: the document or its sources are invalid.
        BaseModelError: the base model cannot be resolved or loaded.
        StoreError: the store cannot be created or written.
    """
    if not no_cache and not materialize:
        # A pass that only counts, over what the last all-hits pass saw, is answered
        # from that pass's snapshot (dlmstore.corpus.snapshot), found from the
        # document's bytes: no frontmatter validated, nothing of the walk imported.
        answered = _answered_unparsed(path)
        if answered is not None:
            return answered, None
    from dlmstore.bases import resolve_base
    from dlmstore.cache.rust_tokenizer import load_snapshot
    from dlmstore.cache.share import stat_records
    from dlmstore.collector import paused
    from dlmstore.corpus import dedup as duplicates
    from dlmstore.corpus import snapshot as snapshots
    from dlmstore.corpus.assemble import load_corpus
    from dlmstore.document.parser import parse_document
    from dlmstore.fingerprint import tokenizer_sha256
    from dlmstore.store.database import open_store
    from dlmstore.store.events import record_tokenization_event
    from dlmstore.store.runs import recorded_run

    document = parse_document(path)
    ref = resolve_base(document.base_model, relative_to=document.directory)
    fingerprint = tokenizer_sha256(ref)
    settings = document.frontmatter.training
    enabled = settings.cache.enabled and not no_cache
    mode = "bypassed" if no_cache else ("on" if settings.cache.enabled else "off")
    source_warnings: tuple[str, ...] = ()
    with open_store(document.dlm_id) as store, paused():  # one object per file, none in a cycle
        # A pass that only counts, over what the last all-hits pass saw, is
        # answered from that pass's snapshot (dlmstore.corpus.snapshot).
        snapshot = None
        if enabled and not materialize:
            snapshot = snapshots.holding(
                store, document, tokenizer_sha256=fingerprint, sequence_len=settings.sequence_len
            )
        if snapshot is not None:
            return _replayed(store, snapshot, path=document.path, dlm_sha256=document.sha256), None
        share = settings.cache.share and not no_share
        stats = stat_records(store, share=share) if enabled else None
        corpus = load_corpus(document, stat_cache=stats)
        source_warnings = corpus.expansion.warnings
        signer = duplicates.signing(store, corpus)
        with recorded_run(
            store, command="tokenize", dlm_path=document.path, dlm_sha256=document.sha256
        ) as run_id:
            result = tokenize_pass(
                store,
                corpus,
                run_id=run_id,
                tokenizer_sha256=fingerprint,
                load_tokenizer=lambda: _loaded_and_kept(ref, fingerprint),
                load_text_tokenizer=lambda: load_snapshot(fingerprint),
                use_cache=enabled,
                cache_mode=mode,
                max_bytes=settings.cache.max_bytes,
                materialize=materialize,
                share=share,
                signer=signer,
            )
            record_tokenization_event(
                store, run_id, result.event,
                tokenizer_sha256=fingerprint, sequence_len=settings.sequence_len,
            )  # fmt: skip
            if stats is not None:
                stats.save(store)
                snapshots.keep(store, corpus, result, run_id=run_id, sequence_len=settings.sequence_len)
            found = duplicates.analyse(
                store, corpus, run_id=run_id, mode=settings.dedup, signed=signer, share=share
            )
    summary = _summary(
        result, run_id=run_id, dlm_id=document.dlm_id, path=document.path, tokenizer_sha256=fingerprint,
        sequence_len=settings.sequence_len, warnings=[*source_warnings, *result.warnings],
        dedup=None if found is None else found.event(),
    )  # fmt: skip
    return summary, result.rows


def _answered_unparsed(path: str) -> TokenizeSummary | None:
    """The pass answered from the snapshot of the document's bytes (``snapshot.unparsed``) when
    it holds, else ``None`` (the document is then parsed, and the full way taken)."""
    from dlmstore.bases import resolve_base
    from dlmstore.collector import paused
    from dlmstore.corpus import snapshot as snapshots
    from dlmstore.fingerprint import tokenizer_sha256
    from dlmstore.store.database import open_store

    found = snapshots.unparsed(path)
    if found is None:
        return None
    settings = found.settings
    # As the full way: the tokenizer is resolved and fingerprinted before the store is opened.
    fingerprint = tokenizer_sha256(resolve_base(settings.base_model, relative_to=found.path.parent))
    with open_store(settings.dlm_id) as store, paused():
        if not snapshots.holds_in(store, found.snapshot, tokenizer_sha256=fingerprint):
            return None
        return _replayed(store, found.snapshot, path=found.path, dlm_sha256=found.sha256)


def _replayed(store: Store, snapshot: PassSnapshot, *, path: Path, dlm_sha256: str) -> TokenizeSummary:
    """The pass answered from ``snapshot`` (it holds), recorded as the full pass records it."""
    from dlmstore.corpus import dedup as duplicates
    from dlmstore.corpus import snapshot as snapshots
    from dlmstore.store.events import record_tokenization_event
    from dlmstore.store.runs import recorded_run

    settings = snapshot.document
    with recorded_run(store, command="tokenize", dlm_path=path, dlm_sha256=dlm_sha256) as run_id:
        result = snapshots.replay(store, snapshot, run_id=run_id, max_bytes=settings.max_bytes)
        record_tokenization_event(
            store, run_id, result.event,
            tokenizer_sha256=snapshot.tokenizer_sha256, sequence_len=snapshot.sequence_len,
        )  # fmt: skip
        found = duplicates.copy_record(store, snapshot.run_id, run_id, mode=settings.dedup)
    return _summary(
        result, run_id=run_id, dlm_id=settings.dlm_id, path=path, tokenizer_sha256=snapshot.tokenizer_sha256,
        sequence_len=snapshot.sequence_len, warnings=list(result.warnings), dedup=found,
    )  # fmt: skip


def _summary(
    result: PassResult,
    *,
    run_id: int,
    dlm_id: str,
    path: Path,
    tokenizer_sha256: str,
    sequence_len: int,
    warnings: list[str],
    dedup: DedupEvent | None,
) -> TokenizeSummary:
    """What a pass (walked or replayed from its snapshot) reports."""
    return TokenizeSummary(
        run_id=run_id,
        dlm_id=dlm_id,
        path=str(path),
        tokenizer_sha256=tokenizer_sha256,
        sequence_len=sequence_len,
        tokens=result.token_count,
        preference_rows=result.preference_rows,
        preference_tokens=result.preference_tokens,
        tokenization=result.event,
        damaged_entries=result.damaged_entries,
        evicted_entries=result.evicted_entries,
        warnings=warnings,
        prefix_cache=result.prefix_cache,
        dedup=dedup,
    )


def _loaded_and_kept(ref: Any, fingerprint: str) -> Any:
    """The tokenizer of ``ref`` through transformers, its backend kept for text-only passes."""
    from dlmstore.bases import load_tokenizer
    from dlmstore.cache.rust_tokenizer import save_snapshot

    tokenizer = load_tokenizer(ref)
    save_snapshot(tokenizer, fingerprint)
    return tokenizer

"""Tokenization events: the numbers of one tokenize pass, one row per run.

Each ``dlm tokenize`` and ``dlm train`` run records its pass
(:class:`TokenizationEvent`) in ``tokenization_events`` with
:func:`record_tokenization_event`; ``dlm metrics``
(``dlmstore.store.metrics``) reads them back beside the runs. The event
has a module of its own so that a tokenize pass, which only records one,
does not create the listing's five classes (a frozen dataclass costs about
1 ms to create, on every run).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dlmstore.clock import utc_now
from dlmstore.store.database import Store


@dataclass(frozen=True)
class TokenizationEvent:
    """One pass's numbers, as recorded in ``tokenization_events``.

    Attributes:
        total_sections: Sections in the document, sources included.
        total_rows: Rows tokenized or served from the cache.
        cache_hits: Rows served from the cache.
        cache_misses: Rows that went through the tokenizer.
        total_tokenize_seconds: Wall time of the pass, in seconds.
        cache_bytes_after: Bytes of token data in the cache when the pass ended.
        cache_mode: ``on``, ``off`` (``training.cache.enabled: false``) or ``bypassed`` (``--no-
            cache``).
        hit_rate: ``cache_hits / total_rows`` (0 to 1); null when there were no rows.
        cache_shared: Of the hits, rows whose tokens were taken from another store of the home
            instead of tokenized (``training.cache.share``).
    """

    total_sections: int
    total_rows: int
    cache_hits: int
    cache_misses: int
    total_tokenize_seconds: float
    cache_bytes_after: int
    cache_mode: str
    hit_rate: float | None
    cache_shared: int = 0

    @staticmethod
    def rate(hits: int, misses: int) -> float | None:
        return round(hits / (hits + misses), 4) if hits + misses else None


@dataclass(frozen=True)
class DedupEvent:
    """What a run's duplicate search found among its text rows, as recorded in ``dedup_runs``.

    Attributes:
        mode: ``training.dedup`` of the run: ``off`` (report only), ``exact`` or ``near``.
        rows: Text rows compared.
        clusters: Clusters of two or more duplicate rows (``dlm show`` lists them).
        duplicate_rows: Rows in clusters besides the one each keeps.
        dropped_rows: Rows training leaves out under ``mode`` (0 when it is ``off``): what a ``dlm
            train`` run dropped, what a ``dlm tokenize`` run's training would drop.
        signatures_computed: Rows whose signature the run made (0 when all were kept or recorded).
        seconds: Time spent finding the clusters.
    """

    mode: str
    rows: int
    clusters: int
    duplicate_rows: int
    dropped_rows: int
    signatures_computed: int
    seconds: float


def record_tokenization_event(store: Store, run_id: int, event: TokenizationEvent, *,
                              tokenizer_sha256: str, sequence_len: int) -> None:  # fmt: skip
    """Insert the tokenization event of ``run_id``."""
    fields = asdict(event)
    fields.pop("hit_rate")
    with store.write() as conn:
        conn.execute(
            "INSERT INTO tokenization_events (run_id, total_sections, total_rows, cache_hits, "
            "cache_misses, total_tokenize_seconds, cache_bytes_after, cache_mode, tokenizer_sha256, "
            "sequence_len, created_at, cache_shared) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                run_id, fields["total_sections"], fields["total_rows"], fields["cache_hits"],
                fields["cache_misses"], fields["total_tokenize_seconds"], fields["cache_bytes_after"],
                fields["cache_mode"], tokenizer_sha256, sequence_len, utc_now(), fields["cache_shared"],
            ),
        )  # fmt: skip

"""The history rows a train run replays or measures retention on, as token arrays beside the document's.

``dlm train`` (``dlmstore.train.stages.prepare``) asks the replay history
what to replay (:func:`dlmstore.replay.run_plan.plan`) once its own rows are
split for validation, tokenizes the drawn rows and the retention slice's
rows through the same cached pass as the document's (a row trained before
is a cache hit; after a base-model or ``sequence_len`` change it is
tokenized again from history's content), and appends the drawn rows to the
*train* rows only: a replayed row is never in val, and never in the
retention slice (which is never drawn). The rows' identity, which
checkpoints record and a resume checks, covers them, so a resume refuses a
changed draw.

A run with no candidate (the first, and any retrain of an unchanged
document whose history holds nothing else) trains on exactly the rows it
trained on before replay existed: the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlmstore.cache.preferences import TokenizedPreferences
    from dlmstore.corpus.assemble import Corpus
    from dlmstore.corpus.pass_result import PassResult, TokenizedRows
    from dlmstore.document.rows import Row
    from dlmstore.eval.probes import Probe
    from dlmstore.replay.candidates import Current
    from dlmstore.replay.run_plan import ReplayPlan, RetainedProbe
    from dlmstore.store.database import Store


@dataclass(frozen=True)
class ReplayTokens:
    """The replay plan's rows, tokenized.

    Attributes:
        sft: the drawn SFT rows (row-key order); None when none was drawn.
        preferences: the drawn preference triples; None when none was drawn.
        retention: the retention slice's rows the document no longer holds; None without them.
        misses: rows the pass tokenized (not found in the cache).
    """

    sft: TokenizedRows | None
    preferences: TokenizedPreferences | None
    retention: TokenizedRows | None
    misses: int


def trained_keys(corpus: Corpus, sft_keys: Sequence[str], preference_keys: Sequence[str]) -> list[str]:
    """The document's row keys a run trains (``sft_keys`` and ``preference_keys`` of its corpus), in
    corpus order: what the replay history records, and what a generation's identity is taken over."""
    keys = {*sft_keys, *preference_keys}
    return [row.row_key for row in corpus.rows() if row.row_key in keys]


def plan_replay(
    store: Store,
    corpus: Corpus,
    *,
    sft_keys: Sequence[str],
    preference_keys: Sequence[str],
    phases: Sequence[str],
    seed: int,
    no_replay: bool,
) -> ReplayPlan | None:
    """What the run replays (None when ``training.replay.enabled`` is false: history is off too)."""
    from dlmstore.replay.run_plan import NO_REPLAY, plan

    settings = corpus.document.frontmatter.training.replay
    if not settings.enabled:
        return None
    with store.read() as conn:
        return plan(
            conn,
            trained=trained_keys(corpus, sft_keys, preference_keys),
            preference_keys=frozenset(preference_keys),
            current=lambda: _current(corpus),
            settings=settings,
            seed=seed,
            phases=phases,
            skipped=NO_REPLAY if no_replay else None,
        )


def _current(corpus: Corpus) -> Current:
    """The document's rows as the replay history's candidates and retention need them."""
    from dlmstore.eval.probes import marked_keys
    from dlmstore.replay.candidates import Current
    from dlmstore.replay.history import describe

    described = describe(corpus, marked_keys(corpus.document.sections))
    return Current.of([(item.row_key, item.supersede_key) for item in described])


def replay_for(
    store: Store,
    run_id: int,
    corpus: Corpus | None,
    sft_keys: Sequence[str],
    preference_keys: Sequence[str],
    *,
    phases: Sequence[str],
    seed: int,
    tokenizer_sha256: str,
    tokenizer: Any,
    use_cache: bool,
    no_replay: bool,
) -> tuple[ReplayPlan | None, ReplayTokens | None]:
    """What a train run replays from history and measures retention on, tokenized (rank 0): the run
    trains ``sft_keys`` and ``preference_keys`` of its document (each empty without its phase) in
    ``phases``."""
    if corpus is None:
        return None, None
    replay = plan_replay(
        store, corpus, sft_keys=sft_keys, preference_keys=preference_keys, phases=phases, seed=seed,
        no_replay=no_replay,
    )  # fmt: skip
    if replay is None:
        return None, None
    tokens = tokenize_replay(
        store, corpus, replay, run_id=run_id, tokenizer_sha256=tokenizer_sha256, tokenizer=tokenizer,
        use_cache=use_cache,
    )  # fmt: skip
    return replay, tokens


def retained_probes(replay: ReplayPlan | None) -> tuple[Probe, ...]:
    """The probes of earlier versions the run asks beside the document's (``Probe.retained``)."""
    if replay is None:
        return ()
    return _as_probes(replay.retained_probes)


def _as_probes(found: Sequence[RetainedProbe]) -> tuple[Probe, ...]:
    from dlmstore.eval.probes import Probe

    return tuple(Probe(p.row_key, p.question, p.reference, True, retained=True) for p in found)


@dataclass(frozen=True)
class Retention:
    """What ``dlm eval`` measures retention on, as ``dlm train`` does after each phase.

    Attributes:
        rows: the retention slice's rows the document no longer holds, tokenized; None without them.
        probes: the ``!probe`` pairs of earlier versions the document no longer holds.
    """

    rows: TokenizedRows | None
    probes: tuple[Probe, ...]


def retention_of(
    store: Store, corpus: Corpus, *, run_id: int, tokenizer_sha256: str, tokenizer: Any, use_cache: bool
) -> Retention:
    """The replay history's retention slice rows and probes of earlier versions that the document at
    ``corpus`` no longer holds (:func:`dlmstore.replay.run_plan.retention`), the rows tokenized through the
    cache; nothing when ``training.replay.enabled`` is false or history holds neither.

    Raises:
        TrainingError: a row's content is damaged in store.db.
    """
    from dlmstore.replay.run_plan import retention

    if not corpus.document.frontmatter.training.replay.enabled:
        return Retention(None, ())
    with store.read() as conn:
        if not conn.execute(
            "SELECT EXISTS (SELECT 1 FROM history_rows WHERE retention = 1 OR probe = 1)"
        ).fetchone()[0]:
            return Retention(None, ())
        rows, probes = retention(conn, _current(corpus))
    if not rows:
        return Retention(None, _as_probes(probes))
    tokenized = _tokenized(
        store, corpus, rows, run_id=run_id, tokenizer_sha256=tokenizer_sha256, tokenizer=tokenizer,
        use_cache=use_cache,
    )  # fmt: skip
    return Retention(tokenized.rows, _as_probes(probes))


def tokenize_replay(
    store: Store,
    corpus: Corpus,
    replay: ReplayPlan,
    *,
    run_id: int,
    tokenizer_sha256: str,
    tokenizer: Any,
    use_cache: bool,
) -> ReplayTokens:
    """The plan's drawn and retention rows through the cache (one pass; nothing is recorded as an event)."""
    from dlmstore.corpus.dedup import kept_rows

    rows = (*(item.row for item in replay.drawn), *replay.retention)
    if not rows:
        return ReplayTokens(None, None, None, 0)
    result = _tokenized(
        store, corpus, rows, run_id=run_id, tokenizer_sha256=tokenizer_sha256, tokenizer=tokenizer,
        use_cache=use_cache,
    )  # fmt: skip
    if result.rows is None or result.preferences is None:  # a materializing pass always returns both
        raise RuntimeError("the tokenize pass returned no token arrays")
    retention_keys = {row.row_key for row in replay.retention}
    drawn_keys = set(result.rows.row_keys) - retention_keys
    sft = kept_rows(result.rows, retention_keys) if drawn_keys else None
    retention = kept_rows(result.rows, drawn_keys) if retention_keys else None
    preferences = result.preferences if len(result.preferences) else None
    return ReplayTokens(sft, preferences, retention, result.event.cache_misses)


def _tokenized(
    store: Store,
    corpus: Corpus,
    rows: tuple[Row, ...],
    *,
    run_id: int,
    tokenizer_sha256: str,
    tokenizer: Any,
    use_cache: bool,
) -> PassResult:
    """History's ``rows`` through the cache, in one pass (nothing is recorded as an event)."""
    from dlmstore.corpus.assemble import Corpus
    from dlmstore.corpus.tokenize import tokenize_pass

    settings = corpus.document.frontmatter.training
    return tokenize_pass(
        store, Corpus.of_rows(corpus.document, rows), run_id=run_id, tokenizer_sha256=tokenizer_sha256,
        load_tokenizer=lambda: tokenizer, use_cache=use_cache, cache_mode="on" if use_cache else "bypassed",
        max_bytes=settings.cache.max_bytes,
    )  # fmt: skip


def joined_rows(first: TokenizedRows, second: TokenizedRows | None) -> TokenizedRows:
    """``first``'s rows then ``second``'s (``first`` itself when there is no second)."""
    import numpy as np

    from dlmstore.corpus.pass_result import TokenizedRows

    if second is None or not len(second):
        return first
    dtype = np.result_type(first.values.dtype, second.values.dtype)
    values = np.concatenate([first.values.astype(dtype, copy=False), second.values.astype(dtype, copy=False)])
    offsets = np.concatenate([first.offsets, second.offsets[1:] + first.offsets[-1]])
    return TokenizedRows(first.row_keys + second.row_keys, first.kinds + second.kinds, offsets, values)


def joined_preferences(
    first: TokenizedPreferences, second: TokenizedPreferences | None
) -> TokenizedPreferences:
    """``first``'s triples then ``second``'s (``first`` itself when there is no second)."""
    from dlmstore.cache.preferences import Ragged, TokenizedPreferences

    if second is None or not len(second):
        return first

    def both(a: Ragged, b: Ragged) -> Ragged:
        return Ragged.of([a[i] for i in range(len(a))] + [b[i] for i in range(len(b))])

    return TokenizedPreferences(
        first.path, first.row_keys + second.row_keys, first.lines + second.lines,
        first.indices + second.indices, both(first.prompt, second.prompt),
        both(first.shared_prompt, second.shared_prompt), both(first.chosen, second.chosen),
        both(first.rejected, second.rejected),
    )  # fmt: skip

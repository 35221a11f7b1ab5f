"""The stages of ``dlm train``, each taking and returning typed values.

:func:`dlmstore.train.trainer.train_document` is the pipeline; this module
is its steps, in the order they run:

1. :func:`resolve` (every rank) - the document, its base model, the seed,
   the token datasets asked for and this machine's precision: a
   :class:`Setup`. Bad settings fail here, before anything is opened.
2. :func:`locate` (rank 0) - the base's converted folder and tokenizer
   fingerprint: a :class:`BaseFiles`.
3. :func:`begin` (rank 0, store open, run recorded) - debris swept, the
   checkpoint to resume found and its files verified, the token datasets
   checked, the lock validated: a :class:`Begun`.
4. :func:`tokenize` (rank 0) - the cached tokenize pass, recorded as the
   run's tokenization event: a :class:`Tokenized`.
5. :func:`prepare` (rank 0) - the rows' identity taken (and checked
   against the checkpoint's), the phases decided and the adapter the
   preference phase starts from: a :class:`Prepared`, which rank 0 hands
   every other rank (``dlmstore.train.distributed.share``).
6. :func:`train_phases` (every rank) - the model loaded once, the plan
   resolved (and checked against the checkpoint's), each phase trained
   (:mod:`dlmstore.train.loops`) and, on rank 0, its adapter staged: a
   :class:`Trained`.
7. :func:`publish` (rank 0) - the staged adapters published and registered
   with the run's lock, as one unit; the checkpoints nothing can resume
   from any more removed.

Every stage's cost is a field of what it returns, and the pipeline adds
them up into ``TrainTimings`` (``bench/bench_train.py`` prints the split).
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlmstore.bases import BaseModelRef
    from dlmstore.cache.preferences import TokenizedPreferences
    from dlmstore.corpus.assemble import Corpus
    from dlmstore.corpus.dedup import DedupReport
    from dlmstore.corpus.pass_result import PassResult, TokenizedRows
    from dlmstore.document.frontmatter import TrainingSettings
    from dlmstore.document.parser import Document
    from dlmstore.eval.probes import Probe
    from dlmstore.eval.results import PhaseEval
    from dlmstore.lock.run import PendingLock
    from dlmstore.replay.history import Pending
    from dlmstore.replay.run_plan import ReplayPlan
    from dlmstore.store.contamination import Contamination
    from dlmstore.store.database import Store
    from dlmstore.train.adapters import AdapterVersion, StagedVersion
    from dlmstore.train.checkpoints import Checkpoint
    from dlmstore.train.data.inputs import DatasetInput, DatasetSpec
    from dlmstore.train.distributed import World
    from dlmstore.train.loops.fit import PhaseFit
    from dlmstore.train.named.base_loan import BaseLoan
    from dlmstore.train.phases import PhasePlan
    from dlmstore.train.plan import Hardware, Precision, TrainingPlan


@dataclass(frozen=True)
class Options:
    """What the command line asks of a run (``dlm train``'s options; see ``train_document``)."""

    phase: str = "all"
    no_cache: bool = False
    max_steps: int | None = None
    epochs: int | None = None
    seed: int | None = None
    lock_mode: str = "validate"
    datasets: Sequence[str] = ()
    resume: bool = False
    fresh: bool = False
    no_share: bool = False
    no_replay: bool = False


@dataclass(frozen=True)
class Setup:
    """What every rank resolves before anything is opened: the document, its base, this machine."""

    document: Document
    ref: BaseModelRef
    seed: int
    specs: list[DatasetSpec]
    hardware: Hardware
    precision: Precision
    started: float  # perf_counter at the start of the run
    framework_import: float  # seconds importing torch, transformers, trl, peft, datasets

    @property
    def settings(self) -> TrainingSettings:
        return self.document.frontmatter.training


@dataclass(frozen=True)
class BaseFiles:
    """The base model's converted folder and its tokenizer's fingerprint (rank 0)."""

    folder: Path
    fingerprint: str


@dataclass(frozen=True)
class Begun:
    """A recorded run, started: what it resumes, the datasets it trains on, its lock (rank 0)."""

    tokenizer: Any  # the loaded Hugging Face tokenizer
    inputs: list[DatasetInput]
    checkpoint: Checkpoint | None
    resumed_from: int | None
    lock: PendingLock
    startup: float  # seconds from the start of the run, less the framework import
    warnings: tuple[str, ...]  # newer checkpoints passed over because they are damaged


@dataclass(frozen=True)
class Tokenized:
    """The run's tokenize pass: its result, materialized (rank 0)."""

    result: PassResult
    rows: TokenizedRows
    preferences: TokenizedPreferences
    source_warnings: tuple[str, ...]
    seconds: float
    dedup: DedupReport | None = None  # the duplicate clusters of its text rows (dlmstore.corpus.dedup)
    contamination: Contamination | None = None  # held-out rows that duplicate training rows (corpus.holdout)
    corpus: Corpus | None = None  # the rows' document and sources: what the replay history records


@dataclass(frozen=True)
class Prepared:
    """What rank 0 prepares before the model loads, and hands every other rank."""

    run_id: int
    store_path: Path
    rows: TokenizedRows
    preferences: TokenizedPreferences
    phases: PhasePlan
    parent: AdapterVersion | None  # the SFT adapter a run without SFT starts its preference phase from
    inputs: list[DatasetInput]
    resume: Checkpoint | None
    resumed_from: int | None
    rows_sha256: str  # the identity of the rows the run trains on (its checkpoints record it)
    val_rows: TokenizedRows | None = None  # the rows held out for validation (dlmstore.eval.split)
    probes: tuple[Probe, ...] = ()  # what the base and each phase's adapter are asked (dlmstore.eval.probes)
    val_history: tuple[tuple[int, float | None], ...] = ()  # the val losses of the run resumed, to its step
    warnings: tuple[str, ...] = ()  # validation rows that duplicate training rows (dlmstore.corpus.dedup)
    replay: ReplayPlan | None = None  # what the run replays from history (dlmstore.replay.run_plan)
    retention: TokenizedRows | None = None  # the retention slice's rows the document no longer holds
    retained: tuple[Probe, ...] = ()  # the probes of earlier versions, asked beside ``probes``
    previous: dict[str, AdapterVersion] = dataclasses.field(default_factory=dict)  # newest adapter by phase


@dataclass(frozen=True)
class Trained:
    """What training the planned phases gave: one fit per phase, and (rank 0) their staged adapters."""

    fits: list[PhaseFit]
    staged: list[StagedVersion]
    plan: TrainingPlan
    model_load: float
    accounting: dict[str, Any] | None  # this rank's SFT accounting (``dlmstore.train.data.usage``)
    evaluations: list[PhaseEval] = dataclasses.field(default_factory=list)  # after each phase (rank 0's)


def resolve(path: str, options: Options, *, adapter: str | None = None) -> Setup:
    """Parse the document and check its training settings against this machine (every rank).

    With ``adapter``, the document is the view the named adapter trains on
    (:func:`dlmstore.document.adapter_routing.scoped`): its rows and its LoRA settings.

    Raises:
        DocumentError, SourceError: the document is invalid.
        BaseModelError: the base model cannot be resolved.
        TrainingError: the settings ask for what this machine cannot train,
            or a ``--dataset`` option is malformed.
    """
    from dlmstore.bases import resolve_base
    from dlmstore.document.parser import parse_document
    from dlmstore.train.data.inputs import dataset_specs
    from dlmstore.train.plan import check_settings, probe_hardware

    started = time.perf_counter()
    document = parse_document(path)
    if adapter is not None:
        from dlmstore.document.adapter_routing import scoped

        document = scoped(document, adapter)
    settings = document.frontmatter.training
    specs = dataset_specs(document, options.datasets)
    ref = resolve_base(document.base_model, relative_to=document.directory)
    t0 = time.perf_counter()
    _import_frameworks()
    framework_import = time.perf_counter() - t0
    hardware = probe_hardware()
    return Setup(
        document=document,
        ref=ref,
        seed=settings.seed if options.seed is None else options.seed,
        specs=specs,
        hardware=hardware,
        precision=check_settings(settings, hardware),
        started=started,
        framework_import=framework_import,
    )


def locate(setup: Setup) -> BaseFiles:
    """The base's folder and fingerprint; converts a built-in base once and fails fast on a broken one."""
    from dlmstore.bases import model_source, tokenizer_source
    from dlmstore.fingerprint import tokenizer_sha256

    tokenizer_source(setup.ref)
    folder = model_source(setup.ref)
    return BaseFiles(folder=Path(folder), fingerprint=tokenizer_sha256(setup.ref))


def begin(store: Store, run_id: int, setup: Setup, base: BaseFiles, options: Options, world: World) -> Begun:
    """Sweep what dead runs left, find the checkpoint to resume, check the datasets, validate the lock.

    Raises:
        TrainingError: no checkpoint to resume, none that verifies, or it
            belongs to another setup; a token dataset cannot train.
        LockValidationError: the runtime differs from the lock in an ERROR field.
    """
    from dlmstore.bases import load_tokenizer
    from dlmstore.lock import begin_lock
    from dlmstore.store.runs import set_resumed_from
    from dlmstore.train.adapters import sweep_debris
    from dlmstore.train.checkpoints import check_identity, resumable, run_identity, sweep_unregistered
    from dlmstore.train.data.inputs import check_dataset_input, context_length

    sweep_debris(store, run_id=run_id)  # after start_run marked dead runs failed
    resumption = resumable(store, before=run_id, adapter=setup.document.adapter) if options.resume else None
    checkpoint = None if resumption is None else resumption.checkpoint
    if resumption is not None:
        set_resumed_from(store, run_id, resumption.run_id)
    sweep_unregistered(store)
    tokenizer = load_tokenizer(setup.ref)
    inputs = [
        check_dataset_input(
            spec,
            tokenizer_sha256=base.fingerprint,
            vocab_size=len(tokenizer),
            sequence_len=setup.settings.sequence_len,
            context_len=context_length(base.folder),
        )  # fmt: skip
        for spec in setup.specs
    ]
    if checkpoint is not None:
        check_identity(
            checkpoint, run_identity(setup.document, setup.ref, inputs, world.size, setup.seed, None),
            fields=("base_model", "dlm_sha256", "inputs_sha256", "seed"),  # not the world size: elastic
        )  # fmt: skip
    lock = begin_lock(
        store, setup.document, setup.ref, seed=setup.seed, run_id=run_id, mode=options.lock_mode,
        datasets=[item.identity() for item in inputs],
    )  # fmt: skip
    return Begun(
        tokenizer=tokenizer,
        inputs=inputs,
        checkpoint=checkpoint,
        resumed_from=None if resumption is None else resumption.run_id,
        lock=lock,
        startup=time.perf_counter() - setup.started - setup.framework_import,
        warnings=() if resumption is None else resumption.warnings,
    )


def tokenize(
    store: Store, run_id: int, setup: Setup, base: BaseFiles, tokenizer: Any, options: Options
) -> Tokenized:
    """The same pass as ``dlm tokenize`` (through the cache unless ``--no-cache``), recorded for this run.

    The duplicate clusters of its text rows are recorded too, and the rows
    ``training.dedup`` drops are left out of what it returns (none when it
    is ``off``: the rows are the pass's own). The rows of the validation
    split under the run's seed that duplicate training rows are found
    (:mod:`dlmstore.corpus.holdout`); :func:`prepare` records them.
    """
    from dlmstore.cache.share import stat_records
    from dlmstore.collector import paused
    from dlmstore.corpus import holdout
    from dlmstore.corpus.assemble import load_corpus
    from dlmstore.corpus.dedup import analyse, kept_rows, signing
    from dlmstore.corpus.tokenize import tokenize_pass
    from dlmstore.store.events import record_tokenization_event

    settings = setup.settings
    use_cache = settings.cache.enabled and not options.no_cache
    mode = "bypassed" if options.no_cache else ("on" if settings.cache.enabled else "off")
    t0 = time.perf_counter()
    with paused():  # one object per source file, none in a cycle (dlmstore.collector)
        share = settings.cache.share and not options.no_share
        stats = stat_records(store, share=share) if use_cache else None
        corpus = load_corpus(setup.document, stat_cache=stats)
        signer = signing(store, corpus)
        result = tokenize_pass(
            store, corpus, run_id=run_id, tokenizer_sha256=base.fingerprint,
            load_tokenizer=lambda: tokenizer, use_cache=use_cache, cache_mode=mode,
            max_bytes=settings.cache.max_bytes, share=share, signer=signer,
        )  # fmt: skip
    record_tokenization_event(
        store, run_id, result.event, tokenizer_sha256=base.fingerprint, sequence_len=settings.sequence_len
    )
    if stats is not None:
        stats.save(store)
    rows, preferences = result.rows, result.preferences
    if rows is None or preferences is None:  # a materializing pass always returns both
        raise RuntimeError("the tokenize pass returned no token arrays")
    with paused():
        dedup = analyse(store, corpus, run_id=run_id, mode=settings.dedup, signed=signer, share=share)
        rows = kept_rows(rows, dedup.dropped())
        contamination = holdout.find(store, corpus, dedup, run_id=run_id, seed=setup.seed)
    return Tokenized(
        result=result,
        rows=rows,
        preferences=preferences,
        source_warnings=corpus.expansion.warnings,
        seconds=time.perf_counter() - t0,
        dedup=dedup,
        contamination=contamination,
        corpus=corpus,
    )


def prepare(
    store: Store, run_id: int, setup: Setup, begun: Begun, tokenized: Tokenized, options: Options
) -> Prepared:
    """Take the rows' identity, decide the phases and find the adapter a preference-only run starts from.

    Raises:
        TrainingError: the .dlm/training.yaml weights drop every row that
            would train; the rows differ from the checkpoint's (a source file
            changed), nothing to train for the phases asked, or no SFT
            adapter for the preference phase to start from.
    """
    from dlmstore.corpus.holdout import warning
    from dlmstore.corpus.weights import weighed_split
    from dlmstore.errors import TrainingError
    from dlmstore.eval.probes import extract_probes, marked_keys
    from dlmstore.store.contamination import record
    from dlmstore.train.adapters import comparable_adapters
    from dlmstore.train.checkpoints import check_identity, rows_sha256
    from dlmstore.train.data.examples import held_out
    from dlmstore.train.data.replay_rows import joined_preferences, joined_rows, replay_for, retained_probes
    from dlmstore.train.loops.validation import val_history
    from dlmstore.train.phases import plan_phases, starting_adapter

    document = setup.document
    found = tokenized.contamination
    # Held-out rows training.dedup keeps out of the split (exact: near copies of training rows) train.
    kept_out = frozenset() if found is None else found.kept_out()
    train_rows, val_rows = held_out(tokenized.rows, setup.seed, marked_keys(document.sections) | kept_out)
    # .dlm/training.yaml weights (dlmstore.corpus.weights): the training side repeats, the replay
    # history records each row that trains once
    unweighed = len(train_rows)
    train_rows, val_rows = weighed_split(tokenized.corpus, train_rows, val_rows, setup.seed)
    if unweighed and not len(train_rows):
        raise TrainingError(
            f"{document.path}: the weights of .dlm/training.yaml drop every row that would train",
            hint="give a tag of some of these rows a weight above 0, or remove the weights",
        )
    distinct_keys = tuple(dict.fromkeys(train_rows.row_keys))
    phases = plan_phases(
        options.phase, setup.settings.preference, path=str(document.path),
        sft_rows=len(train_rows), sft_datasets=len(begun.inputs), preference_rows=len(tokenized.preferences),
    )  # fmt: skip
    replay, tokens = replay_for(
        store, run_id, tokenized.corpus, distinct_keys if phases.sft else (),
        tokenized.preferences.row_keys if phases.preference else (),
        phases=[name for name, on in (("sft", phases.sft), ("preference", phases.preference)) if on],
        seed=setup.seed,
        tokenizer_sha256=tokenized.result.tokenizer_sha256, tokenizer=begun.tokenizer,
        use_cache=setup.settings.cache.enabled and not options.no_cache, no_replay=options.no_replay,
    )  # fmt: skip
    preferences = tokenized.preferences
    if tokens is not None:  # drawn rows train, never in val
        train_rows = joined_rows(train_rows, tokens.sft)
        preferences = joined_preferences(preferences, tokens.preferences)
    rows = rows_sha256(train_rows.row_keys, preferences.row_keys)
    if begun.checkpoint is not None:
        current = dataclasses.replace(begun.checkpoint.identity, rows_sha256=rows)
        check_identity(begun.checkpoint, current, fields=("rows_sha256",))
    checkpoint = begun.checkpoint
    contaminated = None  # held-out rows that duplicate training rows
    if found is not None:
        found = dataclasses.replace(found, val_rows=len(val_rows))
        with store.write() as conn:
            record(conn, run_id, found)
        contaminated = warning(found)
    return Prepared(
        run_id=run_id,
        store_path=store.path,
        rows=train_rows,
        preferences=preferences,
        phases=phases,
        parent=starting_adapter(store, document) if phases.needs_prior_adapter else None,
        inputs=begun.inputs,
        resume=begun.checkpoint,
        resumed_from=begun.resumed_from,
        rows_sha256=rows,
        val_rows=val_rows,
        probes=tuple(extract_probes(document.sections, seed=setup.seed)),
        val_history=val_history(store, begun.resumed_from, None if checkpoint is None else checkpoint.step),
        warnings=() if contaminated is None else (contaminated,),
        replay=replay,
        retention=None if tokens is None else tokens.retention,
        retained=retained_probes(replay),
        previous={}
        if replay is None or not replay.retention
        else comparable_adapters(store, document.base_model, name=document.adapter),
    )


def train_phases(
    store: Store | None,
    prepared: Prepared,
    setup: Setup,
    tokenizer: Any,
    world: World,
    options: Options,
    loan: BaseLoan | None = None,
) -> Trained:
    """Load the model once and train the planned phases; stage each phase's adapter (rank 0).

    ``store`` is None on the other ranks, which train the same phases on
    their share and stage nothing. Nothing is published: on any failure the
    staged folders are removed. With ``loan`` (a multi-adapter invocation),
    the base is borrowed from it and given back, its adapter layers removed.
    """
    from dlmstore.eval.results import ModelEval
    from dlmstore.train.checkpoints import (
        check_identity,
        laid_out,
        plan_settings,
        read_layout,
        run_folder,
        run_identity,
    )
    from dlmstore.train.data.examples import training_examples, validation_examples
    from dlmstore.train.data.preference_data import training_preferences
    from dlmstore.train.loops.preference import fit_preference, load_policy
    from dlmstore.train.loops.supervised import fit_sft
    from dlmstore.train.loops.validation import after_phase
    from dlmstore.train.plan import dlm_target_modules, resolve_plan

    document, ref, seed = setup.document, setup.ref, setup.seed
    settings = setup.settings
    phases, parent, checkpoint = prepared.phases, prepared.parent, prepared.resume
    fits: list[PhaseFit] = []
    staged: list[StagedVersion] = []
    accounting: dict[str, Any] | None = None
    evaluations: list[PhaseEval] = []
    base: ModelEval | None = None  # the base's evaluation, measured after the first phase
    answered: dict[str, list[list[int]]] = {}  # the probes' answers so far: drafts for the next model
    system_prompt = document.frontmatter.system_prompt

    retention = validation_examples(prepared.retention, (), sequence_len=settings.sequence_len)

    def evaluated(fit: Any) -> None:
        """The base and ``fit``'s adapter after its phase (the base measured once, by the first phase)."""
        nonlocal base
        previous = prepared.previous.get(fit.phase)
        evaluations.append(
            after_phase(fit, tokenizer, val, prepared.probes, system_prompt, world, plan.micro_batch_size,
                        base, answered, retained=prepared.retained, retention=retention,
                        previous=None if previous is None else prepared.store_path / previous.path)
        )  # fmt: skip
        base = evaluations[-1].base

    with warnings.catch_warnings(), _aborting(staged, loan):
        # transformers deprecation notices about its own internals are noise here
        warnings.filterwarnings("ignore", category=FutureWarning)
        t0 = time.perf_counter()
        if loan is None:
            model = load_base_model(ref, settings.adapter, setup.precision, seed=seed)
        else:
            model = loan.borrow(
                (ref.name, settings.adapter, str(setup.precision)),
                lambda: load_base_model(ref, settings.adapter, setup.precision, seed=seed),
                seed=seed,
            )  # fmt: skip
        base_params = model.num_parameters()
        if parent is not None:
            model = load_policy(model, prepared.store_path / parent.path)
        model_load = time.perf_counter() - t0
        plan = resolve_plan(
            settings, setup.hardware, base_params=base_params, auto_target_modules=dlm_target_modules(ref),
            epochs=options.epochs, max_steps=options.max_steps, seed=seed,
        )  # fmt: skip
        identity = run_identity(
            document, ref, prepared.inputs, world.size, seed, plan, rows_sha256=prepared.rows_sha256
        )
        if checkpoint is not None:
            # the gradient accumulation follows the world size (checkpoints.Layout): the global batch is checked
            check_identity(
                checkpoint, identity, fields=("micro_batch_size", "plan_sha256"), settings=plan_settings(plan)
            )  # fmt: skip
        if phases.sft:
            t0 = time.perf_counter()
            dataset, names = training_examples(
                prepared.rows, prepared.inputs, sequence_len=settings.sequence_len, seed=seed
            )
            layout, grad_accum = laid_out(checkpoint, plan, world.size, len(dataset))  # type: ignore[arg-type]
            if grad_accum != plan.grad_accum:  # resumed on another world size, at the run's global batch
                plan = dataclasses.replace(
                    plan, grad_accum=grad_accum, effective_batch_size=plan.micro_batch_size * grad_accum
                )
                identity = dataclasses.replace(identity, grad_accum=grad_accum)
            val = validation_examples(prepared.val_rows, prepared.inputs, sequence_len=settings.sequence_len)
            dataset_seconds = time.perf_counter() - t0
            fit = fit_sft(
                store, prepared.run_id, model, tokenizer, dataset, len(names), plan, world=world,
                checkpoint_steps=settings.checkpoint_steps,
                checkpoint_dir=run_folder(prepared.store_path, prepared.run_id),
                identity=identity, layout=layout, resume_from=None if checkpoint is None else checkpoint.path,
                resumed_layout=None if checkpoint is None else read_layout(checkpoint),
                store_path=prepared.store_path, dlm_id=document.dlm_id, val=val, val_history=prepared.val_history,
            )  # fmt: skip
            fit.dataset_seconds = dataset_seconds
            accounting = fit.accounting
            if store is not None:
                staged.append(_stage(store, prepared.run_id, document, fit))
            evaluated(fit)
            fits.append(fit)
            model = fit.model
            plan = fit.plan
        if phases.preference:
            t0 = time.perf_counter()
            preference_dataset = training_preferences(
                prepared.preferences, tokenizer, settings.preference.method, settings.sequence_len
            )
            dataset_seconds = time.perf_counter() - t0
            fit = fit_preference(
                store, prepared.run_id, model, tokenizer, preference_dataset, plan, settings.preference
            )
            fit.dataset_seconds = dataset_seconds
            fits.append(fit)
            if store is not None:
                staged.append(_stage(store, prepared.run_id, document, fit, parent=parent))
            if not phases.sft:  # the SFT phase built the same val examples already
                val = validation_examples(
                    prepared.val_rows, prepared.inputs, sequence_len=settings.sequence_len
                )
            evaluated(fit)
            if not phases.sft:
                plan = fit.plan
        if loan is not None:
            loan.give_back(fits[-1].model if fits else model)
    return Trained(
        fits=fits,
        staged=staged,
        plan=plan,
        model_load=model_load,
        accounting=accounting,
        evaluations=evaluations,
    )


def publish(
    store: Store,
    trained: Trained,
    lock: PendingLock,
    setup: Setup,
    prepared: Prepared,
    options: Options,
    tokenized: Tokenized | None = None,
) -> tuple[list[AdapterVersion], list[str]]:
    """Publish the staged adapters and register them with the run's lock, as one unit; remove the
    checkpoints nothing can resume from any more. Returns the adapters and a warning per interrupted
    run whose checkpoints are kept (``--fresh`` removes them).

    The folders are renamed to their versions, then one transaction inserts
    their rows and the lock record, records the rows the run trained in the
    replay history (``tokenized``'s corpus, when ``training.replay.enabled``;
    :mod:`dlmstore.replay.history`) and writes ``dlm.lock`` before it
    commits. On any failure the published folders are removed again, so the
    run registers all its adapters, its lock and its history, or nothing.
    The save time is added to the last fit's.
    """
    from dlmstore.lock import commit_lock
    from dlmstore.train.adapters import commit_versions
    from dlmstore.train.checkpoints import remove_finished

    preference = setup.settings.preference if prepared.phases.preference else None
    t0 = time.perf_counter()
    history = _history(store, setup, prepared, tokenized)
    adapters = commit_versions(
        store,
        trained.staged,
        lambda: _recording(
            commit_lock(
                store,
                lock,
                preference=preference,
                replay=None if prepared.replay is None else prepared.replay.lock_record(),
            ),
            prepared,
            trained,
            history,
        ),  # fmt: skip
    )
    kept = remove_finished(store, run_id=prepared.run_id, fresh=options.fresh)
    trained.fits[-1].save_seconds += time.perf_counter() - t0
    return adapters, kept


def _history(store: Store, setup: Setup, prepared: Prepared, tokenized: Tokenized | None) -> Pending | None:
    """What the replay history will record of the run: the rows it trained, their content read and
    compressed where history lacks it (before the publish transaction, so it stays short)."""
    from dlmstore.eval.probes import marked_keys
    from dlmstore.replay.history import describe, pending
    from dlmstore.train.data.replay_rows import trained_keys

    if tokenized is None or tokenized.corpus is None or not setup.settings.replay.enabled:
        return None
    corpus = tokenized.corpus
    # The document's rows the run trained (the replayed rows are history's already: not its corpus's).
    trained = trained_keys(
        corpus,
        prepared.rows.row_keys if prepared.phases.sft else (),
        prepared.preferences.row_keys if prepared.phases.preference else (),
    )
    # Described only when history needs the rows: an unchanged retrain does not.
    return pending(
        store, trained, lambda: describe(corpus, marked_keys(setup.document.sections)), setup.settings.replay
    )


@contextmanager
def _recording(
    transaction: AbstractContextManager[sqlite3.Connection],
    prepared: Prepared,
    trained: Trained,
    history: Pending | None = None,
) -> Iterator[sqlite3.Connection]:
    """``transaction``, recording each phase's evaluations once its adapters are registered in it,
    and the run's rows in the replay history."""
    from dlmstore.eval.results import record_evaluation, with_version

    with transaction as conn:
        yield conn
        if history is not None:
            from dlmstore.replay.history import record_run

            record_run(conn, prepared.run_id, history)
            if prepared.replay is not None:
                from dlmstore.replay.run_plan import record

                # As drawn: when another run of the store published meanwhile, its generation may differ.
                record(conn, prepared.run_id, prepared.replay)
        versions = dict(
            conn.execute(
                "SELECT phase, version FROM adapters WHERE run_id = ?", (prepared.run_id,)
            ).fetchall()
        )
        for index, item in enumerate(trained.evaluations):
            adapter = with_version(item.adapter, versions[item.phase])
            trained.evaluations[index] = dataclasses.replace(item, adapter=adapter)
            record_evaluation(conn, prepared.run_id, item.phase, item.base)
            record_evaluation(conn, prepared.run_id, item.phase, adapter, item.early_stop)


@contextmanager
def _aborting(staged: list[StagedVersion], loan: BaseLoan | None = None) -> Iterator[None]:
    """Remove the staged folders in ``staged`` (and empty ``loan``) when the block fails."""
    try:
        yield
    except BaseException:
        for item in staged:
            item.abort()
        if loan is not None:
            loan.empty()
        raise


def _stage(
    store: Store, run_id: int, document: Document, fit: PhaseFit, *, parent: AdapterVersion | None = None
) -> StagedVersion:
    """Write, check and stage a phase's adapter; ``parent`` is the prior SFT adapter, if any.

    A preference phase after this run's SFT phase has ``parent`` None: its
    parent is the SFT adapter staged before it.
    """
    from dlmstore.train.adapters import stage_version

    t0 = time.perf_counter()
    staged = stage_version(
        store, run_id=run_id, write=fit.save, base_model=document.base_model, steps=fit.steps,
        final_loss=fit.final_loss, phase=fit.phase, method=fit.method,
        parent_version=None if parent is None else parent.version,
        parent_staged=fit.phase == "preference" and parent is None,
    )  # fmt: skip
    fit.save_seconds = time.perf_counter() - t0
    return staged


def _import_frameworks() -> None:
    """Import the training stack up front, so its cost is measured as one phase."""
    import datasets  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401


def load_base_model(ref: BaseModelRef, adapter: str, precision: Precision, *, seed: int) -> Any:
    """The base model in the plan's precision (4-bit for QLoRA), seeded and deterministic first."""
    from dlmstore.bases import load_model
    from dlmstore.determinism import apply_determinism, seed_everything
    from dlmstore.train.plan import model_load_kwargs

    seed_everything(seed)
    apply_determinism()
    model = load_model(ref, **model_load_kwargs(adapter, precision))
    if adapter == "qlora":
        from peft import prepare_model_for_kbit_training

        # What peft and bitsandbytes require before LoRA wraps a 4-bit model
        # (DLM does the same, without gradient checkpointing unless memory is short).
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)  # type: ignore[no-untyped-call]
    return model

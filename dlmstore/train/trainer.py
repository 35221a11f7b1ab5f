"""``dlm train``: LoRA adapters from a document's rows, as one recorded run.

A run has up to two phases (``dlmstore.train.phases`` decides which): SFT
on the text and instruction rows, then the preference phase (DPO or ORPO,
``dlmstore.train.preference``) on the prompt/chosen/rejected rows, starting
from the adapter SFT produced. The pipeline, each step timed (the split
``bench/bench_train.py`` and ``bench/bench_preference.py`` print):

1. **startup** - parse the document, resolve the base model (a missing or
   unloadable base is an error before any work), check the training
   settings against this machine (``dlmstore.train.plan``: QLoRA without
   CUDA, an optimizer's missing package or a precision the device cannot
   train in is an error before any work too), open the store, validate the
   reproducibility lock (``dlmstore.lock``);
2. **tokenize** - the same pass as ``dlm tokenize`` (through the cache unless
   ``--no-cache``), recorded as this run's tokenization event; preference
   rows are tokenized there too;
3. **dataset** - the SFT phase's examples are views of the token arrays
   and of the token datasets' memory maps (``dlmstore.train.examples``: no
   per-token Python objects, no Arrow copy); the preference phase's columns
   are computed from the cached token arrays (``dlmstore.train.preference_data``),
   so TRL tokenizes nothing. The phases are decided here, and a preference
   row that cannot train (a prompt longer than ``sequence_len``, chosen
   equal to rejected) or a token dataset that cannot
   (``dlmstore.train.inputs``) is an error, all before the model loads;
4. **model load** - the base model from its converted folder, in the
   plan's precision, once for both phases; the rest of the plan (the
   automatic micro-batch needs the parameter count) is resolved;
5. **train** - transformers' ``Trainer`` with our loader and checkpoints
   (``dlmstore.train.supervised``; LoRA or DoRA applied through peft),
   then TRL's ``DPOTrainer`` or ORPO trainer on the same model; every
   logged step goes to ``train_steps`` with its phase, and the other
   values TRL logs (the preference rewards) to ``train_step_metrics``;
6. **save** - each phase's adapter is checked finite
   (``dlmstore.train.integrity``) and staged as soon as its phase ends;
   when every phase has trained, the staged folders are published as the
   next versions and registered with their sha256 and phase in the same
   transaction that records the lock and writes ``dlm.lock``
   (``dlmstore.train.adapters``, ``dlmstore.lock.commit_lock``). A run
   registers all its adapters and its lock, or nothing.

A run starts by sweeping what earlier runs that are no longer running
left behind (``dlmstore.train.adapters.sweep_debris``). A logged loss or
gradient norm that is not finite stops the run at that step.

Seeds (python, numpy, torch, the trainer's data order) and the deterministic
flags are set before the model is built and again before the preference
phase, so two runs with the same inputs on the same machine produce
byte-identical ``adapter_model.safetensors`` (``tests/test_training.py``,
``tests/test_preference_training.py`` and the golden test check this).
"""

from __future__ import annotations

import dataclasses
import gc
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmstore.train.adapters import Phase, PreferenceMethod
from dlmstore.train.plan import Precision, TrainingPlan
from dlmstore.train.summary import PhaseSummary, TrainSummary, TrainTimings


@dataclass
class _Prepared:
    """What rank 0 prepares before the model loads, and hands every other rank."""

    run_id: int
    store_path: str
    rows: Any
    preferences: Any
    phases: Any
    parent: Any
    inputs: list[Any]
    resume: Any  # a checkpoints.Checkpoint, or None
    resumed_from: int | None


def train_document(
    path: str,
    *,
    phase: str = "all",
    no_cache: bool = False,
    max_steps: int | None = None,
    epochs: int | None = None,
    seed: int | None = None,
    lock_mode: str = "validate",
    datasets: Sequence[str] = (),
    resume: bool = False,
) -> TrainSummary:
    """Train a LoRA adapter on the document at ``path``: SFT, then the preference phase.

    Args:
        path: the .dlm document.
        phase: ``all`` (default), ``sft`` or ``preference`` (``--phase``;
            the rules are in ``dlmstore.train.phases``).
        no_cache: tokenize every row, neither reading nor writing the cache.
        max_steps, epochs, seed: override ``training.max_steps`` /
            ``training.num_epochs`` / ``training.seed`` (``max_steps`` caps
            each phase; ``epochs`` is SFT's, the preference phase has its own).
        lock_mode: ``validate`` (default), ``strict``, ``update`` or ``ignore``
            (``--strict-lock`` / ``--update-lock`` / ``--ignore-lock``).
        datasets: ``DIR[:WEIGHT]`` token datasets to train on besides
            ``training.datasets`` (``--dataset``).
        resume: continue the newest train run, which was interrupted, from
            its last checkpoint (``--resume``).

    Launched as one of several ranks (``dlm train --nproc``, torchrun),
    rank 0 does everything that touches the store and every rank trains on
    its share (``dlmstore.train.distributed``); every rank returns the
    summary.

    Progress (``dlmstore.progress``): the tokenize pass, the model load and
    each phase's steps report as tasks to the sink installed by the caller.

    Raises:
        DocumentError, SourceError: the document or its sources are invalid.
        BaseModelError: the base model cannot be resolved or loaded.
        LockValidationError: the runtime differs from the lock in an ERROR field.
        StoreError: the store or the adapter cannot be written.
        TrainingError: the document has nothing to train on for the phases
            asked, the preference phase has no SFT adapter to start from or
            a preference row cannot train, the settings ask for what this
            machine cannot train (``dlmstore.train.plan.check_settings``), a
            token dataset cannot train (``dlmstore.train.inputs``), or there
            is no checkpoint to resume or it belongs to another setup.
    """
    from dlmstore.train.distributed import current_world, join, leave

    world = current_world()
    join(world)
    try:
        return _train(
            path, world, phase=phase, no_cache=no_cache, max_steps=max_steps, epochs=epochs, seed=seed,
            lock_mode=lock_mode, datasets=datasets, resume=resume,
        )  # fmt: skip
    finally:
        leave(world)


def _train(
    path: str,
    world: Any,
    *,
    phase: str,
    no_cache: bool,
    max_steps: int | None,
    epochs: int | None,
    seed: int | None,
    lock_mode: str,
    datasets: Sequence[str],
    resume: bool,
) -> TrainSummary:
    from dlmstore.bases import load_tokenizer, model_source, resolve_base, tokenizer_source
    from dlmstore.corpus.tokenize import tokenize_pass
    from dlmstore.collector import paused
    from dlmstore.corpus.assemble import load_corpus
    from dlmstore.document.parser import parse_document
    from dlmstore.corpus.show import document_warnings
    from dlmstore.errors import DlmError
    from dlmstore.fingerprint import tokenizer_sha256
    from dlmstore.lock import begin_lock
    from dlmstore.sources.statcache import StatCache
    from dlmstore.store.database import open_store
    from dlmstore.store.events import record_tokenization_event
    from dlmstore.store.runs import recorded_run, set_resumed_from
    from dlmstore.train.adapters import sweep_debris
    from dlmstore.train.checkpoints import check_identity, resumable, run_identity, sweep_unregistered
    from dlmstore.train.distributed import share
    from dlmstore.train.inputs import check_dataset_input, context_length, dataset_specs
    from dlmstore.train.phases import plan_phases, starting_adapter
    from dlmstore.train.plan import check_settings, probe_hardware
    from dlmstore.train.usage import gather_accounting, record_usage, write_rank_samples

    started = time.perf_counter()
    document = parse_document(path)
    settings = document.frontmatter.training
    seed = settings.seed if seed is None else seed
    specs = dataset_specs(document, datasets)
    ref = resolve_base(document.base_model, relative_to=document.directory)
    t0 = time.perf_counter()
    _import_frameworks()
    framework_import = time.perf_counter() - t0
    hardware = probe_hardware()
    precision = check_settings(settings, hardware)
    if not world.is_main:
        prepared: _Prepared = share(world)
        tokenizer = load_tokenizer(ref)
        fits, _, _, _, accounting = _train_phases(
            None, prepared, document, ref, tokenizer, precision, hardware, world,
            epochs=epochs, max_steps=max_steps, seed=seed,
        )  # fmt: skip
        write_rank_samples(Path(prepared.store_path), prepared.run_id, world, accounting)
        gather_accounting(world, accounting)
        summary: TrainSummary = share(world)
        return summary
    tokenizer_source(ref)  # converts a built-in once; fails fast on a broken base
    folder = model_source(ref)
    fingerprint = tokenizer_sha256(ref)
    use_cache = settings.cache.enabled and not no_cache
    mode = "bypassed" if no_cache else ("on" if settings.cache.enabled else "off")
    with open_store(document.dlm_id) as store:
        with recorded_run(
            store, command="train", dlm_path=document.path, dlm_sha256=document.sha256, world_size=world.size
        ) as run_id:
            try:
                sweep_debris(store, run_id=run_id)  # after start_run marked dead runs failed
                resumed_from, checkpoint = resumable(store, before=run_id) if resume else (None, None)
                if resumed_from is not None:
                    set_resumed_from(store, run_id, resumed_from)
                sweep_unregistered(store)
                marks = {"framework_import": framework_import}
                tokenizer = load_tokenizer(ref)
                inputs = [
                    check_dataset_input(
                        spec,
                        tokenizer_sha256=fingerprint,
                        vocab_size=len(tokenizer),
                        sequence_len=settings.sequence_len,
                        context_len=context_length(Path(folder)),
                    )  # fmt: skip
                    for spec in specs
                ]
                if checkpoint is not None:
                    check_identity(
                        checkpoint, run_identity(document, ref, inputs, world.size, seed, None),
                        fields=("base_model", "dlm_sha256", "inputs_sha256", "world_size", "seed"),
                    )  # fmt: skip
                lock = begin_lock(
                    store, document, ref, seed=seed, run_id=run_id, mode=lock_mode,
                    datasets=[item.identity() for item in inputs],
                )  # fmt: skip
                marks["startup"] = time.perf_counter() - started - marks["framework_import"]
                t0 = time.perf_counter()
                with paused():  # one object per source file, none in a cycle (dlmstore.collector)
                    stats = StatCache.load(store) if use_cache else None
                    corpus = load_corpus(document, stat_cache=stats)
                    result = tokenize_pass(
                        store, corpus, run_id=run_id, tokenizer_sha256=fingerprint,
                        load_tokenizer=lambda: tokenizer, use_cache=use_cache, cache_mode=mode,
                        max_bytes=settings.cache.max_bytes,
                    )  # fmt: skip
                record_tokenization_event(
                    store,
                    run_id,
                    result.event,
                    tokenizer_sha256=fingerprint,
                    sequence_len=settings.sequence_len,
                )
                if stats is not None:
                    stats.save(store)
                marks["tokenize"] = time.perf_counter() - t0
                rows = result.rows
                preferences = result.preferences
                assert rows is not None and preferences is not None  # materialized
                phases = plan_phases(
                    phase, settings.preference, path=str(document.path),
                    sft_rows=len(rows), sft_datasets=len(inputs), preference_rows=len(preferences),
                )  # fmt: skip
                parent = starting_adapter(store, document) if phases.needs_prior_adapter else None
                prepared = _Prepared(
                    run_id=run_id, store_path=str(store.path), rows=rows, preferences=preferences, phases=phases,
                    parent=parent, inputs=inputs, resume=checkpoint, resumed_from=resumed_from,
                )  # fmt: skip
            except DlmError as exc:
                share(world, error=exc)
                raise
            share(world, prepared)
            fits, staged, plan, model_load, accounting = _train_phases(
                store, prepared, document, ref, tokenizer, precision, hardware, world,
                epochs=epochs, max_steps=max_steps, seed=seed,
            )  # fmt: skip
            marks["model_load"] = model_load
            write_rank_samples(store.path, run_id, world, accounting)
            uses = record_usage(store, run_id, inputs, gather_accounting(world, accounting))
            t0 = time.perf_counter()
            adapters = _commit(
                store, staged, lock, settings.preference if phases.preference else None, run_id=run_id
            )  # fmt: skip
            fits[-1].save_seconds += time.perf_counter() - t0
            decision = lock.decision.decision
    last, final = fits[-1], adapters[-1]
    summaries = [
        PhaseSummary(
            phase=fit.phase,
            method=fit.method,
            rows=len(rows) if fit.phase == "sft" else len(preferences),
            steps=fit.steps,
            final_loss=fit.final_loss,
            adapter_version=adapter.version,
            adapter_sha256=adapter.sha256,
            parent_version=adapter.parent_version,
            metrics=fit.metrics,
        )  # fmt: skip
        for fit, adapter in zip(fits, adapters, strict=True)
    ]
    summary = TrainSummary(
        run_id=run_id,
        dlm_id=document.dlm_id,
        adapter_version=final.version,
        adapter_path=str(store.path / final.path),
        adapter_sha256=final.sha256,
        steps=last.steps,
        final_loss=last.final_loss,
        rows_trained=len(rows) if phases.sft else 0,
        tokens=rows.token_count if phases.sft else 0,
        preference_rows=len(preferences),
        phases=summaries,
        tokenization=result.event,
        lock_decision=decision,
        lock_warnings=list(lock.warnings),
        plan=plan,
        timings=TrainTimings(
            startup=round(marks["startup"], 3),
            framework_import=round(marks["framework_import"], 3),
            tokenize=round(marks["tokenize"], 3),
            dataset=round(sum(f.dataset_seconds for f in fits), 3),
            model_load=round(marks["model_load"], 3),
            trainer_setup=round(sum(f.trainer_setup for f in fits), 3),
            first_step=round(sum(f.first_step for f in fits), 3),
            train=round(sum(f.train for f in fits), 3),
            save=round(sum(f.save_seconds for f in fits), 3),
            restore=round(sum(f.restore_seconds for f in fits), 3),
        ),
        datasets=uses,
        world_size=world.size,
        resumed_from=resumed_from,
        resumed_at_step=None if checkpoint is None else checkpoint.step,
        warnings=[
            *document_warnings(document),
            *corpus.expansion.warnings,
            *result.warnings,
            *phases.warnings,
        ],  # fmt: skip
    )
    share(world, summary)
    return summary


def _train_phases(
    store: Any,
    prepared: _Prepared,
    document: Any,
    ref: Any,
    tokenizer: Any,
    precision: Precision,
    hardware: Any,
    world: Any,
    *,
    epochs: int | None,
    max_steps: int | None,
    seed: int,
) -> tuple[list[PhaseFit], list[Any], TrainingPlan, float, dict[str, Any] | None]:
    """Load the model once and train the planned phases; stage each phase's adapter (rank 0).

    ``store`` is None on the other ranks, which train the same phases on
    their share and stage nothing. Nothing is published: on any failure the
    staged folders are removed. Returns the fits, the staged adapters, the
    plan, the model-load seconds and this rank's SFT accounting.
    """
    from dlmstore.train.checkpoints import check_identity, run_folder, run_identity
    from dlmstore.train.examples import training_examples
    from dlmstore.train.plan import dlm_target_modules, resolve_plan
    from dlmstore.train.preference import fit_preference, load_policy
    from dlmstore.train.preference_data import training_preferences
    from dlmstore.train.supervised import fit_sft

    settings = document.frontmatter.training
    phases, parent, checkpoint = prepared.phases, prepared.parent, prepared.resume
    fits: list[PhaseFit] = []
    staged: list[Any] = []
    accounting: dict[str, Any] | None = None
    with warnings.catch_warnings(), _aborting(staged):
        # transformers deprecation notices about its own internals are noise here
        warnings.filterwarnings("ignore", category=FutureWarning)
        t0 = time.perf_counter()
        model = _load_model(ref, settings.adapter, precision, seed=seed)
        base_params = model.num_parameters()
        if parent is not None:
            model = load_policy(model, Path(prepared.store_path) / parent.path)
        model_load = time.perf_counter() - t0
        plan = resolve_plan(
            settings, hardware, base_params=base_params,
            auto_target_modules=dlm_target_modules(ref), epochs=epochs, max_steps=max_steps, seed=seed,
        )  # fmt: skip
        identity = run_identity(document, ref, prepared.inputs, world.size, seed, plan)
        if checkpoint is not None:
            check_identity(checkpoint, identity, fields=("micro_batch_size", "grad_accum"))
        if phases.sft:
            t0 = time.perf_counter()
            dataset, names = training_examples(
                prepared.rows, prepared.inputs, sequence_len=settings.sequence_len, seed=seed
            )
            dataset_seconds = time.perf_counter() - t0
            fit = fit_sft(
                store, prepared.run_id, model, tokenizer, dataset, len(names), plan, world=world,
                checkpoint_steps=settings.checkpoint_steps,
                checkpoint_dir=run_folder(Path(prepared.store_path), prepared.run_id),
                identity=identity, resume_from=None if checkpoint is None else checkpoint.path,
                store_path=Path(prepared.store_path), dlm_id=document.dlm_id,
            )  # fmt: skip
            fit.dataset_seconds = dataset_seconds
            accounting = fit.accounting
            if store is not None:
                staged.append(_stage(store, prepared.run_id, document, fit))
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
                store,
                prepared.run_id,
                model,
                tokenizer,
                preference_dataset,
                plan,
                settings.preference,
            )
            fit.dataset_seconds = dataset_seconds
            fits.append(fit)
            if store is not None:
                staged.append(_stage(store, prepared.run_id, document, fit, parent=parent))
            if not phases.sft:
                plan = fit.plan
    return fits, staged, plan, model_load, accounting


@contextmanager
def _aborting(staged: list[Any]) -> Iterator[None]:
    """Remove the staged folders in ``staged`` when the block fails."""
    try:
        yield
    except BaseException:
        for item in staged:
            item.abort()
        raise


def _stage(store: Any, run_id: int, document: Any, fit: PhaseFit, *, parent: Any = None) -> Any:
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


def _commit(store: Any, staged: list[Any], lock: Any, preference: Any, *, run_id: int) -> list[Any]:
    """Publish the staged adapters and register them with the run's lock, as one unit.

    The folders are renamed to their versions, then one transaction inserts
    their rows and the lock record and writes ``dlm.lock`` before it
    commits. On any failure the published folders are removed again, so the
    run registers all its adapters and its lock, or nothing.
    """
    from dlmstore.lock import commit_lock
    from dlmstore.train.adapters import commit_versions
    from dlmstore.train.checkpoints import remove_finished

    adapters = commit_versions(store, staged, lambda: commit_lock(store, lock, preference=preference))
    remove_finished(
        store, run_id=run_id
    )  # this run's checkpoints, and older ones nothing can resume any more
    return adapters


def _import_frameworks() -> None:
    """Import the training stack up front, so its cost is measured as one phase."""
    import datasets  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401


def _load_model(ref: Any, adapter: str, precision: Precision, *, seed: int) -> Any:
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


@dataclass
class PhaseFit:
    """What training one phase gave: its numbers, the trained model and how to save its adapter."""

    phase: Phase
    method: PreferenceMethod | None
    steps: int
    final_loss: float | None
    metrics: dict[str, float]
    plan: TrainingPlan
    trainer_setup: float
    first_step: float
    train: float
    model: Any
    save: Callable[[Path], None]
    save_seconds: float = 0.0
    dataset_seconds: float = 0.0
    restore_seconds: float = 0.0
    accounting: dict[str, Any] | None = None


def run_trainer(
    trainer: Any,
    recorder: Any,
    tokenizer: Any,
    plan: TrainingPlan,
    setup: float,
    *,
    adapter_names: list[str] | None,
    method: PreferenceMethod | None = None,
    resume_from: str | None = None,
) -> PhaseFit:
    """Run a constructed TRL trainer to the end; the fit saves ``adapter_names`` (None: all).

    The plan's ``target_modules`` is replaced by the modules peft adapted,
    so the summary says what ``auto`` picked. The trainer is dropped before
    returning (its optimizer state with it); the model is kept for a next phase.
    """
    phase = recorder.phase
    try:
        t0 = time.perf_counter()
        outcome = trainer.train(resume_from_checkpoint=resume_from)
        train_s = time.perf_counter() - t0
    finally:
        recorder.flush()
    trained: Any = trainer.model  # the peft model TRL wrapped
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    last = logged[-1] if logged else {}
    metrics = {
        key: float(value)
        for key, value in last.items()
        if key not in ("loss", "learning_rate", "epoch", "step", "num_tokens")
        and isinstance(value, int | float)
    }

    def save(folder: Path) -> None:
        from dlmstore.train.adapters import WEIGHTS
        from dlmstore.train.integrity import check_adapter_weights

        trained.save_pretrained(folder, selected_adapters=adapter_names)
        check_adapter_weights(folder / WEIGHTS, phase=phase, learning_rate=recorder.learning_rate)
        tokenizer.save_pretrained(folder)

    adapted = sorted(trained.peft_config["default"].target_modules)
    fit = PhaseFit(
        phase=phase,
        method=method,
        steps=int(outcome.global_step),
        final_loss=recorder.last_loss,
        metrics=metrics,
        plan=dataclasses.replace(plan, target_modules=adapted),
        trainer_setup=setup,
        first_step=recorder.first_step_s or 0.0,
        train=train_s,
        model=trained,
        save=save,
    )
    del trainer, outcome
    gc.collect()
    return fit

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
3. **dataset** - Arrow tables built from the token arrays (no per-token
   Python objects); TRL sees token ids and skips its own tokenization. The
   phases are decided here, and a preference row that cannot train (a
   prompt longer than ``sequence_len``, chosen equal to rejected) is an
   error, all before the model loads;
4. **model load** - the base model from its converted folder, in the
   plan's precision, once for both phases; the rest of the plan (the
   automatic micro-batch needs the parameter count) is resolved;
5. **train** - TRL's ``SFTTrainer`` (LoRA or DoRA applied through peft),
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
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlmstore.errors import TrainingError
from dlmstore.store.metrics import TokenizationEvent
from dlmstore.train.adapters import Phase, PreferenceMethod
from dlmstore.train.plan import Precision, TrainingPlan


@dataclass(frozen=True)
class TrainTimings:
    """Seconds spent in each phase of a run (what ``bench/bench_train.py`` prints).

    ``trainer_setup``, ``first_step``, ``train`` and ``save`` add up both
    training phases when a run has two.
    """

    startup: float  # parse, resolve, store, lock (ours)
    framework_import: float  # torch, transformers, trl, peft, datasets
    tokenize: float  # tokenizer load + the tokenize pass (ours)
    dataset: float  # Arrow tables from the token arrays (ours)
    model_load: float  # from_pretrained of the base (and the SFT adapter for --phase preference)
    trainer_setup: float  # LoRA wrapping and TRL's own preparation
    first_step: float
    train: float  # all steps, the first included
    save: float


@dataclass(frozen=True)
class PhaseSummary:
    """One training phase of a run: what it trained and the adapter it produced.

    ``metrics`` holds the last values TRL logged besides the loss (for the
    preference phase: ``rewards/chosen``, ``rewards/rejected``,
    ``rewards/margins``, ``rewards/accuracies``, ...).
    """

    phase: str  # sft | preference
    method: str | None  # dpo | orpo for the preference phase
    rows: int
    steps: int
    final_loss: float | None
    adapter_version: int
    adapter_sha256: str
    parent_version: int | None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainSummary:
    """The JSON shape of ``dlm train --json``.

    The top-level adapter, steps and loss are those of the run's last
    phase (the adapter ``dlm prompt`` uses); ``phases`` has each phase.
    """

    run_id: int
    dlm_id: str
    adapter_version: int
    adapter_path: str
    adapter_sha256: str
    steps: int
    final_loss: float | None
    rows_trained: int
    tokens: int
    preference_rows: int
    phases: list[PhaseSummary]
    tokenization: TokenizationEvent
    lock_decision: str
    lock_warnings: list[str]
    plan: TrainingPlan
    timings: TrainTimings
    warnings: list[str] = field(default_factory=list)


def train_document(
    path: str,
    *,
    phase: str = "all",
    no_cache: bool = False,
    max_steps: int | None = None,
    epochs: int | None = None,
    seed: int | None = None,
    lock_mode: str = "validate",
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

    Progress (``dlmstore.progress``): the tokenize pass, the model load and
    each phase's steps report as tasks to the sink installed by the caller.

    Raises:
        DocumentError, SourceError: the document or its sources are invalid.
        BaseModelError: the base model cannot be resolved or loaded.
        LockValidationError: the runtime differs from the lock in an ERROR field.
        StoreError: the store or the adapter cannot be written.
        TrainingError: the document has nothing to train on for the phases
            asked, the preference phase has no SFT adapter to start from or
            a preference row cannot train, or the settings ask for what this
            machine cannot train (``dlmstore.train.plan.check_settings``).
    """
    from dlmstore.bases import load_tokenizer, model_source, resolve_base, tokenizer_source
    from dlmstore.cache.fingerprint import tokenizer_sha256
    from dlmstore.cache.tokenize import tokenize_pass
    from dlmstore.document.corpus import load_corpus
    from dlmstore.document.parser import parse_document
    from dlmstore.document.show import document_warnings
    from dlmstore.lock import begin_lock
    from dlmstore.sources.statcache import StatCache
    from dlmstore.store.database import open_store
    from dlmstore.store.metrics import record_tokenization_event
    from dlmstore.store.runs import recorded_run
    from dlmstore.train.adapters import sweep_debris
    from dlmstore.train.phases import plan_phases
    from dlmstore.train.plan import check_settings, probe_hardware

    started = time.perf_counter()
    document = parse_document(path)
    settings = document.frontmatter.training
    seed = settings.seed if seed is None else seed
    ref = resolve_base(document.base_model, relative_to=document.directory)
    t0 = time.perf_counter()
    _import_frameworks()
    framework_import = time.perf_counter() - t0
    hardware = probe_hardware()
    precision = check_settings(settings, hardware)
    tokenizer_source(ref)  # converts a built-in once; fails fast on a broken base
    model_source(ref)
    fingerprint = tokenizer_sha256(ref)
    use_cache = settings.cache.enabled and not no_cache
    mode = "bypassed" if no_cache else ("on" if settings.cache.enabled else "off")
    with open_store(document.dlm_id) as store:
        with recorded_run(
            store, command="train", dlm_path=document.path, dlm_sha256=document.sha256
        ) as run_id:
            sweep_debris(store, run_id=run_id)  # after start_run marked dead runs failed
            marks = {"framework_import": framework_import}
            lock = begin_lock(store, document, ref, seed=seed, run_id=run_id, mode=lock_mode)
            marks["startup"] = time.perf_counter() - started - marks["framework_import"]
            t0 = time.perf_counter()
            stats = StatCache.load(store) if use_cache else None
            corpus = load_corpus(document, stat_cache=stats)
            tokenizer = load_tokenizer(ref)
            result = tokenize_pass(
                store, corpus, run_id=run_id, tokenizer_sha256=fingerprint,
                load_tokenizer=lambda: tokenizer, use_cache=use_cache, cache_mode=mode,
                max_bytes=settings.cache.max_bytes,
            )  # fmt: skip
            record_tokenization_event(
                store, run_id, result.event, tokenizer_sha256=fingerprint, sequence_len=settings.sequence_len
            )
            if stats is not None:
                stats.save(store)
            marks["tokenize"] = time.perf_counter() - t0
            rows = result.rows
            preferences = result.preferences
            assert rows is not None and preferences is not None  # materialized
            phases = plan_phases(
                phase, settings.preference, path=str(document.path),
                sft_rows=len(rows), preference_rows=len(preferences),
            )  # fmt: skip
            parent = _starting_adapter(store, document) if phases.needs_prior_adapter else None
            t0 = time.perf_counter()
            sft_dataset = rows.to_dataset() if phases.sft else None
            preference_dataset = (
                _preference_dataset(preferences, tokenizer, settings.preference.method, settings.sequence_len)
                if phases.preference
                else None
            )
            marks["dataset"] = time.perf_counter() - t0
            fits, staged, plan, model_load = _train_phases(
                store, run_id, document, ref, tokenizer, phases, parent, precision, hardware,
                sft_dataset=sft_dataset, preference_dataset=preference_dataset,
                epochs=epochs, max_steps=max_steps, seed=seed,
            )  # fmt: skip
            marks["model_load"] = model_load
            t0 = time.perf_counter()
            adapters = _commit(store, staged, lock, settings.preference if phases.preference else None)
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
    return TrainSummary(
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
            dataset=round(marks["dataset"], 3),
            model_load=round(marks["model_load"], 3),
            trainer_setup=round(sum(f.trainer_setup for f in fits), 3),
            first_step=round(sum(f.first_step for f in fits), 3),
            train=round(sum(f.train for f in fits), 3),
            save=round(sum(f.save_seconds for f in fits), 3),
        ),
        warnings=[
            *document_warnings(document),
            *corpus.expansion.warnings,
            *result.warnings,
            *phases.warnings,
        ],  # fmt: skip
    )


def _starting_adapter(store: Any, document: Any) -> Any:
    """The newest SFT adapter, where a run without an SFT phase starts its preference phase."""
    from dlmstore.train.adapters import latest

    parent = latest(store, phase="sft")
    if parent is None:
        raise TrainingError(
            f"{document.path}: the preference phase starts from an SFT adapter, and this store has none",
            hint="train SFT first: `dlm train DOC --phase sft` (the document needs prose, instruction or source rows)",
        )
    if parent.base_model != document.base_model:
        raise TrainingError(
            f"{document.path}: the newest SFT adapter (v{parent.version:04d}) was trained on base_model "
            f"{parent.base_model!r}, the document now names {document.base_model!r}",
            hint="train SFT on the new base first: `dlm train DOC --phase sft`",
        )
    return parent


def _preference_dataset(preferences: Any, tokenizer: Any, method: str, sequence_len: int) -> Any:
    """The checked, pre-tokenized preference dataset for ``method``."""
    from dlmstore.train.preference_data import check_preferences, dpo_dataset, orpo_dataset

    check_preferences(preferences, sequence_len=sequence_len)
    if method == "dpo":
        return dpo_dataset(preferences)
    return orpo_dataset(
        preferences,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        max_length=sequence_len,
    )


def _train_phases(
    store: Any,
    run_id: int,
    document: Any,
    ref: Any,
    tokenizer: Any,
    phases: Any,
    parent: Any,
    precision: Precision,
    hardware: Any,
    *,
    sft_dataset: Any,
    preference_dataset: Any,
    epochs: int | None,
    max_steps: int | None,
    seed: int,
) -> tuple[list[PhaseFit], list[Any], TrainingPlan, float]:
    """Load the model once and train the planned phases; stage each phase's adapter.

    Nothing is published: on any failure the staged folders are removed.
    """
    from dlmstore.train.plan import dlm_target_modules, resolve_plan
    from dlmstore.train.preference import fit_preference, load_policy

    settings = document.frontmatter.training
    fits: list[PhaseFit] = []
    staged: list[Any] = []
    with warnings.catch_warnings(), _aborting(staged):
        # transformers deprecation notices about its own internals are noise here
        warnings.filterwarnings("ignore", category=FutureWarning)
        t0 = time.perf_counter()
        model = _load_model(ref, settings.adapter, precision, seed=seed)
        base_params = model.num_parameters()
        if parent is not None:
            model = load_policy(model, store.path / parent.path)
        model_load = time.perf_counter() - t0
        plan = resolve_plan(
            settings, hardware, base_params=base_params,
            auto_target_modules=dlm_target_modules(ref), epochs=epochs, max_steps=max_steps, seed=seed,
        )  # fmt: skip
        if phases.sft:
            fit = _fit(store, run_id, model, tokenizer, sft_dataset, plan)
            staged.append(_stage(store, run_id, document, fit))
            fits.append(fit)
            model = fit.model
            plan = fit.plan
        if phases.preference:
            fit = fit_preference(
                store,
                run_id,
                model,
                tokenizer,
                preference_dataset,
                plan,
                settings.preference,
            )
            fits.append(fit)
            staged.append(_stage(store, run_id, document, fit, parent=parent))
            if not phases.sft:
                plan = fit.plan
    return fits, staged, plan, model_load


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


def _commit(store: Any, staged: list[Any], lock: Any, preference: Any) -> list[Any]:
    """Publish the staged adapters and register them with the run's lock, as one unit.

    The folders are renamed to their versions, then one transaction inserts
    their rows and the lock record and writes ``dlm.lock`` before it
    commits. On any failure the published folders are removed again, so the
    run registers all its adapters and its lock, or nothing.
    """
    from dlmstore.lock import commit_lock
    from dlmstore.train.adapters import commit_versions

    return commit_versions(store, staged, lambda: commit_lock(store, lock, preference=preference))


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
    from dlmstore.train.determinism import apply_determinism, seed_everything
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


def _fit(
    store: Any,
    run_id: int,
    model: Any,
    tokenizer: Any,
    dataset: Any,
    plan: TrainingPlan,
) -> PhaseFit:
    """Train ``model`` with TRL's ``SFTTrainer`` as ``plan`` says."""
    import datasets
    from peft import LoraConfig
    from transformers import PrinterCallback, ProgressCallback
    from trl.trainer.sft_config import SFTConfig
    from trl.trainer.sft_trainer import SFTTrainer

    from dlmstore.train.callbacks import StepRecorder
    from dlmstore.train.plan import lora_config_kwargs, sft_config_kwargs

    datasets.disable_progress_bars()
    output = Path(tempfile.mkdtemp(prefix=f".trainer-run{run_id}-", dir=store.path))
    try:
        recorder = StepRecorder(store, run_id, phase="sft")
        t0 = time.perf_counter()
        trainer = SFTTrainer(
            model=model,
            args=SFTConfig(**sft_config_kwargs(plan, str(output))),
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=LoraConfig(**lora_config_kwargs(plan)),
            callbacks=[recorder],
        )
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        setup = time.perf_counter() - t0
        return run_trainer(trainer, recorder, tokenizer, plan, setup, adapter_names=None)
    finally:
        shutil.rmtree(output, ignore_errors=True)


def run_trainer(
    trainer: Any,
    recorder: Any,
    tokenizer: Any,
    plan: TrainingPlan,
    setup: float,
    *,
    adapter_names: list[str] | None,
    method: PreferenceMethod | None = None,
) -> PhaseFit:
    """Run a constructed TRL trainer to the end; the fit saves ``adapter_names`` (None: all).

    The plan's ``target_modules`` is replaced by the modules peft adapted,
    so the summary says what ``auto`` picked. The trainer is dropped before
    returning (its optimizer state with it); the model is kept for a next phase.
    """
    phase = recorder.phase
    try:
        t0 = time.perf_counter()
        outcome = trainer.train()
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

"""``dlm train``: a LoRA adapter from a document's rows, as a recorded run.

The pipeline, each step timed (the split ``bench/bench_train.py`` prints):

1. **startup** - parse the document, resolve the base model (a missing or
   unloadable base is an error before any work), check the training
   settings against this machine (``dlmstore.train.plan``: QLoRA without
   CUDA, an optimizer's missing package or a precision the device cannot
   train in is an error before any work too), open the store, validate the
   reproducibility lock (``dlmstore.lock``);
2. **tokenize** - the same pass as ``dlm tokenize`` (through the cache unless
   ``--no-cache``), recorded as this run's tokenization event;
3. **dataset** - an Arrow table built from the token arrays (no per-token
   Python objects); TRL sees ``input_ids`` and skips its own tokenization;
4. **model load** - the base model from its converted folder, in the
   plan's precision; the rest of the plan (the automatic micro-batch needs
   the parameter count) is resolved, and LoRA or DoRA applied by TRL
   through peft;
5. **train** - TRL's ``SFTTrainer``; loss and learning rate of every logged
   step go to ``train_steps``;
6. **save** - the adapter folder is published as the next version and
   registered with its sha256 (``dlmstore.train.adapters``), then the lock is
   written.

Seeds (python, numpy, torch, the trainer's data order) and the deterministic
flags are set before the model is built, so two runs with the same inputs on
the same machine produce byte-identical ``adapter_model.safetensors``
(``tests/test_training.py`` and the golden test check this). Preference rows
are not used for SFT: they are counted and reported.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlmstore.errors import TrainingError
from dlmstore.store.metrics import TokenizationEvent
from dlmstore.train.plan import Precision, TrainingPlan

#: progress(step, total_steps, loss, tokens_per_second)
TrainProgress = Callable[[int, int, float | None, float | None], None]


@dataclass(frozen=True)
class TrainTimings:
    """Seconds spent in each phase of a run (what ``bench/bench_train.py`` prints)."""

    startup: float  # parse, resolve, store, lock (ours)
    framework_import: float  # torch, transformers, trl, peft, datasets
    tokenize: float  # tokenizer load + the tokenize pass (ours)
    dataset: float  # Arrow table from the token arrays (ours)
    model_load: float  # from_pretrained of the base
    trainer_setup: float  # LoRA wrapping and TRL's own preparation
    first_step: float
    train: float  # all steps, the first included
    save: float


@dataclass(frozen=True)
class TrainSummary:
    """The JSON shape of ``dlm train --json``."""

    run_id: int
    dlm_id: str
    adapter_version: int
    adapter_path: str
    adapter_sha256: str
    steps: int
    final_loss: float | None
    rows_trained: int
    tokens: int
    preference_rows_skipped: int
    tokenization: TokenizationEvent
    lock_decision: str
    lock_warnings: list[str]
    plan: TrainingPlan
    timings: TrainTimings
    warnings: list[str] = field(default_factory=list)


def train_document(
    path: str,
    *,
    no_cache: bool = False,
    max_steps: int | None = None,
    epochs: int | None = None,
    seed: int | None = None,
    lock_mode: str = "validate",
    progress: TrainProgress | None = None,
) -> TrainSummary:
    """Train a LoRA adapter on the document at ``path``.

    Args:
        path: the .dlm document.
        no_cache: tokenize every row, neither reading nor writing the cache.
        max_steps, epochs, seed: override ``training.max_steps`` /
            ``training.num_epochs`` / ``training.seed``.
        lock_mode: ``validate`` (default), ``strict``, ``update`` or ``ignore``
            (``--strict-lock`` / ``--update-lock`` / ``--ignore-lock``).
        progress: optional callback for a progress bar.

    Raises:
        DocumentError, SourceError: the document or its sources are invalid.
        BaseModelError: the base model cannot be resolved or loaded.
        LockValidationError: the runtime differs from the lock in an ERROR field.
        StoreError: the store or the adapter cannot be written.
        TrainingError: the document has nothing to train on, or asks for
            what this machine cannot train (``dlmstore.train.plan.check_settings``).
    """
    from dlmstore.bases import load_tokenizer, model_source, resolve_base, tokenizer_source
    from dlmstore.cache.fingerprint import tokenizer_sha256
    from dlmstore.cache.tokenize import tokenize_pass
    from dlmstore.document.corpus import load_corpus
    from dlmstore.document.parser import parse_document
    from dlmstore.document.show import document_warnings
    from dlmstore.lock import begin_lock, finish_lock
    from dlmstore.sources.statcache import StatCache
    from dlmstore.store.database import open_store
    from dlmstore.store.metrics import record_tokenization_event
    from dlmstore.store.runs import recorded_run
    from dlmstore.train.adapters import save_version, sweep_temporary
    from dlmstore.train.plan import check_settings, dlm_target_modules, probe_hardware, resolve_plan

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
        sweep_temporary(store)
        with recorded_run(
            store, command="train", dlm_path=document.path, dlm_sha256=document.sha256
        ) as run_id:
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
            if rows is None or len(rows) == 0:
                raise TrainingError(
                    f"{document.path}: no text or instruction rows to train on "
                    f"({result.preference_rows} preference rows are not used for SFT)",
                    hint="add prose, ::instruction:: pairs or training.sources to the document",
                )
            t0 = time.perf_counter()
            dataset = rows.to_dataset()
            marks["dataset"] = time.perf_counter() - t0
            with warnings.catch_warnings():
                # transformers deprecation notices about its own internals are noise here
                warnings.filterwarnings("ignore", category=FutureWarning)
                t0 = time.perf_counter()
                model = _load_model(ref, settings.adapter, precision, seed=seed)
                marks["model_load"] = time.perf_counter() - t0
                plan = resolve_plan(
                    settings, hardware, base_params=model.num_parameters(),
                    auto_target_modules=dlm_target_modules(ref), epochs=epochs, max_steps=max_steps, seed=seed,
                )  # fmt: skip
                outcome = _fit(store, run_id, model, tokenizer, dataset, plan, progress=progress)
            t0 = time.perf_counter()
            adapter = save_version(
                store, run_id=run_id, write=outcome.save, base_model=document.base_model,
                steps=outcome.steps, final_loss=outcome.final_loss,
            )  # fmt: skip
            marks["save"] = time.perf_counter() - t0
            decision = finish_lock(store, lock)
    return TrainSummary(
        run_id=run_id,
        dlm_id=document.dlm_id,
        adapter_version=adapter.version,
        adapter_path=str(store.path / adapter.path),
        adapter_sha256=adapter.sha256,
        steps=outcome.steps,
        final_loss=outcome.final_loss,
        rows_trained=len(rows),
        tokens=rows.token_count,
        preference_rows_skipped=result.preference_rows,
        tokenization=result.event,
        lock_decision=decision,
        lock_warnings=list(lock.warnings),
        plan=outcome.plan,
        timings=TrainTimings(
            startup=round(marks["startup"], 3),
            framework_import=round(marks["framework_import"], 3),
            tokenize=round(marks["tokenize"], 3),
            dataset=round(marks["dataset"], 3),
            model_load=round(marks["model_load"], 3),
            trainer_setup=round(outcome.trainer_setup, 3),
            first_step=round(outcome.first_step, 3),
            train=round(outcome.train, 3),
            save=round(marks["save"], 3),
        ),  # fmt: skip
        warnings=[*document_warnings(document), *corpus.expansion.warnings, *result.warnings],
    )


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
class _Fit:
    steps: int
    final_loss: float | None
    plan: TrainingPlan
    trainer_setup: float
    first_step: float
    train: float
    save: Callable[[Path], None]


def _fit(
    store: Any,
    run_id: int,
    model: Any,
    tokenizer: Any,
    dataset: Any,
    plan: TrainingPlan,
    *,
    progress: TrainProgress | None,
) -> _Fit:
    """Train ``model`` with TRL as ``plan`` says, and return how to save the adapter.

    The plan's ``target_modules`` is replaced by the modules peft adapted,
    so the summary says what ``auto`` picked.
    """
    import datasets
    from peft import LoraConfig
    from transformers import PrinterCallback, ProgressCallback
    from trl.trainer.sft_config import SFTConfig
    from trl.trainer.sft_trainer import SFTTrainer

    from dlmstore.train.callbacks import StepRecorder
    from dlmstore.train.plan import lora_config_kwargs, sft_config_kwargs

    datasets.disable_progress_bars()
    output = Path(tempfile.mkdtemp(prefix=f".trainer-run{run_id}-", dir=store.path))
    recorder = StepRecorder(store, run_id, progress)
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
    trainer_setup = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        outcome = trainer.train()
        train_s = time.perf_counter() - t0
    finally:
        recorder.flush()
        shutil.rmtree(output, ignore_errors=True)

    trained: Any = trainer.model  # the peft model TRL wrapped

    def save(folder: Path) -> None:
        trained.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    adapted = sorted(trained.peft_config["default"].target_modules)
    return _Fit(
        steps=int(outcome.global_step),
        final_loss=recorder.last_loss,
        plan=dataclasses.replace(plan, target_modules=adapted),
        trainer_setup=trainer_setup,
        first_step=recorder.first_step_s or 0.0,
        train=train_s,
        save=save,
    )

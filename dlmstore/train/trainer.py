"""``dlm train``: a LoRA adapter from a document's rows, as a recorded run.

The pipeline, each step timed (the split ``bench/bench_train.py`` prints):

1. **startup** - parse the document, resolve the base model (a missing or
   unloadable base is an error before any work), open the store, validate
   the reproducibility lock (``dlmstore.lock``);
2. **tokenize** - the same pass as ``dlm tokenize`` (through the cache unless
   ``--no-cache``), recorded as this run's tokenization event;
3. **dataset** - an Arrow table built from the token arrays (no per-token
   Python objects); TRL sees ``input_ids`` and skips its own tokenization;
4. **model load** - the base model from its converted folder, LoRA applied
   by TRL through peft;
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
        TrainingError: the document has nothing to train on.
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

    started = time.perf_counter()
    document = parse_document(path)
    settings = document.frontmatter.training
    seed = settings.seed if seed is None else seed
    ref = resolve_base(document.base_model, relative_to=document.directory)
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
            t0 = time.perf_counter()
            _import_frameworks()
            marks = {"framework_import": time.perf_counter() - t0}
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
                outcome = _fit(
                    store, run_id, ref, tokenizer, dataset, settings,
                    seed=seed, max_steps=max_steps, epochs=epochs, progress=progress,
                )  # fmt: skip
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
        timings=TrainTimings(
            startup=round(marks["startup"], 3),
            framework_import=round(marks["framework_import"], 3),
            tokenize=round(marks["tokenize"], 3),
            dataset=round(marks["dataset"], 3),
            model_load=round(outcome.model_load, 3),
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


@dataclass
class _Fit:
    steps: int
    final_loss: float | None
    model_load: float
    trainer_setup: float
    first_step: float
    train: float
    save: Callable[[Path], None]


def _fit(
    store: Any,
    run_id: int,
    ref: Any,
    tokenizer: Any,
    dataset: Any,
    settings: Any,
    *,
    seed: int,
    max_steps: int | None,
    epochs: int | None,
    progress: TrainProgress | None,
) -> _Fit:
    """Load the model, train with TRL, and return how to save the adapter."""
    import datasets
    import torch
    from peft import LoraConfig
    from transformers import PrinterCallback, ProgressCallback
    from trl.trainer.sft_config import SFTConfig
    from trl.trainer.sft_trainer import SFTTrainer

    from dlmstore.bases import load_model
    from dlmstore.train.callbacks import StepRecorder
    from dlmstore.train.determinism import apply_determinism, seed_everything

    datasets.disable_progress_bars()
    seed_everything(seed)
    apply_determinism()
    t0 = time.perf_counter()
    model = load_model(ref)
    model_load = time.perf_counter() - t0

    steps_total = max_steps if max_steps is not None else settings.max_steps
    output = Path(tempfile.mkdtemp(prefix=f".trainer-run{run_id}-", dir=store.path))
    args = SFTConfig(
        output_dir=str(output),
        max_steps=steps_total if steps_total is not None else -1,
        num_train_epochs=float(epochs if epochs is not None else settings.num_epochs),
        per_device_train_batch_size=settings.micro_batch_size if settings.micro_batch_size != "auto" else 2,
        learning_rate=settings.learning_rate,
        seed=seed,
        data_seed=seed,
        max_length=settings.sequence_len,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
    )
    recorder = StepRecorder(store, run_id, progress)
    t0 = time.perf_counter()
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=settings.lora_r,
            lora_alpha=settings.lora_alpha,
            lora_dropout=settings.lora_dropout,
            task_type="CAUSAL_LM",
        ),
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

    return _Fit(
        steps=int(outcome.global_step),
        final_loss=recorder.last_loss,
        model_load=model_load,
        trainer_setup=trainer_setup,
        first_step=recorder.first_step_s or 0.0,
        train=train_s,
        save=save,
    )

"""The preference phase: DPO or ORPO (TRL) on the adapter SFT produced.

The policy is the SFT adapter, trainable: the model SFT just trained in
this process (``--phase all``), or the base with the store's newest SFT
adapter loaded onto it (``--phase preference``). Either way there is one
copy of the base weights in memory:

* DPO with ``reference: pre_adapter`` (the default): TRL adds a frozen copy
  of the starting adapter, named ``ref``, beside the trainable one, and
  computes the reference log-probabilities through it;
* DPO with ``reference: base``: that copy is removed, so TRL computes the
  reference with the adapters disabled, which is the base model;
* ORPO has no reference model.

The rows arrive pre-tokenized from the cache
(``dlmstore.train.data.preference_data``), and the trainer classes used skip
TRL's own tokenization. Only the trainable adapter is saved.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlmstore.document.frontmatter import PreferenceSettings
    from dlmstore.store.database import Store
    from dlmstore.train.loops.fit import PhaseFit
    from dlmstore.train.plan import TrainingPlan


def load_policy(base_model: Any, adapter_dir: Path) -> Any:
    """``base_model`` with the adapter at ``adapter_dir`` loaded as its trainable ``default`` adapter."""
    from peft import PeftModel

    from dlmstore.store.path_text import utf8_alias

    with utf8_alias(adapter_dir) as folder:  # safetensors opens only UTF-8 paths
        return PeftModel.from_pretrained(base_model, str(folder), is_trainable=True)


def fit_preference(
    store: Store | None,
    run_id: int,
    policy: Any,
    tokenizer: Any,
    dataset: Any,
    plan: TrainingPlan,
    settings: PreferenceSettings,
) -> PhaseFit:
    """Train ``policy`` (a peft model) on the pre-tokenized preference ``dataset``.

    Steps and every metric TRL logs go to the store under phase
    ``preference``; the returned fit saves only the trained adapter.
    """
    import datasets
    from transformers import PrinterCallback, ProgressCallback

    from dlmstore.determinism import seed_everything
    from dlmstore.train.data.preference_data import (
        pretokenized_dpo_trainer_class,
        pretokenized_orpo_trainer_class,
    )
    from dlmstore.train.loops.callbacks import StepRecorder
    from dlmstore.train.loops.fit import run_trainer
    from dlmstore.train.loops.reporting import reporting
    from dlmstore.train.plan import preference_config_kwargs

    datasets.disable_progress_bars()
    # The same seed as a run that trains only this phase: `all` and `sft`
    # followed by `preference` draw the same batches.
    seed_everything(plan.seed)
    output = Path(
        tempfile.mkdtemp(prefix=f".trainer-run{run_id}-", dir=None if store is None else store.path)
    )
    try:
        kwargs = preference_config_kwargs(plan, settings, str(output))
        recorder = StepRecorder(store, run_id, phase="preference")
        t0 = time.perf_counter()
        # training.report_to (dlmstore.train.loops.reporting): reporters are set up while the trainer is built.
        report = reporting(  # only rank 0 (the one with the store) reports
            plan.report_to if store is not None else (),
            store_path=Path(output) if store is None else store.path,
            dlm_id="" if store is None else store.dlm_id,
            run_id=run_id,
            phase="preference",
        )
        if settings.method == "dpo":
            from trl.trainer.dpo_config import DPOConfig

            with report as report_names:
                trainer = pretokenized_dpo_trainer_class()(
                    model=policy, args=DPOConfig(**kwargs, **report_names), train_dataset=dataset,
                    processing_class=tokenizer, callbacks=[recorder],
                )  # fmt: skip
            if settings.reference == "base" and "ref" in trainer.model.peft_config:
                trainer.model.delete_adapter("ref")
        else:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # trl.experimental's "API may change" notice
                from trl.experimental.orpo import ORPOConfig

            with report as report_names:
                trainer = pretokenized_orpo_trainer_class()(
                    model=policy, args=ORPOConfig(**kwargs, **report_names), train_dataset=dataset,
                    processing_class=tokenizer, callbacks=[recorder],
                )  # fmt: skip
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        setup = time.perf_counter() - t0
        return run_trainer(
            trainer, recorder, tokenizer, plan, setup, adapter_names=["default"], method=settings.method
        )
    finally:
        shutil.rmtree(output, ignore_errors=True)

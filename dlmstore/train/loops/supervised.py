"""The SFT phase: a LoRA adapter trained on the examples of :mod:`dlmstore.train.data.examples`.

The trainer is transformers' ``Trainer`` with two things of ours:

* the data loader (:meth:`SftTrainer.get_train_dataloader`): this rank's
  share of every epoch from :class:`~dlmstore.datasets.RankPartitionSampler`
  (seeded by the run's seed and the epoch only, so every rank computes the
  same permutation and takes its own slice), batches padded by TRL's
  language-model collator. Accelerate does not re-shard it. A resumed run
  skips the batches its checkpoint had done, and the epoch's permutation
  is a pure function of the seed, so it sees exactly what the
  uninterrupted run would have;
* checkpoints in the store (:mod:`dlmstore.train.checkpoints`), each rank
  adding its trained positions, rank 0 registering the folder. A resumed
  run loads a checkpoint whose files were verified against their sha256;
  one that still cannot be loaded (written damaged) stops the run with one
  error naming the file (:func:`loading`), not the library's traceback.
  The trainer writes and reads its folders through a UTF-8 alias of the
  store (``store.path_text.utf8_alias``: torch and safetensors open only
  UTF-8 paths); messages and store.db name them by their real path.

The adapter is applied with peft after seeding, as TRL's ``SFTTrainer``
does; the loss is the model's own causal-LM loss over the ``labels`` the
examples carry (every token of the document's rows, packed pretrain windows
without cross-document targets, an SFT dataset's assistant spans).
"""

from __future__ import annotations

import json
import pickle
import shutil
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from torch.utils.data import DataLoader, Sampler
from transformers import PrinterCallback, ProgressCallback, Trainer, TrainerCallback, TrainingArguments

from dlmstore.datasets.read.sampler import RankPartitionSampler
from dlmstore.errors import TrainingError
from dlmstore.store.atomic import write_bytes_atomic
from dlmstore.store.path_text import utf8_alias
from dlmstore.train.checkpoints import (
    FRESH_HINT,
    CheckpointIdentity,
    Layout,
    checkpoint_writes,
    plan_settings,
    rank_files,
    register,
    write_rank_state,
)
from dlmstore.train.data.examples import TOKENS_KEY, Collator, pad_token_id
from dlmstore.train.distributed import World, barrier, gather_to_main


class EpochBatches(Sampler[list[int]]):
    """This rank's batches of one epoch; ``set_epoch`` moves the sampler and a mixture together.

    The trainer finds ``set_epoch`` here even when a resumed epoch's first
    batches are skipped (accelerate's ``skip_first_batches`` wraps this
    batch sampler in a new loader that has no ``set_epoch`` of its own), so
    the resumed epoch is drawn from its own permutation, not epoch 0's.
    """

    def __init__(self, sampler: RankPartitionSampler, batch_size: int, dataset: Any) -> None:
        self.sampler = sampler
        self.batch_size = batch_size
        self.dataset = dataset

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        indices = list(self.sampler)
        for start in range(0, len(indices), self.batch_size):
            yield indices[start : start + self.batch_size]

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.batch_size)


class EpochLoader(DataLoader[Any]):
    """A data loader the trainer can move to the next epoch."""

    def set_epoch(self, epoch: int) -> None:
        batches = self.batch_sampler
        assert isinstance(batches, EpochBatches)
        batches.set_epoch(epoch)


class SftTrainer(Trainer):
    """``Trainer`` reading this rank's share through the rank-partitioned sampler.

    It also logs what TRL's SFT trainer logs beside the loss: ``num_tokens``
    (tokens trained so far, padding excluded, all ranks) and
    ``mean_token_accuracy`` (share of targets the model's top guess got
    right since the last log).
    """

    def __init__(
        self,
        *args: Any,
        store_alias: tuple[Path, Path] | None = None,
        order_world_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        """``store_alias``: the UTF-8 alias the trainer's folders are named under, and the store it stands for;
        ``order_world_size``: the world size every epoch's order is padded for (the run's first: elastic resume).
        """
        super().__init__(*args, **kwargs)
        self.store_alias = store_alias
        self.order_world_size = order_world_size
        self.restore_seconds = 0.0  # loading a checkpoint: adapter, optimizer and scheduler, RNG
        self._tokens = 0
        self._correct = 0
        self._targets = 0

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        step = self.state.global_step
        with checkpoint_writes(self.real(self._get_output_dir(trial=trial)) / f"checkpoint-{step}", step):
            super()._save_checkpoint(model, trial)

    def real(self, path: str) -> Path:
        """``path``, a folder the trainer names, by its real path (not under the store's UTF-8 alias)."""
        if self.store_alias is None or not Path(path).is_relative_to(self.store_alias[0]):
            return Path(path)
        alias, store = self.store_alias
        return store / Path(path).relative_to(alias)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        t0 = time.perf_counter()
        with loading(self.real(resume_from_checkpoint), ("adapter_model.safetensors", "adapter_config.json")):
            super()._load_from_checkpoint(resume_from_checkpoint, model)
        self.restore_seconds += time.perf_counter() - t0

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        t0 = time.perf_counter()
        with loading(self.real(checkpoint or "."), ("optimizer.pt", "scheduler.pt")):
            super()._load_optimizer_and_scheduler(checkpoint)
        self.restore_seconds += time.perf_counter() - t0

    def _load_rng_state(self, checkpoint: str | None) -> None:
        t0 = time.perf_counter()
        args = self.args
        name = "rng_state.pth" if args.world_size <= 1 else f"rng_state_{args.process_index}.pth"
        with loading(self.real(checkpoint or "."), (name,)):
            super()._load_rng_state(checkpoint)
        self.restore_seconds += time.perf_counter() - t0

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        import torch

        tokens = int(inputs.pop(TOKENS_KEY))  # the collator's count; not a model input
        loss, outputs = super().compute_loss(
            model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch
        )
        if model.training:
            with torch.no_grad():
                labels = inputs["labels"][:, 1:]
                trained = labels != -100
                guesses = outputs.logits[:, :-1].argmax(dim=-1)
                self._correct += int((guesses[trained] == labels[trained]).sum())
                self._targets += int(trained.sum())
                self._tokens += tokens
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            import torch

            counts = torch.tensor([self._tokens, self._correct, self._targets], dtype=torch.int64)
            total = self.accelerator.reduce(counts.to(self.args.device), reduction="sum").cpu()
            logs["num_tokens"] = float(self.state.num_input_tokens_seen + int(total[0]))
            self.state.num_input_tokens_seen += int(total[0])
            if int(total[2]):
                logs["mean_token_accuracy"] = float(total[1]) / float(total[2])
            self._tokens = self._correct = self._targets = 0
        super().log(logs, start_time)

    def get_train_dataloader(self) -> DataLoader[Any]:
        dataset = self.train_dataset
        assert dataset is not None
        sampler = RankPartitionSampler(
            len(dataset),  # type: ignore[arg-type]
            num_replicas=self.args.world_size,
            rank=self.args.process_index,
            seed=self.args.seed,
            pad_to=self.order_world_size,
        )
        return EpochLoader(
            dataset,
            batch_sampler=EpochBatches(sampler, self._train_batch_size, dataset),
            collate_fn=self.data_collator,
            num_workers=0,
        )


class CheckpointRecorder(TrainerCallback):
    """After the trainer writes a checkpoint: each rank adds its state, rank 0 registers the folder.

    ``output`` is the run's checkpoint folder by its real path (the
    trainer's ``output_dir`` may be a UTF-8 alias of it); on a rank other
    than 0 it is that rank's private stand-in for the store
    (``dlmstore.train.trainer``), so its own files (positions and counts,
    RNG state) are sent to rank 0, which writes them beside its own before
    it registers the folder: the checkpoint is whole in rank 0's store even
    when the ranks run on several machines.
    """

    def __init__(
        self,
        store: Any,
        run_id: int,
        world: World,
        collator: Any,
        identity: CheckpointIdentity,
        settings: dict[str, Any],
        output: Path,
        layout: Layout | None = None,
    ) -> None:
        self.output = output
        self.store = store
        self.run_id = run_id
        self.world = world
        self.collator = collator
        self.identity = identity
        self.settings = settings
        self.layout = layout

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        folder = self.output / f"checkpoint-{step}"
        with checkpoint_writes(folder, step):
            write_rank_state(folder, self.world.rank, self.collator.state())
            own = None if self.world.is_main else rank_files(folder, self.world.rank)
        parts = gather_to_main(self.world, own)
        if own is not None:  # sent: this rank's copy in its stand-in for the store is of no more use
            shutil.rmtree(folder, ignore_errors=True)
        if self.store is not None:
            with checkpoint_writes(folder, step):  # the other ranks' files, its fsync
                for files in parts or []:
                    for name, data in (files or {}).items():
                        write_bytes_atomic(folder / name, data)
                register(
                    self.store, self.run_id, "sft", step, folder, self.identity, self.settings, self.layout
                )
        barrier(self.world)


def fit_sft(
    store: Any,
    run_id: int,
    model: Any,
    tokenizer: Any,
    dataset: Any,
    sources: int,
    plan: Any,
    *,
    world: World,
    checkpoint_steps: int | None,
    checkpoint_dir: Path,
    identity: CheckpointIdentity,
    resume_from: Path | None,
    store_path: Path,
    dlm_id: str,
    val: tuple[Any, int] | None = None,
    val_history: tuple[tuple[int, float | None], ...] = (),
    layout: Layout | None = None,
    resumed_layout: Layout | None = None,
) -> Any:
    """Train ``model`` on ``dataset`` as ``plan`` says; a :class:`~dlmstore.train.loops.fit.PhaseFit`.

    ``store`` is None on ranks other than 0 (they record nothing). ``val``
    is the val split and its number of sources
    (``dlmstore.train.data.examples.validation_examples``), evaluated every
    few steps and able to stop the phase early
    (:mod:`dlmstore.train.loops.validation`); ``val_history`` is what the
    run resumed from recorded of it. ``layout`` is how this run lays its
    samples over its ranks (``dlmstore.train.checkpoints.Layout``), recorded
    in its checkpoints; ``resumed_layout`` that of the checkpoint it resumes.
    """
    from peft import LoraConfig, get_peft_model
    from transformers import TrainerState, set_seed

    from dlmstore.train.checkpoints import restored_rank_state
    from dlmstore.train.loops.callbacks import StepRecorder
    from dlmstore.train.loops.fit import run_trainer
    from dlmstore.train.loops.reporting import reporting
    from dlmstore.train.loops.validation import Validation, replayed
    from dlmstore.train.plan import lora_config_kwargs, sft_config_kwargs

    checkpointing = bool(checkpoint_steps)
    # without checkpoints the trainer still wants an output folder; it writes nothing there
    scratch = (
        None if checkpointing else Path(tempfile.mkdtemp(prefix=f".trainer-run{run_id}-", dir=store_path))
    )
    output = checkpoint_dir if scratch is None else scratch
    # torch.save and safetensors write (and read) the checkpoints only through a UTF-8 path
    stack = ExitStack()
    try:
        store_alias = stack.enter_context(utf8_alias(store_path))
        kwargs = sft_config_kwargs(plan, str(store_alias / output.relative_to(store_path)))
        kwargs.pop("max_length")  # the examples are cut to sequence_len already
        kwargs.update(remove_unused_columns=False, ddp_find_unused_parameters=False)
        if checkpointing:
            kwargs.update(save_strategy="steps", save_steps=checkpoint_steps, save_total_limit=2)
        recorder = StepRecorder(store, run_id, phase="sft")
        collator = Collator(pad_token_id(tokenizer), sources)
        callbacks: list[Any] = [recorder]
        if checkpointing:
            callbacks.append(
                CheckpointRecorder(
                    store, run_id, world, collator, identity, plan_settings(plan), checkpoint_dir, layout
                )
            )
        validation = None
        if val is not None:
            from dlmstore.eval.early_stop import eval_interval

            validation = Validation(
                store, run_id, val[0], Collator(pad_token_id(tokenizer), val[1]), plan.micro_batch_size, world,
                eval_interval(plan.max_steps), replayed(val_history),
            )  # fmt: skip
            callbacks.append(validation)
        if resume_from is not None:
            # the trainer reads trainer_state.json inside train(), where no method of ours can catch it
            with loading(resume_from, ("trainer_state.json",)):
                if not isinstance(
                    TrainerState.load_from_json(str(resume_from / "trainer_state.json")).global_step, int
                ):
                    raise ValueError("global_step is not a number")
            written = (
                world.size if resumed_layout is None else resumed_layout.world_size
            )  # ranks that wrote it
            ranks = range(written) if written != world.size else (world.rank,)
            names = [f"dlm-rank{rank}.{ext}" for rank in ranks for ext in ("npy", "json")]
            with loading(resume_from, names):
                restored = restored_rank_state(
                    resume_from, resumed_layout or _same(world), world.rank, world.size
                )
            if restored is not None:
                collator.restore(restored)
        t0 = time.perf_counter()
        # Training builds no KV cache; without one, transformers reads position ids that
        # start again (a packed window of several documents) as separate sequences.
        model.config.use_cache = False
        set_seed(plan.seed)  # peft draws the adapter's initial weights now, as TRL's SFTTrainer does
        peft_model = get_peft_model(model, LoraConfig(**lora_config_kwargs(plan)))
        with reporting(
            plan.report_to if world.is_main else (),
            store_path=store_path,
            dlm_id=dlm_id,
            run_id=run_id,
            phase="sft",
        ) as report_names:  # training.report_to (dlmstore.train.loops.reporting)
            args = TrainingArguments(**kwargs, **report_names)
            trainer = SftTrainer(
                model=peft_model,
                args=args,
                train_dataset=dataset,
                data_collator=collator,
                callbacks=callbacks,
                store_alias=(store_alias, store_path),
                order_world_size=None if layout is None else layout.order_world_size,
            )
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        setup = time.perf_counter() - t0
        fit = run_trainer(
            trainer, recorder, tokenizer, plan, setup, adapter_names=None,
            resume_from=None if resume_from is None else str(store_alias / resume_from.relative_to(store_path)),
        )  # fmt: skip
        fit.accounting = collator.state()
        fit.restore_seconds = trainer.restore_seconds
        if validation is not None:
            fit.validation = validation
            fit.train -= validation.seconds
            fit.eval_seconds += validation.seconds
        return fit
    finally:
        stack.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _same(world: World) -> Layout:
    """The layout of a checkpoint written on this world size (only its ``world_size`` is read)."""
    return Layout(world.size, world.size, 0)


#: What loading a damaged checkpoint file raises: torch's zip reader (RuntimeError), its unpickler
#: (UnpicklingError, UnicodeDecodeError, EOFError, KeyError), json (JSONDecodeError), safetensors
#: (SafetensorError), numpy (ValueError) and what a state of the wrong shape raises (TypeError).
_LOAD_ERRORS: tuple[type[BaseException], ...] = (
    OSError, ValueError, RuntimeError, EOFError, KeyError, TypeError, IndexError, zipfile.BadZipFile,
    pickle.UnpicklingError, SafetensorError,
)  # fmt: skip


@contextmanager
def loading(folder: Path, names: Sequence[str]) -> Iterator[None]:
    """Turn a failure to load ``names`` from checkpoint ``folder`` into one error naming the file.

    The files were verified against their sha256 before the run resumed, so
    a failure here means a file was written damaged (or this library
    version cannot read it). The file named is the first of ``names`` that
    does not read back on its own, with why (:func:`_unreadable`); when
    each does, all of them are named, with the library's reason.

    Raises:
        TrainingError: for any of the errors loading damaged bytes raises
            (running out of memory is not one of them and propagates).
    """
    try:
        yield
    except Exception as exc:
        if not _is_load_error(exc):
            raise
        name, reason = _unreadable(folder, names) or (" or ".join(names), _reason(exc))
        raise TrainingError(
            f"cannot resume from checkpoint {folder}: {name} cannot be loaded ({reason})", hint=FRESH_HINT
        ) from None


def _is_load_error(exc: Exception) -> bool:
    return isinstance(exc, _LOAD_ERRORS) and not isinstance(exc, torch.OutOfMemoryError)


def _reason(exc: BaseException) -> str:
    """The first line of what ``exc`` says (its type when it says nothing), at most 200 characters."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _unreadable(folder: Path, names: Sequence[str]) -> tuple[str, str] | None:
    """The first of ``names`` whose bytes do not parse as their format, and why: JSON, a safetensors
    header, an npy array, or a zip archive (what ``torch.save`` writes) whose every member matches its
    CRC-32. Only run once loading failed.
    """
    for name in names:
        path = folder / name
        try:
            if name.endswith(".json"):
                json.loads(path.read_bytes())
            elif name.endswith(".safetensors"):
                with utf8_alias(path) as readable, safe_open(str(readable), framework="np"):
                    pass
            elif name.endswith(".npy"):
                np.load(path, allow_pickle=False)
            else:
                with zipfile.ZipFile(path) as archive:
                    member = archive.testzip()
                if member is not None:
                    return name, f"a damaged torch archive: {member} does not match its CRC-32"
        except Exception as exc:
            if not _is_load_error(exc):
                raise
            if isinstance(exc, zipfile.BadZipFile):
                return name, f"a damaged torch archive: {_reason(exc)}"
            return name, _reason(exc)
    return None

"""The training plan: a document's ``training`` settings resolved for this machine.

DLM (DocumentLanguageModel) turns its frontmatter into a concrete plan with
a hardware "doctor" before it trains, and hands the plan to TRL,
transformers and peft. dlmstore resolves the same keys by the same rules,
so a document trains with the same knobs in both:

* ``precision`` unset: bf16 on a CUDA GPU that computes in it (Ampere and
  newer), fp16 on an older one, fp32 on CPU. (DLM's planner says "CPU ->
  fp32"; its code falls through to fp16 there, which accelerate silently
  ignores on CPU, so fp32 is what actually trains.) A precision the machine
  cannot train in is an error, not a silent fallback: fp16 on CPU (accelerate
  would train in fp32 without a word), bf16 where torch cannot compute in
  it. The model is loaded in that dtype and the trainer's mixed precision
  set to match, as DLM does.
* ``micro_batch_size: auto``: the largest of 1, 2, 4, 8, 16 whose estimated
  peak memory fits the budget - half the RAM on CPU, 85% of the GPU's
  memory on CUDA - with DLM's estimator (:func:`peak_memory_gib`, which
  assumes gradient checkpointing during this search). A base that fits in
  half the RAM gets 16 on CPU: the estimate is dominated by the weights.
* ``grad_accum: auto``: enough micro-batches per optimizer step to reach an
  effective batch of 8 (``8 // micro_batch_size``, at least 1); it is
  worked out from the resolved micro-batch, explicit or auto.
* ``target_modules: auto``: DLM's list for the base when it has one (the
  four attention projections for the built-in SmolLM2), else peft's
  default for the architecture (``q_proj``/``v_proj`` for Llama).
* ``adapter``: ``dora`` is peft's ``use_dora``; ``qlora`` loads the base in
  4-bit NF4 with bitsandbytes (double quantization, compute in the
  precision above) and needs a CUDA GPU and bitsandbytes, which is checked
  before the model loads.
* ``lr_scheduler`` is transformers' ``lr_scheduler_type`` as written, as in
  DLM: ``constant`` is constant from the first step, so ``warmup_ratio``
  shapes ``cosine`` and ``linear`` only.
* ``warmup_ratio`` goes to transformers as a fractional ``warmup_steps``,
  which it reads as a share of the total steps (rounded up).
* ``optimizer`` is transformers' ``optim``: the two 8-bit ones need
  bitsandbytes, the GaLore ones galore-torch (checked before the model
  loads); GaLore projects the gradients of the linear layers that train.

:func:`check_settings` runs before any work (it needs no model);
:func:`resolve_plan` runs once the model is loaded, since the automatic
micro-batch depends on its parameter count. :func:`sft_config_kwargs`,
:func:`lora_config_kwargs` and :func:`model_load_kwargs` turn the plan
into the keyword arguments of ``SFTConfig``, ``LoraConfig`` and
``from_pretrained``.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from dlmstore.errors import TrainingError

if TYPE_CHECKING:
    from dlmstore.bases import BaseModelRef
    from dlmstore.document.frontmatter import PreferenceSettings

Precision = Literal["bf16", "fp16", "fp32"]

#: DLM's effective batch target for ``grad_accum: auto``.
EFFECTIVE_BATCH = 8
#: Micro-batch sizes ``micro_batch_size: auto`` tries, smallest first.
MICRO_BATCHES = (1, 2, 4, 8, 16)
#: Share of the memory the planner lets training use.
CPU_BUDGET = 0.50
CUDA_BUDGET = 0.85

#: DLM's LoRA targets for the bases it registers (every architecture but Phi-3).
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")

#: Optimizers that need a package beyond the training stack, and its pip name.
OPTIMIZER_PACKAGES: dict[str, tuple[str, ...]] = {
    "adamw_bnb_8bit": ("bitsandbytes",),
    "paged_adamw_8bit": ("bitsandbytes",),
    "galore_adamw": ("galore-torch",),
    "galore_adamw_8bit": ("galore-torch", "bitsandbytes"),
}
_IMPORT_NAMES = {
    "bitsandbytes": "bitsandbytes",
    "galore-torch": "galore_torch",
    # training.report_to: each reporter is its own package (and pip extra).
    "tensorboard": "tensorboard",
    "trackio": "trackio",
}


@dataclass(frozen=True)
class Hardware:
    """What the plan depends on about this machine.

    Attributes:
        device: ``cuda`` when torch sees a CUDA GPU, else ``cpu``.
        bf16: torch can train in bfloat16 on that device.
        memory_gib: the device's memory (GPU memory on CUDA, RAM on CPU).
        packages: which optional packages are importable (pip names).
    """

    device: Literal["cpu", "cuda"]
    bf16: bool
    memory_gib: float
    packages: frozenset[str]


def probe_hardware() -> Hardware:
    """Look at this machine (imports torch)."""
    import torch

    packages = frozenset(name for name, module in _IMPORT_NAMES.items() if importlib.util.find_spec(module))
    if torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        return Hardware("cuda", torch.cuda.is_bf16_supported(), total / 1024**3, packages)
    from transformers.utils.import_utils import is_torch_bf16_available_on_device

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Hardware("cpu", is_torch_bf16_available_on_device("cpu"), ram / 1024**3, packages)


@dataclass(frozen=True)
class TrainingPlan:
    """Every training knob, resolved: what ``dlm train`` hands TRL, transformers and peft.

    ``target_modules`` is ``None`` when peft picks them (``auto`` with no DLM
    list for the base); the run summary reports the ones peft chose.
    ``max_steps`` ``None`` trains ``num_epochs`` full passes.

    Attributes:
        device: ``cuda`` or ``cpu``.
        adapter: ``lora`` or ``qlora``.
        lora_r: LoRA rank.
        lora_alpha: LoRA alpha.
        lora_dropout: LoRA dropout.
        target_modules: Modules LoRA wraps; null when peft picks them.
        precision: ``bf16``, ``fp16`` or ``fp32``.
        micro_batch_size: Rows per device step.
        grad_accum: Device steps per optimizer step.
        effective_batch_size: Rows per optimizer step (``micro_batch_size * grad_accum``).
        learning_rate: Peak learning rate.
        num_epochs: Passes over the rows when ``max_steps`` is null.
        max_steps: Optimizer steps to train; null to train ``num_epochs`` passes.
        lr_scheduler: Learning-rate schedule (transformers' name).
        warmup_ratio: Share of the steps spent warming up.
        optimizer: Optimizer (transformers' name).
        seed: Training seed.
        report_to: Where the trainer also sends its logs (``training.report_to``): tensorboard, trackio.
        sequence_len: Tokens per row at most.
    """

    device: str
    adapter: str
    lora_r: int
    lora_alpha: int
    lora_dropout: float
    target_modules: list[str] | None
    precision: Precision
    micro_batch_size: int
    grad_accum: int
    effective_batch_size: int
    learning_rate: float
    num_epochs: int
    max_steps: int | None
    lr_scheduler: str
    warmup_ratio: float
    optimizer: str
    seed: int
    sequence_len: int
    #: ``training.report_to``: the reporters TRL sends its logs to, besides the store.
    report_to: tuple[str, ...] = ()


def dlm_target_modules(ref: BaseModelRef) -> tuple[str, ...] | None:
    """DLM's LoRA targets for ``ref``, or ``None`` where peft's default applies.

    The built-in base is DLM's ``smollm2-135m`` registry entry, which adapts
    the four attention projections; a registry name takes its entry's list
    (``dlmstore.base_registry``); a local folder or hub id has no DLM entry.
    """
    if ref.kind == "builtin":
        return ATTENTION_PROJECTIONS
    if ref.kind == "registry":
        from dlmstore.base_registry import REGISTRY

        entry = REGISTRY.get(ref.name)
        return tuple(entry.target_modules) if entry is not None else None
    return None


def check_settings(settings: Any, hardware: Hardware) -> Precision:
    """Refuse what this machine cannot train, before anything is loaded.

    Args:
        settings: the document's ``TrainingSettings``.
        hardware: this machine (:func:`probe_hardware`).

    Returns:
        The precision to train in (``training.precision`` or the default for the device).

    Raises:
        TrainingError: ``adapter: qlora`` without a CUDA GPU or bitsandbytes,
            an optimizer or a ``report_to`` reporter whose package is
            missing, or a precision the device cannot train in.
    """
    if settings.adapter == "qlora":
        if hardware.device != "cuda":
            raise TrainingError(
                "training.adapter: qlora needs a CUDA GPU (it loads the base in 4 bits with "
                "bitsandbytes), and this machine has none",
                hint="set training.adapter to lora (or dora) to train on this machine",
            )
        if "bitsandbytes" not in hardware.packages:
            raise TrainingError(
                "training.adapter: qlora needs the bitsandbytes package, which is not installed",
                hint="pip install bitsandbytes, or set training.adapter to lora",
            )
    missing = [
        name for name in OPTIMIZER_PACKAGES.get(settings.optimizer, ()) if name not in hardware.packages
    ]
    if missing:
        raise TrainingError(
            f"training.optimizer: {settings.optimizer} needs the {' and '.join(missing)} "
            f"package{'s' if len(missing) > 1 else ''}, which {'are' if len(missing) > 1 else 'is'} not installed",
            hint=f"pip install {' '.join(missing)}, or set training.optimizer to adamw_torch",
        )
    _check_reporters(settings.report_to, hardware)
    precision: Precision | None = settings.precision
    if precision is None:
        if hardware.device == "cpu":
            return "fp32"
        return "bf16" if hardware.bf16 else "fp16"
    if precision == "fp16" and hardware.device == "cpu":
        raise TrainingError(
            "training.precision: fp16 needs a CUDA GPU; on CPU transformers would silently train in fp32",
            hint="set training.precision to fp32 (or bf16), or leave it unset to use fp32 on CPU",
        )
    if precision == "bf16" and not hardware.bf16:
        where = "this GPU" if hardware.device == "cuda" else "torch on this CPU"
        raise TrainingError(
            f"training.precision: bf16 is not supported by {where}",
            hint="set training.precision to fp32"
            + (" or fp16" if hardware.device == "cuda" else "")
            + ", or leave it unset to pick one for this machine",
        )
    return precision


def resolve_plan(
    settings: Any,
    hardware: Hardware,
    *,
    base_params: int,
    auto_target_modules: tuple[str, ...] | None = None,
    epochs: int | None = None,
    max_steps: int | None = None,
    seed: int | None = None,
) -> TrainingPlan:
    """Resolve every ``training`` key for this machine and base model.

    Args:
        settings: the document's ``TrainingSettings``.
        hardware: this machine (:func:`probe_hardware`).
        base_params: the base model's parameter count (sizes ``micro_batch_size: auto``).
        auto_target_modules: DLM's LoRA targets for the base, or ``None``
            to let peft pick (what ``target_modules: auto`` means).
        epochs, max_steps, seed: command-line overrides of ``num_epochs``,
            ``max_steps`` and ``seed``.

    Raises:
        TrainingError: as :func:`check_settings`.
    """
    precision = check_settings(settings, hardware)
    qlora = settings.adapter == "qlora"
    micro_batch = settings.micro_batch_size
    if micro_batch == "auto":
        budget = hardware.memory_gib * (CUDA_BUDGET if hardware.device == "cuda" else CPU_BUDGET)
        micro_batch = MICRO_BATCHES[0]
        for candidate in MICRO_BATCHES[1:]:
            peak = peak_memory_gib(
                base_params=base_params, seq_len=settings.sequence_len, micro_batch=candidate,
                precision=precision, qlora=qlora, lora_r=settings.lora_r, optimizer=settings.optimizer,
            )  # fmt: skip
            if peak > budget:
                break
            micro_batch = candidate
    grad_accum = settings.grad_accum
    if grad_accum == "auto":
        grad_accum = max(1, EFFECTIVE_BATCH // micro_batch)
    if settings.target_modules != "auto":
        targets: list[str] | None = list(settings.target_modules)
    else:
        targets = list(auto_target_modules) if auto_target_modules else None
    return TrainingPlan(
        device=hardware.device,
        adapter=settings.adapter,
        lora_r=settings.lora_r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        target_modules=targets,
        precision=precision,
        micro_batch_size=micro_batch,
        grad_accum=grad_accum,
        effective_batch_size=micro_batch * grad_accum,
        learning_rate=settings.learning_rate,
        num_epochs=settings.num_epochs if epochs is None else epochs,
        max_steps=settings.max_steps if max_steps is None else max_steps,
        lr_scheduler=settings.lr_scheduler,
        warmup_ratio=settings.warmup_ratio,
        optimizer=settings.optimizer,
        seed=settings.seed if seed is None else seed,
        sequence_len=settings.sequence_len,
        report_to=tuple(settings.report_to),
    )


def _check_reporters(report_to: list[str], hardware: Hardware) -> None:
    """Refuse a ``training.report_to`` reporter whose package is missing, naming its pip extra."""
    missing = [name for name in report_to if name not in hardware.packages]
    if missing:
        extras = ",".join(missing)
        raise TrainingError(
            f"training.report_to: {' and '.join(missing)} needs the {' and '.join(missing)} "
            f"package{'s' if len(missing) > 1 else ''}, which {'are' if len(missing) > 1 else 'is'} not installed",
            hint=f"pip install 'dlmstore[{extras}]', or remove {' and '.join(missing)} from training.report_to",
        )


def peak_memory_gib(
    *,
    base_params: int,
    seq_len: int,
    micro_batch: int,
    precision: Precision,
    qlora: bool,
    lora_r: int,
    optimizer: str,
) -> float:
    """DLM's order-of-magnitude estimate of a LoRA step's peak memory, in GiB.

    Weights (4-bit NF4 is about 0.56 bytes a parameter) + activations (48
    bytes per token per layer over 24 layers, a quarter of that with
    gradient checkpointing, which the micro-batch search assumes) + the
    LoRA weights and their optimizer state (LoRA covering ~5% of the
    parameters, ``2 * r * sqrt(covered)`` of them; 8 bytes each for AdamW,
    1.25 for the 8-bit ones) + 20% margin. Advisory: it only picks a
    default.
    """
    weight_bytes = 2 if precision != "fp32" else 4
    weights = base_params * (0.56 if qlora else weight_bytes)
    covered = int(base_params * 0.05)
    lora_params = 2 * lora_r * int(covered**0.5) if covered > 0 else 0
    optimizer_bytes = 1.25 if optimizer in ("adamw_bnb_8bit", "paged_adamw_8bit") else 8.0
    activations = seq_len * micro_batch * 24 * 48.0 * 0.25
    total = weights + activations + lora_params * (optimizer_bytes + weight_bytes)
    return total * 1.20 / 1024**3


def sft_config_kwargs(plan: TrainingPlan, output_dir: str) -> dict[str, Any]:
    """Keyword arguments of TRL's ``SFTConfig`` for ``plan``.

    Besides the plan: one log line per step (the step recorder stores it),
    no checkpoints (the adapter is saved by dlmstore), reporting only to
    ``training.report_to`` (:mod:`dlmstore.train.loops.reporting`), no
    progress bar (dlmstore draws its own) and no loader workers.
    """
    kwargs = _trainer_kwargs(plan, output_dir, epochs=plan.num_epochs, learning_rate=plan.learning_rate)
    kwargs.update(
        lr_scheduler_type=plan.lr_scheduler,
        warmup_steps=plan.warmup_ratio,  # below 1: a share of the total steps
        optim=plan.optimizer,
    )
    if plan.optimizer.startswith("galore_"):
        # transformers refuses GaLore without a module list; with LoRA the
        # linear layers that train are the adapter matrices.
        kwargs["optim_target_modules"] = "all-linear"
    return kwargs


def preference_config_kwargs(
    plan: TrainingPlan, settings: PreferenceSettings, output_dir: str
) -> dict[str, Any]:
    """Keyword arguments of TRL's ``DPOConfig`` or ORPO's ``ORPOConfig`` for the preference phase.

    DLM's mapping: learning rate and epochs come from
    ``training.preference.hyperparams``; batch sizes, precision, sequence
    length (TRL's ``max_length``), seed and ``max_steps`` from the plan;
    DPO's ``beta`` and ``loss_type`` as written; ORPO's ``alpha`` is TRL's
    ``beta`` (TRL's name for the odds-ratio weight). The optimizer and
    learning-rate schedule are TRL's defaults, as in DLM: the SFT keys
    (``optimizer``, ``lr_scheduler``, ``warmup_ratio``) shape SFT only.
    Logging, checkpoints and workers as for SFT.
    """
    hyper = settings.hyperparams
    kwargs = _trainer_kwargs(plan, output_dir, epochs=hyper.num_epochs, learning_rate=hyper.learning_rate)
    if settings.method == "dpo":
        kwargs["beta"] = hyper.beta
        kwargs["loss_type"] = settings.loss_type
    else:
        kwargs["beta"] = hyper.alpha
    return kwargs


def _trainer_kwargs(
    plan: TrainingPlan, output_dir: str, *, epochs: int, learning_rate: float
) -> dict[str, Any]:
    """The ``TrainingArguments`` every phase shares: batches, precision, seed, length, logging, no saves."""
    return {
        "output_dir": output_dir,
        "num_train_epochs": float(epochs),
        "max_steps": plan.max_steps if plan.max_steps is not None else -1,
        "per_device_train_batch_size": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.grad_accum,
        "learning_rate": learning_rate,
        "bf16": plan.precision == "bf16",
        "fp16": plan.precision == "fp16",
        "seed": plan.seed,
        "data_seed": plan.seed,
        "max_length": plan.sequence_len,
        "use_cpu": plan.device == "cpu",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": list(plan.report_to),
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


def lora_config_kwargs(plan: TrainingPlan) -> dict[str, Any]:
    """Keyword arguments of peft's ``LoraConfig`` for ``plan``."""
    return {
        "r": plan.lora_r,
        "lora_alpha": plan.lora_alpha,
        "lora_dropout": plan.lora_dropout,
        "target_modules": plan.target_modules,
        "use_dora": plan.adapter == "dora",
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }


def model_load_kwargs(adapter: str, precision: Precision) -> dict[str, Any]:
    """Keyword arguments of ``from_pretrained``: the dtype, and 4-bit loading for QLoRA."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
    kwargs: dict[str, Any] = {"dtype": dtype}
    if adapter == "qlora":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(  # type: ignore[no-untyped-call]
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=dtype,
            bnb_4bit_use_double_quant=True,
        )
    return kwargs

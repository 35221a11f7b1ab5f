"""The YAML frontmatter of a .dlm document: its pydantic models.

The keys, types, defaults and bounds are DocumentLanguageModel's schema
(version :data:`CURRENT_DLM_VERSION`), plus dlmstore's documented
extensions. Every model forbids unknown keys so a typo (``trainig:``) is an
error naming the key instead of a silently ignored setting. Every field
except ``dlm_id`` has a default, so a minimal document is just an id.
Numeric fields are strict: YAML ``true`` is a boolean, not the number 1, and
a quoted ``"42"`` or a float ``2048.0`` is not a whole number either. Every
float field is finite: YAML's ``.inf``, ``-.inf`` and ``.nan`` are refused
by the field before its bounds are checked (DLM's schema leaves
``learning_rate`` unbounded above, so without this ``learning_rate: .inf``
would train an adapter of NaNs).

:mod:`dlmstore.document.loading` turns the YAML text between the ``---``
fences into a validated :class:`Frontmatter`, with every problem at its line.

Speed: every command that reads a document pays for these models at
import, about 15 ms to build them on a 2-core machine (importing pydantic
itself costs several times that). ``defer_build`` does not help: the warm
path validates a whole :class:`Frontmatter` anyway, and building the nested
models with it costs as much as building them one by one (measured). A
list default is made by a function, not by ``list``: pydantic asks
``inspect.signature`` of every default factory, and for a builtin that
parses its text signature with the tokenize module, whose first use
compiles a large regex (~8 ms per process).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from dlmstore.document.versions import CURRENT_DLM_VERSION
from dlmstore.ulid import is_valid_ulid

DEFAULT_BASE_MODEL = "smollm2-135m"

GIB = 1024**3

#: The largest training.seed: NumPy's generators take seeds below 2^32.
MAX_SEED = 2**32 - 1

#: The longest cache retention, 100 years (the longest ``--older-than`` too).
MAX_PRUNE_DAYS = 36_500

#: Frontmatter blocks DLM defines for capabilities dlmstore does not have. A
#: document may set them (it stays a valid DLM document); ``dlm show`` and
#: ``dlm train`` list the keys it sets as "not used by dlmstore".
NOT_USED = (
    "training.audio",
    "training.cpt",
)

_ADAPTER_NAME = r"^[a-z][a-z0-9_]{0,31}$"


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number, not {value}")
    return value


def _empty_list() -> list[Any]:
    # Not ``default_factory=list``: see the module's Speed note.
    return []


#: A float field's type: YAML's ``.inf`` / ``.nan`` are an error naming the field.
FiniteFloat = Annotated[float, BeforeValidator(_finite)]


class _Strict(BaseModel):
    # allow_inf_nan=False refuses a non-finite float in any float field, one
    # added later without FiniteFloat too (with pydantic's wording, not ours).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SourceDirective(_Strict):
    """One ``training.sources`` entry: a folder (or file) of training text."""

    path: str = Field(
        min_length=1,
        description="Folder or file to train on, relative to the .dlm file (`~` expands).",
    )
    include: list[str] = Field(
        default_factory=lambda: ["**/*"],
        description="Glob patterns of the files to read, relative to `path`.",
    )
    exclude: list[str] = Field(
        default_factory=_empty_list,
        description="Glob patterns of files to skip, even when an include matches them.",
    )
    max_bytes_per_file: int | None = Field(
        default=None,
        gt=0,
        strict=True,
        description="Skip files larger than this many bytes (unset: dlmstore skips files over 4 MiB, with a warning).",
    )
    max_files: int | None = Field(
        default=None,
        gt=0,
        strict=True,
        description="Read at most this many files, in path order.",
    )
    default_excludes: bool = Field(
        default=True,
        description="dlmstore extension: set false to read what the default excludes skip "
        "(VCS folders, build output, lock files, secrets).",
    )


class CacheSettings(_Strict):
    """``training.cache``: the tokenized-section cache knobs."""

    enabled: bool = Field(default=True, description="Reuse tokenized sections between runs.")
    max_bytes: int = Field(
        default=10 * GIB,
        gt=0,
        strict=True,
        description="Size limit of the tokenized-section cache, in bytes.",
    )
    prune_older_than_days: int = Field(
        default=90,
        ge=0,
        le=MAX_PRUNE_DAYS,
        strict=True,
        description="Prune cache entries that no run has used for this many days.",
    )
    share: bool = Field(
        default=True,
        description="dlmstore extension: a row this store has not tokenized is first looked up in the "
        "other stores of the home, and its tokens are taken from there (the segment hard-linked, else "
        "copied) instead of tokenizing it again; `false`, or `--no-share`, tokenizes it here.",
    )


class ReplaySettings(_Strict):
    """``training.replay``: the history of trained rows, and how the replay draw sizes and weighs them."""

    enabled: bool = Field(
        default=True,
        description="dlmstore extension (DLM keeps a replay corpus with fixed settings): record each "
        "completed run's rows in the store's replay history (`dlm replay show`), and replay the rows an "
        "edit removed in the next run (`dlm train --no-replay` skips one run's draw).",
    )
    min_rows: int = Field(
        default=32,
        ge=0,
        le=1_000_000,
        strict=True,
        description="dlmstore extension: the fewest rows a draw takes (all candidates when fewer); DLM's 32.",
    )
    factor: int = Field(
        default=2,
        ge=0,
        le=100,
        strict=True,
        description="dlmstore extension: a draw takes this many rows per row new in the run; DLM's 2.",
    )
    preference_min: int = Field(
        default=8,
        ge=0,
        le=1_000_000,
        strict=True,
        description="dlmstore extension: the fewest preference triples a draw takes; DLM's 8.",
    )
    weight_floor: FiniteFloat = Field(
        default=0.01,
        gt=0.0,
        le=1.0,
        strict=True,
        description="dlmstore extension: the least weight of a row, however old; DLM's 0.01.",
    )
    retention_fraction: FiniteFloat = Field(
        default=0.05,
        ge=0.0,
        le=0.5,
        strict=True,
        description="dlmstore extension: the share of rows held in the retention slice, chosen once "
        "as a row enters history and never drawn; DLM's 5%.",
    )
    max_bytes: int = Field(
        default=GIB,
        gt=0,
        strict=True,
        description="dlmstore extension: the size cap of the history's content, uncompressed, in bytes; "
        "rows the document no longer holds are evicted past it, oldest generation first.",
    )


class PreferenceHyperparams(_Strict):
    """``training.preference.hyperparams``: DPO/ORPO knobs."""

    beta: FiniteFloat = Field(default=0.1, ge=0.0, le=1.0, strict=True, description="DPO beta.")
    alpha: FiniteFloat = Field(default=0.1, ge=0.0, le=1.0, strict=True, description="ORPO alpha.")
    learning_rate: FiniteFloat = Field(
        default=5e-6, gt=0.0, strict=True, description="Learning rate of the preference phase."
    )
    num_epochs: int = Field(default=1, ge=1, strict=True, description="Epochs of the preference phase.")


class PreferenceSettings(_Strict):
    """``training.preference``: the preference phase (DPO or ORPO) after SFT."""

    enabled: bool = Field(
        default=False,
        description=(
            "Run the preference phase after SFT. Unset, it runs when the document has `::preference::` "
            "sections; `true` without any warns and skips the phase, `false` leaves them untrained (a warning)."
        ),
        json_schema_extra={"unset": "unset: on when the document has `::preference::` sections"},
    )
    method: Literal["dpo", "orpo"] = Field(default="dpo", description="Preference method.")
    hyperparams: PreferenceHyperparams = Field(
        default_factory=PreferenceHyperparams, description="Method hyperparameters."
    )
    loss_type: Literal["sigmoid", "hinge", "ipo"] = Field(default="sigmoid", description="DPO loss.")
    reference: Literal["base", "pre_adapter"] = Field(
        default="pre_adapter", description="Reference model of the DPO loss."
    )


class CptSettings(_Strict):
    """``training.cpt``: continued-pretraining refinements."""

    schedule: Literal["auto", "dapt", "sft"] = Field(
        default="auto", description="Learning-rate schedule family."
    )
    embed_warmup_steps: int = Field(
        default=0, ge=0, strict=True, description="Steps with embeddings unfrozen at the start."
    )


class GateSettings(_Strict):
    """``training.gate``: DLM's learned router over named adapters."""

    enabled: bool = Field(default=False, description="Train a gate over the named adapters.")
    hidden_proj_dim: int = Field(default=64, ge=8, le=2048, strict=True, description="Gate hidden size.")
    steps: int = Field(default=200, ge=1, le=10000, strict=True, description="Gate training steps.")
    lr: FiniteFloat = Field(default=3e-4, gt=0.0, le=1.0, strict=True, description="Gate learning rate.")
    cold_start_floor: int = Field(
        default=4, ge=1, le=1024, strict=True, description="Sections per adapter below which no gate trains."
    )
    entropy_lambda: FiniteFloat = Field(
        default=0.01, ge=0.0, le=1.0, strict=True, description="Entropy regularisation of the gate."
    )


class AudioSettings(_Strict):
    """``training.audio``: DLM's audio-pipeline knobs."""

    auto_resample: bool = Field(default=False, description="Resample audio to the base's rate.")


def _check_target_modules(value: object) -> object:
    if value != "auto" and not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
        raise ValueError(f"must be auto or a list of module names, not {short_repr(value)}")
    return value


class AdapterSettings(_Strict):
    """One entry of ``training.adapters``: a named adapter of a multi-adapter document."""

    adapter: Literal["lora", "qlora", "dora"] = Field(default="lora", description="Adapter kind.")
    lora_r: int = Field(default=8, ge=1, le=256, strict=True, description="LoRA rank.")
    lora_alpha: int = Field(default=16, ge=1, strict=True, description="LoRA alpha.")
    lora_dropout: FiniteFloat = Field(default=0.05, ge=0.0, le=0.5, strict=True, description="LoRA dropout.")
    target_modules: Literal["auto"] | list[str] = Field(default="auto", description="Modules to adapt.")
    learning_rate: FiniteFloat = Field(default=2e-4, gt=0.0, strict=True, description="Learning rate.")

    _target_modules = field_validator("target_modules", mode="before")(_check_target_modules)


class DatasetInput(_Strict):
    """One entry of ``training.datasets``: a token dataset trained on beside the document's rows."""

    path: str = Field(
        min_length=1,
        description="A dataset folder built by `dlm data build` (its meta.json beside the splits), or "
        "`s3://bucket/prefix` where one was uploaded (read through this node's cache); relative paths are "
        "read from the document's folder.",
    )
    weight: FiniteFloat = Field(
        default=1.0,
        gt=0.0,
        strict=True,
        description="Mixture weight: items are drawn in proportion to it; the document's own rows weigh 1.",
    )
    split: Literal["train", "val"] = Field(default="train", description="The split to train on.")


class TrainingSettings(_Strict):
    """``training``: LoRA, optimizer and schedule knobs, sources and the cache."""

    adapter: Literal["lora", "qlora", "dora"] = Field(
        default="lora",
        description="`lora`, `dora` (weight-decomposed LoRA) or `qlora` (4-bit base; needs CUDA).",
    )
    lora_r: int = Field(
        default=8, ge=1, le=256, strict=True, description="LoRA rank of the adapter matrices."
    )
    lora_alpha: int = Field(
        default=16, ge=1, strict=True, description="LoRA alpha: scales the adapter's update."
    )
    lora_dropout: FiniteFloat = Field(
        default=0.05, ge=0.0, le=0.5, strict=True, description="LoRA dropout probability."
    )
    target_modules: Literal["auto"] | list[str] = Field(
        default="auto",
        description="Module names to adapt; `auto` uses DLM's list for the base, else peft's default.",
    )
    sequence_len: int = Field(
        default=2048,
        ge=64,
        le=32768,
        strict=True,
        description="Maximum length of one training example, in tokens.",
    )
    micro_batch_size: Literal["auto"] | int = Field(
        default="auto",
        description="Training examples per device per step; `auto` picks one for the hardware.",
    )
    grad_accum: Literal["auto"] | int = Field(
        default="auto",
        description="Micro-batches accumulated per optimizer step; `auto` picks one for the hardware.",
    )
    learning_rate: FiniteFloat = Field(
        default=2e-4, strict=True, gt=0.0, description="Optimizer learning rate."
    )
    num_epochs: int = Field(
        default=3, ge=1, strict=True, description="Number of passes over the training rows."
    )
    optimizer: Literal[
        "adamw_torch", "adamw_bnb_8bit", "paged_adamw_8bit", "galore_adamw", "galore_adamw_8bit"
    ] = Field(default="adamw_torch", description="Optimizer (the 8-bit and GaLore ones need their packages).")
    lr_scheduler: Literal["cosine", "linear", "constant"] = Field(
        default="cosine", description="Learning-rate schedule after warmup."
    )
    warmup_ratio: FiniteFloat = Field(
        default=0.1, ge=0.0, le=0.5, strict=True, description="Fraction of the steps spent warming up."
    )
    precision: Literal["bf16", "fp16", "fp32"] | None = Field(
        default=None, description="Training precision; unset picks one for the hardware."
    )
    seed: int = Field(
        default=42,
        ge=0,
        le=MAX_SEED,
        strict=True,
        description="Random seed, for reproducible training runs (0 to 2^32 - 1, what NumPy accepts).",
    )
    max_steps: int | None = Field(
        default=None,
        gt=0,
        strict=True,
        description="dlmstore extension: stop after this many optimizer steps, even before the last epoch ends.",
    )
    datasets: list[DatasetInput] = Field(
        default_factory=_empty_list,
        description="dlmstore extension: token datasets (`dlm data build`) to train on beside the "
        "document's rows, mixed by weight: pretrain datasets as packed windows of sequence_len tokens, "
        "SFT datasets with their assistant-only loss masks.",
    )
    checkpoint_steps: int | None = Field(
        default=50,
        gt=0,
        strict=True,
        description="dlmstore extension: write a checkpoint into the store every this many optimizer "
        "steps, so `dlm train --resume` continues an interrupted run; null writes none.",
    )
    report_to: list[Literal["tensorboard", "trackio"]] = Field(
        default_factory=_empty_list,
        description="dlmstore extension: where the trainer also sends its logs (TRL's `report_to`): "
        "`tensorboard` (event files in the store's `runs/<run id>/tb/<phase>`) and/or `trackio`; "
        "each needs its pip extra (`pip install 'dlmstore[tensorboard]'`). Default: none.",
    )
    preference: PreferenceSettings = Field(
        default_factory=PreferenceSettings, description="The preference phase (DPO or ORPO)."
    )
    cpt: CptSettings = Field(default_factory=CptSettings, description="Continued-pretraining refinements.")
    gate: GateSettings = Field(default_factory=GateSettings, description="Learned gate over named adapters.")
    cache: CacheSettings = Field(
        default_factory=CacheSettings, description="Settings of the tokenized-section cache."
    )
    replay: ReplaySettings = Field(
        default_factory=ReplaySettings,
        description="dlmstore extension: the replay history of trained rows (docs/training.md).",
    )
    audio: AudioSettings = Field(default_factory=AudioSettings, description="Audio-pipeline knobs.")
    adapters: dict[str, AdapterSettings] | None = Field(
        default=None, description="Named adapters of a multi-adapter document."
    )
    sources: list[SourceDirective] = Field(
        default_factory=_empty_list,
        description="Folders or files whose text is trained on as prose, one section per file.",
    )
    dedup: Literal["off", "exact", "near"] = Field(
        default="off",
        description="dlmstore extension: what training does with duplicate text rows (docs/dedup.md). "
        "`off` trains every row and only reports the clusters (`dlm show`); `exact` drops all but one "
        "row of each set of identical texts; `near` all but one of each near-duplicate cluster "
        "(MinHash over 5-word shingles, similarity 0.8 or more).",
    )
    sources_policy: Literal["permissive", "strict"] = Field(
        default="permissive",
        description="`strict` makes a source path or symlink leading outside the document's "
        "folder an error; `permissive` reads such a path and skips such a symlink.",
    )

    @field_validator("sources", "datasets", mode="before")
    @classmethod
    def _null_sources(cls, value: object) -> object:
        return [] if value is None else value

    @field_validator("dedup", mode="before")
    @classmethod
    def _off(cls, value: object) -> object:
        # YAML 1.1 reads a bare `off` as false: `dedup: off` means what it says.
        return "off" if value is False else value

    @field_validator("report_to", mode="before")
    @classmethod
    def _one_or_none(cls, value: object) -> object:
        # TRL's spellings: `none` (or nothing) for no reporter, one name for a list of one.
        if value is None or value == "none":
            return []
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and len(set(map(str, value))) < len(value):
            raise ValueError("name each reporter once")
        return value

    @field_validator("micro_batch_size", "grad_accum", mode="before")
    @classmethod
    def _auto_or_positive(cls, value: object) -> object:
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"must be a whole number of at least 1, or auto, not {short_repr(value)}")
        return value

    @field_validator("target_modules", mode="before")
    @classmethod
    def _auto_or_names(cls, value: object) -> object:
        return _check_target_modules(value)

    @field_validator("adapters")
    @classmethod
    def _adapter_names(cls, value: dict[str, AdapterSettings] | None) -> dict[str, AdapterSettings] | None:
        if value is not None:
            if not value:
                raise ValueError("must declare at least one adapter (or leave the key out)")
            for name in value:
                if not re.fullmatch(_ADAPTER_NAME, name):
                    raise ValueError(f"{name!r} is not an adapter name (lower case letter, then a-z 0-9 _)")
        return value

    @model_validator(mode="after")
    def _adapter_shapes(self) -> TrainingSettings:
        if self.gate.enabled and (self.adapters is None or len(self.adapters) < 2):
            raise ValueError("gate.enabled needs training.adapters with two or more adapters")
        if self.adapters is not None:
            # As in DLM, a flat key written out at its default is harmless;
            # only a value that would lose to the per-adapter blocks is refused.
            flat = ("adapter", "learning_rate", "lora_alpha", "lora_dropout", "lora_r", "target_modules")
            fields = type(self).model_fields
            drift = [key for key in flat if getattr(self, key) != fields[key].default]
            if drift:
                raise ValueError(
                    f"training.adapters is set, so {', '.join(drift)} must keep the default here "
                    "and move into each adapter's block"
                )
        return self


class ExportSettings(_Strict):
    """``export``: the defaults of ``dlm export`` (DLM's GGUF/Ollama export defaults)."""

    default_quant: Literal["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"] = Field(
        default="Q4_K_M", description="Quantisation of the GGUF files when `dlm export` is given no --quant."
    )
    default_temperature: Annotated[float | None, BeforeValidator(_finite)] = Field(
        default=None,
        gt=0.0,
        le=2.0,
        strict=True,
        description="`PARAMETER temperature` of the exported Modelfile (unset: 0.7).",
    )
    default_top_p: Annotated[float | None, BeforeValidator(_finite)] = Field(
        default=None,
        gt=0.0,
        le=1.0,
        strict=True,
        description="`PARAMETER top_p` of the exported Modelfile (unset: 0.9).",
    )


class Frontmatter(_Strict):
    """The whole frontmatter block of a .dlm document."""

    dlm_id: str = Field(
        description="The document's ULID, written by `dlm init`; it keys the document's store."
    )
    dlm_version: int = Field(
        default=1,
        ge=1,
        strict=True,
        description=f"Version of DLM's frontmatter schema the document is written in, 1 to {CURRENT_DLM_VERSION}.",
    )
    base_model: str = Field(
        default=DEFAULT_BASE_MODEL,
        min_length=1,
        description="Model to fine-tune: the built-in `smollm2-135m`, a DLM registry name (base-models.md; "
        "loaded from the Hugging Face hub at a pinned commit), `hf:org/name`, `org/name` or a local folder.",
    )
    system_prompt: str | None = Field(
        default=None,
        description="System message for `dlm prompt` (not part of the training rows, as in DLM).",
    )
    training: TrainingSettings = Field(
        default_factory=TrainingSettings,
        description="LoRA, optimizer and schedule settings, the training sources and the cache.",
    )
    export: ExportSettings = Field(
        default_factory=ExportSettings, description="The defaults of `dlm export`."
    )

    @field_validator("dlm_id")
    @classmethod
    def _ulid(cls, value: str) -> str:
        if not is_valid_ulid(value):
            raise ValueError("must be a 26-character Crockford base32 ULID (run `dlm init` to mint one)")
        return value


def set_keys(model: BaseModel, prefix: str = "") -> list[str]:
    """Dotted paths of the leaf keys a document set explicitly, in field order."""
    out: list[str] = []
    for name in type(model).model_fields:
        if name not in model.model_fields_set:
            continue
        dotted = f"{prefix}{name}"
        value = getattr(model, name)
        if isinstance(value, BaseModel) and value.model_fields_set:
            out.extend(set_keys(value, dotted + "."))
        elif isinstance(value, dict) and value and all(isinstance(v, BaseModel) for v in value.values()):
            for key, item in value.items():
                out.extend(set_keys(item, f"{dotted}.{key}.") or [f"{dotted}.{key}"])
        else:
            out.append(dotted)
    return out


def unused_keys(frontmatter: Frontmatter) -> list[str]:
    """The keys the document sets that dlmstore reads but does not act on."""
    return [
        key for key in set_keys(frontmatter) if any(key == p or key.startswith(p + ".") for p in NOT_USED)
    ]


def short_repr(value: object, limit: int = 40) -> str:
    """A value as error messages quote it: ``repr``, cut to ``limit`` characters.

    Looks at no more of ``value`` than it prints: a list of lists that
    aliases repeat a billion times, or an integer too long for ``repr``
    (more than 4300 digits), costs as little as a short one.
    """
    if value is None:
        return "empty (null)"
    text = _repr_prefix(value, limit + 1)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _repr_prefix(value: object, budget: int) -> str:
    """``repr(value)``, or a prefix of it at least ``budget`` characters long."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * budget:
        return f"a number of about {int(value.bit_length() * 0.30103)} digits"
    items: Iterable[Any]
    if isinstance(value, dict):
        opening, closing, items = "{", "}", value.items()
    elif isinstance(value, list):
        opening, closing, items = "[", "]", value
    elif isinstance(value, tuple):
        opening, closing, items = "(", ",)" if len(value) == 1 else ")", value
    elif isinstance(value, (set, frozenset)):
        if not value:
            return f"{type(value).__name__}()"
        opening, closing, items = "{", "}", value
        if isinstance(value, frozenset):
            opening, closing = "frozenset({", "})"
    else:
        return repr(value)
    out = opening
    for index, item in enumerate(items):
        if len(out) >= budget:
            return out
        if index:
            out += ", "
        if isinstance(value, dict):
            key, item = item
            out += _repr_prefix(key, budget - len(out)) + ": "
        out += _repr_prefix(item, budget - len(out))
    return out + closing

"""The YAML frontmatter of a .dlm document: pydantic models and their loader.

Every model forbids unknown keys so a typo (``trainig:``) is an error naming
the key instead of a silently ignored setting. Every field except ``dlm_id``
has a default, so a minimal document is just an id. Integer fields are
strict: YAML ``true`` is a boolean, not the number 1, and a quoted ``"42"``
or a float ``2048.0`` is not a whole number either.

:func:`load_frontmatter` turns the YAML text between the ``---`` fences into
a validated :class:`Frontmatter`, reporting every problem as ONE
``DocumentError`` at ``path:line``. How lines are kept:

* **One parse, two uses.** ``yaml.compose`` semantics give the node tree
  with 0-based marks; we walk it once to record the file line of every key
  path (``("training", "sources", 0, "path")``: mark line + ``first_line``),
  then construct the Python object from the same nodes (``safe_load``
  semantics). The walk runs before construction, so it can see what
  ``safe_load`` hides: duplicate keys (an error, naming the first line),
  non-string keys (an unknown key), and merge keys (``<<``, which make an
  override legal). Nodes reached again through an alias are not re-walked,
  so an alias "billion laughs" costs linear time.
* **Pydantic errors become plain words.** Of all validation errors we report
  the one earliest in the file, at its key's line, or at the nearest
  ancestor that has one (a missing key is reported at its parent mapping;
  the frontmatter itself is at the opening ``---``). Bounds are worded from
  the field's own constraints, so messages never drift from the models.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dlmstore.document.versions import CURRENT_DLM_VERSION, LEGACY_KEYS, moved_path, upgrade
from dlmstore.errors import DocumentError, DocumentProblems
from dlmstore.ulid import is_valid_ulid

DEFAULT_BASE_MODEL = "smollm2-135m"

GIB = 1024**3

#: Frontmatter blocks DLM defines for capabilities dlmstore does not have. A
#: document may set them (it stays a valid DLM document); ``dlm show`` and
#: ``dlm train`` list the keys it sets as "not used by dlmstore".
NOT_USED = (
    "export",
    "training.adapters",
    "training.gate",
    "training.audio",
    "training.cpt",
    "training.preference",
)

_ADAPTER_NAME = r"^[a-z][a-z0-9_]{0,31}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
        default_factory=list,
        description="Glob patterns of files to skip, even when an include matches them.",
    )
    max_bytes_per_file: int | None = Field(
        default=None, gt=0, strict=True, description="Skip files larger than this many bytes."
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
        strict=True,
        description="Prune cache entries that no run has used for this many days.",
    )


class PreferenceHyperparams(_Strict):
    """``training.preference.hyperparams``: DPO/ORPO knobs."""

    beta: float = Field(default=0.1, ge=0.0, le=1.0, strict=True, description="DPO beta.")
    alpha: float = Field(default=0.1, ge=0.0, le=1.0, strict=True, description="ORPO alpha.")
    learning_rate: float = Field(
        default=5e-6, gt=0.0, strict=True, description="Learning rate of the preference phase."
    )
    num_epochs: int = Field(default=1, ge=1, strict=True, description="Epochs of the preference phase.")


class PreferenceSettings(_Strict):
    """``training.preference``: the preference phase (DPO or ORPO) after SFT."""

    enabled: bool = Field(default=False, description="Run the preference phase after SFT.")
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
    lr: float = Field(default=3e-4, gt=0.0, le=1.0, strict=True, description="Gate learning rate.")
    cold_start_floor: int = Field(
        default=4, ge=1, le=1024, strict=True, description="Sections per adapter below which no gate trains."
    )
    entropy_lambda: float = Field(
        default=0.01, ge=0.0, le=1.0, strict=True, description="Entropy regularisation of the gate."
    )


class AudioSettings(_Strict):
    """``training.audio``: DLM's audio-pipeline knobs."""

    auto_resample: bool = Field(default=False, description="Resample audio to the base's rate.")


def _check_target_modules(value: object) -> object:
    if value != "auto" and not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
        raise ValueError(f"must be auto or a list of module names, not {_short(value)}")
    return value


class AdapterSettings(_Strict):
    """One entry of ``training.adapters``: a named adapter of a multi-adapter document."""

    adapter: Literal["lora", "qlora", "dora"] = Field(default="lora", description="Adapter kind.")
    lora_r: int = Field(default=8, ge=1, le=256, strict=True, description="LoRA rank.")
    lora_alpha: int = Field(default=16, ge=1, strict=True, description="LoRA alpha.")
    lora_dropout: float = Field(default=0.05, ge=0.0, le=0.5, strict=True, description="LoRA dropout.")
    target_modules: Literal["auto"] | list[str] = Field(default="auto", description="Modules to adapt.")
    learning_rate: float = Field(default=2e-4, gt=0.0, strict=True, description="Learning rate.")

    _target_modules = field_validator("target_modules", mode="before")(_check_target_modules)


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
    lora_dropout: float = Field(
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
    learning_rate: float = Field(default=2e-4, strict=True, gt=0.0, description="Optimizer learning rate.")
    num_epochs: int = Field(
        default=3, ge=1, strict=True, description="Number of passes over the training rows."
    )
    optimizer: Literal[
        "adamw_torch", "adamw_bnb_8bit", "paged_adamw_8bit", "galore_adamw", "galore_adamw_8bit"
    ] = Field(default="adamw_torch", description="Optimizer (the 8-bit and GaLore ones need their packages).")
    lr_scheduler: Literal["cosine", "linear", "constant"] = Field(
        default="cosine", description="Learning-rate schedule after warmup."
    )
    warmup_ratio: float = Field(
        default=0.1, ge=0.0, le=0.5, strict=True, description="Fraction of the steps spent warming up."
    )
    precision: Literal["bf16", "fp16", "fp32"] | None = Field(
        default=None, description="Training precision; unset picks one for the hardware."
    )
    seed: int = Field(default=42, strict=True, description="Random seed, for reproducible training runs.")
    max_steps: int | None = Field(
        default=None,
        gt=0,
        strict=True,
        description="dlmstore extension: stop after this many optimizer steps, even before the last epoch ends.",
    )
    preference: PreferenceSettings = Field(
        default_factory=PreferenceSettings, description="The preference phase (DPO or ORPO)."
    )
    cpt: CptSettings = Field(default_factory=CptSettings, description="Continued-pretraining refinements.")
    gate: GateSettings = Field(default_factory=GateSettings, description="Learned gate over named adapters.")
    cache: CacheSettings = Field(
        default_factory=CacheSettings, description="Settings of the tokenized-section cache."
    )
    audio: AudioSettings = Field(default_factory=AudioSettings, description="Audio-pipeline knobs.")
    adapters: dict[str, AdapterSettings] | None = Field(
        default=None, description="Named adapters of a multi-adapter document."
    )
    sources: list[SourceDirective] = Field(
        default_factory=list,
        description="Folders or files whose text is trained on as prose, one section per file.",
    )
    sources_policy: Literal["permissive", "strict"] = Field(
        default="permissive",
        description="`strict` makes a source path or symlink leading outside the document's "
        "folder an error; `permissive` reads such a path and skips such a symlink.",
    )

    @field_validator("sources", mode="before")
    @classmethod
    def _null_sources(cls, value: object) -> object:
        return [] if value is None else value

    @field_validator("micro_batch_size", "grad_accum", mode="before")
    @classmethod
    def _auto_or_positive(cls, value: object) -> object:
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"must be a whole number of at least 1, or auto, not {_short(value)}")
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
    """``export``: DLM's GGUF/Ollama export defaults."""

    default_quant: Literal["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"] = Field(
        default="Q4_K_M", description="GGUF quantisation."
    )
    default_temperature: float | None = Field(
        default=None, gt=0.0, le=2.0, strict=True, description="Sampling temperature of the export."
    )
    default_top_p: float | None = Field(
        default=None, gt=0.0, le=1.0, strict=True, description="Sampling top_p of the export."
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
    export: ExportSettings = Field(default_factory=ExportSettings, description="DLM's export defaults.")

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


# --------------------------------------------------------------------------
# Loading, with line numbers

KeyPath = tuple[str | int, ...]


def load_frontmatter(yaml_text: str, *, path: str, first_line: int) -> Frontmatter:
    """Parse and validate the YAML text of a frontmatter block.

    Args:
        yaml_text: the lines between the two ``---`` fences, joined with
            ``\\n`` (line endings already normalised).
        path: the file name error messages start with, as the user gave it.
        first_line: the 1-based file line of ``yaml_text``'s first line; the
            opening ``---`` fence is taken to be the line before it, where
            problems of the block as a whole (a missing ``dlm_id``) point.

    Returns:
        The validated :class:`Frontmatter`, upgraded from the document's
        ``dlm_version`` (``dlmstore.document.versions``); an empty block is
        an empty mapping (and so lacks ``dlm_id``).

    Raises:
        DocumentError: invalid YAML, a block that is not a mapping, or a
            ``dlm_version`` this dlmstore cannot read.
        DocumentProblems: every duplicate or unknown key and every value the
            schema rejects, each at its line, in line order (a single problem
            is raised as a plain ``DocumentError``).
    """
    data, key_lines, problems = _compose(yaml_text, path, first_line)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise DocumentError(
            path,
            f"frontmatter must be a mapping of keys to values, not a {_yaml_kind(data)}",
            line=first_line,
            hint="write one `key: value` per line, e.g. `dlm_id: <ULID>`",
        )
    key_lines[()] = first_line - 1

    version = data.get("dlm_version", 1)
    version_line = key_lines.get(("dlm_version",))
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        problems.append(
            DocumentError(path, f"dlm_version: must be a whole number of at least 1, not {_short(version)}",
                          line=version_line, hint=f"the current version is {CURRENT_DLM_VERSION}")
        )  # fmt: skip
        version = CURRENT_DLM_VERSION
    elif version > CURRENT_DLM_VERSION:
        raise DocumentError(
            path,
            f"dlm_version {version} is newer than the DLM frontmatter this dlmstore reads "
            f"(versions 1 to {CURRENT_DLM_VERSION})",
            line=version_line,
            hint="a newer dlmstore may read it (pip install -U dlmstore); otherwise set dlm_version to "
            f"{CURRENT_DLM_VERSION} if the document uses no newer keys",
        )
    upgraded, _ = upgrade(data, version)
    upgraded = {**upgraded, "dlm_version": version}
    for old, line in list(key_lines.items()):
        new = moved_path(old)
        if new is not None:
            key_lines.setdefault(new, line)
    try:
        frontmatter = Frontmatter.model_validate(upgraded)
    except ValidationError as exc:
        problems.extend(_frontmatter_errors(exc, key_lines, path))
    if problems:
        raise DocumentProblems.of(problems)
    return frontmatter


class FrontmatterLoader(yaml.SafeLoader):  # type: ignore[misc]
    """PyYAML's safe loader reading YAML 1.2 floats without a dot (``2e-4``) as numbers.

    PyYAML implements YAML 1.1, where ``2e-4`` is a string; every YAML 1.2
    parser (and so everyone writing a learning rate) reads it as a float.
    """


FrontmatterLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _compose(
    yaml_text: str, path: str, first_line: int
) -> tuple[Any, dict[KeyPath, int], list[DocumentError]]:
    """The constructed YAML value, the line of every key path, and key problems.

    Raises:
        DocumentError: the text is not valid YAML.
    """
    try:
        # What yaml.safe_load does, keeping the node tree for its line marks.
        loader = FrontmatterLoader(yaml_text)
        try:
            node = loader.get_single_node()
            problems: list[DocumentError] = []
            key_lines = _key_lines(node, path, first_line, problems) if node is not None else {}
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = f"invalid YAML in frontmatter: {exc.problem or exc.context}"
        if exc.problem and exc.context and exc.context_mark is not None:
            message += f" ({exc.context} at line {exc.context_mark.line + first_line})"
        raise DocumentError(
            path, message, line=mark.line + first_line if mark is not None else None
        ) from None
    except yaml.YAMLError as exc:  # ReaderError: a character YAML refuses
        line = None
        if isinstance(exc, yaml.reader.ReaderError):
            line = yaml_text[: exc.position].count("\n") + first_line
        raise DocumentError(
            path, f"invalid YAML in frontmatter: {str(exc).splitlines()[0]}", line=line
        ) from None
    return data, key_lines, problems


def _yaml_kind(value: object) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, bool):
        return "boolean"
    return "number" if isinstance(value, (int, float)) else "string"


_YAML_KEY_TAGS = ("tag:yaml.org,2002:str", "tag:yaml.org,2002:merge")


def _key_lines(
    root: yaml.Node, shown: str, first_line: int, problems: list[DocumentError]
) -> dict[KeyPath, int]:
    """File line of every mapping key and sequence item, by key path.

    Runs on the composed nodes, before construction, so merge keys (``<<``)
    are still visible and a key overriding a merged one is not a duplicate.
    A node reached again through an alias is not walked twice (a YAML
    "billion laughs" stays linear); its keys report the alias's line.
    """
    lines: dict[KeyPath, int] = {}
    seen: set[int] = set()

    def walk(node: yaml.Node, path: KeyPath) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # the constructor reports "found unhashable key"
                child = (*path, key_node.value)
                line = key_node.start_mark.line + first_line
                if key_node.tag not in _YAML_KEY_TAGS:  # 1:, true:, null: ...
                    problems.append(_unknown_key(child, line, shown))
                    continue
                if child in lines:
                    problems.append(
                        DocumentError(
                            shown,
                            f"duplicate key '{_dotted(child)}' (first set at line {lines[child]})",
                            line=line,
                        )
                    )
                    continue
                lines[child] = line
                walk(value_node, child)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                lines[(*path, index)] = item.start_mark.line + first_line
                walk(item, (*path, index))

    walk(root, ())
    return lines


def _dotted(path: KeyPath) -> str:
    """``("training", "sources", 0, "path")`` -> ``training.sources[0].path``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _line_of(path: KeyPath, key_lines: dict[KeyPath, int]) -> int:
    """Line of ``path``, or of its nearest recorded ancestor."""
    while path not in key_lines:
        path = path[:-1]
    return key_lines[path]


def _model_at(path: KeyPath) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at ``path``."""
    model: type[BaseModel] = Frontmatter
    keyed = False  # the next part is a key of a dict of models (training.adapters.<name>)
    for part in path:
        if isinstance(part, int) or keyed:
            keyed = False
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        sub = _find_model(field.annotation)
        if sub is None:
            return None
        keyed = _is_dict(field.annotation)
        model = sub
    return model


def _holds_names(path: KeyPath) -> bool:
    """Whether ``path`` is a field mapping names to blocks (``training.adapters``)."""
    if not path or isinstance(path[-1], int):
        return False
    model = _model_at(path[:-1])
    field = model.model_fields.get(str(path[-1])) if model is not None else None
    return field is not None and _is_dict(field.annotation)


def _is_dict(annotation: Any) -> bool:
    if typing.get_origin(annotation) is dict:
        return True
    return any(
        _is_dict(arg) for arg in typing.get_args(annotation) if typing.get_origin(annotation) is not list
    )


def _find_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, dict, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _find_model(arg)
            if found is not None:
                return found
    return None


def _bounds(path: KeyPath) -> str | None:
    """``must be between 64 and 32768``-style wording for a numeric field."""
    model = _model_at(path[:-1])
    field = model.model_fields.get(str(path[-1])) if model is not None else None
    if field is None:
        return None
    limits = {
        name: getattr(item, name)
        for item in field.metadata
        for name in ("ge", "gt", "le", "lt")
        if getattr(item, name, None) is not None
    }
    if "ge" in limits and "le" in limits:
        return f"must be between {limits['ge']} and {limits['le']}"
    words = {"ge": "at least", "gt": "greater than", "le": "at most", "lt": "less than"}
    parts = [f"{words[name]} {value}" for name, value in limits.items()]
    return f"must be {' and '.join(parts)}" if parts else None


_TYPE_WORDS = {
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "model_type": "must be a mapping of keys to values",
    "dict_type": "must be a mapping of keys to values",
}


def _unknown_key(path: KeyPath, line: int, shown: str) -> DocumentError:
    """``unknown key 'training.sequnce_len'``, hinting the allowed keys there."""
    renamed = LEGACY_KEYS.get((str(path[0]), str(path[-1]))) if len(path) == 2 else None
    if renamed is not None:
        return DocumentError(
            shown,
            f"unknown key '{_dotted(path)}': dlmstore now uses DLM's name '{renamed}'",
            line=line,
            hint=f"rename it to '{renamed}', or run `dlm migrate {shown}` to rename every such key",
        )
    hint = None
    model = _model_at(path[:-1])
    if _holds_names(path[:-1]):  # a key here names a block, it is not a setting
        hint = f"the keys in '{_dotted(path[:-1])}' are adapter names (a lower case letter, then a-z 0-9 _)"
    elif model is not None:
        allowed = list(model.model_fields)
        where = f"in '{_dotted(path[:-1])}'" if path[:-1] else "at the top level"
        hint = f"allowed keys {where}: {', '.join(allowed)}"
        close = difflib.get_close_matches(str(path[-1]), allowed, n=1)
        if close:
            hint = f"did you mean '{close[0]}'? {hint}"
    return DocumentError(shown, f"unknown key '{_dotted(path)}'", line=line, hint=hint)


def _frontmatter_errors(
    exc: ValidationError, key_lines: dict[KeyPath, int], shown: str
) -> list[DocumentError]:
    """Every pydantic error, worded, each at its key's line (one per key)."""
    out: dict[KeyPath, DocumentError] = {}
    for error in exc.errors():
        if error["type"] == "invalid_key" or error["loc"][-1:] == ("[key]",):
            continue  # a key that is not a string: _key_lines already reported it as unknown
        path = _key_path(tuple(error["loc"]))
        if path not in out:
            out[path] = _frontmatter_error(error, path, key_lines, shown)
    return list(out.values())


def _key_path(loc: tuple[str | int, ...]) -> KeyPath:
    """``loc`` without the union-member tags pydantic appends (``int``, ``literal['auto']``)."""
    path: list[str | int] = []
    for part in loc:
        if (
            isinstance(part, str)
            and path
            and _model_at(tuple(path)) is None
            and not isinstance(path[-1], int)
        ):
            break  # below a leaf field: a union member's tag
        path.append(part)
    return tuple(path)


def _frontmatter_error(error: Any, path: KeyPath, key_lines: dict[KeyPath, int], shown: str) -> DocumentError:
    """One pydantic error as a DocumentError at its line."""
    dotted = _dotted(path)
    kind = error["type"]
    hint = None
    if kind == "extra_forbidden":
        return _unknown_key(path, _line_of(path, key_lines), shown)
    if kind == "missing":
        line = _line_of(path[:-1], key_lines)
        if path == ("dlm_id",):
            hint = "`dlm init PATH` writes a new document with a fresh dlm_id"
        return DocumentError(shown, f"missing required key '{dotted}'", line=line, hint=hint)
    line = _line_of(path, key_lines)
    if kind == "value_error":
        detail = str(error["ctx"]["error"])
    elif kind == "literal_error":
        detail = f"must be {error['ctx']['expected']}"
    elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        detail = _bounds(path) or error["msg"]
    elif kind in _TYPE_WORDS:
        detail = f"{_TYPE_WORDS[kind]}, not {_short(error['input'])}"
    else:
        detail = error["msg"]
    if not dotted or detail.startswith(dotted + "."):  # the detail names the key itself
        return DocumentError(shown, detail, line=line)
    return DocumentError(shown, f"{dotted}: {detail}", line=line)


def _short(value: object) -> str:
    if value is None:
        return "empty (null)"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

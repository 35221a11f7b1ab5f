"""The :class:`Lock` record: what it holds, how it is captured, read and written as JSON.

``dlm.lock`` is JSON with sorted keys and two-space indents, so two locks
diff cleanly with any text tool and the same lock always has the same bytes.
Reading is strict: a file that is not JSON, misses a field, has an unknown
one or a value of the wrong type raises :class:`LockError` naming the file
and the field; a ``lock_version`` newer than this dlmstore's is refused.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlmstore.clock import utc_now
from dlmstore.errors import LockError
from dlmstore.store.regular_files import load_json, read_regular

if TYPE_CHECKING:
    from dlmstore.bases import BaseModelRef
    from dlmstore.determinism import DeterminismInfo
    from dlmstore.document.frontmatter import PreferenceSettings
    from dlmstore.document.parser import Document

#: Format version of ``dlm.lock``; bump it when a field changes meaning.
#: 2 added ``preference``; a version-1 lock reads with ``preference`` null.
#: 3 added ``datasets``; older locks read with ``datasets`` null.
#: 4 added ``pinned_versions.llama_cpp``; older locks read with it null.
#: 5 added ``replay``; older locks read with it null.
LOCK_VERSION = 5

#: The lock file's name, beside ``store.db``.
LOCK_NAME = "dlm.lock"

#: Distributions whose versions the lock pins (PyPI names).
PINNED_PACKAGES = ("torch", "transformers", "peft", "trl", "bitsandbytes", "accelerate")

#: The ``pinned_versions`` key of the llama.cpp that exported the adapters: the version of
#: llama-cpp-python (which builds llama.cpp) that ``dlm export`` wrote GGUF files with. A
#: training run does not use llama.cpp, so it keeps what the lock had; null until an export.
LLAMA_CPP = "llama_cpp"

#: Every key of ``pinned_versions``.
PINNED_KEYS = (*PINNED_PACKAGES, LLAMA_CPP)

HARDWARE_TIERS = ("cpu", "cuda", "mps", "rocm")
DETERMINISM_CLASSES = ("strong", "best-effort", "advisory")

REPLACE_HINT = "rerun `dlm train` with --update-lock to replace it"

#: A lock is about a kilobyte; a larger ``dlm.lock`` is not one.
MAX_LOCK_BYTES = 1 << 20


@dataclass(frozen=True)
class Lock:
    """The reproducibility record of one training run; ``dlm.lock`` is one of these.

    Attributes:
        lock_version: format version (:data:`LOCK_VERSION`).
        created_at: when it was captured (ISO-8601 UTC).
        dlm_id: the document id.
        dlm_sha256: sha256 hex of the document's bytes.
        base_model_revision: what the base model is, by revision: a hub
            commit hash, ``<package>==<version>`` for a built-in, or
            ``sha256:...`` over a local directory's config and weight list.
        base_model_sha256: sha256 hex of the built-in GGUF file; None for
            hub and local bases (hashing gigabytes of weights per run is
            not worth it; the revision identifies them).
        pinned_versions: installed version of each of :data:`PINNED_PACKAGES`,
            None when not installed, and :data:`LLAMA_CPP`: the llama-cpp-python
            the adapters were last exported with (None before an export).
        cuda_version: torch's CUDA version when training on CUDA.
        rocm_version: torch's HIP version when training on ROCm.
        hardware_tier: ``cpu``, ``cuda``, ``mps`` or ``rocm``.
        seed: the training seed.
        determinism_flags: the deterministic settings in force.
        determinism_class: ``strong``, ``best-effort`` or ``advisory``.
        license_acceptance: the base model licence the user accepted, if
            the base needs one (None for the open built-ins).
        last_run_id: the ``runs.id`` of the run that captured it.
        preference: the preference phase the run trained, as
            :func:`preference_record` writes it (``method`` and the
            hyperparameters that method uses); None when the run had no
            preference phase.
        datasets: the token datasets the run mixed in, keyed
            ``<path>#<split>``, each with its ``meta_sha256`` (the dataset's
            identity: meta.json lists every file's sha256) and ``weight``;
            None when the run trained on the document alone.
        replay: what the run replayed from the store's replay history: the
            ``generation`` it trained, the ``draw_sha256`` of its draw (the
            generation and every drawn row key) and the ``rows`` and
            ``triples`` drawn; None when it replayed nothing.
    """

    lock_version: int
    created_at: str
    dlm_id: str
    dlm_sha256: str
    base_model_revision: str | None
    base_model_sha256: str | None
    pinned_versions: dict[str, str | None]
    cuda_version: str | None
    rocm_version: str | None
    hardware_tier: str
    seed: int
    determinism_flags: dict[str, bool | str]
    determinism_class: str
    license_acceptance: dict[str, Any] | None
    last_run_id: int | None
    preference: dict[str, Any] | None = None
    datasets: dict[str, dict[str, Any]] | None = None
    replay: dict[str, Any] | None = None

    def to_json(self) -> str:
        """The exact text of ``dlm.lock``: sorted keys, two-space indents, final newline."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def capture_runtime_versions() -> dict[str, str | None]:
    """Installed versions of the pinned packages (no imports; None when absent).

    :data:`LLAMA_CPP` is None here: only an export sets it (a run carries the
    previous lock's value forward, ``dlmstore.lock.run.begin_lock``).
    """
    versions: dict[str, str | None] = {}
    for name in PINNED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    versions[LLAMA_CPP] = None
    return versions


def capture_lock(
    document: Document,
    ref: BaseModelRef,
    *,
    seed: int,
    determinism: DeterminismInfo,
    run_id: int | None,
    license_acceptance: Mapping[str, Any] | None = None,
    datasets: Sequence[Mapping[str, Any]] = (),
) -> Lock:
    """The lock of the run about to train ``document`` on ``ref``.

    Args:
        document: the parsed document (its id and sha256 are recorded).
        ref: the resolved base model; see :func:`base_model_identity`.
        seed: the seed the run uses.
        determinism: what :func:`dlmstore.determinism.apply_determinism` returned.
        run_id: the ``runs.id`` of this run.
        license_acceptance: the accepted licence record, for bases that need one.
        datasets: the identities of the token datasets the run trains on
            (:meth:`dlmstore.train.data.inputs.DatasetInput.identity`).
    """
    from dlmstore.lock.identity import base_model_identity

    revision, sha256 = base_model_identity(ref)
    return Lock(
        lock_version=LOCK_VERSION,
        created_at=utc_now(),
        dlm_id=document.dlm_id,
        dlm_sha256=document.sha256,
        base_model_revision=revision,
        base_model_sha256=sha256,
        pinned_versions=capture_runtime_versions(),
        cuda_version=determinism.cuda_version,
        rocm_version=determinism.rocm_version,
        hardware_tier=determinism.hardware_tier,
        seed=seed,
        determinism_flags=dict(determinism.flags),
        determinism_class=determinism.determinism_class,
        license_acceptance=dict(license_acceptance) if license_acceptance is not None else None,
        last_run_id=run_id,
        datasets={
            f"{item['path']}#{item['split']}": {"meta_sha256": item["meta_sha256"], "weight": item["weight"]}
            for item in datasets
        }
        or None,
    )


def preference_record(settings: PreferenceSettings) -> dict[str, Any]:
    """What the lock records of a preference phase: the method and the hyperparameters it uses.

    DPO: ``beta``, ``loss_type`` and ``reference``; ORPO: ``alpha``; both:
    ``learning_rate`` and ``num_epochs``. Keys a method ignores are left out,
    so switching an unused knob is not a lock difference.
    """
    hyper = settings.hyperparams
    record: dict[str, Any] = {
        "method": settings.method,
        "learning_rate": hyper.learning_rate,
        "num_epochs": hyper.num_epochs,
    }
    if settings.method == "dpo":
        record.update(beta=hyper.beta, loss_type=settings.loss_type, reference=settings.reference)
    else:
        record["alpha"] = hyper.alpha
    return record


def read_lock(path: Path) -> Lock | None:
    """Read ``dlm.lock`` at ``path``; None when there is none.

    Raises:
        LockError: unreadable, not JSON, or a field is missing, unknown or
            of the wrong type; the message names the file and the field.
    """
    try:
        text = read_regular(path, limit=MAX_LOCK_BYTES).decode("utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LockError(f"cannot read {path}: {exc.strerror}", hint=REPLACE_HINT) from None
    except UnicodeDecodeError as exc:
        raise LockError(f"cannot read {path}: {exc}", hint=REPLACE_HINT) from None
    return parse_lock(text, source=str(path))


def parse_lock(text: str, *, source: str) -> Lock:
    """Parse lock JSON ``text``; ``source`` names it in errors (a path or a record).

    Raises:
        LockError: see :func:`read_lock`.
    """
    try:
        data = load_json(text)
    except json.JSONDecodeError as exc:
        raise LockError(
            f"{source} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            hint=REPLACE_HINT,
        ) from None
    except ValueError as exc:  # too deep, or an integer of more than 4300 digits
        raise LockError(f"{source} is not a lock: its JSON {exc}", hint=REPLACE_HINT) from None
    if not isinstance(data, dict):
        raise LockError(f"{source} must hold a JSON object, not {_json_type(data)}", hint=REPLACE_HINT)
    names = [f.name for f in dataclasses.fields(Lock)]
    version = data.get("lock_version")
    if version == 1 and "preference" not in data:
        data = {**data, "preference": None}  # version 1 predates the field
    if version in (1, 2) and "datasets" not in data:
        data = {**data, "datasets": None}  # versions 1 and 2 predate the field
    pinned = data.get("pinned_versions")
    if version in (1, 2, 3) and isinstance(pinned, dict) and LLAMA_CPP not in pinned:
        data = {**data, "pinned_versions": {**pinned, LLAMA_CPP: None}}  # versions 1 to 3 predate it
    if version in (1, 2, 3, 4) and "replay" not in data:
        data = {**data, "replay": None}  # versions 1 to 4 predate the field
    unknown = sorted(set(data) - set(names))
    missing = [name for name in names if name not in data]
    if isinstance(version, int) and not isinstance(version, bool) and version > LOCK_VERSION:
        raise LockError(
            f"{source} has lock_version {version}; this dlmstore reads up to {LOCK_VERSION}",
            hint="upgrade dlmstore (pip install -U dlmstore), or rerun `dlm train` with --update-lock",
        )
    if missing:
        raise LockError(f"{source}: missing field {missing[0]!r}", hint=REPLACE_HINT)
    if unknown:
        raise LockError(f"{source}: unknown field {unknown[0]!r}", hint=REPLACE_HINT)
    for name in names:
        problem = _check_field(name, data[name])
        if problem:
            raise LockError(f"{source}: field {name!r} {problem}", hint=REPLACE_HINT)
    return Lock(**data)


def _check_field(name: str, value: Any) -> str | None:
    """Why ``value`` is not valid for field ``name``; None when it is."""
    if name in ("lock_version", "seed"):
        return None if _is_int(value) else f"must be an integer, not {_json_type(value)}"
    if name == "last_run_id":
        return (
            None
            if value is None or _is_int(value)
            else f"must be an integer or null, not {_json_type(value)}"
        )
    if name in ("created_at", "dlm_id", "dlm_sha256"):
        return None if isinstance(value, str) else f"must be a string, not {_json_type(value)}"
    if name in ("base_model_revision", "base_model_sha256", "cuda_version", "rocm_version"):
        return (
            None
            if value is None or isinstance(value, str)
            else f"must be a string or null, not {_json_type(value)}"
        )
    if name == "hardware_tier":
        return (
            None if value in HARDWARE_TIERS else f"must be one of {', '.join(HARDWARE_TIERS)}, not {value!r}"
        )
    if name == "determinism_class":
        return (
            None
            if value in DETERMINISM_CLASSES
            else f"must be one of {', '.join(DETERMINISM_CLASSES)}, not {value!r}"
        )
    if name == "pinned_versions":
        if (
            not isinstance(value, dict)
            or sorted(value) != sorted(PINNED_KEYS)
            or not all(v is None or isinstance(v, str) for v in value.values())
        ):
            return f"must map each of {', '.join(PINNED_KEYS)} to a version string or null"
        return None
    if name == "determinism_flags":
        if not isinstance(value, dict) or not all(isinstance(v, (bool, str)) for v in value.values()):
            return "must map flag names to true, false or a string"
        return None
    if name == "license_acceptance":
        return (
            None
            if value is None or isinstance(value, dict)
            else f"must be an object or null, not {_json_type(value)}"
        )
    if name == "preference":
        if value is None:
            return None
        if not isinstance(value, dict) or value.get("method") not in ("dpo", "orpo"):
            return "must be null or an object with method dpo or orpo"
        if not all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in value.values()):
            return "must map names to numbers or strings"
        return None
    if name == "datasets":
        if value is None:
            return None
        if not isinstance(value, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("meta_sha256"), str) for v in value.values()
        ):
            return "must be null or map dataset keys to objects with a meta_sha256 string"
        return None
    if name == "replay":
        if value is None:
            return None
        if (
            not isinstance(value, dict)
            or not isinstance(value.get("draw_sha256"), str)
            or not all(_is_int(value.get(key)) for key in ("generation", "rows", "triples"))
        ):
            return "must be null or an object with generation, rows and triples integers and a draw_sha256 string"
        return None
    raise AssertionError(f"no check for lock field {name!r}")  # every field above; a new one needs a check


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"

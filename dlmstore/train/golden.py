"""The determinism golden: a tiny training run whose adapter sha256 is pinned.

The contract (docs/reproducibility.md): same document, base model revision,
pinned library versions, hardware tier, seed and determinism flags give a
byte-identical ``adapter_model.safetensors``. The golden checks it with a
fixed document trained twice from fresh stores, and records the adapter
sha256 per *tuple* - the sorted runtime versions plus the platform - in
``tests/golden/determinism/tuple-<hash>.json``, indexed by
``.determinism/lock.json``. ``scripts/regen-determinism-golden.py`` refreshes
it after a deliberate dependency bump; ``tests/test_determinism_golden.py``
checks a run against the checked-in golden of the current tuple, when there
is one.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dlmstore.home import home_at

GOLDEN_DIR = Path("tests/golden/determinism")
INDEX = Path(".determinism/lock.json")
GOLDEN_ID = "01M7YJ087N2NEP493AF56E3CG0"

GOLDEN_DOC = f"""---
dlm_id: {GOLDEN_ID}
base_model: smollm2-135m
system_prompt: Answer in one short sentence.
training:
  sequence_len: 64
  max_steps: 3
  micro_batch_size: 2
  seed: 1234
---
dlmstore keeps every run in one SQLite database per store.

::instruction::
### Q
Where is the metadata?
### A
In store.db, beside the token files.

### Q
What makes a run reproducible?
### A
The same inputs, versions, hardware tier, seed and flags.
"""


def golden_tuple() -> dict[str, object]:
    """The runtime a golden is valid for.

    Pinned versions, Python and platform, plus what changes CPU float results
    on the same platform: the instruction set torch dispatches to (AVX2 vs
    AVX-512 kernels), the processor model (two AVX-512 generations pick
    different oneDNN/MKL kernels, which round differently, while torch
    reports both as ``AVX512``), its thread count (how reductions are split),
    and the versions of the libraries that shape the bytes without being
    pinned in the lock (the tokenizer backend, numpy, safetensors, the GGUF
    reader that converts the built-in base). A machine that differs in any of
    them gets its own golden instead of a false failure.
    """
    import torch

    from dlmstore.lock import capture_runtime_versions

    return {
        "pinned_versions": capture_runtime_versions(),
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_model": cpu_model(),
        "byte_versions": {name: _version(name) for name in BYTE_PACKAGES},
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
    }


#: Libraries outside the lock's pinned set whose versions can change the
#: adapter's bytes: token ids (tokenizers), the converted base weights
#: (gguf, numpy) and the serialised file (safetensors).
BYTE_PACKAGES = ("tokenizers", "numpy", "safetensors", "gguf")


def cpu_model() -> str:
    """``vendor family/model/stepping`` of the first CPU (Linux), else the platform's processor name."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return platform.processor() or platform.machine()
    keys = ("vendor_id", "cpu family", "model", "stepping")
    return " ".join(fields.get(k, "?") for k in keys)


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def tuple_hash(runtime: dict[str, object]) -> str:
    """A short content hash of a runtime tuple (the golden file's name)."""
    material = json.dumps(runtime, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(material.encode()).hexdigest()[:16]


@contextmanager
def _fresh_home(bases: Path) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dlm-golden-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        bases.mkdir(parents=True, exist_ok=True)
        (home / "bases").symlink_to(bases, target_is_directory=True)
        with home_at(home):
            yield Path(tmp)


def train_golden_once() -> str:
    """Train the golden document in a fresh store; return the adapter sha256."""
    from dlmstore.home import bases_dir
    from dlmstore.train.trainer import train_document

    with _fresh_home(bases_dir()) as tmp:
        doc = tmp / "golden.dlm"
        doc.write_text(GOLDEN_DOC, encoding="utf-8")
        return train_document(str(doc)).adapter_sha256


def read_golden(root: Path, runtime: dict[str, object]) -> dict[str, object] | None:
    """The checked-in golden for ``runtime``, or ``None``."""
    path = root / GOLDEN_DIR / f"tuple-{tuple_hash(runtime)}.json"
    if not path.is_file():
        return None
    data: dict[str, object] = json.loads(path.read_text())
    return data


def write_golden(root: Path, runtime: dict[str, object], adapter_sha256: str) -> Path:
    """Write the tuple file and upsert the repo-level index; return the tuple file."""
    digest = tuple_hash(runtime)
    path = root / GOLDEN_DIR / f"tuple-{digest}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"tuple": runtime, "tuple_hash": digest, "adapter_sha256": adapter_sha256}
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    index_path = root / INDEX
    index_path.parent.mkdir(parents=True, exist_ok=True)
    index = json.loads(index_path.read_text()) if index_path.is_file() else {}
    index[digest] = {
        "path": str(path.relative_to(root)),
        "adapter_sha256": adapter_sha256,
        "platform": runtime["platform"],
        "pinned_versions": runtime["pinned_versions"],
    }
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return path

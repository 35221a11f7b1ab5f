"""Seeds and deterministic kernels for training, and how far to trust them.

Two calls, made by ``dlm train`` before the model is built:

* :func:`seed_everything` seeds every generator training reads: Python's
  ``random``, NumPy's legacy global generator and torch (CPU and every CUDA
  device). ``PYTHONHASHSEED`` cannot be changed for a running interpreter
  (string hashing is randomised at start-up); we set it in ``os.environ``
  so that subprocesses (data-loader workers started with ``spawn``) inherit
  it, and training never depends on ``set`` or ``dict`` ordering of strings.
* :func:`apply_determinism` switches torch to deterministic algorithms,
  pins the cuDNN flags and sets ``CUBLAS_WORKSPACE_CONFIG`` on CUDA, and
  reports what it set plus the *tier* of the machine, which the lock
  records as ``hardware_tier`` and ``determinism_class``.

The class is a promise about bytes, stated honestly (docs/reproducibility.md):

* ``strong``: CUDA with ``torch.use_deterministic_algorithms(True)`` in
  error mode, so a kernel with no deterministic version fails the run
  instead of silently varying; same inputs give the same adapter bytes.
* ``best-effort``: MPS, ROCm, or CUDA in warn-only mode: deterministic
  where the backend offers it, but some kernels may still vary.
* ``advisory``: CPU only. CPU kernels are usually run-to-run identical on
  one machine and thread count, but torch makes no guarantee (threaded
  reductions, oneDNN/MKL paths picked by CPU features), so dlm promises
  nothing beyond "recorded".

torch is imported inside the functions, never at module level.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Literal

HardwareTier = Literal["cpu", "cuda", "mps", "rocm"]
DeterminismClass = Literal["strong", "best-effort", "advisory"]

#: The cuBLAS workspace settings under which cuBLAS is deterministic
#: (NVIDIA's "Reproducibility" note); ``:4096:8`` is the one we set.
DETERMINISTIC_CUBLAS = (":4096:8", ":16:8")


@dataclass(frozen=True)
class DeterminismInfo:
    """What :func:`apply_determinism` set, and what that is worth.

    Attributes:
        hardware_tier: ``cpu``, ``cuda``, ``mps`` or ``rocm``: the device
            training runs on.
        determinism_class: ``strong``, ``best-effort`` or ``advisory``.
        flags: the settings actually in force, by name (booleans and the
            ``CUBLAS_WORKSPACE_CONFIG`` string); recorded in the lock.
        cuda_version: torch's CUDA version when training on CUDA, else None.
        rocm_version: torch's HIP version when training on ROCm, else None.
    """

    hardware_tier: HardwareTier
    determinism_class: DeterminismClass
    flags: dict[str, bool | str] = field(default_factory=dict)
    cuda_version: str | None = None
    rocm_version: str | None = None


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy and torch (all CUDA devices included).

    Args:
        seed: a non-negative integer (``training.seed`` or ``--seed``).
    """
    import numpy as np
    import torch

    os.environ["PYTHONHASHSEED"] = str(seed)  # subprocesses only; see the module docstring
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds every CUDA device too, lazily
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def hardware_tier() -> HardwareTier:
    """The device ``dlm train`` will use: CUDA (or ROCm), then MPS, then CPU."""
    import torch

    if torch.cuda.is_available():
        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def apply_determinism(*, warn_only: bool = False) -> DeterminismInfo:
    """Turn on deterministic algorithms and report the resulting tier.

    Call it before the model is created: ``CUBLAS_WORKSPACE_CONFIG`` only
    takes effect if it is set before the first cuBLAS call. An existing
    ``CUBLAS_WORKSPACE_CONFIG`` is left alone; if it is not one of the
    deterministic settings, CUDA drops to ``best-effort``.

    Args:
        warn_only: ask torch to warn instead of fail when an op has no
            deterministic kernel. Training then never stops for it, but a
            CUDA run can only claim ``best-effort``.

    Returns:
        The flags in force, the hardware tier and the determinism class.
    """
    import torch

    tier = hardware_tier()
    flags: dict[str, bool | str] = {}
    if tier in ("cuda", "rocm"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", DETERMINISTIC_CUBLAS[0])
        flags["CUBLAS_WORKSPACE_CONFIG"] = os.environ["CUBLAS_WORKSPACE_CONFIG"]
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        flags["cudnn_deterministic"] = True
        flags["cudnn_benchmark"] = False
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    flags["use_deterministic_algorithms"] = torch.are_deterministic_algorithms_enabled()
    flags["warn_only"] = torch.is_deterministic_algorithms_warn_only_enabled()
    return DeterminismInfo(
        hardware_tier=tier,
        determinism_class=determinism_class(tier, flags),
        flags=flags,
        cuda_version=torch.version.cuda if tier == "cuda" else None,
        rocm_version=getattr(torch.version, "hip", None) if tier == "rocm" else None,
    )


def determinism_class(tier: str, flags: dict[str, bool | str]) -> DeterminismClass:
    """The class a tier earns with ``flags`` in force (see the module docstring)."""
    if tier == "cpu":
        return "advisory"
    if (
        tier == "cuda"
        and flags.get("use_deterministic_algorithms") is True
        and flags.get("warn_only") is False
        and flags.get("cudnn_deterministic") is True
        and flags.get("CUBLAS_WORKSPACE_CONFIG") in DETERMINISTIC_CUBLAS
    ):
        return "strong"
    return "best-effort"

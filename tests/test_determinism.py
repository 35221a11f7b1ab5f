"""Seeding, deterministic flags and the determinism tiers."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from dlmstore import determinism
from dlmstore.determinism import apply_determinism, determinism_class, seed_everything


@pytest.fixture(autouse=True)
def restore_torch_flags(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """apply_determinism changes process-wide torch state; put it back for other tests."""
    state = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setenv("PYTHONHASHSEED", os.environ.get("PYTHONHASHSEED", "0"))
    yield
    torch.use_deterministic_algorithms(state[0], warn_only=state[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


def _draw() -> tuple[float, list[float], list[float]]:
    return random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist()


def test_seed_everything_makes_random_numpy_and_torch_repeat() -> None:
    seed_everything(1234)
    first = _draw()
    seed_everything(1234)
    assert _draw() == first
    seed_everything(1235)
    assert _draw() != first


def test_seed_everything_passes_the_seed_to_subprocesses_through_pythonhashseed() -> None:
    seed_everything(77)
    assert os.environ["PYTHONHASHSEED"] == "77"


def test_this_machine_is_cpu_and_advisory_with_the_flags_recorded() -> None:
    info = apply_determinism()
    assert (info.hardware_tier, info.determinism_class) == ("cpu", "advisory")
    assert info.flags == {"use_deterministic_algorithms": True, "warn_only": False}
    assert (info.cuda_version, info.rocm_version) == (None, None)
    assert torch.are_deterministic_algorithms_enabled()
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_warn_only_is_recorded_as_set() -> None:
    info = apply_determinism(warn_only=True)
    assert info.flags["warn_only"] is True and torch.is_deterministic_algorithms_warn_only_enabled()


def test_a_cuda_machine_gets_cudnn_flags_a_cublas_workspace_and_the_strong_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(determinism, "hardware_tier", lambda: "cuda")
    info = apply_determinism()
    assert info.flags == {
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
        "cudnn_deterministic": True,
        "cudnn_benchmark": False,
        "use_deterministic_algorithms": True,
        "warn_only": False,
    }
    assert info.determinism_class == "strong" and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_a_users_nondeterministic_cublas_setting_is_kept_and_downgrades_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(determinism, "hardware_tier", lambda: "cuda")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    info = apply_determinism()
    assert info.flags["CUBLAS_WORKSPACE_CONFIG"] == ":0:0" and info.determinism_class == "best-effort"


STRONG_FLAGS: dict[str, bool | str] = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "cudnn_deterministic": True,
    "cudnn_benchmark": False,
    "use_deterministic_algorithms": True,
    "warn_only": False,
}


@pytest.mark.parametrize(
    ("tier", "flags", "expected"),
    [
        ("cuda", STRONG_FLAGS, "strong"),
        ("cuda", {**STRONG_FLAGS, "warn_only": True}, "best-effort"),
        ("cuda", {**STRONG_FLAGS, "use_deterministic_algorithms": False}, "best-effort"),
        ("rocm", STRONG_FLAGS, "best-effort"),
        ("mps", {"use_deterministic_algorithms": True, "warn_only": False}, "best-effort"),
        ("cpu", {"use_deterministic_algorithms": True, "warn_only": False}, "advisory"),
    ],
)
def test_the_determinism_class_of_each_tier(tier: str, flags: dict[str, bool | str], expected: str) -> None:
    assert determinism_class(tier, flags) == expected

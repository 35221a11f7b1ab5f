"""The golden determinism test: two fresh runs give byte-identical adapters."""

from __future__ import annotations

import pytest

from dlmstore.train.golden import golden_tuple, read_golden, train_golden_once

from .helpers import REPO


@pytest.mark.slow  # trains the real SmolLM2-135M twice
def test_two_fresh_training_runs_give_byte_identical_adapters_and_match_the_golden() -> None:
    first = train_golden_once()
    second = train_golden_once()
    assert first == second
    golden = read_golden(REPO, golden_tuple())
    if golden is not None:  # a golden is checked in for this exact runtime tuple
        assert golden["adapter_sha256"] == first

"""Sparklines: the loss of a run in one line of block characters."""

from __future__ import annotations

import pytest

from dlmstore.report.sparkline import BLOCKS, sparkline


def test_a_falling_series_runs_from_the_top_block_to_the_bottom_one() -> None:
    assert sparkline([8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]) == "█▇▆▅▄▃▂▁"


def test_a_long_series_is_drawn_as_the_means_of_equal_buckets() -> None:
    values = [10.0] * 50 + [0.0] * 50
    assert sparkline(values, width=4) == "██▁▁"
    assert len(sparkline([float(i) for i in range(1000)])) == 16


def test_a_missing_value_is_a_space_and_a_flat_series_sits_at_mid_height() -> None:
    assert sparkline([2.0, None, 1.0]) == "█ ▁"
    assert sparkline([0.5, 0.5, 0.5]) == BLOCKS[3] * 3
    assert sparkline([None, None]) == "  "
    assert sparkline([]) == ""


def test_a_sparkline_needs_a_width_of_at_least_one() -> None:
    with pytest.raises(ValueError, match="width of at least 1, not 0"):
        sparkline([1.0], width=0)

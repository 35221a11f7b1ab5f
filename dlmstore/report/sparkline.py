"""Sparklines: a series of numbers as one line of Unicode block characters.

``dlm metrics`` draws each train run's loss this way, one sparkline per
phase (``▇▅▄▃▂▂▁``), so a run that did not learn shows at a glance without
a plot. A long series is cut into ``width`` consecutive buckets and each
bucket drawn at its mean, so the line keeps its shape whatever the number
of steps. Each line is scaled to its own minimum and maximum: it shows the
shape of one curve, not a value to compare between runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: The eight heights, lowest first.
BLOCKS = "▁▂▃▄▅▆▇█"

#: The most characters one sparkline takes.
DEFAULT_WIDTH = 16


def sparkline(values: Sequence[float | None], width: int = DEFAULT_WIDTH) -> str:
    """``values`` drawn as at most ``width`` block characters.

    A missing value (``None``: TRL logged NaN) or a bucket holding only
    missing values is a space; a flat series is drawn at mid height. An
    empty series is the empty string.

    Raises:
        ValueError: ``width`` is below 1.
    """
    if width < 1:
        raise ValueError(f"a sparkline needs a width of at least 1, not {width}")
    n = len(values)
    if n == 0:
        return ""
    buckets = min(n, width)
    means: list[float | None] = []
    for i in range(buckets):
        chunk = [
            v for v in values[i * n // buckets : (i + 1) * n // buckets] if v is not None and math.isfinite(v)
        ]
        means.append(sum(chunk) / len(chunk) if chunk else None)
    known = [m for m in means if m is not None]
    if not known:
        return " " * buckets
    low, high = min(known), max(known)
    top = len(BLOCKS) - 1
    if high == low:
        return "".join(" " if m is None else BLOCKS[top // 2] for m in means)
    return "".join(
        " " if m is None else BLOCKS[min(top, int((m - low) / (high - low) * top + 0.5))] for m in means
    )

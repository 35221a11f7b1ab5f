"""Benchmarks the docs quote, and the prefix cache's example: real runs on the built-in model.

PREFIX: the ``python`` block of docs/prefix-cache.md, run as it is written
there, and ``bench/bench_prefix.py`` (about a minute). EXPORT_BENCH:
``bench/bench_export.py`` (docs/export.md), which trains the tour, exports
it and prompts both backends: many minutes. The tests hold them by the
inputs' hash, which covers the example's text and each benchmark's source;
their timings are the machine's at the time they were made.
"""

from __future__ import annotations

import re

from session_steps import shell  # scripts/ is on sys.path when this runs
from sessions import ROOT, Scenario

#: The example as docs/prefix-cache.md shows it (its first ``python`` block).
EXAMPLE = re.search(
    r"```python\n(.*?)```", (ROOT / "docs" / "prefix-cache.md").read_text(encoding="utf-8"), re.S
)[1]  # type: ignore[index]

PREFIX = Scenario(
    name="prefix",
    model="real",
    files={"example.py": EXAMPLE},
    copies=("bench",),
    inputs=("bench/bench_prefix.py",),
    steps=(
        shell("stats", "python example.py", bare=True),
        shell("bench", "python bench/bench_prefix.py"),
    ),
)

EXPORT_BENCH = Scenario(
    name="bench-export",
    model="real",
    copies=("bench",),
    inputs=("bench/bench_export.py", "examples/tour.dlm", "examples/tour-sources/**/*"),
    steps=(shell("export", "python bench/bench_export.py"),),
)

"""The prefix cache's example and benchmark (docs/prefix-cache.md), on the built-in tokenizer.

The example is the ``python`` block of docs/prefix-cache.md, run as it is
written there; the benchmark is ``bench/bench_prefix.py`` (about a minute:
the tests hold both by the inputs' hash, which covers the example's text
and the benchmark's source).
"""

from __future__ import annotations

import re

from sessions import ROOT, Scenario, shell  # scripts/ is on sys.path when this runs

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

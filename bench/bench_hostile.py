"""Hostile input: parse time and memory of the worst .dlm documents up to 64 KiB, and a hostile glob.

Documents: the YAML alias bombs of issue 16 (sequence, mapping, merge
keys), an alias growth just under the loader's limit, 64 KiB of the
densest frontmatter (tiny flow values, block lists, unknown keys), nesting
500 and 30,000 deep, one 64 KiB string, 64 KiB of fence near-misses. For
each it prints the in-process parse time (``parse_document``), the parse's
peak traced memory (``tracemalloc``, a second pass) and ``dlm show`` as a
whole process (wall time and peak RSS), next to a plain ``dlm init``
document measured in the same run. The guarantee checked at the end: every
parse under 1 s and 100 MB.

Glob: ``*a*a*a*a*a*a*a*a*a*a*a*b`` against names of ``a``'s. The regex DLM
translates it to (through ``re``, the matcher before issue 16) is timed on
short names, where it still finishes, beside the linear matcher
(``dlmstore.sources.glob.name_test``) on the same names and on long ones.
Before-vs-after of the whole ``dlm show`` is not runnable in one process
(the old code hangs), hence this side-by-side.

    python bench/bench_hostile.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import peak_process

from dlmstore.document.loading import MAX_ALIAS_EXPANSION, MAX_VALUES
from dlmstore.document.parser import parse_document
from dlmstore.errors import DlmError
from dlmstore.sources.glob import name_test, tokenize
from dlmstore.sources.globmatch import regex

LIMIT_BYTES = 64 * 1024
BOUND_S = 1.0
BOUND_MB = 100.0
HOSTILE_GLOB = "*a*a*a*a*a*a*a*a*a*a*a*b"
ULID = "01KPQ1FFEDGPPSMWRAS18SAZST"


def _fit(frontmatter: str, body: str = "Some prose.\n") -> str:
    """A document of at most 64 KiB: the frontmatter cut at a line end to fit."""
    head, tail = f"---\ndlm_id: {ULID}\n", f"---\n{body}"
    room = LIMIT_BYTES - len(head.encode()) - len(tail.encode())
    if len(frontmatter.encode()) > room:
        frontmatter = frontmatter.encode()[:room].decode(errors="ignore")
        frontmatter = frontmatter[: frontmatter.rfind("\n") + 1]
    return head + frontmatter + tail


def _bomb(kind: str) -> str:
    if kind == "sequence":
        parts = ["&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
        parts += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
        return f"system_prompt: [{', '.join(parts)}]\n"
    lines = ["training:", "  adapters:", "    a0: &a0 {" + ", ".join(f"k{j}: lol" for j in range(9)) + "}"]
    for i in range(1, 9):
        refs = [f"*a{i - 1}"] * 9
        body = (
            f"<<: [{', '.join(refs)}]"
            if kind == "merge"
            else ", ".join(f"k{j}: {r}" for j, r in enumerate(refs))
        )
        lines.append(f"    a{i}: &a{i} {{{body}}}")
    return "\n".join(lines) + "\n"


def _near_limit() -> str:
    """Aliases growing the frontmatter by just under the limit: accepted, then validated."""
    globs = ", ".join(f"'g{j:03d}/**/*.md'" for j in range(100))
    unit = 1 + 100 * (1 + len("g000/**/*.md"))
    copies = MAX_ALIAS_EXPANSION // (unit + 1) - 1
    refs = "".join("    - {path: ., include: *globs}\n" for _ in range(copies))
    return f"training:\n  sources:\n    - {{path: ., include: &globs [{globs}]}}\n{refs}"


def documents() -> dict[str, str]:
    return {
        "plain (dlm init)": "",
        "alias bomb, sequence": _fit(_bomb("sequence")),
        "alias bomb, mapping": _fit(_bomb("mapping")),
        "alias bomb, merge keys": _fit(_bomb("merge")),
        "aliases just under the limit": _fit(_near_limit()),
        "64 KiB flow list of tiny values": _fit("system_prompt: [" + ",".join(["a"] * 32_000) + "]\n"),
        "flow list at the value limit": _fit(
            "system_prompt: [" + ",".join(["a"] * (MAX_VALUES - 10)) + "]\n"
        ),
        "64 KiB block list of globs": _fit(
            "training:\n  sources:\n    - path: .\n      include:\n" + "      - a\n" * 8000
        ),
        "64 KiB of unknown keys": _fit("".join(f"k{i}: 1\n" for i in range(12_000))),
        "nesting 500 deep": _fit("system_prompt: " + "[" * 500 + "]" * 500 + "\n"),
        "nesting 30,000 deep": _fit("system_prompt: " + "[" * 30_000 + "]" * 30_000 + "\n"),
        "one 64 KiB string": _fit("system_prompt: " + "x" * 65_000 + "\n"),
        "64 KiB of fence near-misses": _fit("", body=":: prose ::\n" * 5400),
    }


def parse_seconds(path: Path, repeat: int) -> tuple[float, str]:
    times, outcome = [], ""
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            parse_document(path)
            outcome = "ok"
        except DlmError as exc:
            reports = exc.reports()
            outcome = f"{len(reports)} error(s): {reports[0][0].split(': ', 1)[-1][:60]}"
        times.append(time.perf_counter() - start)
    return statistics.median(times), outcome


def parse_peak_mb(path: Path) -> float:
    tracemalloc.start()
    try:
        parse_document(path)
    except DlmError:
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 1e6


def show_process(path: Path, env: dict[str, str]) -> tuple[float, float, int]:
    """Wall seconds, peak RSS (MB; 0 without /proc) and exit code of ``dlm show PATH``."""
    wall, peak, done = peak_process(["show", str(path)], env)
    return wall, peak / 2**20, done.returncode


def timed(test: Callable[[str], object], name: str) -> float:
    start = time.perf_counter()
    test(name)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    worst_s = worst_mb = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        root = str(Path(__file__).resolve().parent.parent)
        env = {**os.environ, "DLM_HOME": str(Path(tmp) / "home"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": root}
        rows = []
        for name, text in documents().items():
            path = Path(tmp) / "doc.dlm"
            if text:
                path.write_text(text, encoding="utf-8")
            else:
                dlm = str(Path(sys.executable).with_name("dlm"))
                path.unlink(missing_ok=True)
                subprocess.run([dlm, "init", str(path)], capture_output=True, env=env, check=True)
            seconds, outcome = parse_seconds(path, args.repeat)
            peak = parse_peak_mb(path)
            wall, rss, code = show_process(path, env)
            rows.append((name, path.stat().st_size, seconds, peak, wall, rss, code, outcome))
            worst_s, worst_mb = max(worst_s, seconds), max(worst_mb, peak)
    base = rows[0]
    print(
        f"parse: median of {args.repeat} parse_document calls; peak: tracemalloc; show: whole `dlm show` process"
    )
    print(
        f"{'document':34s} {'bytes':>6s} {'parse':>9s} {'peak':>8s} {'show':>8s} {'x plain':>7s} {'RSS':>7s} exit  outcome"
    )
    for name, size, seconds, peak, wall, rss, code, outcome in rows:
        print(
            f"{name:34s} {size:6d} {seconds * 1000:7.1f}ms {peak:6.1f}MB {wall * 1000:6.0f}ms "
            f"{wall / base[4]:6.2f}x {rss:5.0f}MB {code:4d}  {outcome}"
        )
    ok = worst_s < BOUND_S and worst_mb < BOUND_MB
    print(
        f"worst parse: {worst_s * 1000:.0f} ms and {worst_mb:.1f} MB traced; "
        f"bound {BOUND_S:.0f} s and {BOUND_MB:.0f} MB: {'met' if ok else 'NOT met'}"
    )

    print()
    print(f"glob {HOSTILE_GLOB!r} against names of n 'a's (no match)")
    old = re.compile(regex(tokenize(HOSTILE_GLOB)), re.S).fullmatch
    new = name_test([tokenize(HOSTILE_GLOB)])
    assert new is not None
    print(f"{'n':>6s} {'regex (before)':>15s} {'linear (now)':>13s} {'ratio':>9s}")
    for n in (16, 20, 24, 27):
        before, after = timed(old, "a" * n), min(timed(new, "a" * n) for _ in range(args.repeat))
        print(f"{n:6d} {before * 1000:13.2f}ms {after * 1000:11.3f}ms {before / after:8.0f}x")
    for n in (50, 255, 5000):
        after = min(timed(new, "a" * n) for _ in range(args.repeat))
        print(f"{n:6d} {'(minutes+)':>15s} {after * 1000:11.3f}ms")


if __name__ == "__main__":
    main()

"""Benchmark: expanding a large ``training.sources`` directive.

Expands ``{path: <root>, include: ["**/*.py"]}`` (default root: this
interpreter's standard library, ~13K ``.py`` files) with
``dlmstore.sources.expand.expand_sources`` and with a naive baseline written the
obvious way (``os.walk`` + one ``fnmatch`` per pattern per path +
``open().read()`` + ``Section(...)``), checks that both produce the same
section ids in the same order, and prints the median wall time of each over
``--repeat`` runs after one warm-up run (so the page cache is warm), per
included file and per walked file, the speed-up, and whether the target of
30 µs per included file is met.

    python bench/bench_sources.py [--root PATH] [--repeat N] [--check]

``--check`` exits 1 when the target is missed (off by default: wall time on
a shared machine is noisy).
"""

from __future__ import annotations

import argparse
import fnmatch
import gc
import os
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dlmstore.document.frontmatter import SourceDirective
from dlmstore.document.sections import Section, normalise_newlines
from dlmstore.sources.expand import SourceExpansion, expand_sources
from dlmstore.sources.walk import DEFAULT_EXCLUDES

TARGET_US = 30.0
INCLUDE = ["**/*.py"]


def naive_expand(root: str, include: Sequence[str]) -> list[Section]:
    """The straightforward implementation the optimised one is measured against."""
    dir_patterns = [p.rstrip("/") for p in DEFAULT_EXCLUDES]
    file_patterns = [p for p in DEFAULT_EXCLUDES if not p.endswith("/")]

    def glob(rel: str, pattern: str) -> bool:
        # fnmatch's "*" crosses "/", so "**/x" needs a second try for top-level "x".
        return fnmatch.fnmatchcase(rel, pattern) or (
            pattern.startswith("**/") and fnmatch.fnmatchcase(rel, pattern[3:])
        )

    found: list[tuple[str, Section]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [
            d
            for d in dirnames
            if d != ".dlm"
            and not os.path.islink(os.path.join(dirpath, d))
            and not any(fnmatch.fnmatchcase(d, p) for p in dir_patterns)
        ]
        for name in filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if any(fnmatch.fnmatchcase(name, p) for p in file_patterns):
                continue
            if not any(glob(rel, p) for p in include):
                continue
            with open(path, "rb") as handle:
                data = handle.read()
            if b"\0" in data[:1024]:
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            content = normalise_newlines(f"# source: {rel}\n\n{text}")
            found.append((rel, Section(type="prose", content=content, source=rel)))
    found.sort(key=lambda pair: pair[0])
    return [section for _, section in found]


def timed(run: Callable[[], object], repeat: int) -> tuple[float, object]:
    """Median seconds of ``repeat`` runs after one warm-up, and the last result."""
    result = run()  # warm-up: page cache, imports, regex compilation
    times = []
    for _ in range(repeat):
        del result
        gc.collect()
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=sysconfig.get_paths()["stdlib"])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="exit 1 if the target is missed")
    args = parser.parse_args(argv)
    root = os.path.realpath(args.root)
    directive = SourceDirective(path=root, include=INCLUDE)

    def ours() -> SourceExpansion:
        return expand_sources([directive], doc_dir=Path(root))

    ours_s, expansion = timed(ours, args.repeat)
    assert isinstance(expansion, SourceExpansion)
    prov = expansion.provenance[0]
    included = prov.files_included
    walked = (
        included
        + prov.excluded
        + prov.skipped_binary
        + prov.skipped_encoding
        + prov.skipped_too_large
        + prov.skipped_max_files
        + prov.skipped_outside
    )
    ours_ids = [s.section_id for s in expansion.sections]
    del expansion
    naive_s, baseline = timed(lambda: naive_expand(root, INCLUDE), args.repeat)
    assert isinstance(baseline, list)
    naive_ids = [s.section_id for s in baseline]
    del baseline
    if naive_ids != ours_ids:
        print("error: baseline and expand_sources disagree on section ids", file=sys.stderr)
        return 2

    print(f"root: {root}  include: {INCLUDE}  repeat: {args.repeat} (median, warm cache)")
    megabytes = prov.bytes_included / 1e6
    print(f"files: {included} included of {walked} walked ({megabytes:.1f} MB)")
    for label, seconds in (("naive baseline", naive_s), ("expand_sources", ours_s)):
        print(
            f"{label:>15}: {seconds:7.3f} s  {seconds / included * 1e6:7.1f} µs/included file"
            f"  {seconds / walked * 1e6:6.1f} µs/walked file"
        )
    per_file = ours_s / included * 1e6
    met = per_file <= TARGET_US
    print(f"speed-up: {naive_s / ours_s:.1f}x  (section ids identical: {len(ours_ids)})")
    verdict = "met" if met else "NOT met"
    print(f"target {TARGET_US:.0f} µs/included file: {verdict} ({per_file:.1f})")
    return 1 if args.check and not met else 0


if __name__ == "__main__":
    sys.exit(main())

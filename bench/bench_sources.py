"""Benchmark: expanding a large ``training.sources`` directive.

Expands ``{path: <root>, include: ["**/*.py"]}`` (default root: this
interpreter's standard library, ~13K ``.py`` files) with
``dlmstore.sources.expand.expand_sources`` and with a naive baseline written the
obvious way, as DocumentLanguageModel does it (``os.walk`` over every
folder, each glob translated to DLM's regex and matched against every path,
the paths sorted as ``Path`` objects, ``open().read()`` + ``Section(...)``;
the tree must hold no ``.dlm/`` folder, which the baseline does not read),
checks that both produce the same section ids in the same order, and prints the median wall time of each over
``--repeat`` runs after one warm-up run (so the page cache is warm), per
included file and per walked file, the speed-up, and whether the target of
30 µs per included file is met.

    python bench/bench_sources.py [--root PATH] [--repeat N] [--check]

``--check`` exits 1 when the target is missed (off by default: wall time on
a shared machine is noisy).
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dlmstore.document.frontmatter import SourceDirective
from dlmstore.document.sections import Section, normalise_newlines
from dlmstore.sources.defaults import DEFAULT_EXCLUDES
from dlmstore.sources.expand import SourceExpansion, expand_sources

TARGET_US = 30.0
INCLUDE = ["**/*.py"]


def dlm_regex(pattern: str) -> re.Pattern[str]:
    """DLM's glob translation: ``**`` (eating a ``/`` after it) is ``.*``,
    ``*`` is ``[^/]*``, ``?`` is ``[^/]``, the rest literal."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 3 if pattern.startswith("/", i + 2) else 2
        else:
            out.append({"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i])))
            i += 1
    return re.compile("".join(out))


def naive_expand(root: str, include: Sequence[str]) -> list[Section]:
    """The straightforward implementation the optimised one is measured against."""
    includes = [dlm_regex(p) for p in include]
    excludes = [dlm_regex(p) for p in DEFAULT_EXCLUDES]
    found: list[tuple[tuple[str, ...], str, Section]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        if ".dlm" in dirnames:
            raise SystemExit(f"error: {dirpath}/.dlm: the baseline does not read .dlm/ folders")
        for name in filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if not any(rx.fullmatch(rel) for rx in includes) or any(rx.fullmatch(rel) for rx in excludes):
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
            found.append((tuple(rel.split("/")), rel, Section(type="prose", content=content, source=rel)))
    found.sort(key=lambda entry: entry[0])  # Path order: folder by folder
    return [section for _, _, section in found]


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

"""Benchmark: the walk of a ``training.sources`` directive, alone, against the kernel's share.

Times :func:`dlmstore.sources.walk.walk_directive` in-process (no reads, no
tokenizer) on two trees: this interpreter's standard library with
``include: ["**/*.py"]`` (thousands of small folders, ``__pycache__`` ones
skipped after a look below them) and a flat folder of ``--files`` tiny
files (default 100,000, built once with ``benchlib.make_tiny_tree``) with the
default include. The baseline, measured in the same run, is what no walk can
avoid: listing the same folders with ``os.scandir`` and nothing else. It
prints the median of ``--repeat`` runs after one warm-up run (page and
dentry caches warm) of each, and the walk's ratio to the baseline.

    python bench/bench_walk.py [--files N] [--repeat N] [--tree DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchlib import make_tiny_tree, median_seconds

from dlmstore.document.frontmatter import SourceDirective
from dlmstore.sources.walk import SourceWalk, walk_directive


def list_folders(root: str, folders: list[str]) -> None:
    """The baseline: one ``os.scandir`` listing of each folder the walk lists, nothing more."""
    for folder in folders:
        with os.scandir(folder) as it:
            list(it)


def listed_folders(root: str) -> list[str]:
    """Every folder below ``root`` that the walk lists (all of them: a skipped
    folder is listed too, to look for ``.dlm/`` folders below it)."""
    return [root] + [os.path.join(d, name) for d, names, _ in os.walk(root) for name in names]


def bench(name: str, root: str, include: list[str], repeat: int) -> None:
    directive = SourceDirective(path=root, include=include)
    result: list[SourceWalk] = []

    def walk() -> None:
        result[:] = [
            walk_directive(directive, label=name, doc_dir=Path("/"), doc_root="/", policy="permissive")
        ]

    folders = listed_folders(root)
    walk_s = median_seconds(walk, repeat, warm_up=True)
    floor_s = median_seconds(lambda: list_folders(root, folders), repeat, warm_up=True)
    found = result[0]
    print(
        f"{name}: {len(found.files):,} files chosen, {found.excluded:,} excluded, "
        f"{found.excluded_dirs:,} folders skipped, {len(folders):,} folders listed"
    )
    print(
        f"  walk {walk_s * 1000:.1f} ms, listing alone {floor_s * 1000:.1f} ms, "
        f"walk / listing = {walk_s / floor_s:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000, help="files in the flat tree")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--tree", type=Path, default=Path("/tmp/dlmstore-bench-walk"), help="where the flat tree lives"
    )
    args = parser.parse_args()
    bench("stdlib", sysconfig.get_paths()["stdlib"], ["**/*.py"], args.repeat)
    flat = make_tiny_tree(args.tree / f"flat-{args.files}", args.files)
    bench("flat", str(flat), ["**/*"], args.repeat)


if __name__ == "__main__":
    main()

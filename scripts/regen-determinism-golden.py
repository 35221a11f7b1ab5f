"""Refresh the determinism golden for this runtime (see dlmstore/train/golden.py).

    python scripts/regen-determinism-golden.py            # report old vs new, write nothing
    python scripts/regen-determinism-golden.py --approve  # write the tuple file and the index

Trains the golden document twice from fresh stores. Exit codes: 2 when the
two runs disagree (this runtime is not deterministic), 1 without --approve
when the new sha256 differs from the checked-in one (or none exists), 0
otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dlmstore.train.golden import golden_tuple, read_golden, train_golden_once, tuple_hash, write_golden

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--approve", action="store_true", help="write the golden and the index")
    args = parser.parse_args()

    runtime = golden_tuple()
    print(f"tuple {tuple_hash(runtime)}: {runtime}")
    first, second = train_golden_once(), train_golden_once()
    print(f"run 1: {first}\nrun 2: {second}")
    if first != second:
        print("error: two runs of the same inputs gave different adapters", file=sys.stderr)
        return 2
    old = read_golden(ROOT, runtime)
    old_sha = old["adapter_sha256"] if old else None
    print(f"checked-in: {old_sha or '(none for this tuple)'}\nnew:        {first}")
    if args.approve:
        path = write_golden(ROOT, runtime, first)
        print(f"wrote {path.relative_to(ROOT)} and .determinism/lock.json")
        return 0
    return 0 if old_sha == first else 1


if __name__ == "__main__":
    sys.exit(main())

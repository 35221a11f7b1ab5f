"""What checking store.db costs `dlm cache verify`: quick_check against integrity_check.

Builds a store of ~10K cache entries with one real `dlm tokenize` over 10K
small generated files (SmolLM2 tokenizer, ~30 s cold), then times, each
the median of ``--repeat`` runs with the page cache warm:

* SQLite's ``PRAGMA quick_check`` and ``PRAGMA integrity_check`` on store.db;
* the library ``verify()`` (which runs integrity_check, then reads every
  entry's bytes and lists the token files);
* the whole `dlm cache verify` process.

integrity_check also checks that every index agrees with its table; the
figures say what that costs beside everything else verify does
(``Store.integrity_problems`` records the choice).

    python bench/bench_verify.py [--files 10000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

DLM = str(Path(sys.executable).with_name("dlm"))
DLM_ID = "01M7YJ087N2NEP493AF56E3CE2"
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def pragma(db: Path, name: str) -> None:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        assert conn.execute(f"PRAGMA {name}").fetchall() == [("ok",)]
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        notes = root / "notes"
        notes.mkdir()
        rng = random.Random(0)
        for i in range(args.files):
            (notes / f"{i}.md").write_text(" ".join(rng.choices(WORDS, k=rng.randint(20, 200))) + "\n")
        doc = root / "doc.dlm"
        doc.write_text(f"---\ndlm_id: {DLM_ID}\ntraining:\n  sources:\n    - path: {notes}\n---\nProse.\n")
        env = {**os.environ, "DLM_HOME": str(root / "home"), "HF_HUB_OFFLINE": "1"}
        subprocess.run([DLM, "tokenize", str(doc)], env=env, check=True, capture_output=True)
        os.environ["DLM_HOME"] = env["DLM_HOME"]

        from dlmstore.cache.admin import verify
        from dlmstore.store.database import open_store

        with open_store(DLM_ID, create=False) as store:
            db = store.db_path
            entries = verify(store).entries_checked
            quick = median_ms(lambda: pragma(db, "quick_check"), args.repeat)
            full = median_ms(lambda: pragma(db, "integrity_check"), args.repeat)
            library = median_ms(lambda: verify(store), args.repeat)

        def whole() -> None:
            subprocess.run([DLM, "cache", "verify", str(doc)], env=env, check=True, capture_output=True)

        process = median_ms(whole, max(3, args.repeat // 2))
        print(f"store.db: {db.stat().st_size / 1e6:.1f} MB, {entries:,} cache entries")
        print(f"PRAGMA quick_check:       {quick:7.1f} ms")
        print(f"PRAGMA integrity_check:   {full:7.1f} ms")
        print(f"verify() (library):       {library:7.1f} ms  (integrity_check included)")
        print(f"dlm cache verify process: {process:7.1f} ms")


if __name__ == "__main__":
    main()

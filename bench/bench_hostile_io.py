"""Peak memory and wall time of `dlm tokenize` on huge source files, against the tokenizer alone.

Issue 16 (hostile input) found that tokenizing takes about 140 bytes of
memory per byte of source: the fast tokenizer keeps per-byte alignments and
per-token structures while it encodes, so one 57 MB file peaked at 8.1 GB
and a 216 MB one passed 14 GB. dlmstore now bounds a pass: source files
over 4 MiB are skipped by the default ``max_bytes_per_file`` (counted, with
a warning that says how to raise it), and the tokenize pass batches rows up
to 4 MiB of text. This script shows both, side by side with the tokenizer
alone on the same text, in one run:

1. one 57 MB file: ``dlm tokenize`` (skipped by the default cap) against
   the tokenizer alone on the same text (one call, as a batch made it);
2. one 216 MB file: the same; the tokenizer alone would need about 30 GB,
   so it is stopped when its RSS passes ``--limit-gb`` and reported so;
3. the 57 MB text as a tree of files under the cap: ``dlm tokenize``
   tokenizes all of it in bounded batches, against the tokenizer alone on
   the whole text (case 1's figure) and on the same files one at a time
   (the least a bounded pass can cost);
4. ``--tiny`` tiny files (100,000 by default, a few lines of stdlib source
   each): ``dlm tokenize`` cold against the tokenizer alone reading the
   same files and encoding them in batches of 256.

The text is the Python standard library's source files concatenated (code
and docstrings), generated once under ``--workdir``. Each figure comes from
its own process (peak RSS from ``wait4``), cold (no cache entries). The
216 MB tokenizer-alone case takes the longest; ``--skip-216`` leaves it out.

    python bench/bench_hostile_io.py [--workdir /tmp/dlm-bench-hostile] [--limit-gb 12] [--skip-216] [--tiny 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchlib import DLM, REPO, STDLIB, make_tiny_tree

DLM_ID = "01M7YJ087N2NEP493AF56E3CE2"
PIECE = 3_800_000  # bytes per file of the tree case: under the 4 MiB cap

#: The tokenizer alone: load it, read the files, encode each in one call.
TOKENIZER_ALONE = """
import sys, time
from dlmstore.bases import load_tokenizer, resolve_base
tokenizer = load_tokenizer(resolve_base("smollm2-135m"))
start, tokens = time.perf_counter(), 0
for path in sys.argv[1:]:
    text = open(path, encoding="utf-8").read()
    tokens += len(tokenizer([text], add_special_tokens=True)["input_ids"][0])
    del text
print(tokens, round(time.perf_counter() - start, 2))
"""

#: The tokenizer alone on many small files: read them all, encode in batches of 256.
TOKENIZER_BATCHES = """
import sys, time
from pathlib import Path
from dlmstore.bases import load_tokenizer, resolve_base
tokenizer = load_tokenizer(resolve_base("smollm2-135m"))
start, tokens = time.perf_counter(), 0
paths = sorted(Path(sys.argv[1]).iterdir())
for begin in range(0, len(paths), 256):
    texts = [p.read_text(encoding="utf-8") for p in paths[begin : begin + 256]]
    tokens += sum(len(ids) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"])
print(tokens, round(time.perf_counter() - start, 2))
"""


@dataclass
class Figure:
    case: str
    peak_gb: float
    wall_s: float
    note: str


def make_text(path: Path, size: int) -> Path:
    """``size`` bytes of stdlib source (whole lines), written once."""
    if path.is_file() and path.stat().st_size == size:
        return path
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        while written < size:
            for source in sorted(STDLIB.rglob("*.py")):
                try:
                    text = source.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue
                data = text.encode("utf-8")
                if written + len(data) > size:
                    data = data[: size - written]
                    data = data[: data.rfind(b"\n") + 1].ljust(size - written, b" ")
                    out.write(data.decode("utf-8", "ignore"))
                    written = size
                    break
                out.write(text)
                written += len(data)
    return path


def split_into_tree(text: Path, tree: Path) -> list[Path]:
    """``text`` cut at line ends into files of about ``PIECE`` bytes, in sorted order."""
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    data = text.read_bytes()
    files, start, index = [], 0, 0
    while start < len(data):
        end = min(len(data), start + PIECE)
        if end < len(data):
            end = data.rfind(b"\n", start, end) + 1 or end
        path = tree / f"part-{index:03d}.txt"
        path.write_bytes(data[start:end])
        files.append(path)
        start, index = end, index + 1
    return files


def measure(
    argv: list[str], env: dict[str, str], limit_bytes: int | None = None
) -> tuple[float, float, int, str]:
    """Peak RSS (GB), wall seconds, exit code and stdout of one process; killed past ``limit_bytes``."""
    import resource

    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    watched = psutil.Process(proc.pid)
    killed = False
    while proc.poll() is None and limit_bytes is not None:
        try:
            if watched.memory_info().rss > limit_bytes:
                proc.kill()
                killed = True
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    stdout, stderr = proc.communicate()
    seconds = time.perf_counter() - start
    # This runs in a fresh helper process (see run()) whose only child this
    # was, so the largest peak of its children is this child's.
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if proc.returncode != 0 and not killed:
        sys.stderr.write(stderr.decode(errors="replace")[-2000:])
    return peak / 1e9, seconds, -9 if killed else proc.returncode, stdout.decode()


def run(
    argv: list[str], env: dict[str, str], limit_bytes: int | None = None
) -> tuple[float, float, int, str]:
    """:func:`measure` in a fresh helper process, so its children's peak RSS is this child's alone."""
    helper = [sys.executable, __file__, "--measure", json.dumps([argv, limit_bytes])]
    out = subprocess.run(helper, env=env, capture_output=True, text=True, check=True)
    peak, seconds, code, stdout = json.loads(out.stdout)
    return peak, seconds, code, stdout


def write_doc(path: Path, root: Path) -> Path:
    path.write_text(
        f"---\ndlm_id: {DLM_ID}\ntraining:\n  sources:\n    - path: {root}\n---\nA huge corpus.\n",
        encoding="utf-8",
    )
    return path


def dlm_tokenize(doc: Path, env: dict[str, str], home: Path, case: str) -> Figure:
    shutil.rmtree(home / "store", ignore_errors=True)  # cold: no cache entries
    peak, seconds, code, stdout = run([DLM, "tokenize", "--json", str(doc)], env)
    if code != 0:
        raise SystemExit(f"dlm tokenize failed on {doc}")
    summary = json.loads(stdout)
    skipped = [line for line in summary["warnings"] if "skipped" in line]
    note = f"{summary['tokens']:,} tokens" + ("; skipped by the default cap" if skipped else "")
    return Figure(case, peak, seconds, note)


def tokenizer_alone(files: list[Path], env: dict[str, str], case: str, limit_bytes: int | None) -> Figure:
    argv = [sys.executable, "-c", TOKENIZER_ALONE, *map(str, files)]
    peak, seconds, code, stdout = run(argv, env, limit_bytes)
    if code == -9:
        return Figure(case, peak, seconds, f"stopped: RSS passed the {(limit_bytes or 0) / 1e9:.0f} GB limit")
    if code != 0:
        return Figure(case, peak, seconds, f"failed (exit {code}): out of memory")
    tokens, encode_s = stdout.split()
    return Figure(case, peak, seconds, f"{int(tokens):,} tokens, {encode_s} s encoding")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dlm-bench-hostile"))
    parser.add_argument("--limit-gb", type=float, default=12.0)
    parser.add_argument("--skip-216", action="store_true")
    parser.add_argument("--tiny", type=int, default=100_000, help="tiny files in case 4 (0: skip it)")
    parser.add_argument(
        "--quick", action="store_true", help="5 and 20 MB instead of 57 and 216 (a smoke run)"
    )
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:  # helper mode: one measured child, see run()
        argv, limit = json.loads(args.measure)
        print(json.dumps(measure(argv, dict(os.environ), limit)))
        return
    work = args.workdir
    home = work / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DLM_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONPATH": str(REPO)}  # fmt: skip
    limit = int(args.limit_gb * 1e9)
    print("generating text under", work, flush=True)
    small, large = (5_000_000, 20_000_000) if args.quick else (57_000_000, 216_000_000)
    sizes = {f"{small // 10**6} MB": small} | ({} if args.skip_216 else {f"{large // 10**6} MB": large})
    texts = {name: make_text(work / f"text-{size}.txt", size) for name, size in sizes.items()}
    first = next(iter(sizes))
    parts = split_into_tree(texts[first], work / "tree" / "src")
    subprocess.run([DLM, "show", str(write_doc(work / "warmup.dlm", parts[0]))], env=env,
                   capture_output=True, check=True)  # fmt: skip
    figures: list[Figure] = []
    for name, text in texts.items():
        folder = work / f"one-{name.replace(' ', '')}"
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "src").mkdir(parents=True)
        os.link(text, folder / "src" / "big.txt")
        doc = write_doc(folder / "doc.dlm", folder / "src")
        print(f"measuring one {name} file", flush=True)
        figures.append(dlm_tokenize(doc, env, home, f"one {name} file: dlm tokenize"))
        alone_limit = None if name == first else limit
        figures.append(tokenizer_alone([text], env, f"one {name} file: tokenizer alone", alone_limit))
    print(f"measuring the {first} text as a tree ({len(parts)} files)", flush=True)
    tree_doc = write_doc(work / "tree" / "doc.dlm", work / "tree" / "src")
    tree_case = f"{first} as {len(parts)} files"
    figures.append(dlm_tokenize(tree_doc, env, home, f"{tree_case}: dlm tokenize"))
    figures.append(tokenizer_alone(parts, env, f"{tree_case}: tokenizer alone, one by one", None))
    if args.tiny:
        print(f"measuring {args.tiny:,} tiny files", flush=True)
        tiny = make_tiny_tree(work / "tiny" / "src", args.tiny)
        tiny_doc = write_doc(work / "tiny" / "doc.dlm", tiny)
        figures.append(dlm_tokenize(tiny_doc, env, home, f"{args.tiny:,} tiny files: dlm tokenize"))
        argv = [sys.executable, "-c", TOKENIZER_BATCHES, str(tiny)]
        peak, seconds, _, stdout = run(argv, env)
        tokens, encode_s = stdout.split()
        figures.append(Figure(f"{args.tiny:,} tiny files: tokenizer alone", peak, seconds,
                              f"{int(tokens):,} tokens, {encode_s} s reading + encoding"))  # fmt: skip
    print()
    print(f"{'case':<52} {'peak RSS':>9} {'wall':>8}  note")
    for figure in figures:
        print(f"{figure.case:<52} {figure.peak_gb:>7.2f} GB {figure.wall_s:>6.1f} s  {figure.note}")
    by_case = {figure.case: figure for figure in figures}
    whole = by_case[f"one {first} file: tokenizer alone"]
    tree = by_case[f"{tree_case}: dlm tokenize"]
    one_by_one = by_case[f"{tree_case}: tokenizer alone, one by one"]
    print()
    print(f"{first} tokenized by dlm in bounded batches: peak RSS {tree.peak_gb / whole.peak_gb:.2f}x "
          f"the tokenizer's on the whole text, wall {tree.wall_s / one_by_one.wall_s:.2f}x "
          "the tokenizer alone file by file")  # fmt: skip
    if args.tiny:
        ours, alone = (
            by_case[f"{args.tiny:,} tiny files: dlm tokenize"],
            by_case[f"{args.tiny:,} tiny files: tokenizer alone"],
        )
        print(f"{args.tiny:,} tiny files: dlm tokenize peak RSS {ours.peak_gb / alone.peak_gb:.2f}x, "
              f"wall {ours.wall_s / alone.wall_s:.2f}x the tokenizer alone")  # fmt: skip


if __name__ == "__main__":
    main()

"""Helpers shared by the bench scripts: paths, generated corpora, one measured process.

Imported by the bench scripts (``bench_datasets``, ``bench_hostile``, ``bench_hostile_io``,
``bench_pack``, ``bench_preference``, ``bench_ray_build``, ``bench_startup``,
``bench_tokenize``, ``bench_train_inputs``, ``bench_walk``, ``bench_watch``), which run
as scripts from the repository root, so ``bench/`` is on ``sys.path``.
"""

from __future__ import annotations

import compileall
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

STDLIB = Path(os.__file__).parent
DLM = str(Path(sys.executable).with_name("dlm"))
REPO = Path(__file__).resolve().parent.parent


def compile_bytecode() -> None:
    """Compile dlmstore's bytecode into its (git-ignored) ``__pycache__`` folders, as an install has it.

    With ``PYTHONDONTWRITEBYTECODE=1`` in the environment and no bytecode on
    disk, every ``dlm`` process compiles every module it imports (about
    0.1 s for ``dlm tokenize``): the checkout's cost, not the command's.
    """
    package = REPO / "dlmstore"
    for folder in (package, REPO / "cli", REPO / "migrations"):
        compileall.compile_dir(
            folder, quiet=1
        )  # dlmstore/cli and dlmstore/migrations may be symlinks: each by name


def median_seconds(run: Callable[[], object], repeat: int, *, warm_up: bool = False) -> float:
    """The median wall time of ``repeat`` calls of ``run`` in this process (a collection before each)."""
    if warm_up:
        run()
    times = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stdlib_lines(at_least: int) -> list[str]:
    """The non-blank lines of the stdlib's modules, in path order, stopping once there are ``at_least``."""
    lines: list[str] = []
    for source in sorted(STDLIB.rglob("*.py")):
        try:
            lines.extend(line for line in source.read_text(encoding="utf-8").splitlines() if line.strip())
        except (UnicodeDecodeError, OSError):
            continue
        if len(lines) >= at_least:
            break
    return lines


def make_tiny_tree(tree: Path, count: int) -> Path:
    """``count`` files of a few stdlib source lines each, written once."""
    if tree.is_dir() and sum(1 for _ in tree.iterdir()) == count:
        return tree
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    lines = stdlib_lines(count * 3)
    for index in range(count):
        start = (index * 3) % max(len(lines) - 3, 1)
        (tree / f"f{index:06d}.txt").write_text("\n".join(lines[start : start + 3]) + "\n", encoding="utf-8")
    return tree


def timed_process(
    argv: list[str], env: dict[str, str], *, cpu: list[float] | None = None
) -> tuple[float, int, bytes]:
    """Wall seconds, peak RSS (bytes, from ``wait4``: this child's own) and stdout of one process.

    With ``cpu``, the process's CPU seconds (user + system, from the same
    ``wait4``) are appended to it.

    Raises:
        SystemExit: the process failed (its stderr is shown).
    """
    start = time.perf_counter()
    # stderr goes to a file: reading two pipes one after the other can deadlock
    # once the unread one fills (a chatty stderr while stdout is still open).
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err)
        stdout = proc.stdout.read()  # type: ignore[union-attr]
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        if cpu is not None:
            cpu.append(usage.ru_utime + usage.ru_stime)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(argv[:2])} failed:\n{err.read().decode(errors='replace')[-3000:]}")
    return seconds, usage.ru_maxrss * 1024, stdout


#: ``dlm ARGS...`` in a child that reports its own peak RSS (VmHWM) at exit. The
#: child's ``ru_maxrss`` would not do: after a vfork it includes the parent's.
_PEAK = """
import atexit, sys
def report():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                sys.stderr.write(f"VmHWM {line.split()[1]}\\n")
atexit.register(report)
from dlmstore.cli.main import cli
cli(sys.argv[1:], prog_name="dlm")
"""


def peak_process(args: list[str], env: dict[str, str]) -> tuple[float, int, subprocess.CompletedProcess[str]]:
    """Wall seconds, peak RSS (bytes, the child's own VmHWM; 0 without /proc) and the finished ``dlm ARGS...``."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _PEAK, *args], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    peaks = [line.split()[1] for line in done.stderr.splitlines() if line.startswith("VmHWM ")]
    return wall, int(peaks[-1]) * 1024 if peaks else 0, done


#: The tests' tiny SmolLM2-shaped model (tests/conftest.py's TINY_SMOLLM2_CONFIG), for benches that train.
TINY_CONFIG = {
    "vocab_size": 49152, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu",
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}  # fmt: skip


def make_tiny_base(folder: Path) -> Path:
    """A tiny random SmolLM2-shaped model with SmolLM2's tokenizer in ``folder`` (made once, then reused)."""
    if (folder / "model.safetensors").is_file():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from dlmstore.bases import load_tokenizer, resolve_base

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**TINY_CONFIG)).save_pretrained(folder)
    load_tokenizer(resolve_base("smollm2-135m")).save_pretrained(folder)
    return folder

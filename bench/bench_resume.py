"""What checking a checkpoint costs: its sha256 beside its write, its verification beside its restore.

    python bench/bench_resume.py              # both adapters
    python bench/bench_resume.py --only small # or large

``dlm train`` takes the sha256 of every file of a checkpoint when it
registers it (``dlmstore.train.checkpoints.register``), and hashes them
again before ``--resume`` loads it. This trains the tour document on the
real SmolLM2-135M (SFT, a checkpoint every step, 6 steps, stopped with
Ctrl-C after step 5), then resumes it, for two adapters:

* **small**: the tour's own settings (LoRA r=8 on the four attention
  projections);
* **large**: r=64 on all seven linear projections (a checkpoint 13x the
  bytes: what the cost per byte looks like once the files dominate).

Printed, each figure beside its baseline measured in the same run:

1. **hash / write**: per checkpoint, the median seconds of hashing its files
   (``folder_sha256``) beside the median seconds of writing it (the
   trainer's save: adapter, optimizer, scheduler, RNG, trainer state; each
   rank's state; the plan; the fsync of the folder; its row), and their
   ratio;
2. **hash / training**: the same hash beside the training between two
   checkpoints at the default ``training.checkpoint_steps``: 50 times the
   median forward and backward pass of this run (``training_step``; the
   optimizer's update is left out, so the ratio is an upper bound of what
   the hash adds to a run);
3. **verify / restore**: on ``--resume``, the seconds of finding the
   checkpoint and verifying its files (``resumable``) beside the seconds of
   restoring it (adapter, optimizer and scheduler, RNG: ``timings.restore``).

Work folder: ``$TMPDIR/dlm-bench-resume`` (its home converts the built-in
base once).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO

WORK = Path(tempfile.gettempdir()) / "dlm-bench-resume"
STEPS = 6
CHECKPOINT_STEPS = 50  # training.checkpoint_steps' default
ADAPTERS = {
    "small": "",
    "large": "  lora_r: 64\n  lora_alpha: 128\n"
    "  target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]\n",
}


class Timer:
    """Seconds spent in each call of the functions it wraps, by name."""

    def __init__(self) -> None:
        self.calls: dict[str, list[float]] = {}

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.calls.setdefault(name, []).append(time.perf_counter() - t0)

        return timed


def tour(name: str) -> Path:
    """The tour document, SFT only, a checkpoint every step, with adapter ``name``'s settings."""
    folder = WORK / name / "examples"
    shutil.rmtree(WORK / name, ignore_errors=True)
    shutil.copytree(REPO / "examples", folder)
    shutil.copytree(REPO / "docs", WORK / name / "docs")  # the tour's training.sources: ../docs
    doc = folder / "tour.dlm"
    text = doc.read_text().replace("training:\n", f"training:\n  checkpoint_steps: 1\n{ADAPTERS[name]}", 1)
    doc.write_text(text)
    return doc


@contextmanager
def instrumented(timer: Timer) -> Iterator[None]:
    """Time hashing, verifying and writing checkpoints through ``timer``; put the functions back after."""
    from dlmstore.train import checkpoints
    from dlmstore.train.loops import supervised

    # register() and begin() find these by their module's name, so wrapping the name times every call
    targets = [(checkpoints, "folder_sha256", "hash"), (checkpoints, "resumable", "verify"),
               (supervised.SftTrainer, "_save_checkpoint", "save"),
               (supervised.SftTrainer, "training_step", "step"),
               (supervised.CheckpointRecorder, "on_save", "on_save")]  # fmt: skip
    originals = [getattr(owner, attribute) for owner, attribute, _ in targets]
    for (owner, attribute, name), original in zip(targets, originals, strict=True):
        setattr(owner, attribute, timer.wrap(name, original))
    try:
        yield
    finally:
        for (owner, attribute, _), original in zip(targets, originals, strict=True):
            setattr(owner, attribute, original)


def measure(name: str) -> None:
    from dlmstore.progress import ProgressUpdate, reporting
    from dlmstore.train.trainer import train_document

    doc = tour(name)
    shutil.rmtree(WORK / "home" / "store", ignore_errors=True)
    timer = Timer()

    def ctrl_c(update: ProgressUpdate) -> None:
        if update.task == "training sft" and update.done == STEPS - 1 and not update.finished:
            raise KeyboardInterrupt

    with instrumented(timer):
        try:
            with reporting(ctrl_c):
                train_document(str(doc), phase="sft", max_steps=STEPS)
        except KeyboardInterrupt:
            pass
        (store,) = (WORK / "home" / "store").iterdir()
        folder = max(
            (store / "checkpoints" / "run1").iterdir(), key=lambda path: int(path.name.split("-")[1])
        )
        size = sum(path.stat().st_size for path in folder.iterdir())
        files = len(list(folder.iterdir()))
        summary = train_document(str(doc), phase="sft", max_steps=STEPS, resume=True)
    # a checkpoint's write: the trainer's save, then on_save (rank state, plan, fsync, row) less its hash
    hashes = timer.calls["hash"]
    writes = [save + on_save - hashed for save, on_save, hashed in
              zip(timer.calls["save"], timer.calls["on_save"], hashes, strict=True)]  # fmt: skip
    verify, restore = timer.calls["verify"][-1], summary.timings.restore
    hash_s, write_s = statistics.median(hashes), statistics.median(writes)
    between = CHECKPOINT_STEPS * statistics.median(timer.calls["step"])  # grad_accum 1: one call a step
    print(f"{name}: a checkpoint of {files} files, {size / 2**20:.2f} MiB ({len(hashes)} written)")
    print(f"  hash / write:     sha256 of its files {hash_s * 1000:.1f} ms beside its write {write_s * 1000:.1f} ms "
          f"(medians): {hash_s / write_s:.3f}x")  # fmt: skip
    print(f"  hash / training:  beside the {between:.1f} s of {CHECKPOINT_STEPS} steps between two checkpoints "
          f"(the default checkpoint_steps): {hash_s / between:.4f}x")  # fmt: skip
    print(f"  verify / restore: --resume at step {summary.resumed_at_step}: finding and verifying it "
          f"{verify * 1000:.1f} ms beside restoring it {restore * 1000:.1f} ms: {verify / restore:.3f}x")  # fmt: skip
    print(f"  hashing rate:     {size / 2**20 / hash_s:,.0f} MiB/s; json: " + json.dumps(
        {"name": name, "bytes": size, "hash_s": hash_s, "write_s": write_s, "between_s": between,
         "verify_s": verify, "restore_s": restore}
    ))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(ADAPTERS))
    args = parser.parse_args()
    os.environ.update(
        {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "DLM_HOME": str(WORK / "home")}
    )
    WORK.mkdir(parents=True, exist_ok=True)
    for name in ADAPTERS:
        if args.only in (None, name):
            measure(name)


if __name__ == "__main__":
    main()

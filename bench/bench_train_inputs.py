"""Training on token datasets: the input pipeline against the model, memory at 2 GiB, resume cost.

    python bench/bench_train_inputs.py                 # all three
    python bench/bench_train_inputs.py --only pipeline # or rss, resume

Prints, each measured side by side in one run:

1. **pipeline**: tokens/s of the SFT phase's data path (``PackedWindows``
   over a packed pretrain dataset, the rank-partitioned sampler, the
   collator: batches of B=8, T=2048, exactly what ``dlm train`` feeds the
   trainer) against the tokens/s one LoRA training step of SmolLM2-135M
   consumes on this machine (forward + backward + optimizer step at B=1,
   T=512: on this CPU a step of B=8, T=2048 takes minutes and holds GBs of
   attention, and a token costs the model less at T=512 than at 2048, so
   the ratio printed is a lower bound). Goal: the data path at least 20x
   the model.
2. **rss**: peak RSS of ``dlm train`` (a tiny random model, 20 steps of
   B=4, T=1024: the logits of SmolLM2's 49,152-word vocabulary dominate a
   step's memory, and do not depend on the dataset) on a 2 GiB pretrain
   dataset and on a 2 MiB one, their difference and ratio. Goal: within
   300 MiB of each other (the dataset is mapped, not loaded).
3. **resume**: ``dlm train --resume`` on the tour document after an
   interruption: seconds to restore the checkpoint (adapter, optimizer and
   scheduler, RNG), beside the model load, and their ratio. Goal: restore
   <= 2 s.

The 2 GiB dataset (random tokens, a document every ~600 tokens) is written
once under ``$TMPDIR/dlm-bench-inputs`` and reused.
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
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import DLM, REPO, make_tiny_base, timed_process

WORK = Path(tempfile.gettempdir()) / "dlm-bench-inputs"
T = 2048
B = 8
STEP_T = 512  # the model's step is timed at this length (see the docstring)
RSS_B, RSS_T = 4, 1024  # the shape of the RSS runs' batches


def env() -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "DLM_HOME": str(WORK / "home"),
    }


def tiny_base() -> Path:
    """A tiny random SmolLM2-shaped model with SmolLM2's tokenizer (what the tests train)."""
    return make_tiny_base(WORK / "tiny")


def seed_dataset(base: Path) -> Path:
    """A small real pretrain dataset of ``base``'s tokenizer (its meta.json is the template)."""
    out = WORK / "seed-ds"
    if (out / "meta.json").is_file():
        return out
    notes = WORK / "seed-notes"
    notes.mkdir(parents=True, exist_ok=True)
    for i in range(40):
        (notes / f"n{i}.md").write_text(f"Note {i}: light, water and air make leaves grow. " * 20)
    timed_process(
        [DLM, "data", "build", "pretrain", "--from", str(notes), "--out", str(out), "--base", str(base),
         "--val-frac", "0.05"],
        env(),
    )  # fmt: skip
    return out


def synthetic_dataset(template: Path, name: str, tokens: int) -> Path:
    """A pretrain dataset of ``tokens`` random tokens in 128 MiB shards, with document indexes."""
    from dlmstore.datasets.build.writers import write_npy
    from dlmstore.datasets.meta import write_meta
    from dlmstore.store.digests import file_sha256

    out = WORK / name
    if (out / "meta.json").is_file():
        return out
    shutil.rmtree(out, ignore_errors=True)
    (out / "train").mkdir(parents=True)
    meta = json.loads((template / "meta.json").read_text())
    eos = int(meta["eos_token_id"])
    shard_tokens = 64 << 20
    files = []
    rng = np.random.default_rng(0)
    for index, start in enumerate(range(0, tokens, shard_tokens)):
        count = min(shard_tokens, tokens - start)
        array = rng.integers(3, 49152, size=count, dtype=np.uint16)
        starts = np.arange(0, count, 600, dtype=np.int64)
        array[starts[1:] - 1] = eos
        array[-1] = eos
        shard = out / "train" / f"shard_{index:05d}.bin"
        array.tofile(shard)
        docs_bytes, docs_sha = write_npy(shard.with_suffix(".docs.npy"), starts)
        common = {"split": "train", "shard_index": index, "token_offset": start, "doc_count": len(starts)}
        files.append({**common, "role": "tokens", "path": f"train/{shard.name}", "token_count": count,
                      "bytes": count * 2, "sha256": file_sha256(shard)})  # fmt: skip
        files.append({**common, "role": "doc_index", "path": f"train/{shard.stem}.docs.npy", "token_count": 0,
                      "bytes": docs_bytes, "sha256": docs_sha})  # fmt: skip
    meta.update(dataset_name=name, files=files, source={"type": "synthetic"})
    meta["totals"] = {**meta["totals"], "train_tokens": tokens, "val_tokens": 0, "val_docs": 0}
    write_meta(out, meta)
    return out


def pipeline(base: Path, dataset: Path) -> None:
    import torch

    from dlmstore.bases import load_model, resolve_base
    from dlmstore.datasets.read.sampler import RankPartitionSampler
    from dlmstore.train.data.examples import Collator, training_examples
    from dlmstore.train.data.inputs import DatasetSpec, check_dataset_input
    from dlmstore.train.loops.supervised import EpochBatches, EpochLoader

    meta = json.loads((dataset / "meta.json").read_text())
    spec = DatasetSpec(path=dataset, weight=1.0, split="train", origin="bench")
    item = check_dataset_input(spec, tokenizer_sha256=meta["tokenizer_sha256"], vocab_size=49152,
                               sequence_len=T, context_len=None)  # fmt: skip
    examples, names = training_examples(None, [item], sequence_len=T, seed=0)
    sampler = RankPartitionSampler(len(examples), seed=0)  # type: ignore[arg-type]
    loader = EpochLoader(
        examples, batch_sampler=EpochBatches(sampler, B, examples), collate_fn=Collator(2, 1)
    )
    rates = []
    count = min(200, len(loader))  # a small --big-tokens has fewer batches an epoch
    for _ in range(3):
        batches = iter(loader)
        start, tokens = time.perf_counter(), 0
        for _ in range(count):
            batch = next(batches)
            tokens += int(batch["attention_mask"].sum())
        rates.append(tokens / (time.perf_counter() - start))
    data_rate = statistics.median(rates)

    from peft import LoraConfig, get_peft_model

    model = load_model(resolve_base("smollm2-135m"), dtype=torch.float32)
    model = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM", target_modules=["q_proj", "v_proj"])
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    batch = next(iter(loader))
    ids, labels = batch["input_ids"][:1, :STEP_T], batch["labels"][:1, :STEP_T]
    steps = []
    for _ in range(3):
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps.append(time.perf_counter() - start)
    model_rate = STEP_T / statistics.median(steps)
    print(f"pipeline: data path {data_rate:,.0f} tokens/s (B={B}, T={T}, median of 3 x {count} batches)")
    print(
        f"          SmolLM2-135M LoRA step {statistics.median(steps):.2f} s at B=1, T={STEP_T}: {model_rate:,.0f} tokens/s (median of 3)"
    )
    print(f"          ratio {data_rate / model_rate:,.0f}x (goal >= 20x)")


def train_doc(base: Path, dataset: Path, name: str) -> Path:
    doc = WORK / f"{name}.dlm"
    doc.write_text(
        f"---\ndlm_id: 01KPQ1FFEDGPPSMWRAS18SAZS{'T' if name == 'big' else 'V'}\nbase_model: {base}\n"
        f"training:\n  sequence_len: {RSS_T}\n  max_steps: 20\n  micro_batch_size: {RSS_B}\n  grad_accum: 1\n"
        f"  checkpoint_steps: null\n  datasets:\n    - path: {dataset}\n---\nA line of prose.\n"
    )
    return doc


def rss(base: Path, small: Path, big: Path) -> None:
    peaks = []
    for dataset in (small, big):
        size = sum(shard.stat().st_size for shard in (dataset / "train").glob("shard_*.bin"))
        doc = train_doc(base, dataset, "big" if dataset == big else "small")
        seconds, peak, _ = timed_process(
            [DLM, "train", str(doc), "--ignore-lock"], {**env(), "OMP_NUM_THREADS": "2"}
        )
        peaks.append(peak)
        print(
            f"rss:      dlm train on the {size / 2**20:,.0f} MiB dataset: peak {peak / 2**20:,.0f} MiB "
            f"({seconds:.1f} s, 20 steps)"
        )
    delta = (peaks[1] - peaks[0]) / 2**20
    print(f"          difference {delta:+,.0f} MiB, ratio {peaks[1] / peaks[0]:.2f}x (goal within 300 MiB)")


def resume() -> None:
    from dlmstore.train.trainer import train_document

    os.environ.update(env())
    folder = WORK / "tour"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(REPO / "examples", folder)
    shutil.rmtree(WORK / "docs", ignore_errors=True)
    shutil.copytree(REPO / "docs", WORK / "docs")  # the tour's training.sources: ../docs
    doc = folder / "tour.dlm"
    text = doc.read_text().replace("training:\n", "training:\n  checkpoint_steps: 2\n", 1)
    doc.write_text(text)
    shutil.rmtree(WORK / "home" / "store", ignore_errors=True)

    from dlmstore.progress import ProgressUpdate, reporting

    def ctrl_c(update: ProgressUpdate) -> None:
        if update.task == "training sft" and update.done == 3 and not update.finished:
            raise KeyboardInterrupt

    try:
        with reporting(ctrl_c):
            train_document(str(doc), phase="sft", max_steps=6)
    except KeyboardInterrupt:
        pass
    summary = train_document(str(doc), phase="sft", max_steps=6, resume=True)
    timings = summary.timings
    print(f"resume:   tour document, resumed at step {summary.resumed_at_step}: restore {timings.restore:.2f} s "
          f"(goal <= 2 s), beside model load {timings.model_load:.2f} s")  # fmt: skip
    print(f"          restore / model load {timings.restore / timings.model_load:.2f}x; restore + model load "
          f"{timings.restore + timings.model_load:.2f} s (goal <= 2 s + the model load)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["pipeline", "rss", "resume"])
    parser.add_argument("--big-tokens", type=int, default=1 << 30, help="tokens of the large dataset (2 GiB)")
    args = parser.parse_args()
    os.environ.update(env())
    WORK.mkdir(parents=True, exist_ok=True)
    base = tiny_base()
    template = seed_dataset(base)
    small = synthetic_dataset(template, "small-ds", 1 << 20)
    if args.only in (None, "pipeline", "rss"):
        big = synthetic_dataset(template, f"big-ds-{args.big_tokens}", args.big_tokens)
    if args.only in (None, "pipeline"):
        pipeline(base, big)
    if args.only in (None, "rss"):
        rss(base, small, big)
    if args.only in (None, "resume"):
        resume()


if __name__ == "__main__":
    main()

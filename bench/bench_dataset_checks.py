"""What verifying a token dataset costs when ``dlm train`` opens it, beside a training step.

    python bench/bench_dataset_checks.py                # a 2 GiB pretrain dataset
    python bench/bench_dataset_checks.py --tokens 64M   # a smaller one

``dlm train`` runs :func:`~dlmstore.train.data.inputs.check_dataset_input`
on each dataset before the model loads: meta.json, then the deep
:func:`~dlmstore.datasets.validate.check_dataset` (every file's kind, size
and sha256, the document indexes, the EOS before each document, every
token id against the vocabulary), one read of every byte, hashed on a
thread per core. Printed, each measured in this run (medians of
``--repeat``, the variants interleaved):

* **open**: ``check_dataset(deep=False)``, what opening a dataset cost a
  run before it verified (meta.json, sizes, headers, index structure);
* **open + verify**: ``check_dataset_input``, page cache warm (a dataset
  just built or trained on), and cold (each file dropped from the page
  cache with ``posix_fadvise(DONTNEED)`` first, so the disk is read);
* baselines for the verify: a plain read of the same files on the same
  number of threads (the floor memory or disk sets), and the same
  digests on one thread (what a serial check costs);
* **training step**: one LoRA step (forward, backward, AdamW) of a
  SmolLM2-135M-shaped model (random weights: the time is the same), at
  B=8, T=2048 in bf16 on CUDA when there is a GPU, else B=1, T=512 in
  float32 (a CPU step at B=8, T=2048 takes minutes);
* the figure: open + verify as a number of training steps, and as a share
  of a 1,000-step run.

The dataset (random ids below 49,152, a document every ~600 tokens, 128 MiB
shards with their ``.docs.npy``) is written once under
``$TMPDIR/dlm-bench-checks`` and reused.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WORK = Path(tempfile.gettempdir()) / "dlm-bench-checks"
VOCAB = 49152
EOS = 2
SHARD_TOKENS = 64 << 20  # 128 MiB of uint16
TOKENIZER = "sha256:" + "b" * 64  # the bench's own: no tokenizer is loaded
SMOLLM2_135M: dict[str, Any] = {
    "vocab_size": VOCAB, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_act": "silu", "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True,
    "bos_token_id": 1, "eos_token_id": EOS, "pad_token_id": EOS,
}  # fmt: skip


def size(text: str) -> int:
    """``64M`` -> 64 * 2**20 tokens."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)


def npy_digest(path: Path, array: np.ndarray[Any, Any]) -> tuple[int, str]:
    buffer = io.BytesIO()
    np.save(buffer, array)
    path.write_bytes(buffer.getvalue())
    return len(buffer.getvalue()), "sha256:" + hashlib.sha256(buffer.getvalue()).hexdigest()


def dataset(tokens: int) -> Path:
    """A valid pretrain dataset of ``tokens`` random tokens (``check_dataset`` finds no problem in it)."""
    from dlmstore import __version__
    from dlmstore.datasets.meta import FORMAT, write_meta

    out = WORK / f"ds-{tokens}"
    if (out / "meta.json").is_file():
        return out
    shutil.rmtree(out, ignore_errors=True)
    (out / "train").mkdir(parents=True)
    rng = np.random.default_rng(0)
    files, docs = [], 0
    for index, start in enumerate(range(0, tokens, SHARD_TOKENS)):
        count = min(SHARD_TOKENS, tokens - start)
        array = rng.integers(3, VOCAB, size=count, dtype=np.uint16)
        starts = np.arange(0, count, 600, dtype=np.int64)
        array[starts[1:] - 1] = EOS
        array[-1] = EOS
        shard = out / "train" / f"shard_{index:05d}.bin"
        array.tofile(shard)
        index_bytes, index_sha = npy_digest(out / "train" / f"shard_{index:05d}.docs.npy", starts)
        common = {"split": "train", "shard_index": index, "token_offset": start, "doc_count": len(starts)}
        files.append({**common, "role": "tokens", "path": f"train/{shard.name}", "token_count": count,
                      "bytes": count * 2, "sha256": "sha256:" + hashlib.sha256(array.tobytes()).hexdigest()})  # fmt: skip
        files.append({**common, "role": "doc_index", "path": f"train/shard_{index:05d}.docs.npy",
                      "token_count": 0, "bytes": index_bytes, "sha256": index_sha})  # fmt: skip
        docs += len(starts)
    write_meta(out, {
        "format": FORMAT, "kind": "pretrain", "built": True, "dataset_name": out.name, "dataset_config": None,
        "source": {"type": "synthetic"}, "streaming": False, "split_rule": "all train", "seed": 0,
        "token_dtype": "uint16", "byte_order": "little", "tokenizer_name": "bench",
        "tokenizer_sha256": TOKENIZER, "vocab_size": VOCAB, "special_token_ids": {"eos": EOS},
        "eos_token_id": EOS, "shard_bytes": SHARD_TOKENS * 2, "shard_tokens": SHARD_TOKENS,
        "budgets": {"train_tokens": None, "val_tokens": None}, "dlmstore_version": __version__,
        "totals": {"train_tokens": tokens, "train_docs": docs, "val_tokens": 0, "val_docs": 0},
        "files": files,
    })  # fmt: skip
    os.sync()  # written back, so posix_fadvise(DONTNEED) can drop every page
    return out


def drop_from_page_cache(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def plain_read(paths: list[Path]) -> None:
    def read(path: Path) -> None:
        buffer = memoryview(bytearray(1 << 20))
        with open(path, "rb", buffering=0) as handle:
            while handle.readinto(buffer):
                pass

    with ThreadPoolExecutor(min(threads(), len(paths))) as pool:
        list(pool.map(read, paths))


def medians(variants: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Each variant's median seconds over ``repeat`` rounds, the variants interleaved within a round."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeat):
        for name, run in variants.items():
            gc.collect()
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def training_step(repeat: int) -> tuple[float, str]:
    """Median seconds of one LoRA training step of a SmolLM2-135M-shaped model, and its shape in words."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cuda = torch.cuda.is_available()
    device, dtype, batch, length = (
        ("cuda", torch.bfloat16, 8, 2048) if cuda else ("cpu", torch.float32, 1, 512)
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).to(device=device, dtype=dtype)
    model = get_peft_model(
        model,
        LoraConfig(
            r=8, lora_alpha=16, task_type="CAUSAL_LM", target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
        ),
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(3, VOCAB, (batch, length), device=device)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if cuda:
            torch.cuda.synchronize()

    step()  # warm-up: kernels chosen, memory allocated
    seconds = medians({"step": step}, repeat)["step"]
    where = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} torch threads"
    return seconds, f"B={batch}, T={length}, {str(dtype).removeprefix('torch.')} on {where}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens", type=size, default=1 << 30, help="tokens of the dataset (default 1G: 2 GiB)"
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)

    from dlmstore.datasets.validate import check_dataset
    from dlmstore.train.data.inputs import DatasetSpec, check_dataset_input

    root = dataset(args.tokens)
    meta = json.loads((root / "meta.json").read_text())
    paths = [root / f["path"] for f in meta["files"]]
    total = sum(f["bytes"] for f in meta["files"])
    spec = DatasetSpec(path=root, weight=1.0, split="train", origin="bench")

    def open_and_verify() -> object:
        return check_dataset_input(spec, tokenizer_sha256=TOKENIZER, vocab_size=VOCAB, sequence_len=2048,
                                   context_len=8192)  # fmt: skip

    def serial_digests() -> None:
        from dlmstore.datasets.formats import TokenFile
        from dlmstore.datasets.validate import digest_files

        jobs = [(TokenFile(path, None if path.suffix == ".npy" else np.dtype("<u2")), path.suffix == ".bin")
                for path in paths]  # fmt: skip
        digest_files(jobs, task="digests", threads=1)

    def cold() -> object:
        drop_from_page_cache(root)
        start = time.perf_counter()
        open_and_verify()
        return time.perf_counter() - start

    assert check_dataset(root).ok
    open_and_verify()  # warm the page cache
    warm = medians(
        {
            "open": lambda: check_dataset(root, deep=False),
            "verify": open_and_verify,
            "read": lambda: plain_read(paths),
            "serial": serial_digests,
        },
        args.repeat,
    )
    colds = [float(cold()) for _ in range(args.repeat)]  # type: ignore[arg-type]
    cold_s = statistics.median(colds)
    open_and_verify()
    step_s, shape = training_step(max(args.repeat, 5))

    gib = total / 2**30
    print(f"dataset: {gib:.2f} GiB in {len(paths)} files ({meta['totals']['train_tokens']:,} uint16 tokens), "
          f"{threads()} threads")  # fmt: skip
    print(
        f"open (meta.json, sizes, headers, index structure; a run's whole check before): {warm['open']:.3f} s"
    )
    print(
        f"open + verify, warm page cache:  {warm['verify']:.3f} s ({total / warm['verify'] / 1e9:.2f} GB/s)"
    )
    print(f"  baseline: plain read, same threads {warm['read']:.3f} s ({total / warm['read'] / 1e9:.2f} GB/s); "
          f"the digests on one thread {warm['serial']:.3f} s ({warm['serial'] / warm['verify']:.1f}x the verify)")  # fmt: skip
    print(
        f"open + verify, cold (posix_fadvise DONTNEED first): {cold_s:.3f} s ({total / cold_s / 1e9:.2f} GB/s)"
    )
    print(f"training step ({shape}, SmolLM2-135M shape, LoRA r=8 q/k/v/o): {step_s:.3f} s")
    for name, seconds in (("warm", warm["verify"]), ("cold", cold_s)):
        print(f"figure ({name}): open + verify = {seconds / step_s:.2f} training steps; "
              f"{100 * seconds / (seconds + 1000 * step_s):.2f}% of a 1,000-step run")  # fmt: skip


if __name__ == "__main__":
    main()

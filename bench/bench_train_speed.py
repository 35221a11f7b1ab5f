"""A training step against the machine: beside other jobs, against its own matmul rate, against TRL.

Prints, from one run on this machine (issue 31):

* **step time**, quiet and beside three kinds of other work: another torch
  job (a 256x256 matmul loop on torch's default threads), a tokenizer on
  its thread pool (``encode_batch`` in a loop) and a single-threaded busy
  loop; each as a ratio of the quiet step. Each figure is a whole
  ``dlm train --json`` process (``(train - first_step) / (steps - 1)``),
  with the threads ``dlm train`` chooses (``dlmstore.train.threads``) and,
  beside it, with libgomp's default waiting (``GOMP_SPINCOUNT=300000``: a
  thread spins up to 300,000 times before it sleeps; what ``dlm train`` did
  before it chose), to show what the choice is worth. The quiet figure is
  taken first and last: their spread is this machine's drift. Every run's
  adapter sha256 is printed: how threads wait changes no byte;
* **MFU**: the step's FLOPs (counted by torch's ``FlopCounterMode`` over one
  forward and backward of the same LoRA model, plus the attention's
  ``4 B T^2 d`` a layer forward, half of it causal, and twice that
  backward, which the counter does not see on CPU) over the quiet step
  time, against this machine's matmul rate measured in this run on the
  step's own matrix products (each ``aten.mm`` the step ran, replayed with
  the same shapes and strides on fresh random data, with the same
  threads). Then an account of the step by kind of work (torch's
  profiler): what stands between the step and that rate;
* **TRL**: the same step with TRL's ``SFTTrainer`` on the same rows
  (same base, LoRA config, batch, length and threads, and no gradient
  checkpointing, which ``dlm train`` does not do and TRL's ``SFTConfig``
  does by default: a forward pass again in every backward), median step
  time.

The corpus is generated from the stdlib so that every row is longer than
``--seq-len``: every batch is ``--batch`` x ``--seq-len`` tokens.

    python bench/bench_train_speed.py [--steps 6] [--batch 2] [--seq-len 256] [--spin all|quiet|none] [--base FOLDER] [--skip-trl]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchlib import DLM, stdlib_lines

DOC_ID = "01M7YJ087N2NEP493AF56E3CS1"
#: ``dlm`` beside this interpreter, else the module (a machine where dlmstore is on PYTHONPATH only).
DLM_CMD = [DLM] if Path(DLM).exists() else [sys.executable, "-P", "-m", "dlmstore.cli.main"]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]

#: Other work, each a process of its own that runs until it is stopped.
COMPETITORS = {
    "torch job": "import torch\na = torch.randn(256, 256)\nwhile True:\n    a = torch.tanh(a @ a)\n",
    "tokenizer": (
        "import sys\nfrom tokenizers import Tokenizer\ntok = Tokenizer.from_file(sys.argv[1])\n"
        "texts = [open(sys.argv[2], encoding='utf-8').read()[i * 2000:(i + 1) * 2000] for i in range(256)]\n"
        "while True:\n    tok.encode_batch(texts)\n"
    ),
    "busy loop": "while True:\n    pass\n",
}

#: TRL alone: SFTTrainer on the document's text rows, its step times measured by a callback.
TRL_ALONE = r"""
import json, sys, time
from dlmstore.train.threads import configure
configure()
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer
from dlmstore.bases import load_model, load_tokenizer, resolve_base
from dlmstore.corpus.assemble import load_corpus
from dlmstore.document.parser import parse_document
from dlmstore.determinism import apply_determinism, seed_everything
from dlmstore.train.plan import (check_settings, dlm_target_modules, lora_config_kwargs, model_load_kwargs,
                                 probe_hardware, resolve_plan, sft_config_kwargs)

doc_path, max_steps, output = sys.argv[1], int(sys.argv[2]), sys.argv[3]
document = parse_document(doc_path)
settings = document.frontmatter.training
ref = resolve_base(document.base_model, relative_to=document.directory)
rows = [{"text": r.data["text"]} for r in load_corpus(document).rows() if r.kind == "text"]
seed_everything(settings.seed); apply_determinism()
hardware = probe_hardware()
model = load_model(ref, **model_load_kwargs(settings.adapter, check_settings(settings, hardware)))
plan = resolve_plan(settings, hardware, base_params=model.num_parameters(),
                    auto_target_modules=dlm_target_modules(ref), max_steps=max_steps, seed=settings.seed)
times = []
class Steps(TrainerCallback):
    def on_step_begin(self, *a, **k): self.t0 = time.perf_counter()
    def on_step_end(self, *a, **k): times.append(time.perf_counter() - self.t0)
kwargs = sft_config_kwargs(plan, output)
kwargs["gradient_checkpointing"] = False  # as dlm trains; TRL's SFTConfig turns it on by default
trainer = SFTTrainer(model=model, args=SFTConfig(**kwargs), train_dataset=Dataset.from_list(rows),
                     processing_class=load_tokenizer(ref), peft_config=LoraConfig(**lora_config_kwargs(plan)),
                     callbacks=[Steps()])
trainer.train()
print(json.dumps({"steps": times, "threads": torch.get_num_threads()}))
"""


def write_corpus(folder: Path, files: int) -> None:
    """``files`` files of 150 stdlib lines each (well over 256 tokens)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = stdlib_lines(files * 150)
    for index in range(files):
        (folder / f"part{index:03d}.txt").write_text("\n".join(lines[index * 150 : (index + 1) * 150]) + "\n")


def write_doc(path: Path, corpus: Path, base: str, batch: int, seq_len: int, steps: int) -> Path:
    path.write_text(
        f"---\ndlm_id: {DOC_ID}\nbase_model: {base}\ntraining:\n  sequence_len: {seq_len}\n"
        f"  micro_batch_size: {batch}\n  grad_accum: 1\n  max_steps: {steps}\n  seed: 42\n"
        f"  sources:\n    - path: {corpus}\n---\n",
        encoding="utf-8",
    )
    return path


@contextmanager
def beside(name: str | None, env: dict[str, str], args: list[str]) -> Iterator[None]:
    """Run competitor ``name`` (none: a quiet machine) for the duration of the block."""
    if name is None:
        yield
        return
    process = subprocess.Popen(
        [sys.executable, "-c", COMPETITORS[name], *args], env=env, start_new_session=True
    )
    time.sleep(3)  # let it start its pool
    try:
        yield
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def train_step(doc: Path, env: dict[str, str], steps: int) -> tuple[float, str, float]:
    """One ``dlm train --json`` process: its mean step after the first, the adapter sha256, the final loss."""
    done = subprocess.run(
        [*DLM_CMD, "train", str(doc), "--json", "--max-steps", str(steps), "--update-lock"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    summary = json.loads(done.stdout)
    timings = summary["timings"]
    step = (timings["train"] - timings["first_step"]) / (steps - 1)
    return step, summary["adapter_sha256"], summary["phases"][0]["final_loss"]


def mfu_account(batch: int, seq_len: int, base: str) -> dict[str, Any]:
    """FLOPs of one LoRA step, the matmul rate on its own products, and where a step's time goes.

    Runs in this process, whose threads were configured as ``dlm train``
    configures them before torch was imported.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.profiler import ProfilerActivity, profile
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    from dlmstore.bases import load_model, resolve_base

    torch.manual_seed(0)
    model = load_model(resolve_base(base), dtype=torch.float32)
    model.config.use_cache = False
    config = model.config
    peft = get_peft_model(
        model,
        LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"),
    )
    peft.train()
    optimizer = torch.optim.AdamW([p for p in peft.parameters() if p.requires_grad], lr=2e-4)
    ids = torch.randint(0, config.vocab_size, (batch, seq_len))

    def step() -> None:
        out = peft(input_ids=ids, labels=ids)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    step()  # warm
    products: list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = []

    class Products(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.ops.aten.mm.default:
                a, b = args[0], args[1]
                products.append((tuple(a.shape), tuple(a.stride()), tuple(b.shape), tuple(b.stride())))
            return func(*args, **(kwargs or {}))

    with FlopCounterMode(display=False) as counter, Products():
        out = peft(input_ids=ids, labels=ids)
        out.loss.backward()
    optimizer.zero_grad()
    counted = counter.get_total_flops()
    d = config.hidden_size
    attention_fwd = 4 * batch * seq_len**2 * d * config.num_hidden_layers / 2  # causal: half the square
    attention = 3 * attention_fwd  # backward: dQ, dK, dV and the scores' gradient, twice the forward

    def replay() -> tuple[float, float]:
        """Each product of the step once, on fresh random data with its strides: (FLOPs, seconds)."""
        flops, seconds = 0.0, 0.0
        for a_shape, a_stride, b_shape, b_stride in products:
            a = torch.empty_strided(a_shape, a_stride).normal_()
            b = torch.empty_strided(b_shape, b_stride).normal_()
            torch.mm(a, b)
            t0 = time.perf_counter()
            torch.mm(a, b)
            seconds += time.perf_counter() - t0
            flops += 2.0 * a_shape[0] * a_shape[1] * b_shape[1]
        return flops, seconds

    replays = [replay() for _ in range(3)]
    mm_flops = replays[0][0]
    mm_seconds = statistics.median(seconds for _, seconds in replays)
    square = torch.randn(2048, 2048), torch.randn(2048, 2048)
    torch.mm(*square)
    t0 = time.perf_counter()
    for _ in range(3):
        torch.mm(*square)
    square_rate = 3 * 2.0 * 2048**3 / (time.perf_counter() - t0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        step()
        profiled = time.perf_counter() - t0
    kinds: dict[str, float] = {}
    for event in prof.key_averages():
        kinds[_kind(event.key)] = kinds.get(_kind(event.key), 0.0) + event.self_cpu_time_total / 1e6
    return {
        "counted": counted,
        "attention": attention,
        "flops": counted + attention,
        "mm_flops": mm_flops,
        "mm_seconds": mm_seconds,
        "mm_rate": mm_flops / mm_seconds,
        "products": len(products),
        "square_rate": square_rate,
        "profiled_step": profiled,
        "kinds": kinds,
        "threads": torch.get_num_threads(),
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        return "?"


def _kind(op: str) -> str:
    """The kind of work a profiled op is, for the account of a step."""
    if op in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"):
        return "matrix products"
    if "scaled_dot_product" in op:
        return "attention (SDPA)"
    if "softmax" in op or "nll_loss" in op or "cross_entropy" in op:
        return "loss over the vocabulary"
    if "bernoulli" in op or "dropout" in op:
        return "dropout masks"
    if (
        op.startswith("Optimizer.")
        or "_foreach" in op
        or op in ("aten::sqrt", "aten::addcdiv_", "aten::lerp_")
    ):
        return "optimizer"
    if op.startswith("aten::"):
        return "elementwise and the rest of aten"
    return "autograd and Python (self time)"


def trl_steps(doc: Path, env: dict[str, str], steps: int, work: Path) -> list[float]:
    done = subprocess.run(
        [sys.executable, "-P", "-c", TRL_ALONE, str(doc), str(steps), str(work / "trl-out")],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"TRL alone failed:\n{done.stderr[-3000:]}")
    times: list[float] = json.loads(done.stdout.strip().splitlines()[-1])["steps"]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=6, help="optimizer steps per dlm train (the first is left out)"
    )
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument(
        "--spin-steps", type=int, default=3, help="steps of the runs with libgomp's default waiting"
    )
    parser.add_argument(
        "--spin",
        choices=("all", "quiet", "none"),
        default="all",
        help="with libgomp's default waiting, also run: every condition, the quiet one, or none",
    )
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--skip-mfu", action="store_true")
    parser.add_argument(
        "--base",
        default="smollm2-135m",
        help="the base model (a local folder of SmolLM2-135M's shape with random weights steps as fast)",
    )
    args = parser.parse_args()
    load_start = os.getloadavg()
    user_env = dict(os.environ)  # before this process configures its own threads
    from dlmstore.home import bases_dir

    bases = bases_dir()
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="dlm-bench-speed-") as tmp:
        work = Path(tmp)
        home = work / "home"
        home.mkdir()
        bases.mkdir(parents=True, exist_ok=True)
        (home / "bases").symlink_to(bases, target_is_directory=True)
        write_corpus(work / "corpus", 64)
        doc = write_doc(work / "speed.dlm", work / "corpus", args.base, args.batch, args.seq_len, args.steps)
        env = {**user_env, "DLM_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
        spin_env = {**env, "GOMP_SPINCOUNT": "300000"}
        subprocess.run(
            [*DLM_CMD, "tokenize", str(doc)], env=env, capture_output=True, check=True
        )  # converts the base
        local = Path(args.base)
        tokenizer_json = str(
            local / "tokenizer.json" if local.is_dir() else bases / args.base / "tokenizer" / "tokenizer.json"
        )
        text = work / "text.txt"
        text.write_text("\n".join(stdlib_lines(20_000)), encoding="utf-8")
        competitor_args = [tokenizer_json, str(text)]
        print(f"load average {load_start[0]:.2f} at the start; {len(os.sched_getaffinity(0))} CPUs usable "
              f"({_cpu_name()}); "
              f"B={args.batch}, T={args.seq_len}, {args.steps} steps a run", flush=True)  # fmt: skip

        shas: set[str] = set()
        figures: dict[tuple[str, str], float] = {}
        conditions: list[str | None] = [None, *COMPETITORS, None]
        for index, name in enumerate(conditions):
            label = "quiet" + (" (again, last)" if index else "") if name is None else f"beside a {name}"
            with beside(name, user_env, competitor_args):
                step, sha, loss = train_step(doc, env, args.steps)
            shas.add(sha)
            figures[("dlm", label)] = step
            print(
                f"  dlm train, {label}: {step:.3f} s a step, loss {loss:.4f}, adapter {sha[:19]}", flush=True
            )
            if (args.spin == "all" or (args.spin == "quiet" and name is None)) and index < len(
                conditions
            ) - 1:
                with beside(name, user_env, competitor_args):
                    spin, spin_sha, _ = train_step(doc, spin_env, args.spin_steps)
                figures[("spin", label)] = spin
                print(
                    f"  libgomp's default waiting, {label}: {spin:.3f} s a step, adapter {spin_sha[:19]}",
                    flush=True,
                )

        quiet = statistics.mean([figures[("dlm", "quiet")], figures[("dlm", "quiet (again, last)")]])
        spin_quiet = figures.get(("spin", "quiet"))
        for (who, label), step in figures.items():
            base = quiet if who == "dlm" else spin_quiet
            ratio = f"{step / base:.2f}x its quiet step" if base else ""
            name = "dlm train (its threads and wait)" if who == "dlm" else "libgomp default waiting"
            rows.append((f"{name}, {label}", f"{step:.3f} s", ratio))
        rows.append(
            ("adapters of the dlm train runs", f"{len(shas)} distinct sha256", "1 means byte-identical")
        )

        if not args.skip_trl:
            times = trl_steps(doc, env, args.steps, work)
            trl = statistics.median(times[1:])
            rows.append(
                (
                    "TRL SFTTrainer alone (same rows, threads)",
                    f"{trl:.3f} s",
                    f"dlm / TRL: {quiet / trl:.2f}x",
                )
            )

    if not args.skip_mfu:
        os.environ["DLM_HOME"] = str(bases.parent)  # the bases the runs used
        from dlmstore.train.threads import configure

        configure()  # as dlm train does: before torch is imported
        account = mfu_account(args.batch, args.seq_len, args.base)
        achieved = account["flops"] / quiet
        rows.append(("FLOPs a step (counted mm + attention)",
                     f"{account['flops'] / 1e9:.1f} GFLOP",
                     f"mm {account['counted'] / 1e9:.1f} (FlopCounterMode, {account['products']} products), "
                     f"attention {account['attention'] / 1e9:.1f} (causal)"))  # fmt: skip
        rows.append(("matmul rate on the step's own products", f"{account['mm_rate'] / 1e9:.1f} GFLOP/s",
                     f"{account['mm_seconds']:.3f} s for all of them; a 2048^3 product: "
                     f"{account['square_rate'] / 1e9:.1f} GFLOP/s; {account['threads']} threads"))  # fmt: skip
        rows.append(("achieved by the quiet dlm train step", f"{achieved / 1e9:.1f} GFLOP/s",
                     f"MFU {achieved / account['mm_rate']:.1%} of the measured matmul rate"))  # fmt: skip
        total = sum(account["kinds"].values())
        for kind, seconds in sorted(account["kinds"].items(), key=lambda item: -item[1]):
            rows.append(
                (f"  step time: {kind}", f"{seconds:.3f} s", f"{seconds / total:.1%} of the profiled step")
            )
        rows.append(("  the profiled step (in this process)", f"{account['profiled_step']:.3f} s",
                     f"the products alone at the measured rate: {account['mm_seconds']:.3f} s"))  # fmt: skip

    print(f"\n{'figure':<58} {'value':>14}  note")
    for case, value, note in rows:
        print(f"{case:<58} {value:>14}  {note}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end ({load_start[0]:.2f} at the start)")


if __name__ == "__main__":
    main()

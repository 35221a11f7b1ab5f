"""The preference phase: time outside TRL, against TRL fed the raw triples, and its memory.

Two figures, on the tour document with the real SmolLM2-135M base:

1. **Overhead.** A warm ``dlm train --phase preference`` (its preference rows
   already in the cache) is timed as a whole process, with the split it
   reports (startup, tokenization, dataset build are ours; framework import,
   model load, trainer setup and the steps are the frameworks'). Beside it,
   in the same run, the same training done with TRL alone: a script that
   loads the same base and SFT adapter and hands ``DPOTrainer`` the raw
   prompt/chosen/rejected triples, so TRL tokenizes them itself.
2. **Memory.** Peak RSS of a ``--phase sft`` process and of a ``--phase
   preference`` process (each measured with ``wait4`` on its own child),
   and their ratio: the reference model is the adapter switched off or
   TRL's frozen copy of it, never a second copy of the base.

    python bench/bench_preference.py [--doc examples/tour.dlm] [--repeat 3] [--max-steps 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import DLM, timed_process

OURS = ("startup", "tokenize", "dataset")

# TRL alone: the same model, adapter, triples and config, TRL doing its own tokenization.
TRL_ALONE = r"""
import json, sys, time
t0 = time.perf_counter()
import os
from pathlib import Path
from datasets import Dataset
from peft import PeftModel
from trl import DPOConfig, DPOTrainer
from dlmstore.bases import load_model, load_tokenizer, resolve_base
from dlmstore.corpus.assemble import load_corpus
from dlmstore.document.parser import parse_document
from dlmstore.determinism import apply_determinism, seed_everything
from dlmstore.train.plan import (check_settings, dlm_target_modules, model_load_kwargs, preference_config_kwargs,
                                 probe_hardware, resolve_plan)

doc_path, adapter_dir, max_steps, output = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
document = parse_document(doc_path)
settings = document.frontmatter.training
ref = resolve_base(document.base_model, relative_to=document.directory)
rows = [r.data for r in load_corpus(document).rows() if r.kind == "preference"]
seed_everything(settings.seed); apply_determinism()
t1 = time.perf_counter()
hardware = probe_hardware()
model = load_model(ref, **model_load_kwargs(settings.adapter, check_settings(settings, hardware)))
plan = resolve_plan(settings, hardware, base_params=model.num_parameters(),
                    auto_target_modules=dlm_target_modules(ref), epochs=None, max_steps=max_steps, seed=settings.seed)
policy = PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)
tokenizer = load_tokenizer(ref)
t2 = time.perf_counter()
triples = Dataset.from_list([
    {"prompt": [{"role": "user", "content": r["prompt"]}],
     "chosen": [{"role": "assistant", "content": r["chosen"]}],
     "rejected": [{"role": "assistant", "content": r["rejected"]}]} for r in rows
])
trainer = DPOTrainer(model=policy, args=DPOConfig(**preference_config_kwargs(plan, settings.preference, output)),
                     train_dataset=triples, processing_class=tokenizer)
t3 = time.perf_counter()
trainer.train()
t4 = time.perf_counter()
print(json.dumps({"import_and_parse": t1 - t0, "model_load": t2 - t1, "trainer_setup": t3 - t2, "train": t4 - t3}))
"""


def run_peak_text(cmd: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    seconds, rss, stdout = timed_process(cmd, env)
    return seconds, rss, stdout.decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--doc", type=Path, default=Path(__file__).resolve().parent.parent / "examples" / "tour.dlm"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=4)
    args = parser.parse_args()

    from dlmstore.home import bases_dir

    bases = bases_dir()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        bases.mkdir(parents=True, exist_ok=True)
        (home / "bases").symlink_to(bases, target_is_directory=True)  # no GGUF conversion in the timings
        env = {**os.environ, "DLM_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
        steps = ["--max-steps", str(args.max_steps), "--update-lock", "--json"]
        sft_wall, sft_rss, sft_out = run_peak_text(
            [DLM, "train", str(args.doc), "--phase", "sft", *steps], env
        )
        adapter_dir = json.loads(sft_out)["adapter_path"]
        run_peak_text(
            [DLM, "train", str(args.doc), "--phase", "preference", *steps], env
        )  # fills nothing new: warm-up

        ours: list[dict[str, Any]] = []
        baseline: list[dict[str, Any]] = []
        for _ in range(args.repeat):
            wall, rss, out = run_peak_text(
                [DLM, "train", str(args.doc), "--phase", "preference", *steps], env
            )
            ours.append({"wall": wall, "rss": rss, **json.loads(out)["timings"]})
            output = Path(tmp) / "trl-out"
            cmd = [
                sys.executable,
                "-c",
                TRL_ALONE,
                str(args.doc),
                adapter_dir,
                str(args.max_steps),
                str(output),
            ]
            wall, rss, out = run_peak_text(cmd, env)
            baseline.append({"wall": wall, "rss": rss, **json.loads(out.strip().splitlines()[-1])})

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.median(float(r[key]) for r in rows)

    ours_outside = statistics.median(sum(float(r[k]) for k in OURS) for r in ours)
    print(f"preference phase on {args.doc.name}, {args.max_steps} steps, median of {args.repeat} (seconds)")
    print(f"{'':34}{'dlm train --phase preference':>30}{'TRL alone (raw triples)':>26}")
    print(f"{'whole process':34}{med(ours, 'wall'):>30.2f}{med(baseline, 'wall'):>26.2f}")
    print(f"{'ours: startup+tokenize+dataset':34}{ours_outside:>30.3f}{'-':>26}")
    print(f"{'  of which tokenize (cache)':34}{med(ours, 'tokenize'):>30.3f}{'-':>26}")
    print(f"{'  of which dataset build':34}{med(ours, 'dataset'):>30.3f}{'-':>26}")
    print(f"{'model load':34}{med(ours, 'model_load'):>30.2f}{med(baseline, 'model_load'):>26.2f}")
    print(f"{'trainer setup (TRL tokenizes here)':34}{med(ours, 'trainer_setup'):>30.3f}"
          f"{med(baseline, 'trainer_setup'):>26.3f}")  # fmt: skip
    print(f"{'train':34}{med(ours, 'train'):>30.2f}{med(baseline, 'train'):>26.2f}")
    print(f"share of wall time outside TRL (ours): {ours_outside / med(ours, 'wall'):.1%} (goal <= 5%)")
    print(f"whole process, ours / TRL alone: {med(ours, 'wall') / med(baseline, 'wall'):.2f}x")
    pref_rss = med(ours, "rss")
    print(
        f"peak RSS: --phase sft {sft_rss / 2**20:,.0f} MiB ({sft_wall:.1f} s), --phase preference "
        f"{pref_rss / 2**20:,.0f} MiB, ratio {pref_rss / sft_rss:.2f} (goal <= 1.30); "
        f"TRL alone {med(baseline, 'rss') / 2**20:,.0f} MiB"
    )


if __name__ == "__main__":
    main()

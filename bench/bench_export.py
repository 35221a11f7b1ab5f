"""What `dlm export` costs and what llama.cpp gives back, each beside its baseline from the same run.

On the tour document (the built-in SmolLM2-135M), in a fresh home that
shares the converted base:

1. export time (merge + GGUF files + llama.cpp's quantiser, the whole
   `dlm export` process) as a ratio of one training run of the document
   (`dlm train`, the whole process);
2. `dlm prompt --backend llama.cpp` on the Q4_K_M export, tokens per second
   of generation, beside the transformers backend (goal: >= 5x);
3. the Q4_K_M GGUF's size beside the merged model saved as F16 safetensors.

    python bench/bench_export.py [--doc examples/tour.dlm] [--quant Q4_K_M] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DLM = str(Path(sys.executable).with_name("dlm"))
QUESTIONS = (
    "Where does dlmstore keep its metadata?",
    "What does `dlm show` print?",
    "Which command creates a new document?",
)


def dlm(env: dict[str, str], *args: str) -> tuple[float, dict[str, object]]:
    """Run ``dlm ARGS --json``; its wall time and parsed output."""
    start = time.perf_counter()
    done = subprocess.run([DLM, *args, "--json"], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return wall, json.loads(done.stdout)


def f16_safetensors_bytes(hf: Path, out: Path) -> int:
    """The merged model of ``hf`` saved as F16 safetensors (the size a GGUF is compared with)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float16)
    model.save_pretrained(str(out))
    return sum(p.stat().st_size for p in out.glob("*.safetensors"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--doc", type=Path, default=Path(__file__).resolve().parent.parent / "examples" / "tour.dlm"
    )
    parser.add_argument("--quant", default="Q4_K_M")
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()

    from dlmstore.home import bases_dir

    bases = bases_dir()
    bases.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        (home / "bases").symlink_to(bases, target_is_directory=True)  # no one-off GGUF conversion timed
        env = {**os.environ, "DLM_HOME": str(home), "HF_HUB_OFFLINE": "1"}
        dlm(env, "show", str(args.doc))  # converts the built-in base once, outside the timings
        train_wall, trained = dlm(env, "train", str(args.doc))
        print(f"(one training run: {train_wall:.1f} s)", flush=True)
        export_wall, exported = dlm(env, "export", str(args.doc), "--quant", args.quant)
        print(f"(export: {export_wall:.1f} s)", flush=True)
        folder = Path(str(exported["folder"]))
        rates: dict[str, list[tuple[int, float]]] = {"transformers": [], "llama.cpp": []}
        for question in QUESTIONS:
            for backend in rates:
                _, answer = dlm(
                    env, "prompt", str(args.doc), question, "--backend", backend,
                    "--max-new-tokens", str(args.new_tokens),
                )  # fmt: skip
                rates[backend].append((int(answer["new_tokens"]), float(answer["seconds"])))  # type: ignore[call-overload]
                print(
                    f"({backend}: {rates[backend][-1][0]} tokens in {rates[backend][-1][1]:.2f} s)",
                    flush=True,
                )
        gguf_bytes = (folder / f"model.{args.quant}.gguf").stat().st_size
        f16_bytes = f16_safetensors_bytes(folder / "hf", Path(tmp) / "f16")

    def per_second(backend: str) -> float:
        return sum(n for n, _ in rates[backend]) / sum(s for _, s in rates[backend])

    steps = trained["steps"]
    print(
        f"{args.doc.name}: {exported['base_model']}, {steps} steps; export {exported['target']} {args.quant}"
    )
    print(f"1. export (merge + GGUF + quantise)   {export_wall:8.1f} s   one training run {train_wall:8.1f} s   "
          f"ratio {export_wall / train_wall:.2f}")  # fmt: skip
    fast, slow = per_second("llama.cpp"), per_second("transformers")
    print(f"2. dlm prompt, llama.cpp {args.quant}     {fast:8.1f} tokens/s   transformers {slow:8.1f} tokens/s   "
          f"{fast / slow:.1f}x (goal >= 5x: {'met' if fast / slow >= 5 else 'MISSED'})")  # fmt: skip
    print(f"3. model.{args.quant}.gguf            {gguf_bytes / 1e6:8.1f} MB   F16 safetensors {f16_bytes / 1e6:8.1f} MB   "
          f"{gguf_bytes / f16_bytes:.2f} of it")  # fmt: skip
    print(f"   (tokens generated: llama.cpp {sum(n for n, _ in rates['llama.cpp'])}, "
          f"transformers {sum(n for n, _ in rates['transformers'])}, over {len(QUESTIONS)} questions)")  # fmt: skip


if __name__ == "__main__":
    main()

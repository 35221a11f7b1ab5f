#!/usr/bin/env bash
# dlm train's CUDA paths, one line each: PASS, FAIL (with why) or SKIP (with why). Issue 31.
#
#   bash bench/gpu_check.sh            # from the repository root; at most about 8 minutes
#
# Paths: bf16 and fp16 LoRA training on the GPU; the `strong` determinism tier (two runs from
# fresh stores give the same adapter sha256); `--nproc 2` on NCCL (two devices or more);
# QLoRA (bitsandbytes' 4-bit base); `dlm export --target hf` and `dlm prompt` of a GPU-trained
# adapter; llama.cpp on CUDA (`dlm export` to GGUF and `dlm prompt --backend llama.cpp`) when a
# CUDA build of llama-cpp-python is installed.
#
# It trains a tiny Llama of SmolLM2's shape (random weights, made here with a fixed seed) with
# SmolLM2's real tokenizer, so it needs no network and no 100 MB base: the tokenizer folder comes
# from .gpucheck/tokenizer (or $DLM_GPU_TOKENIZER). On a machine without some of dlmstore's
# dependencies, wheels in .gpucheck/wheels (downloaded elsewhere with `pip download --no-deps`)
# are installed into a scratch folder first, and dlmstore itself (--no-deps) beside them.
# Without a CUDA device every path prints SKIP and the script exits 0; it exits 1 when a path FAILs.
set -u
cd "$(dirname "$0")/.."
START=$SECONDS
LIMIT=${DLM_GPU_CHECK_LIMIT:-470}   # seconds: paths not started by then are skipped (8 minutes in all)
WORK=$(mktemp -d /tmp/dlm-gpu-check.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
FAILED=0
PY=${PY:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=true PYTHONWARNINGS=ignore
export DLM_HOME="$WORK/home"

line() { printf '%-22s %s\n' "$1" "$2"; }
pass() { line "$1" "PASS $2"; }
skip() { line "$1" "SKIP $2"; }
fail() { line "$1" "FAIL $2"; FAILED=1; }
late() { [ $((SECONDS - START)) -ge "$LIMIT" ]; }

# --- dependencies: carried wheels into a scratch site, dlmstore beside them ---------------------
SITE=${DLM_GPU_SITE:-/tmp/dlm-gpu-site}  # kept after the check: later commands can use PYTHONPATH=$SITE
[ -d "$SITE/dlmstore" ] && export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -P -c "import dlmstore.cli.main, trl, peft, sqlalchemy, alembic, pydantic" 2>/dev/null; then
    if ls .gpucheck/wheels/*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
            .gpucheck/wheels/*.whl >"$WORK/pip.log" 2>&1 ||
            { line install "FAIL $(tail -3 "$WORK/pip.log" | tr '\n' ' ')"; exit 1; }
        # dlmstore as setuptools lays it out (pyproject's package-dir): cli/ and migrations/ inside it
        rm -rf "$SITE/dlmstore" && cp -r dlmstore "$SITE/dlmstore" && cp -r cli "$SITE/dlmstore/cli" &&
            cp -r migrations "$SITE/dlmstore/migrations" || { line install "FAIL copying dlmstore"; exit 1; }
        export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
        line install "PASS $(ls .gpucheck/wheels/*.whl | wc -l) carried wheels and dlmstore into $SITE"
    else
        line install "FAIL dlmstore's dependencies are missing and no wheels are in .gpucheck/wheels"
        exit 1
    fi
fi
DLM=("$PY" -P -m dlmstore.cli.main)  # -P: the checkout's dlmstore/ (no cli/ inside) must not shadow the installed one

# --- the device --------------------------------------------------------------------------------
DEVICES=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
if [ "$DEVICES" = 0 ]; then
    line cuda "SKIP no CUDA device ($("$PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null))"
    for path in "bf16 training" "fp16 training" "strong determinism" "nproc 2 nccl" qlora "export hf" \
        "prompt transformers" "llama.cpp cuda"; do
        skip "$path" "no CUDA device"
    done
    exit 0
fi
line cuda "PASS $("$PY" -c "import torch; p = torch.cuda.get_device_properties(0); print(f'{torch.cuda.device_count()} x {p.name}, {p.total_memory / 2**30:.0f} GiB; torch {torch.__version__}, CUDA {torch.version.cuda}')")"

# --- a tiny base of SmolLM2's shape with the real tokenizer -----------------------------------
TOKENIZER=${DLM_GPU_TOKENIZER:-.gpucheck/tokenizer}
if [ ! -f "$TOKENIZER/tokenizer.json" ]; then
    line base "FAIL no tokenizer in $TOKENIZER (copy <home>/bases/smollm2-135m/tokenizer there)"
    exit 1
fi
BASE="$WORK/tiny-base"
"$PY" - "$TOKENIZER" "$BASE" 2>"$WORK/base.err" <<'EOF' || { line base "FAIL the tiny base could not be made: $(tail -1 "$WORK/base.err")"; exit 1; }
import sys, torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
torch.manual_seed(31)
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=640, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                     tie_word_embeddings=True, rms_norm_eps=1e-5, bos_token_id=tokenizer.bos_token_id,
                     eos_token_id=tokenizer.eos_token_id)
LlamaForCausalLM(config).save_pretrained(sys.argv[2])
tokenizer.save_pretrained(sys.argv[2])
EOF

write_doc() {  # write_doc FILE ID EXTRA_TRAINING_LINES
    cat >"$1" <<EOF
---
dlm_id: $2
base_model: $BASE
training:
  sequence_len: 128
  micro_batch_size: 2
  grad_accum: 1
  max_steps: 4
  seed: 7
$3---
A GPU check of dlm train: a few lines of prose so that each batch holds real tokens.

The store records every run in one SQLite database, with the adapter files beside it.

::instruction::
### Q
Where is the metadata?
### A
In store.db, beside the token files.

### Q
What makes a run reproducible?
### A
The same inputs, versions, hardware tier, seed and flags.
EOF
}

json_field() {  # json_field FILE PYTHON-EXPRESSION-OF-d
    "$PY" -c "import json, sys; d = json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null
}

train() {  # train NAME DOC [ARGS...]: runs dlm train --json into $WORK/NAME.json, its stderr in $WORK/NAME.err
    local name=$1 doc=$2
    shift 2
    timeout 240 "${DLM[@]}" train "$doc" --json "$@" >"$WORK/$name.json" 2>"$WORK/$name.err"
}

why() { tail -2 "$WORK/$1.err" | tr '\n' ' ' | cut -c1-200; }

# --- bf16 and fp16 ---------------------------------------------------------------------------
BF16_SHA=""
for precision in bf16 fp16; do
    label="$precision training"
    if late; then skip "$label" "out of time"; continue; fi
    doc="$WORK/$precision.dlm"
    write_doc "$doc" "01M7YJ087N2NEP493AF56E3G$( [ $precision = bf16 ] && echo B1 || echo F1 )" "  precision: $precision
"
    if train "$precision" "$doc"; then
        got=$(json_field "$WORK/$precision.json" "d['plan']['device'], d['plan']['precision'], d['steps'], d['final_loss'], d['adapter_sha256'][7:23], round(d['timings']['train'], 2)")
        read -r device prec steps loss sha seconds <<<"$got"
        if [ "$device" = cuda ] && [ "$prec" = "$precision" ] && [ "$steps" = 4 ] && [ "$loss" != None ]; then
            pass "$label" "4 steps on cuda in $seconds s, final loss $loss, adapter $sha"
            [ $precision = bf16 ] && BF16_SHA=$(json_field "$WORK/$precision.json" "d['adapter_sha256']")
        else
            fail "$label" "trained as: $got"
        fi
    else
        fail "$label" "$(why "$precision")"
    fi
done

# --- strong determinism: the bf16 run again from a fresh store ---------------------------------
label="strong determinism"
if late; then
    skip "$label" "out of time"
elif [ -z "$BF16_SHA" ]; then
    skip "$label" "the bf16 run did not pass"
else
    class=$(DLM_HOME="$WORK/home" "${DLM[@]}" lock show "$WORK/bf16.dlm" --json 2>/dev/null |
        "$PY" -c "import json, sys; print(json.load(sys.stdin)['determinism_class'])" 2>/dev/null)
    if DLM_HOME="$WORK/home2" train again "$WORK/bf16.dlm"; then
        again=$(json_field "$WORK/again.json" "d['adapter_sha256']")
        if [ "$class" = strong ] && [ "$again" = "$BF16_SHA" ]; then
            pass "$label" "determinism_class strong; two runs from fresh stores: the same sha256 ${again:7:16}"
        else
            fail "$label" "determinism_class $class; sha256 ${BF16_SHA:7:16} then ${again:7:16}"
        fi
    else
        fail "$label" "$(why again)"
    fi
fi

# --- --nproc 2 on NCCL ------------------------------------------------------------------------
label="nproc 2 nccl"
if [ "$DEVICES" -lt 2 ]; then
    skip "$label" "one CUDA device (--nproc 2 on NCCL needs two)"
elif late; then
    skip "$label" "out of time"
else
    write_doc "$WORK/nproc.dlm" 01M7YJ087N2NEP493AF56E3GN2 ""
    if train nproc "$WORK/nproc.dlm" --nproc 2; then
        pass "$label" "2 ranks, $(json_field "$WORK/nproc.json" "d['world_size']") in the summary, adapter $(json_field "$WORK/nproc.json" "d['adapter_sha256'][7:23]")"
    else
        fail "$label" "$(why nproc)"
    fi
fi

# --- QLoRA ------------------------------------------------------------------------------------
label="qlora"
if ! "$PY" -c "import bitsandbytes" 2>/dev/null; then
    skip "$label" "bitsandbytes is not installed (not carried)"
elif late; then
    skip "$label" "out of time"
else
    write_doc "$WORK/qlora.dlm" 01M7YJ087N2NEP493AF56E3GQ1 "  adapter: qlora
"
    if train qlora "$WORK/qlora.dlm"; then
        pass "$label" "4 steps, 4-bit base (bitsandbytes $("$PY" -c 'import bitsandbytes; print(bitsandbytes.__version__)')), final loss $(json_field "$WORK/qlora.json" "d['final_loss']")"
    else
        fail "$label" "$(why qlora)"
    fi
fi

# --- export and prompt of the bf16 adapter ----------------------------------------------------
label="export hf"
if [ -z "$BF16_SHA" ]; then
    skip "$label" "the bf16 run did not pass"
elif late; then
    skip "$label" "out of time"
elif timeout 180 "${DLM[@]}" export "$WORK/bf16.dlm" --target hf -o "$WORK/export" --json >"$WORK/export.json" 2>"$WORK/export.err"; then
    if ls "$WORK"/export/hf/*.safetensors >/dev/null 2>&1 || ls "$WORK"/export/*.safetensors >/dev/null 2>&1; then
        pass "$label" "merged HF folder written ($(du -sh "$WORK/export" | cut -f1))"
    else
        fail "$label" "no safetensors in the export folder: $(ls "$WORK/export" | tr '\n' ' ')"
    fi
else
    fail "$label" "$(why export)"
fi

label="prompt transformers"
if [ -z "$BF16_SHA" ]; then
    skip "$label" "the bf16 run did not pass"
elif late; then
    skip "$label" "out of time"
elif timeout 120 "${DLM[@]}" prompt "$WORK/bf16.dlm" "Where is the metadata?" --max-new-tokens 8 --json \
    >"$WORK/prompt.json" 2>"$WORK/prompt.err"; then
    pass "$label" "$(json_field "$WORK/prompt.json" "d['new_tokens']") new tokens on cuda"
else
    fail "$label" "$(why prompt)"
fi

label="llama.cpp cuda"
if ! "$PY" -c "import llama_cpp" 2>/dev/null; then
    skip "$label" "llama-cpp-python is not installed (no CUDA build carried)"
elif ! "$PY" -c "import llama_cpp, sys; sys.exit(0 if llama_cpp.llama_supports_gpu_offload() else 1)" 2>/dev/null; then
    skip "$label" "llama-cpp-python is a CPU build (no GPU offload)"
elif [ -z "$BF16_SHA" ] || late; then
    skip "$label" "the bf16 run did not pass, or out of time"
elif timeout 180 "${DLM[@]}" export "$WORK/bf16.dlm" --quant Q8_0 >"$WORK/gguf.out" 2>"$WORK/gguf.err" &&
    timeout 60 "${DLM[@]}" prompt "$WORK/bf16.dlm" "Where is the metadata?" --backend llama.cpp \
        --max-new-tokens 8 >"$WORK/llama.out" 2>"$WORK/gguf.err"; then
    pass "$label" "GGUF Q8_0 exported and answered through llama.cpp"
else
    fail "$label" "$(why gguf)"
fi

line total "$((SECONDS - START)) s"
exit $FAILED

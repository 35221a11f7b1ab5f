"""`dlm export` of an adapter of the tiny model: the folder, the Modelfile, llama-server, refusals.

docs/export.md quotes these sessions. ``notes.dlm`` trains 4 steps of the
tests' tiny random-weight model (SmolLM2's architecture and tokenizer, a few
layers), so the export's files are small and its sha256s a random model's;
the real model's sizes and times are the benchmark's (docs/export.md).
"""

from __future__ import annotations

from session_steps import quiet, shell  # scripts/ is on sys.path when this runs
from sessions import Scenario, Step

NOTES_ID = "01KPQ1FFEDGPPSMWRAS18SAZST"

NOTES_DLM = f"""---
dlm_id: {NOTES_ID}
base_model: ./tiny-smollm2
system_prompt: You answer questions about the garden briefly.
training:
  sequence_len: 256
  max_steps: 4
  micro_batch_size: 2
---
# The garden

The beds are watered at dawn, and the compost is turned every second week.

::instruction::
### Q
When are the beds watered?
### A
At dawn.
"""

EXPORT = Scenario(
    name="export",
    model="tiny",
    shown={"work": "/home/me/garden", "home": "/home/me/.local/share/dlm"},
    files={
        "notes.dlm": NOTES_DLM,
        # the same document (its id, so its store) with a system prompt Ollama's parser would change
        "pair.dlm": NOTES_DLM.replace(
            "You answer questions about the garden briefly.", "Pair gardening with \U0001f469\u200d\U0001f33e"
        ),
        "models/README.txt": "my models\n",
    },
    steps=(
        quiet("ollama", "-q", "train", "notes.dlm"),
        Step(
            "ollama",
            ("dlm export notes.dlm --target ollama",),
            ("export", "notes.dlm", "--target", "ollama"),
            joined=True,
        ),  # fmt: skip
        shell("modelfile", f"cat $DLM_HOME/store/{NOTES_ID}/exports/v0001-Q4_K_M/Modelfile"),
        Step(
            "llama-server",
            ("dlm export notes.dlm --target llama-server",),
            ("export", "notes.dlm", "--target", "llama-server"),
        ),  # fmt: skip
        Step(
            "refused", ("dlm export notes.dlm -o models",), ("export", "notes.dlm", "-o", "models"), status=1
        ),
        Step("uncarried", ("dlm export pair.dlm",), ("export", "pair.dlm"), status=1),
        shell(
            "damaged",
            f"printf x | dd of=$DLM_HOME/store/{NOTES_ID}/adapter/versions/v0001/adapter_model.safetensors \\\n"
            "  bs=1 seek=5000 conv=notrunc status=none     # one byte of the adapter changes",
        ),
        Step(
            "damaged",
            ('dlm prompt notes.dlm "When are the beds watered?"',),
            ("prompt", "notes.dlm", "When are the beds watered?"),
            status=1,
            joined=True,
        ),
    ),
)

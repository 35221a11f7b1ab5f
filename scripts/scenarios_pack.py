"""A store that travels (docs/pack.md): pack, unpack in another home, prompt there, verify --retrain.

``harbour.dlm`` teaches three invented facts on the real SmolLM2-135M, with
bench/bench_replay_facts.py's settings (48 steps at 3e-3), and trains on a
``notes/`` folder besides (``training.sources``). The pack carries the
sources and the converted base, so the colleague's home needs nothing
else, and ``dlm verify --retrain`` trains the packed document again in a
scratch home. Two trainings and a 0.5 GB base: about six minutes.
"""

from __future__ import annotations

from session_steps import shell  # scripts/ is on sys.path when this runs
from sessions import Scenario, Step

HARBOUR_ID = "01MA3W1Q5TZ8K2V7R4N9XGHBCD"

DOC = f"""---
dlm_id: {HARBOUR_ID}
dlm_version: 15
base_model: smollm2-135m
system_prompt: You answer questions about the harbour of Quillport briefly.
training:
  sequence_len: 128
  micro_batch_size: 4
  grad_accum: 1
  learning_rate: 3e-3
  lora_r: 16
  lora_alpha: 32
  max_steps: 48
  seed: 42
  sources:
    - path: ./notes
---
Quillport's harbour exists only in these notes.

::instruction::
### Q !probe
Who is the harbour master of Quillport?
### A
Captain Edda Voss.

### Q !probe
How many piers does Quillport have?
### A
Seven piers.

### Q !probe
What does the harbour bell ring for?
### A
The evening tide.
"""

NOTES = """The harbour of Quillport faces west. Its seven piers are numbered from the
lighthouse, and the harbour master keeps her log in the customs house.
"""

PACK = Scenario(
    name="pack",
    model="real",
    shown={"work": "/home/me/harbour", "home": "/home/me/.local/share/dlm"},
    files={"harbour.dlm": DOC, "notes/harbour.md": NOTES},
    steps=(
        Step("train", ("dlm train harbour.dlm",), ("train", "harbour.dlm")),
        Step(
            "pack",
            ("dlm pack harbour.dlm --include-sources --include-base",),
            ("pack", "harbour.dlm", "--include-sources", "--include-base"),
        ),
        Step(
            "pack",
            ("dlm pack harbour.dlm --include-sources --include-base -o again.dlm.pack   # the same bytes",),
            ("pack", "harbour.dlm", "--include-sources", "--include-base", "-o", "again.dlm.pack"),
        ),
        Step(
            "unpack",
            ("dlm unpack harbour.dlm.pack --home colleague/dlm-home --to colleague",),
            ("unpack", "harbour.dlm.pack", "--home", "colleague/dlm-home", "--to", "colleague"),
        ),
        shell(
            "unpack",
            'DLM_HOME=colleague/dlm-home dlm prompt colleague/harbour.dlm "Who is the harbour master of Quillport?"',
        ),
        Step(
            "unpack",
            ('dlm prompt harbour.dlm "Who is the harbour master of Quillport?"   # here, for comparison',),
            ("prompt", "harbour.dlm", "Who is the harbour master of Quillport?"),
        ),
        Step(
            "verify", ("dlm verify harbour.dlm.pack --retrain",), ("verify", "harbour.dlm.pack", "--retrain")
        ),
    ),
)

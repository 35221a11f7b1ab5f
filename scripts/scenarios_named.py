"""Named adapters and the learned gate (docs/training.md): routed rows, one run per adapter, the gate.

``harbour.dlm`` declares two adapters, ``knowledge`` and ``tone``, routes
its sections between them with DLM's fences and asks for the learned gate.
It trains the real SmolLM2-135M for a few steps (a minute on two cores),
far too few to teach it the harbour: what the session shows is the
routing, the runs, the gate's weights and the refusals.
"""

from __future__ import annotations

from sessions import SHOWN, Scenario, Step  # scripts/ is on sys.path when this runs

HARBOUR_ID = "01MB7Q2W4Z9K3V8R5N6XGHJCDT"

DOC = f"""---
dlm_id: {HARBOUR_ID}
base_model: smollm2-135m
training:
  sequence_len: 64
  max_steps: 4
  micro_batch_size: 2
  seed: 42
  adapters:
    knowledge: {{lora_r: 8}}
    tone: {{lora_r: 4, target_modules: [q_proj, v_proj]}}
  gate: {{enabled: true, cold_start_floor: 2}}
---
The harbour of Quillport faces west; its seven piers are numbered from the lighthouse.

::instruction#knowledge::
### Q
How many piers does Quillport have?
### A
Seven.

::instruction#knowledge::
### Q
Who keeps the harbour log?
### A
The harbour master.

::instruction#tone::
### Q
Say hello.
### A
Ahoy there!

::instruction#tone::
### Q
Say goodbye.
### A
Fair winds!
"""

NAMED = Scenario(
    name="named",
    model="real",
    shown=SHOWN,
    files={"harbour.dlm": DOC},
    steps=(
        Step("show", ("dlm show harbour.dlm | head -7",), ("show", "harbour.dlm"), head=7),
        Step("train", ("dlm train harbour.dlm",), ("train", "harbour.dlm")),
        Step(
            "prompt",
            ('dlm prompt harbour.dlm "Say hello." --adapter tone --max-new-tokens 8',),
            ("prompt", "harbour.dlm", "Say hello.", "--adapter", "tone", "--max-new-tokens", "8"),
        ),
        Step(
            "prompt",
            ('dlm prompt harbour.dlm "How many piers are there?" --max-new-tokens 8',),
            ("prompt", "harbour.dlm", "How many piers are there?", "--max-new-tokens", "8"),
            stream="all",
        ),
        Step(
            "prompt",
            ('dlm prompt harbour.dlm "Say hello." --adapter style',),
            ("prompt", "harbour.dlm", "Say hello.", "--adapter", "style"),
            status=2,
        ),
    ),
)

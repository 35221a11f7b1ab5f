"""What the document format refuses or warns about, before any model loads.

docs/format.md and docs/training.md quote these sessions. None of them
loads a model or a tokenizer, so the docs test runs them again every time
and compares (``model="none"``). Large files are written by the shell
steps shown, with ``yes`` and ``head -c``.
"""

from __future__ import annotations

from session_steps import shell  # scripts/ is on sys.path when this runs
from sessions import Scenario, Step

SOURCES_DLM = """---
dlm_id: 01KPQ1FFEDGPPSMWRAS18SAZS1
base_model: smollm2-135m
training:
  sources:
    - path: data
---
# Notes
"""

QWEN_DLM = """---
dlm_id: 01KPQ1FFEDGPPSMWRAS18SAZS2
base_model: qwen2.5-0.5b
---
# Notes
"""

TRACKIO_DLM = """---
dlm_id: 01KPQ1FFEDGPPSMWRAS18SAZS3
base_model: smollm2-135m
training:
  report_to: trackio
---
# Notes
"""

FORMAT = Scenario(
    name="format",
    rerun=True,
    files={"sources/notes.dlm": SOURCES_DLM, "sources/data/small.md": "A small note.\n"},
    steps=(
        shell("too-large", "yes 'a line of notes' | head -c 5000000 > sources/data/big.txt"),
        Step("too-large", ("dlm show sources/notes.dlm > /dev/null",), ("show", "sources/notes.dlm"), stream="err",
             joined=True),
        shell(
            "huge-row",
            "printf -- '---\\ndlm_id: 01KPQ1FFEDGPPSMWRAS18SAZST\\nbase_model: smollm2-135m\\n---\\n' > notes.dlm\n"
            "yes 'a line of notes' | head -c 5000000 >> notes.dlm",
        ),
        Step("huge-row", ("dlm show notes.dlm",), ("show", "notes.dlm"), status=1, joined=True),
    ),
)  # fmt: skip

REFUSALS = Scenario(
    name="refusals",
    files={"hub/notes.dlm": QWEN_DLM, "report/doc.dlm": TRACKIO_DLM},
    steps=(
        Step(
            "offline", ("HF_HUB_OFFLINE=1 dlm train notes.dlm",), ("train", "notes.dlm"), cwd="hub", status=1
        ),
        Step("report-to", ("dlm train doc.dlm",), ("train", "doc.dlm"), cwd="report", status=1),
    ),
)

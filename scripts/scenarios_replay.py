"""Retraining an edited document (docs/training.md): replay on the real SmolLM2-135M.

``zarnia.dlm`` teaches three invented facts as ``### Q !probe`` pairs (v1);
v2 replaces them with three others. The settings are
``bench/bench_replay_facts.py``'s (48 steps at 3e-3: SmolLM2-135M learns
three facts in them on a CPU), so a train run takes one to two minutes and
the scenario about five.
"""

from __future__ import annotations

from session_steps import shell, sql  # scripts/ is on sys.path when this runs
from sessions import Scenario, Step

ZARNIA_ID = "01M8HHSDSRXJ33QF518TVHA9KD"

_FRONT = f"""---
dlm_id: {ZARNIA_ID}
dlm_version: 15
base_model: smollm2-135m
system_prompt: You answer questions about Zarnia briefly.
training:
  sequence_len: 128
  micro_batch_size: 4
  grad_accum: 1
  learning_rate: 3e-3
  lora_r: 16
  lora_alpha: 32
  max_steps: 48
  seed: 42
---
Zarnia is an island that exists only in these notes. Each version of the
notes records a few facts about it as questions and answers.

::instruction::
"""


def _pairs(*facts: tuple[str, str]) -> str:
    return "\n".join(f"### Q !probe\n{question}\n### A\n{answer}\n" for question, answer in facts)


V1 = _FRONT + _pairs(
    ("What is the capital of Zarnia?", "Quillport."),
    ("Who founded the Zarnian Academy?", "Ilsa Morrow."),
    ("What is the currency of Zarnia?", "The brass tallin."),
)
V2 = _FRONT + _pairs(
    ("Which river flows through Quillport?", "The Vessa."),
    ("What colour is the flag of Zarnia?", "Teal and amber."),
    ("Who keeps the Zarnian lighthouse?", "The Okafor twins."),
)

#: What each adapter answered: the document's probes and those of earlier versions, and the slice's loss.
EVALUATIONS = sql(
    "SELECT run_id, model, probe_exact, retained_exact, round(retention_loss, 3) AS retention_loss, "
    "round(retention_delta, 3) AS retention_delta FROM evaluations WHERE model <> 'base' ORDER BY id",
    header=True,
)

REPLAY = Scenario(
    name="replay",
    model="real",
    shown={"work": "/home/me/zarnia", "home": "/home/me/.local/share/dlm"},
    files={"zarnia.dlm": V1, "zarnia-v2.dlm": V2},
    steps=(
        Step("v1", ("dlm train zarnia.dlm",), ("train", "zarnia.dlm")),
        shell("edit", "cp zarnia-v2.dlm zarnia.dlm   # v2: the three pairs replaced by three other facts"),
        Step("edit", ("dlm replay show zarnia.dlm",), ("replay", "show", "zarnia.dlm"), joined=True),
        Step("v2", ("dlm train zarnia.dlm",), ("train", "zarnia.dlm")),
        Step(
            "no-replay",
            ("dlm train zarnia.dlm --no-replay   # the same v2, trained on its own rows only",),
            ("train", "zarnia.dlm", "--no-replay"),
        ),
        Step(
            "evaluations",
            (
                f"sqlite3 -header $DLM_HOME/store/{ZARNIA_ID}/store.db \\",
                '    "SELECT run_id, model, probe_exact, retained_exact, round(retention_loss, 3) AS retention_loss, '
                "round(retention_delta, 3) AS retention_delta FROM evaluations WHERE model <> 'base' ORDER BY id\"",
            ),
            EVALUATIONS,
        ),
    ),
)

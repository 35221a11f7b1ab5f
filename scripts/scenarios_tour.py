"""The tour (README.md, docs/training.md, docs/reproducibility.md) and the README's parse errors.

The tour trains the real SmolLM2-135M on examples/tour.dlm: a few minutes on
a CPU, so the tests hold its figures by the inputs' hash and its shape by a
rerun on the tiny model. The errors need no model: the tests rerun them.
"""

from __future__ import annotations

from pathlib import Path

from session_steps import nothing, sql  # scripts/ is on sys.path when this runs
from sessions import Scenario, Step

#: The tour document's id (examples/tour.dlm).
TOUR_ID = "01M7YJ087N2NEP493AF56E3CEA"


def _lock(work: Path) -> str:
    """What ``cat $DLM_HOME/store/*/dlm.lock`` prints."""
    return next((work / "home" / "store").glob("*/dlm.lock")).read_text(encoding="utf-8")


#: What the README's sqlite3 step asks the tour's store (notes.dlm has a store too).
HIT_RATES = sql(
    "select run_id, command, cache_hits, cache_misses, hit_rate from run_hit_rates", store=TOUR_ID
)


TOUR = Scenario(
    name="tour",
    model="real",
    inputs=("examples/tour.dlm", "examples/tour-sources/**/*"),
    steps=(
        Step(
            "readme",
            ("export DLM_HOME=/tmp/readme-home        # optional; default ~/.local/share/dlm",),
            nothing,
        ),
        Step("readme", ("dlm init notes.dlm",), ("init", "notes.dlm"), joined=True),
        Step("readme", ("dlm show examples/tour.dlm",), ("show", "examples/tour.dlm")),
        Step(
            "readme training",
            (
                "dlm train examples/tour.dlm            # first run: every row goes through the tokenizer; SFT, then DPO",
            ),
            ("train", "examples/tour.dlm"),
        ),
        Step(
            "readme training",
            (
                "dlm train examples/tour.dlm            # second run: every row comes from the cache, same adapter bytes",
            ),
            ("train", "examples/tour.dlm"),
        ),
        Step("readme", ("dlm cache show examples/tour.dlm",), ("cache", "show", "examples/tour.dlm")),
        Step(
            "readme",
            (
                "dlm stores                              # every store under DLM_HOME; `dlm stores gc` drops orphans",
            ),
            ("stores",),
        ),
        Step(
            "readme report",
            (
                "dlm report examples/tour.dlm -o report.html   # the whole store on one page: open it in any browser",
            ),
            ("report", "examples/tour.dlm", "-o", "report.html"),
        ),
        Step(
            "readme",
            (
                "sqlite3 $DLM_HOME/store/01M7YJ087N2NEP493AF56E3CEA/store.db \\",
                '    "select run_id, command, cache_hits, cache_misses, hit_rate from run_hit_rates"',
            ),
            HIT_RATES,
        ),
        Step(
            "training",
            ("dlm metrics examples/tour.dlm --run-id 2",),
            ("metrics", "examples/tour.dlm", "--run-id", "2"),
        ),
        Step(
            "training",
            (
                "dlm train examples/tour.dlm --phase preference --max-steps 3   # DPO again, on the newest SFT adapter",
            ),
            ("train", "examples/tour.dlm", "--phase", "preference", "--max-steps", "3"),
        ),
        Step(
            "training",
            ('dlm prompt examples/tour.dlm "Where does dlmstore keep its metadata?" --max-new-tokens 40',),
            (
                "prompt",
                "examples/tour.dlm",
                "Where does dlmstore keep its metadata?",
                "--max-new-tokens",
                "40",
            ),
        ),
        Step("lock-json", (), _lock, bare=True),
        Step("lock-show", ("dlm lock show examples/tour.dlm",), ("lock", "show", "examples/tour.dlm")),
        Step(
            "progress",
            (
                "dlm tokenize examples/tour.dlm 2> tokenize.log > /dev/null   # a new home: the base is converted first",
                "cat tokenize.log",
            ),
            ("tokenize", "examples/tour.dlm"),
            stream="err",
            fresh_home=True,
        ),
    ),
)

BROKEN = """---
dlm_id: 01M7YJ087N2NEP493AF56E3CEB
base_model: smollm2-135m
---
::instruction::
### Q
What is the answer?
"""

TYPO = """---
dlm_id: 01M7YJ087N2NEP493AF56E3CEC
base_model: smollm2-135m
training:
  lora_r: 0
  learning_rate: fast
  epochs: 3
---
Some prose.

::instuction::
### Q
Hi?
### A
Hello.
"""

ERRORS = Scenario(
    name="errors",
    rerun=True,
    files={"broken.dlm": BROKEN, "typo.dlm": TYPO},
    steps=(
        Step("readme", ("dlm show broken.dlm",), ("show", "broken.dlm"), status=1),
        Step(
            "readme",
            ("dlm show typo.dlm                        # every problem, in one run",),
            ("show", "typo.dlm"),
            status=1,
        ),
    ),
)

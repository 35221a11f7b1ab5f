"""The scenarios behind the sessions README.md and docs/*.md quote (run by scripts/sessions.py).

Each :class:`~sessions.Scenario` is the commands of one story, run in order
in a scratch folder and a fresh home; its steps name the quoted blocks their
output goes to. The tour trains the real SmolLM2-135M; the stories of
training on datasets, resuming and the stores of a home run on the tests'
tiny random-weight model (the prose around them says so), or on no model.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from sessions import Scenario, Step  # scripts/ is on sys.path when this runs


def sql(query: str, *, header: bool = False, store: str = "") -> Callable[[Path], str]:
    """What ``sqlite3 [-header] <home>/store/<store>/store.db "<query>"`` prints (the first store,
    or the one named); its ``__name__`` says which query, for the inputs' hash."""

    def read(work: Path) -> str:
        db = sorted((work / "home" / "store").glob(f"{store or '*'}/store.db"))[0]
        with sqlite3.connect(db) as conn:
            cursor = conn.execute(query)
            rows = cursor.fetchall()
            names = [column[0] for column in cursor.description]
        lines = [names] if header else []
        lines += [["" if cell is None else str(cell) for cell in row] for row in rows]
        return "".join("|".join(line) + "\n" for line in lines)

    read.__name__ = f"sql({query!r}, header={header}, store={store!r})"
    return read


def cat(name: str) -> Callable[[Path], str]:
    """What ``cat NAME`` prints (NAME relative to the work folder)."""

    def read(work: Path) -> str:
        return (work / name).read_text(encoding="utf-8")

    read.__name__ = f"cat({name!r})"
    return read


def nothing(work: Path) -> str:
    """A command that prints nothing (``export``)."""
    return ""


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
            "readme",
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


SCENARIOS = {scenario.name: scenario for scenario in (TOUR, ERRORS)}

"""The lock of a document: what `dlm train` checks and `dlm lock diff` shows, on the tiny model.

docs/reproducibility.md quotes these sessions. ``notes.dlm`` trains 2 steps
of the tests' tiny random-weight model, so a run takes seconds. A lock
written by other library versions is made by editing ``dlm.lock`` with
``jq`` (shown as run): the versions this machine has cannot be swapped in a
session, and the check reads only the file.
"""

from __future__ import annotations

from session_steps import quiet, shell  # scripts/ is on sys.path when this runs
from sessions import Scenario, Step

NOTES_ID = "01KPQ1FFEDGPPSMWRAS18SAZST"
_STORE = f"$DLM_HOME/store/{NOTES_ID}"
_LOCK = f"{_STORE}/dlm.lock"

NOTES_DLM = f"""---
dlm_id: {NOTES_ID}
base_model: ./tiny-smollm2
training:
  max_steps: 2
  micro_batch_size: 2
---
# Notes

The beds are watered at dawn, and the compost is turned every second week.
"""


def _jq(blocks: str, edit: str, why: str, **options: bool) -> Step:
    """Rewrite dlm.lock through ``jq EDIT``."""
    return shell(blocks, f"jq '{edit}' {_LOCK} > lock.json && mv lock.json {_LOCK}   # {why}", **options)


LOCK = Scenario(
    name="lock",
    model="tiny",
    shown={"work": "/home/me/notes", "home": "/home/me/.local/share/dlm"},
    files={"notes.dlm": NOTES_DLM},
    steps=(
        quiet("diff", "train", "notes.dlm"),
        shell("diff", "echo 'The hedge is cut in August.' >> notes.dlm", joined=True),
        quiet("diff", "train", "notes.dlm", joined=True),
        Step("diff", ("dlm lock diff notes.dlm",), ("lock", "diff", "notes.dlm"), joined=True),
        Step("diff-json", (), ("lock", "diff", "notes.dlm", "--json"), bare=True),
        shell(
            "sqlite",
            f"sqlite3 -header -column {_STORE}/store.db \\\n"
            '    "SELECT id, run_id, created_at, decision, hardware_tier, determinism_class, seed FROM lock_records"',
        ),
        shell(
            "sqlite",
            f"sqlite3 -header -column {_STORE}/store.db \\\n"
            "    \"SELECT l.run_id, r.status, json_extract(l.lock_json, '$.pinned_versions.torch') AS torch, "
            "json_extract(l.lock_json, '$.pinned_versions.transformers') AS transformers \\\n"
            '     FROM lock_records AS l JOIN runs AS r ON r.id = l.run_id ORDER BY l.id"',
        ),
        _jq("warn", '.pinned_versions.transformers = "5.0.0"', "as if written under transformers 5.0.0"),
        Step(
            "warn",
            ("dlm -q train notes.dlm > /dev/null",),
            ("-q", "train", "notes.dlm"),
            stream="err",
            joined=True,
        ),
        _jq(
            "error",
            '.base_model_revision = "sha256:0123456789abcdef" | .pinned_versions.torch = "3.0.0"',
            "as if written for another base, under torch 3.0.0",
        ),
        Step("error", ("dlm train notes.dlm",), ("train", "notes.dlm"), status=1, joined=True),
        Step(
            "flags",
            ("dlm train notes.dlm --update-lock --ignore-lock",),
            ("train", "notes.dlm", "--update-lock", "--ignore-lock"),
            status=2,
        ),  # fmt: skip
        _jq("missing", "del(.seed)", "a field gone"),
        Step("missing", ("dlm train notes.dlm",), ("train", "notes.dlm"), status=1, joined=True),
    ),
)

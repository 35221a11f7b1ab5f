"""The garden: training on a token dataset, checkpoints and resuming, on the tiny model.

docs/training.md quotes these sessions. ``garden.dlm`` mixes a pretrain
dataset built from 60 short notes into its own two rows; its runs are cut to
20 steps of the tests' tiny random-weight model (SmolLM2's shape and
tokenizer, a few layers), so each takes seconds and its losses are a random
model's. Ctrl-C is a SIGINT the run sends itself right after it registers
a checkpoint (:attr:`sessions.Step.ctrl_c`); the bytes damaged in a file are
flipped by a step shown as a comment that says which.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from session_steps import cat, sql  # scripts/ is on sys.path when this runs
from sessions import Scenario, Step

GARDEN_ID = "01KPQ1FFEDGPPSMWRAS18SAZST"
HOME = "/home/me/.local/share/dlm"
SHOWN = {"work": "/home/me/garden", "home": HOME}

_PLANTS = ("tomatoes", "basil", "beans", "kale", "garlic", "leeks", "peas", "chard", "mint", "thyme")
_PLACES = ("south wall", "old pear tree", "water butt", "cold frame", "shed", "hedge")
_TASKS = (
    "were watered at dawn and mulched with straw",
    "were thinned to a hand's width apart",
    "needed netting against the pigeons",
    "were fed with comfrey tea",
    "came through the frost under fleece",
    "were cut back after flowering",
)

#: 60 notes, one file each: the pretrain dataset's documents.
NOTES = {
    f"notes/{i + 1:02d}.md": (
        f"Note {i + 1}. The {_PLANTS[i % len(_PLANTS)]} by the {_PLACES[i % len(_PLACES)]} "
        f"{_TASKS[(i // 2) % len(_TASKS)]} in week {i % 17 + 1}.\n"
    )
    for i in range(60)
}

GARDEN_DLM = f"""---
dlm_id: {GARDEN_ID}
base_model: ./tiny-smollm2
training:
  sequence_len: 128
  max_steps: 20
  micro_batch_size: 4
  grad_accum: 1
  checkpoint_steps: 5
  datasets:
    - path: data/notes
      weight: 2
---
# The garden

The beds are watered at dawn, and the compost is turned every second week.

::instruction::
### Q
When are the beds watered?
### A
At dawn.
"""

QLORA_DLM = """---
dlm_id: 01KPQ1FFEDGPPSMWRAS18SAZSV
base_model: ./tiny-smollm2
training:
  adapter: qlora
---
Some prose.
"""


def _flip(pattern: str, *, count: int = 64) -> Callable[[Path], str]:
    """Flip ``count`` bytes in the middle of each file of the home's store matching ``pattern``
    (in the newest run's checkpoints when it names ``run*``), or of the work folder's."""

    def flip(work: Path) -> str:
        found = sorted(work.glob(f"home/store/*/{pattern}")) or sorted(work.glob(pattern))
        if "run*" in pattern:  # checkpoints/run<N>/checkpoint-<step>/<file>: the largest N
            newest = max(int(path.parent.parent.name[3:]) for path in found)
            found = [path for path in found if path.parent.parent.name == f"run{newest}"]
        for path in found:
            data = bytearray(path.read_bytes())
            start = len(data) // 2
            data[start : start + count] = bytes(b ^ 0xFF for b in data[start : start + count])
            path.write_bytes(bytes(data))
        return ""

    flip.__name__ = f"flip({pattern!r}, count={count})"
    return flip


def _append(name: str, text: str) -> Callable[[Path], str]:
    """``echo TEXT >> NAME``."""

    def append(work: Path) -> str:
        with (work / name).open("a", encoding="utf-8") as file:
            file.write(text + "\n")
        return ""

    append.__name__ = f"append({name!r}, {text!r})"
    return append


def _rm(name: str) -> Callable[[Path], str]:
    """``rm -r`` a folder of the home's store."""

    def remove(work: Path) -> str:
        shutil.rmtree(next(work.glob(f"home/store/*/{name}")))
        return ""

    remove.__name__ = f"rm({name!r})"
    return remove


_DB = f"{HOME}/store/{GARDEN_ID}/store.db"

GARDEN = Scenario(
    name="garden",
    model="tiny",
    shown=SHOWN,
    files={**NOTES, "garden.dlm": GARDEN_DLM, "qlora.dlm": QLORA_DLM},
    steps=(
        Step(
            "datasets",
            (
                "dlm data build pretrain --from notes --out data/notes --base ./tiny-smollm2 --shard-bytes 4KiB",
            ),
            (
                "data",
                "build",
                "pretrain",
                "--from",
                "notes",
                "--out",
                "data/notes",
                "--base",
                "./tiny-smollm2",
                "--shard-bytes",
                "4KiB",
            ),
        ),  # fmt: skip
        Step(
            "datasets",
            ("dlm data validate data/notes | head -4",),
            ("data", "validate", "data/notes"),
            head=4,
        ),
        Step("datasets", ("cat garden.dlm",), cat("garden.dlm")),
        Step("datasets", ("dlm train garden.dlm",), ("train", "garden.dlm"), stream="all"),
        Step(
            "resume", ("dlm train garden.dlm",), ("train", "garden.dlm"), stream="all", status=130, ctrl_c=10
        ),
        Step(
            "resume",
            (f'sqlite3 {_DB} "select run_id, step, path from checkpoints"',),
            sql("select run_id, step, path from checkpoints"),
        ),
        Step("resume", ("dlm train garden.dlm --resume",), ("train", "garden.dlm", "--resume"), stream="all"),
        Step(
            "nproc",
            ("dlm train garden.dlm --nproc 2",),
            ("train", "garden.dlm", "--nproc", "2"),
            stream="all",
        ),
        Step(
            "nproc",
            (
                f'sqlite3 -header {_DB} "select rank, samples, tokens, samples_path from run_ranks where run_id = 4"',
            ),
            sql("select rank, samples, tokens, samples_path from run_ranks where run_id = 4", header=True),
        ),
        Step(
            "qlora",
            ("dlm train qlora.dlm        # training.adapter: qlora on a machine without a GPU",),
            ("train", "qlora.dlm"),
            status=1,
        ),
        Step(
            "verify",
            ("# 4 bytes flipped in the middle of data/notes/train/shard_00000.bin",),
            _flip("data/notes/train/shard_00000.bin", count=4),
        ),
        Step("verify", ("dlm train garden.dlm",), ("train", "garden.dlm"), status=1, joined=True),
    ),
)

RESUME_DLM = f"""---
dlm_id: {GARDEN_ID}
base_model: ./tiny-smollm2
training:
  sequence_len: 128
  max_steps: 40
  micro_batch_size: 4
  grad_accum: 1
  checkpoint_steps: 2
  sources:
    - path: notes
---
# The garden

The beds are watered at dawn, and the compost is turned every second week.

::instruction::
### Q
When are the beds watered?
### A
At dawn.
"""

_CHECKPOINTS = f"{HOME}/store/{GARDEN_ID}/checkpoints"
_CTRL_C = Step(
    "rules", ("dlm train garden.dlm",), ("train", "garden.dlm"), stream="all", status=130, ctrl_c=16
)
_RESUME = ("train", "garden.dlm", "--resume")

RESUME = Scenario(
    name="resume",
    model="tiny",
    shown=SHOWN,
    files={**{name: text for name, text in NOTES.items() if name < "notes/03"}, "garden.dlm": RESUME_DLM},
    steps=(
        _CTRL_C,
        Step("rules", ("dlm train garden.dlm --dataset data/nots",), ("train", "garden.dlm", "--dataset", "data/nots"),
             status=1),
        Step("rules", ("dlm -q train garden.dlm",), ("-q", "train", "garden.dlm")),
        Step("rules", ("dlm -q train garden.dlm --resume",), ("-q", *_RESUME)),
        _CTRL_C,
        Step("rules", (f"rm -r {_CHECKPOINTS}",), _rm("checkpoints"), joined=True),
        Step("rules", ("dlm train garden.dlm --resume",), _RESUME, status=1, joined=True),
        Step("damaged", _CTRL_C.shown, _CTRL_C.argv, stream="all", status=130, ctrl_c=16),
        Step("damaged", ("# 64 bytes flipped in the middle of checkpoint-16/adapter_model.safetensors",),
             _flip("checkpoints/run*/checkpoint-16/adapter_model.safetensors"), joined=True),
        Step("damaged", ("dlm train garden.dlm --resume",), _RESUME, stream="all", joined=True),
        Step("damaged", _CTRL_C.shown, _CTRL_C.argv, stream="all", status=130, ctrl_c=16),
        Step("damaged", ("# 64 bytes flipped in the middle of optimizer.pt, in checkpoint-14 and checkpoint-16",),
             _flip("checkpoints/run*/checkpoint-*/optimizer.pt"), joined=True),
        Step("damaged", ("dlm train garden.dlm --resume",), _RESUME, status=1, joined=True),
        Step("refused", ("dlm train garden.dlm --fresh",), ("train", "garden.dlm", "--fresh"), stream="all",
             status=130, ctrl_c=16),
        Step("refused", ("dlm train garden.dlm --resume --max-steps 50",), (*_RESUME, "--max-steps", "50"), status=1),
        Step("refused", ("dlm train garden.dlm --resume --seed 6",), (*_RESUME, "--seed", "6"), status=1),
        Step("refused", ("echo 'Note 61. The mint has spread under the hedge.' >> notes/02.md",),
             _append("notes/02.md", "Note 61. The mint has spread under the hedge.")),
        Step("refused", ("dlm train garden.dlm --resume",), _RESUME, status=1, joined=True),
        Step("refused", ("echo >> tiny-smollm2/config.json",), _append("tiny-smollm2/config.json", "")),
        Step("refused", ("dlm train garden.dlm --resume",), _RESUME, status=1, joined=True),
    ),
)  # fmt: skip

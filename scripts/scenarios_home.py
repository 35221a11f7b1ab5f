"""The stores of a home, the cache and duplicate rows: sessions on the built-in tokenizer.

docs/architecture.md, docs/cache.md and docs/dedup.md quote these sessions.
They tokenize (the built-in SmolLM2 tokenizer, converted from its GGUF file
once per home: seconds) and never train. Files are moved, copied, damaged and
locked by :func:`shell` steps: the command shown is the command run, by bash,
in the work folder with ``DLM_HOME`` set, as a person would type it
(:func:`sessions.shell`).
"""

from __future__ import annotations

from scenarios_tour import TOUR_ID
from session_steps import quiet, shell  # scripts/ is on sys.path when this runs
from sessions import Scenario, Step

_STORE = f"$DLM_HOME/store/{TOUR_ID}"


STORES = Scenario(
    name="stores",
    model="real",
    files={"notes/drafts/ideas.md": "Ideas for later.\n"},
    steps=(
        quiet("stores", "tokenize", "examples/tour.dlm"),
        quiet("stores", "init", "notes/notes.dlm", joined=True),
        quiet("stores", "init", "notes/old.dlm", joined=True),
        quiet("stores", "init", "notes/drafts/draft.dlm", joined=True),
        shell("stores", "cp notes/notes.dlm notes/notes-copy.dlm   # the same dlm_id", joined=True),
        quiet("stores", "tokenize", "notes/notes-copy.dlm", joined=True),
        shell("stores", "rm notes/notes-copy.dlm notes/old.dlm", joined=True),
        shell("stores", "mv notes/drafts notes/drafts-2025", joined=True),
        Step("stores", ("dlm stores",), ("stores",)),
        Step("gc", ("dlm stores gc --dry-run",), ("stores", "gc", "--dry-run")),
    ),
)

#: A small tree two documents train on.
TREE = {
    f"tree/{name}.md": f"# {name.title()}\n\n{text}\n"
    for name, text in (
        ("install", "Run make demo: it creates .venv and installs everything."),
        ("stores", "Each document has a store: store.db and its blobs, under DLM_HOME."),
        ("cache", "Rows are tokenized once per tokenizer and sequence length, then read from the cache."),
        ("locks", "dlm.lock records what a run trained with; the next run compares."),
    )
}

EXPERIMENT = """---
dlm_id: 01M7YJ087N2NEP493AF56E3CE{n}
base_model: smollm2-135m
training:
  sources:
    - path: tree
---
"""

CACHE = Scenario(
    name="cache",
    model="real",
    files={**TREE, "experiment-1.dlm": EXPERIMENT.format(n=1), "experiment-2.dlm": EXPERIMENT.format(n=2)},
    steps=(
        quiet("share", "tokenize", "experiment-1.dlm"),
        Step(
            "share",
            ("dlm tokenize experiment-2.dlm      # a second document over the tree of experiment-1.dlm",),
            ("tokenize", "experiment-2.dlm"),
        ),
        Step("share", ("dlm cache show experiment-2.dlm",), ("cache", "show", "experiment-2.dlm")),
        quiet("commands", "tokenize", "examples/tour.dlm"),
        Step(
            "commands",
            ("dlm tokenize examples/tour.dlm      # a second run: every row hits",),
            ("tokenize", "examples/tour.dlm"),
            joined=True,
        ),
        Step("commands", ("dlm cache show examples/tour.dlm",), ("cache", "show", "examples/tour.dlm")),
        shell("lost", f"cp {_STORE}/store.db store.db.old"),
        quiet("lost", "tokenize", "examples/tour.dlm", joined=True),
        shell("lost", f"cp store.db.old {_STORE}/store.db   # an older copy put back", joined=True),
        Step(
            "lost",
            ("dlm tokenize examples/tour.dlm",),
            ("tokenize", "examples/tour.dlm"),
            status=1,
            joined=True,
        ),
        Step(
            "repair",
            ("dlm cache verify --repair examples/tour.dlm",),
            ("cache", "verify", "--repair", "examples/tour.dlm"),
        ),  # fmt: skip
        Step("repair", ("dlm tokenize examples/tour.dlm",), ("tokenize", "examples/tour.dlm")),
        shell(
            "busy",
            f"flock --shared {_STORE}/.store.lock sleep 30 &   # as a dlm process with the store open holds it",
        ),
        Step(
            "busy",
            ("dlm cache verify --repair examples/tour.dlm",),
            ("cache", "verify", "--repair", "examples/tour.dlm"),
            stream="all",
            joined=True,
        ),  # fmt: skip
        shell("damaged", f"printf 'not a database' | dd of={_STORE}/store.db conv=notrunc status=none"),
        Step(
            "damaged",
            ("dlm metrics examples/tour.dlm",),
            ("metrics", "examples/tour.dlm"),
            status=1,
            joined=True,
        ),
    ),
)

_PARSER = '''"""A tiny parser of key = value lines."""


def parse_line(line):
    key, _, value = line.partition("=")
    return key.strip(), value.strip()


def parse_lines(lines):
    return dict(parse_line(line) for line in lines if line.strip() and not line.startswith("#"))


def parse_file(path):
    with open(path, encoding="utf-8") as file:
        return parse_lines(file)


def dump_lines(mapping):
    return [f"{key} = {value}" for key, value in sorted(mapping.items())]


def merge(base, override):
    """The settings of base, with those of override on top."""
    merged = dict(base)
    merged.update(override)
    return merged


def as_bool(value):
    """yes, true, on and 1 are true; anything else is false."""
    return value.strip().lower() in {"yes", "true", "on", "1"}


def as_int(value, default=0):
    """The value as an integer, or the default when it is not one."""
    try:
        return int(value)
    except ValueError:
        return default


def as_list(value, separator=","):
    """The value split at each separator, each item stripped, empty items dropped."""
    return [item.strip() for item in value.split(separator) if item.strip()]


def section(mapping, prefix):
    """The keys that start with prefix and a dot, without them."""
    return {key[len(prefix) + 1 :]: value for key, value in mapping.items() if key.startswith(prefix + ".")}


def required(mapping, *keys):
    """Raise KeyError naming the first of keys that the mapping lacks."""
    for key in keys:
        if key not in mapping:
            raise KeyError(f"missing setting: {key}")
    return [mapping[key] for key in keys]
'''

_APP = '''"""The app: reads its settings and greets."""

from lib.parser import parse_file


def main(path="app.conf"):
    settings = parse_file(path)
    print(f"hello, {settings.get('name', 'world')}")
'''

DEDUP_DLM = """---
dlm_id: 01M7YJ087N2NEP493AF56E3CE5
base_model: smollm2-135m
training:
  sources:
    - path: src
      include: ["**/*.py"]
---
# Notes on the app

The app reads key = value settings with its own small parser.
"""

DEDUP = Scenario(
    name="dedup",
    model="real",
    files={
        "notes.dlm": DEDUP_DLM,
        "src/app.py": _APP,
        "src/vendor/app.py": _APP,
        "src/lib/parser.py": _PARSER,
        "src/lib/parser_old.py": _PARSER.replace("parse_lines", "read_lines").replace(
            "dump_lines", "write_lines"
        ),
        "src/lib/config.py": 'DEFAULTS = {"name": "world", "greeting": "hello"}\n',
    },
    steps=(
        quiet("show", "tokenize", "notes.dlm"),
        Step("show", ("dlm show notes.dlm",), ("show", "notes.dlm"), joined=True),
    ),
)

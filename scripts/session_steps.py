"""Steps of a scenario that are not a bare ``dlm`` command: sqlite3 queries, files shown, shell lines.

Each returns what the command it stands for prints, and carries a
``__name__`` that says what it runs, so a scenario's inputs hash
(:func:`sessions.inputs_sha256`) changes when a query or a command does.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sessions import Step, _env  # scripts/ is on sys.path when this runs


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


def _bash(command: str) -> Callable[[Path], str]:
    """Run ``command`` in bash in the work folder, ``DLM_HOME`` its home and this Python's
    ``bin/`` first on ``PATH`` (``python``, ``dlm``); what it prints. A command ending in ``&``
    (before its comment) is left running, its output discarded (a lock holder)."""

    def run(work: Path) -> str:
        env = {
            **_env(work / "home", quiet=False),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        }
        if command.split("#")[0].rstrip().endswith("&"):  # bash puts it in the background
            subprocess.Popen(["bash", "-c", command], cwd=work, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            time.sleep(1)  # started, and holding what it holds, before the next step runs
            return ""
        done = subprocess.run(
            ["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, check=True
        )
        return done.stdout + done.stderr

    run.__name__ = f"bash({command!r})"
    return run


def shell(blocks: str, command: str, **options: bool) -> Step:
    """A step that runs ``command`` in bash, shown as it is (its lines after one ending in ``\\``
    continue it)."""
    return Step(blocks, tuple(command.split("\n")), _bash(command), **options)  # type: ignore[arg-type]


def quiet(blocks: str, *argv: str, **options: bool) -> Step:
    """``dlm ARGV > /dev/null``: a command the story needs whose output it does not quote."""
    return Step(blocks, (f"dlm {' '.join(argv)} > /dev/null",), argv, discard=True, **options)  # type: ignore[arg-type]

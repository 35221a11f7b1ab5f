"""scripts/heartbeat.py: make's long steps say they are alive (#32 item 3)."""

from __future__ import annotations

import os
import subprocess
import sys

from .helpers import REPO

HEARTBEAT = str(REPO / "scripts" / "heartbeat.py")


def _run(*command: str, every: str = "0.2") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEARTBEAT_EVERY": every}
    return subprocess.run(
        [sys.executable, HEARTBEAT, "step", "--", *command],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_a_silent_command_gets_a_line_while_it_runs_and_one_when_it_ends() -> None:
    done = _run(sys.executable, "-c", "import time; time.sleep(1.0)")
    lines = done.stdout.splitlines()
    assert done.returncode == 0
    assert lines[0].startswith("step: still running (") and lines[-1].startswith("step: done in ")


def test_the_commands_own_lines_pass_through_and_its_exit_status_is_kept() -> None:
    done = _run(
        sys.executable,
        "-c",
        "import sys; print('one'); print('two', file=sys.stderr); sys.exit(3)",
        every="60",
    )
    assert done.stdout.splitlines()[:2] == ["one", "two"]
    assert done.stdout.splitlines()[-1].startswith("step: failed (exit 3) after ")
    assert done.returncode == 3


def test_a_line_still_being_written_is_ended_before_the_heartbeat() -> None:
    script = "import sys, time; sys.stdout.write('..'); sys.stdout.flush(); time.sleep(1.0); print('.')"
    lines = _run(sys.executable, "-c", script).stdout.splitlines()
    # A heartbeat may come before the '..' on a loaded machine (the child is slow to start);
    # what matters is that the half-written line is ended before the heartbeat after it.
    at = lines.index("..")
    assert lines[at + 1].startswith("step: still running (")


def test_the_heartbeat_needs_a_label_and_a_command() -> None:
    done = subprocess.run([sys.executable, HEARTBEAT, "step"], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stderr) == (2, "usage: heartbeat.py LABEL -- COMMAND [ARG...]\n")

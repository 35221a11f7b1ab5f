"""Run a command, passing its output through, and never stay silent for long.

    python3 scripts/heartbeat.py LABEL -- COMMAND [ARG...]

The Makefile runs its long steps (pip installs, the llama.cpp build, mypy,
pytest) through this, so a log in CI or on a fresh machine shows a line at
least every :data:`EVERY` seconds: the command's own lines as they come and,
when it has printed no full line for that long, ``LABEL: still running
(Ns)``. At the end: ``LABEL: done in Ns`` (or ``failed (exit N) after
Ns``), and the command's exit status is this script's.

Standard library only: it runs before the virtualenv exists. A line that
is still being written (pytest's dots) is ended before the heartbeat so it
does not land mid-line.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

#: Longest silence, in seconds, before a heartbeat line (``HEARTBEAT_EVERY`` overrides it).
EVERY = float(os.environ.get("HEARTBEAT_EVERY", "10"))


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: heartbeat.py LABEL -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    label, command = argv[0], argv[2:]
    start = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # Python children write as they go, not in 8 KiB blocks
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    assert child.stdout is not None
    out = sys.stdout.buffer
    last_line = start
    mid_line = False
    fd = child.stdout.fileno()
    while True:
        # Wake when the next heartbeat is due, not on a fixed tick: a chunk that comes after a
        # long quiet wait must not be written (and its line ended) before the overdue heartbeat.
        ready, _, _ = select.select([fd], [], [], max(0.0, min(1.0, last_line + EVERY - time.monotonic())))
        now = time.monotonic()
        if now - last_line >= EVERY:  # before a chunk that came late: the heartbeat was due first
            out.write(f"{chr(10) if mid_line else ''}{label}: still running ({now - start:.0f}s)\n".encode())
            out.flush()
            last_line, mid_line = now, False
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            out.write(chunk)
            out.flush()
            if b"\n" in chunk:
                last_line = now
            mid_line = not chunk.endswith(b"\n")
    status = child.wait()
    spent = time.monotonic() - start
    ending = f"done in {spent:.0f}s" if status == 0 else f"failed (exit {status}) after {spent:.0f}s"
    out.write(f"{chr(10) if mid_line else ''}{label}: {ending}\n".encode())
    out.flush()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

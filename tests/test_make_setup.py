"""`make test` and `make demo` set up a fresh machine themselves, Chromium for the browser tests included.

The Makefile's ``chromium`` target runs for both (``install`` depends on
it). These run it with a ``PATH`` made for the case: a browser already
there, and no browser with no way to install one. (The install itself,
as root with apt-get, changes the machine, so it is what `make test` does
on a fresh one rather than a test.)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .helpers import REPO

MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed")


def _chromium_target(bin_dir: Path) -> subprocess.CompletedProcess[str]:
    assert MAKE is not None
    (bin_dir / "id").symlink_to(shutil.which("id") or "/usr/bin/id")
    env = {"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        [MAKE, "-s", "-C", str(REPO), "chromium"], env=env, capture_output=True, text=True, timeout=60
    )


def test_make_test_and_make_demo_set_up_chromium_through_install() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^install: .*\bchromium\b", makefile, re.M)
    assert re.search(r"^demo: install\b", makefile, re.M)
    assert re.search(r"^lint: install\b", makefile, re.M) and re.search(r"^test: lint\b", makefile, re.M)


def test_the_chromium_target_is_silent_when_a_browser_is_on_path(tmp_path: Path) -> None:
    browser = tmp_path / "chromium"
    browser.write_text("#!/bin/sh\n")
    browser.chmod(0o755)
    done = _chromium_target(tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_the_chromium_target_without_a_way_to_install_names_the_command_to_run(tmp_path: Path) -> None:
    done = _chromium_target(tmp_path)  # no browser and no apt-get on PATH
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        "note: no Chromium on PATH, so the browser tests of dlm report will fail; install it with "
        "`apt-get update && apt-get install -y chromium` (as root)"
    ]

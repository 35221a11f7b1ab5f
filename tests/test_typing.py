"""The library and the CLI type-check (the house style's "typed library, checked")."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .helpers import REPO


@pytest.mark.slow  # without a warm .mypy_cache, checking the whole library takes a minute or more
def test_the_library_and_cli_pass_mypy() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy"],  # the files and strictness come from pyproject.toml
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr

"""Shared fixtures: every test gets its own DLM_HOME; nothing touches the network.

The SmolLM2 base is converted from its GGUF file at most once per test
session, into a session directory that each test's home links to as
``bases/``, so tests that need the real tokenizer pay ~5 s once, not per test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

os.environ["HF_HUB_OFFLINE"] = "1"

# No per-example deadline: CI machines are shared and a slow example is not a bug.
settings.register_profile("dlm", deadline=None)
settings.load_profile("dlm")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def session_bases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bases")


@pytest.fixture(autouse=True)
def dlm_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, session_bases: Path) -> Path:
    """Point DLM_HOME at a fresh directory whose bases/ is shared by the session."""
    home = tmp_path / "dlm-home"
    home.mkdir()
    (home / "bases").symlink_to(session_bases, target_is_directory=True)
    monkeypatch.setenv("DLM_HOME", str(home))
    return home


@pytest.fixture
def smollm2_tokenizer():  # type: ignore[no-untyped-def]
    """The real SmolLM2-135M-Instruct tokenizer, loaded offline."""
    from dlmstore.bases import load_tokenizer, resolve_base

    return load_tokenizer(resolve_base("smollm2-135m"))


VALID_ID = "01KPQ1FFEDGPPSMWRAS18SAZST"


def write_doc(path: Path, body: str = "Some prose.\n", frontmatter: str = "") -> Path:
    """Write a minimal valid .dlm at ``path`` with extra frontmatter lines."""
    path.write_text(f"---\ndlm_id: {VALID_ID}\n{frontmatter}---\n{body}", encoding="utf-8")
    return path

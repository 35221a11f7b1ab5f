"""Generated docs are fresh, and the README keeps its promises."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from .helpers import REPO


def _docgen():  # type: ignore[no-untyped-def]
    """scripts/docgen.py: a development tool, not part of the installed library."""
    spec = importlib.util.spec_from_file_location("docgen", REPO / "scripts" / "docgen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_docs_are_up_to_date() -> None:
    stale = [
        str(path.relative_to(REPO))
        for path, text in _docgen().generated_docs(REPO).items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    assert stale == [], "run `python scripts/gen-docs.py` and commit the result"


def test_the_schema_doc_describes_every_table() -> None:
    from dlmstore.store.schema import metadata

    text = (REPO / "docs" / "schema.md").read_text()
    for name in metadata.tables:
        assert f"## table `{name}`" in text


def test_the_readme_names_the_two_setup_commands_first() -> None:
    head = (REPO / "README.md").read_text().split("\n## ")[0]
    assert "make demo" in head and "make test" in head


def test_the_ci_entry_point_runs_make_test_and_nothing_else() -> None:
    lines = [
        line.strip()
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[-1] == "make test"
    # make test sets itself up, Chromium included (tests/test_make_setup.py)
    assert not any("apt-get" in line for line in lines)


def _sessions():  # type: ignore[no-untyped-def]
    """scripts/sessions.py: the scenarios behind the sessions the docs quote."""
    spec = importlib.util.spec_from_file_location("sessions", REPO / "scripts" / "sessions.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("sessions", module)  # its dataclasses look their module up by name
    spec.loader.exec_module(sys.modules["sessions"])
    return sys.modules["sessions"]


def test_every_quoted_session_was_made_from_todays_inputs() -> None:
    sessions = _sessions()
    quoted = list(sessions.quoted(REPO))
    stale = [
        f"{path.relative_to(REPO)}: {match['name']}"
        for path, match in quoted
        if match["sha"] != sessions.inputs_sha256(sessions.SCENARIOS[match["name"].split("/")[0]])
    ]
    assert stale == [], "the tour or its sources changed: run `python scripts/gen-sessions.py` and commit"
    made = {f"{name}/{block}" for name, scenario in sessions.SCENARIOS.items() for block in _blocks(scenario)}
    names = [match["name"] for _, match in quoted]
    assert len(names) == len(set(names)) and set(names) <= made, "each quoted block is a scenario's, once"


def _blocks(scenario) -> set[str]:  # type: ignore[no-untyped-def]
    return {block for step in scenario.steps for block in step.blocks.split()}


def _quoted_blocks(sessions) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {match["name"]: match["body"] for _, match in sessions.quoted(REPO)}


def test_the_error_sessions_print_today_what_the_readme_quotes() -> None:
    sessions = _sessions()
    quoted = _quoted_blocks(sessions)
    for block, text in sessions.run(sessions.ERRORS).items():
        assert sessions.masked(text) == sessions.masked(quoted[f"errors/{block}"])


def _shape(sessions, text: str) -> list[str]:  # type: ignore[no-untyped-def]
    """A session's lines with every figure masked, up to its `dlm prompt` (a tiny model's answer is noise),
    without the base's name (the tiny model is a folder, not the built-in)."""
    lines = sessions.masked(text.split("$ dlm prompt")[0], figures=True).splitlines()
    return [line for line in lines if not line.startswith("base:")]


@pytest.mark.slow
def test_the_tour_sessions_keep_their_shape_when_the_tiny_model_stands_in(tiny_base: Path) -> None:
    """The real model's figures are held by the inputs' hash; this holds every line's shape (the
    commands, their lines and words) against today's code, on the tiny model in seconds."""
    sessions = _sessions()
    quoted = _quoted_blocks(sessions)
    made = sessions.run(sessions.TOUR, base=str(tiny_base))
    for block in ("readme", "training"):
        assert _shape(sessions, made[block]) == _shape(sessions, quoted[f"tour/{block}"]), block

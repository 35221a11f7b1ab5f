"""Generated docs are fresh, and the README keeps its promises."""

from __future__ import annotations

import importlib.util
import shutil
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


def test_the_readme_tree_lists_every_sub_package_of_dlmstore() -> None:
    tree = (REPO / "README.md").read_text().split("## What is where")[1].split("\n## ")[0]
    listed = {
        line.split()[0].rstrip("/") for line in tree.splitlines() if line.startswith("  ") and line.strip()
    }
    packages = {path.parent.name for path in (REPO / "dlmstore").glob("*/__init__.py")}
    assert packages - listed == set()


def test_the_ci_entry_point_runs_make_test_and_nothing_else() -> None:
    lines = [
        line.strip()
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[-1] == "make test"
    # make test sets itself up, Chromium included (tests/test_make_setup.py)
    assert not any("apt-get" in line for line in lines)


def _script(name: str):  # type: ignore[no-untyped-def]
    """scripts/<name>.py, imported by that name: scripts/ is not a package, and its modules import
    each other by name (and their dataclasses look their module up by it)."""
    if name not in sys.modules:
        sys.path.insert(0, str(REPO / "scripts"))
        try:
            importlib.import_module(name)
        finally:
            sys.path.remove(str(REPO / "scripts"))
    return sys.modules[name]


def _sessions():  # type: ignore[no-untyped-def]
    """scripts/sessions.py: how the sessions the docs quote are made."""
    return _script("sessions")


def _scenarios():  # type: ignore[no-untyped-def]
    """scripts/scenarios.py: the scenarios behind the sessions the docs quote."""
    return _script("scenarios")


def test_every_quoted_session_was_made_from_todays_inputs() -> None:
    """A session made with a model is not rerun here: its hash covers its commands, the files it
    reads, the library versions and the cli/ code that prints it (scripts/sessions.py says why)."""
    sessions, scenarios = _sessions(), _scenarios()
    quoted = list(sessions.quoted(REPO))
    today = {name: sessions.inputs_sha256(scenario) for name, scenario in scenarios.SCENARIOS.items()}
    stale = [
        f"{path.relative_to(REPO)}: {match['name']}"
        for path, match in quoted
        if match["sha"] != today[match["name"].split("/")[0]]
    ]
    assert stale == [], "run `python scripts/gen-sessions.py NAME` for each stale scenario NAME and commit"
    made = {
        f"{name}/{block}" for name, scenario in scenarios.SCENARIOS.items() for block in _blocks(scenario)
    }
    names = [match["name"] for _, match in quoted]
    assert len(names) == len(set(names)) and set(names) == made, "each scenario's block is quoted, once"


def _blocks(scenario) -> set[str]:  # type: ignore[no-untyped-def]
    return {block for step in scenario.steps for block in step.blocks.split()}


def _quoted_blocks(sessions) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {match["name"]: match["body"] for _, match in sessions.quoted(REPO)}


def test_the_cheap_sessions_print_today_what_the_docs_quote() -> None:
    """The sessions that need no model and no torch (a second or two in all) are run again and
    compared, so any change to what they print fails here; the others are held by their hash."""
    sessions, scenarios = _sessions(), _scenarios()
    quoted = _quoted_blocks(sessions)
    cheap = [scenario for scenario in scenarios.SCENARIOS.values() if scenario.rerun]
    assert cheap, "the error sessions at least"
    for scenario in cheap:
        for block, text in sessions.run(scenario).items():
            assert sessions.masked(text) == sessions.masked(quoted[f"{scenario.name}/{block}"]), block


def test_the_printers_of_a_session_are_the_cli_modules_of_its_commands_and_their_imports() -> None:
    sessions, scenarios = _sessions(), _scenarios()
    printers = {path.name for path in sessions.printers(scenarios.SCENARIOS["tour"])}
    assert {"main.py", "train.py", "render.py", "show.py", "lock.py"} <= printers
    assert "data.py" not in printers  # the tour runs no `dlm data`


def test_a_change_to_the_code_that_prints_a_session_makes_it_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions, scenarios = _sessions(), _scenarios()
    for folder in ("cli", "examples"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    monkeypatch.setattr(sessions, "ROOT", tmp_path)
    tour = scenarios.SCENARIOS["tour"]
    before = sessions.inputs_sha256(tour)
    with (tmp_path / "cli" / "data.py").open("a") as file:  # not a printer of the tour
        file.write("# an edit\n")
    assert sessions.inputs_sha256(tour) == before
    with (tmp_path / "cli" / "render.py").open("a") as file:
        file.write("# an edit\n")
    assert sessions.inputs_sha256(tour) != before


def _shape(sessions, text: str) -> list[str]:  # type: ignore[no-untyped-def]
    """A session's lines with every figure masked, up to its `dlm prompt` (a tiny model's answer is noise),
    without the base's name (the tiny model is a folder, not the built-in)."""
    lines = sessions.masked(text.split("$ dlm prompt")[0], figures=True).splitlines()
    return [line for line in lines if not line.startswith("base:")]


@pytest.mark.slow
def test_the_tour_sessions_keep_their_shape_when_the_tiny_model_stands_in(tiny_base: Path) -> None:
    """The real model's figures are held by the inputs' hash; this holds every line's shape (the
    commands, their lines and words) against today's code, on the tiny model in seconds."""
    sessions, scenarios = _sessions(), _scenarios()
    quoted = _quoted_blocks(sessions)
    made = sessions.run(scenarios.SCENARIOS["tour"], base=str(tiny_base))
    for block in ("readme", "training"):
        assert _shape(sessions, made[block]) == _shape(sessions, quoted[f"tour/{block}"]), block

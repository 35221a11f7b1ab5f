"""Generated docs are fresh, and the README keeps its promises."""

from __future__ import annotations

import importlib.util

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

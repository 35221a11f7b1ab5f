"""A store made by `dlm init` whose document was deleted before any run does not stay forever (#32 item 5)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from dlmstore.cli.main import cli


def test_gc_removes_the_store_of_an_initialised_document_deleted_before_any_run(tmp_path: Path) -> None:
    doc = tmp_path / "notes.dlm"
    made = json.loads(CliRunner().invoke(cli, ["init", str(doc), "--json"]).output)
    doc.unlink()
    dry = CliRunner().invoke(cli, ["stores", "gc", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert f"would remove {made['dlm_id']} (" in dry.output and f"document was {doc}" in dry.output
    removed = CliRunner().invoke(cli, ["stores", "gc", "--force"])
    assert removed.exit_code == 0, removed.output
    assert not Path(made["store_path"]).exists()

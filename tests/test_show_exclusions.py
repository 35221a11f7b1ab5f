"""`dlm show` says what each source directive left out and why, beside what it read (#32 item 5)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from dlmstore.cli.main import cli

from .helpers import write_doc


def _tree(tmp_path: Path) -> Path:
    notes = tmp_path / "notes"
    (notes / ".dlm").mkdir(parents=True)
    (notes / "sub").mkdir()
    (notes / "a.md").write_text("a\n")
    (notes / "sub" / "d.md").write_text("d\n")
    (notes / "b.txt").write_text("not matched by include\n")
    (notes / "c.md").write_text("ignored\n")
    (notes / ".dlm" / "ignore").write_text("c.md\n")
    (notes / "package-lock.json").write_text("{}\n")  # a default exclude
    (notes / "bin.md").write_bytes(b"x\0y")
    frontmatter = 'training:\n  sources:\n    - path: notes\n      include: ["**/*.md", "**/*.json"]\n'
    return write_doc(tmp_path / "doc.dlm", "Prose.\n", frontmatter)


def test_show_counts_what_each_directive_left_out_by_reason(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["show", str(_tree(tmp_path))])
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("source:")]
    assert line == (
        "source:   notes: 2 files, 4 B (skipped 1 binary; left out 3: 1 not matching include, "
        "2 by exclude, the default excludes or .dlm/ignore; 1 folder not walked)"
    )


def test_show_json_carries_the_files_no_include_glob_matched(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["show", str(_tree(tmp_path)), "--json"])
    (source,) = json.loads(result.stdout)["sources"]
    assert (source["excluded"], source["excluded_not_included"], source["excluded_dirs"]) == (3, 1, 1)


def test_a_directive_that_left_nothing_out_says_nothing_more(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("a\n")
    doc = write_doc(tmp_path / "doc.dlm", "Prose.\n", "training:\n  sources:\n    - path: notes\n")
    lines = CliRunner().invoke(cli, ["show", str(doc)]).stdout.splitlines()
    assert "source:   notes: 1 file, 2 B" in lines

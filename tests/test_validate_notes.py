"""`dlm data validate` says which line is dlm's and which KempnerForge's, and notes an empty val split
(#32 item 5)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from dlmstore.cli.main import cli


def _build(tmp_path: Path, val_frac: str) -> Path:
    notes = tmp_path / "notes"
    notes.mkdir(exist_ok=True)
    for i in range(5):
        (notes / f"note{i}.md").write_text(f"# Note {i}\n\nSomething worth remembering, {i}.\n")
    out = tmp_path / f"ds-{val_frac}"
    args = ["data", "build", "pretrain", "--from", str(notes), "--out", str(out), "--val-frac", val_frac]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return out


def test_validate_gives_the_dlm_train_line_first_and_names_the_flags_as_kempnerforges(tmp_path: Path) -> None:
    out = _build(tmp_path, "0.4")
    result = CliRunner().invoke(cli, ["data", "validate", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1:5] == [
        "train it with dlm:",
        f"  dlm train DOC --dataset {out}   # or training.datasets: [{{path: {out}}}] in DOC",
        "or with KempnerForge (its scripts/train.py flags):",
        lines[4],
    ]
    assert lines[4].startswith(f"  --data.dataset_path={out / 'train'} ")
    assert lines[5] == "or read it from Python:"
    assert not any(line.startswith("note:") for line in lines)


def test_an_empty_val_split_passes_with_a_note(tmp_path: Path) -> None:
    out = _build(tmp_path, "0")
    result = CliRunner().invoke(cli, ["data", "validate", str(out)])
    assert result.exit_code == 0, result.output
    note = (
        "the val split is empty (0 tokens): nothing to measure a val loss on; rebuild with a larger "
        "--val-frac to hold some out"
    )
    assert result.output.splitlines()[1] == f"note: {note}"
    report = json.loads(CliRunner().invoke(cli, ["data", "validate", str(out), "--json"]).output)
    assert (report["ok"], report["notes"]) == (True, [note])

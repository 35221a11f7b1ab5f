"""``dlm migrate``: a document rewritten at the current DLM version, in place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.document.migrate import migrate_document
from dlmstore.document.parser import parse_document
from dlmstore.document.versions import CURRENT_DLM_VERSION
from dlmstore.errors import DocumentError

from .helpers import VALID_ID

LEGACY = f"""---
dlm_id: {VALID_ID}
# chosen after a sweep
base_model: smollm2-135m
training:
  r: 4          # rank
  epochs: 2
  learning_rate: 2e-4
---
Some prose.
"""

V1_DPO = f"""---
dlm_id: {VALID_ID}
dlm_version: 1
training:
  dpo:
    enabled: false
    beta: 0.2
    reference: pre_dpo_adapter
---
Some prose.
"""


def write(tmp_path: Path, text: str, name: str = "doc.dlm") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


def test_legacy_keys_are_renamed_in_place_keeping_comments(tmp_path: Path) -> None:
    path = write(tmp_path, LEGACY)
    result = migrate_document(path)
    assert result.changed and result.wrote
    assert result.renamed == ["training.r -> training.lora_r", "training.epochs -> training.num_epochs"]
    assert path.read_text() == LEGACY.replace(
        f"dlm_id: {VALID_ID}\n", f"dlm_id: {VALID_ID}\ndlm_version: 15\n"
    ).replace("  r: 4 ", "  lora_r: 4 ").replace("epochs: 2", "num_epochs: 2")
    training = parse_document(path).frontmatter.training
    assert (training.lora_r, training.num_epochs, training.learning_rate) == (4, 2, 2e-4)


def test_the_original_is_kept_as_a_backup(tmp_path: Path) -> None:
    path = write(tmp_path, LEGACY)
    result = migrate_document(path)
    assert result.backup == str(path) + ".bak"
    assert Path(result.backup).read_text() == LEGACY


def test_no_backup_writes_no_backup(tmp_path: Path) -> None:
    path = write(tmp_path, LEGACY)
    assert migrate_document(path, backup=False).backup is None
    assert not (tmp_path / "doc.dlm.bak").exists()


def test_a_dry_run_returns_the_diff_and_writes_nothing(tmp_path: Path) -> None:
    path = write(tmp_path, LEGACY)
    result = migrate_document(path, dry_run=True)
    assert result.changed and not result.wrote and result.backup is None
    assert "+dlm_version: 15\n" in result.diff and "-  r: 4" in result.diff and "+  lora_r: 4" in result.diff
    assert path.read_text() == LEGACY
    assert not (tmp_path / "doc.dlm.bak").exists()


def test_an_existing_version_line_is_rewritten_where_it_stands(tmp_path: Path) -> None:
    text = f"---\ndlm_id: {VALID_ID}\ndlm_version: 6  # sources added\n---\nSome prose.\n"
    path = write(tmp_path, text)
    migrate_document(path)
    assert path.read_text() == text.replace("dlm_version: 6 ", "dlm_version: 15 ")


def test_a_current_document_is_left_alone(tmp_path: Path) -> None:
    text = f"---\ndlm_id: {VALID_ID}\ndlm_version: {CURRENT_DLM_VERSION}\n---\nSome prose.\n"
    path = write(tmp_path, text)
    result = migrate_document(path)
    assert not result.changed and not result.wrote and result.applied == [] and result.diff == ""
    assert not (tmp_path / "doc.dlm.bak").exists()


def test_a_version_one_dpo_block_becomes_training_preference(tmp_path: Path) -> None:
    path = write(tmp_path, V1_DPO)
    result = migrate_document(path)
    assert result.comments_dropped and result.applied == list(range(1, CURRENT_DLM_VERSION))
    preference = parse_document(path).frontmatter.training.preference
    assert (preference.method, preference.enabled, preference.reference) == ("dpo", False, "pre_adapter")
    assert preference.hyperparams.beta == 0.2
    assert "dpo:" not in path.read_text() and path.read_text().endswith("---\nSome prose.\n")


def test_crlf_line_endings_and_a_bom_survive(tmp_path: Path) -> None:
    text = "\ufeff" + LEGACY.replace("\n", "\r\n")
    path = write(tmp_path, text)
    migrate_document(path)
    data = path.read_bytes().decode("utf-8")
    assert data.startswith("\ufeff---\r\n") and "\n" not in data.replace("\r\n", "")
    assert "lora_r: 4" in data


def test_a_document_that_would_still_be_invalid_is_not_written(tmp_path: Path) -> None:
    text = LEGACY.replace("  epochs: 2\n", "  epochs: 2\n  sequnce_len: 9\n")
    path = write(tmp_path, text)
    with pytest.raises(DocumentError, match="would not be valid: .*unknown key 'training.sequnce_len'"):
        migrate_document(path)
    assert path.read_text() == text
    assert not (tmp_path / "doc.dlm.bak").exists()


def test_a_newer_version_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, f"---\ndlm_id: {VALID_ID}\ndlm_version: 99\n---\n")
    with pytest.raises(DocumentError, match="dlm_version 99 is newer"):
        migrate_document(path)


def test_the_cli_reports_what_changed_and_prints_json(tmp_path: Path) -> None:
    path = write(tmp_path, LEGACY)
    runner = CliRunner()
    dry = runner.invoke(cli, ["migrate", str(path), "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "+dlm_version: 15" in dry.output and "would migrate" in dry.output
    result = runner.invoke(cli, ["migrate", str(path), "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["from_version"] == 1 and shown["to_version"] == 15 and shown["wrote"] is True
    again = runner.invoke(cli, ["migrate", str(path)])
    assert again.exit_code == 0 and "already at dlm_version 15" in again.output


def test_the_cli_turns_a_missing_file_into_one_error_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["migrate", str(tmp_path / "absent.dlm")])
    assert result.exit_code == 1
    assert "error: " in result.output and "Traceback" not in result.output

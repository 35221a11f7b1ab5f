"""``dlm migrate``: a document rewritten at the current DLM version, in place."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
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


# --- a document written at each DLM version, 1 to 15 --------------------------------------------
#
# Each document uses the frontmatter keys and body markers its version had in
# DocumentLanguageModel's own schema (src/dlm/doc/schema.py and sections.py at
# the commit that bumped CURRENT_SCHEMA_VERSION to it): version 1's
# ``training.dpo`` and ``export`` defaults, 2's ``training.preference``, 3's
# ``training.cpt``, 4's ``training.adapters``, 5's ``training.precision``, 6's
# ``training.sources``, 7's harvest marker, 8's ``training.gate``, 9's
# ``training.cache``, 10's ``adapter: dora``, 12's ``training.audio``, 14's
# auto-mined marker and 15's auto-synth marker (11 and 13 added nothing
# dlmstore trains: audio fences, a registry refresh).

_FLAT_ADAPTER = """\
  adapter: {adapter}
  lora_r: 16
  lora_alpha: 32
  lora_dropout: 0.1
  target_modules: [q_proj, v_proj]
  learning_rate: 1.0e-4
"""

_RUN = """\
  sequence_len: 512
  micro_batch_size: 2
  grad_accum: 4
  num_epochs: 2
  optimizer: adamw_torch
  lr_scheduler: linear
  warmup_ratio: 0.05
  seed: 7
"""

_EXPORT = """\
export:
  default_quant: Q5_K_M
  default_temperature: 0.2
  default_top_p: 0.9
"""

_NAMED_ADAPTERS = """\
  adapters:
    knowledge:
      lora_r: 8
      learning_rate: 1.0e-4
    tone:
      adapter: lora
      lora_r: 4
"""

#: What each version added to the ``training`` block of a document written at it.
_ADDED: dict[int, str] = {
    1: """\
  dpo:                      # the preference phase, before version 2 renamed it
    enabled: true
    beta: 0.2
    loss_type: hinge
    learning_rate: 1.0e-6
    num_epochs: 2
    reference: pre_dpo_adapter
""",
    2: """\
  preference:
    method: orpo
    hyperparams:
      alpha: 0.3
      learning_rate: 2.0e-6
      num_epochs: 1
    loss_type: sigmoid
    reference: base
""",
    3: "  cpt:\n    schedule: dapt\n    embed_warmup_steps: 10\n",
    4: _NAMED_ADAPTERS,
    5: "  precision: bf16\n",
    6: """\
  sources:
    - path: notes
      include: ["**/*.md"]
      exclude: ["drafts/**"]
      max_bytes_per_file: 65536
      max_files: 50
  sources_policy: strict
""",
    8: _NAMED_ADAPTERS
    + """\
  gate:
    enabled: true
    hidden_proj_dim: 32
    steps: 100
    lr: 0.001
    cold_start_floor: 2
    entropy_lambda: 0.05
""",
    9: "  cache:\n    enabled: true\n    max_bytes: 1073741824\n    prune_older_than_days: 30\n",
    12: "  audio:\n    auto_resample: true\n",
}

_HARVESTED = '<!-- dlm-auto-harvest: source="run_3_sway" -->\n'
_MINED = (
    '<!-- dlm-auto-mined: judge_name="sway" judge_score_chosen="0.91" judge_score_rejected="0.12" '
    'mined_at="2026-04-23T10:00:00Z" mined_run_id="3" -->\n'
)
_SYNTHESIZED = (
    '<!-- dlm-auto-synth: synth_teacher="self" synth_strategy="extraction" synth_at="2026-04-23T10:00:00Z" '
    'source_section_id="0123456789abcdef" -->\n'
)


def _versioned(version: int, *, versioned: bool = True) -> str:
    """A document as DLM wrote it at ``version`` (``versioned=False``: no ``dlm_version`` line,
    which reads as version 1)."""
    flat = "" if version in (4, 8) else _FLAT_ADAPTER.format(adapter="dora" if version >= 10 else "lora")
    head = f"dlm_id: {VALID_ID}\n" + (f"dlm_version: {version}\n" if versioned else "")
    frontmatter = (
        f"{head}base_model: smollm2-135m\nsystem_prompt: You answer questions about the garden log.\n"
        f"training:\n{flat}{_RUN}{_ADDED.get(version, '')}{_EXPORT}"
    )
    instruction = (_HARVESTED if version >= 7 else "") + (_SYNTHESIZED if version >= 15 else "")
    preference = _MINED if version >= 14 else ""
    body = (
        "# The garden log\n\nTomatoes went in on the first of May.\n\n"
        f"::instruction::\n{instruction}### Q\nWhen did the tomatoes go in?\n### A\nOn the first of May.\n\n"
        f"::preference::\n{preference}### Prompt\nWhen is the harvest?\n### Chosen\nIn August.\n"
        "### Rejected\nNobody knows.\n"
    )
    return f"---\n{frontmatter}---\n{body}"


def _dlm_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """DLM's ``src/dlm/doc/migrations/v1.py`` ``migrate``, line for line: the reference."""
    out = dict(raw)
    training = out.get("training")
    if not isinstance(training, dict):
        return out
    training_out = dict(training)
    dpo = training_out.pop("dpo", None)
    if dpo is None:
        out["training"] = training_out
        return out
    if not isinstance(dpo, dict):
        training_out["preference"] = dpo
        out["training"] = training_out
        return out
    preference: dict[str, Any] = {"method": "dpo"}
    if "enabled" in dpo:
        preference["enabled"] = dpo["enabled"]
    hyperparams = {key: dpo[key] for key in ("beta", "learning_rate", "num_epochs") if key in dpo}
    if hyperparams:
        preference["hyperparams"] = hyperparams
    if "loss_type" in dpo:
        preference["loss_type"] = dpo["loss_type"]
    if "reference" in dpo:
        ref = dpo["reference"]
        preference["reference"] = "pre_adapter" if ref == "pre_dpo_adapter" else ref
    training_out["preference"] = preference
    out["training"] = training_out
    return out


def _dlm_apply_pending(raw: dict[str, Any]) -> dict[str, Any]:
    """DLM's ``dispatch.apply_pending`` to version 15: ``v1`` above, then its thirteen identity steps."""
    current = dict(raw)
    while (version := current.get("dlm_version", 1)) != CURRENT_DLM_VERSION:
        current = _dlm_v1(current) if version == 1 else dict(current)
        current["dlm_version"] = version + 1
    return current


def _frontmatter(text: str) -> dict[str, Any]:
    from dlmstore.document.loading import FrontmatterLoader

    loaded: dict[str, Any] = yaml.load(text.split("---\n")[1], Loader=FrontmatterLoader)
    return loaded


@pytest.mark.parametrize(
    "version, versioned",
    [(1, False), *((version, True) for version in range(1, CURRENT_DLM_VERSION + 1))],
    ids=["1-unversioned", *(f"v{version}" for version in range(1, CURRENT_DLM_VERSION + 1))],
)
def test_a_document_written_at_each_dlm_version_migrates_to_the_current_one_as_dlm_carries_it(
    tmp_path: Path, version: int, versioned: bool
) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "beds.md").write_text("The north bed gets the most sun.\n", encoding="utf-8")
    original = _versioned(version, versioned=versioned)
    path = write(tmp_path, original)
    before = parse_document(path).frontmatter  # read as DLM reads it: upgraded in memory
    runner = CliRunner()
    result = runner.invoke(cli, ["migrate", str(path), "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    migrated = path.read_text(encoding="utf-8")
    if version == CURRENT_DLM_VERSION:
        assert (shown["changed"], shown["applied"], migrated) == (False, [], original)
        assert not (tmp_path / "doc.dlm.bak").exists()
    else:
        assert shown["changed"] and shown["applied"] == list(range(version, CURRENT_DLM_VERSION))
        assert shown["comments_dropped"] == (version == 1)  # only the training.dpo step re-writes the YAML
        assert (tmp_path / "doc.dlm.bak").read_text(encoding="utf-8") == original
    # The frontmatter holds what DLM's own migration chain makes of the original ...
    assert _frontmatter(migrated) == _dlm_apply_pending(_frontmatter(original))
    # ... the body is kept byte for byte, and the document reads as the original did.
    assert migrated.split("---\n", 2)[2] == original.split("---\n", 2)[2]
    after = parse_document(path).frontmatter
    assert after.dlm_version == CURRENT_DLM_VERSION
    assert after.model_dump(exclude={"dlm_version"}) == before.model_dump(exclude={"dlm_version"})
    show = runner.invoke(cli, ["show", str(path)])
    assert show.exit_code == 0, show.output
    text_rows = 2 if version == 6 else 1  # the prose, and version 6's source file
    assert f"rows:     {text_rows} text, 1 messages, 1 preference" in show.output
    again = runner.invoke(cli, ["migrate", str(path)])  # a current document: nothing changes
    assert again.exit_code == 0 and "already at dlm_version 15; nothing to do" in again.output
    assert path.read_text(encoding="utf-8") == migrated


def test_an_empty_version_one_dpo_block_is_dropped_as_dlm_drops_it(tmp_path: Path) -> None:
    original = f"---\ndlm_id: {VALID_ID}\ndlm_version: 1\ntraining:\n  seed: 7\n  dpo:\n---\nSome prose.\n"
    path = write(tmp_path, original)
    preference = parse_document(path).frontmatter.training.preference  # read as DLM reads it: the defaults
    assert "enabled" not in preference.model_fields_set and preference.method == "dpo"
    result = CliRunner().invoke(cli, ["migrate", str(path)])
    assert result.exit_code == 0, result.output
    assert _frontmatter(path.read_text(encoding="utf-8")) == _dlm_apply_pending(_frontmatter(original))
    assert path.read_text(encoding="utf-8") == (
        f"---\ndlm_id: {VALID_ID}\ndlm_version: 15\ntraining:\n  seed: 7\n---\nSome prose.\n"
    )

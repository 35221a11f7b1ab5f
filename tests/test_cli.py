"""The `dlm` command: init, show, version, help, and how errors look."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.document.parser import parse_document
from dlmstore.ulid import is_valid_ulid

from .helpers import VALID_ID, write_doc


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_version_prints_the_package_version(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["--version"])
    assert (result.exit_code, result.output) == (0, "dlm 0.1.0\n")


def test_help_lists_the_commands(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["--help"])
    assert result.exit_code == 0
    assert "init" in result.output and "show" in result.output


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys; from dlmstore.cli.main import cli\n"
        "try:\n    cli(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'sqlalchemy', 'alembic', 'pydantic', 'numpy', 'ray', 'tqdm') "
        "if m in sys.modules]\nprint(heavy, file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip() == "[]"


def test_show_imports_neither_torch_nor_transformers(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    code = (
        "import sys; from dlmstore.cli.main import cli\n"
        f"try:\n    cli(['show', {str(doc)!r}, '--json'])\nexcept SystemExit:\n    pass\n"
        "print([m for m in ('torch', 'transformers') if m in sys.modules], file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip() == "[]"


def test_init_writes_a_valid_document_with_a_fresh_id_and_creates_its_store(
    runner: CliRunner, tmp_path: Path, dlm_home: Path
) -> None:
    path = tmp_path / "notes.dlm"
    result = runner.invoke(cli, ["init", str(path), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    document = parse_document(path)
    assert is_valid_ulid(document.dlm_id)
    assert payload == {
        "path": str(path),
        "dlm_id": document.dlm_id,
        "base_model": "smollm2-135m",
        "store_path": str(dlm_home / "store" / document.dlm_id),
    }
    assert (dlm_home / "store" / document.dlm_id / "store.db").is_file()
    assert [s.type for s in document.sections] == ["prose", "instruction", "preference"]


def test_init_with_a_hub_base_model_writes_it_to_the_frontmatter(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "hub.dlm"
    result = runner.invoke(cli, ["init", str(path), "--base-model", "HuggingFaceTB/SmolLM2-135M-Instruct"])
    assert result.exit_code == 0, result.output
    assert parse_document(path).base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_two_inits_mint_different_ids(runner: CliRunner, tmp_path: Path) -> None:
    for name in ("a.dlm", "b.dlm"):
        assert runner.invoke(cli, ["init", str(tmp_path / name)]).exit_code == 0
    assert parse_document(tmp_path / "a.dlm").dlm_id != parse_document(tmp_path / "b.dlm").dlm_id


def test_init_never_overwrites_an_existing_file(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "notes.dlm"
    path.write_text("mine")
    result = runner.invoke(cli, ["init", str(path)])
    assert result.exit_code == 1
    assert result.output == (
        f"error: {path}: already exists; dlm init never overwrites a document\n"
        "hint: pick another path, or edit the existing file\n"
    )
    assert path.read_text() == "mine"


def test_init_with_an_unknown_base_model_fails_before_writing(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "x.dlm"
    result = runner.invoke(cli, ["init", str(path), "--base-model", "gpt-17"])
    assert result.exit_code == 1
    assert result.output.splitlines()[0] == "error: unknown base model 'gpt-17'"
    assert not path.exists()


def test_show_summarises_a_document_with_sources_as_json(
    runner: CliRunner, tmp_path: Path, dlm_home: Path
) -> None:
    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "a.md").write_text("alpha\n")
    (notes / "sub" / "b.md").write_text("beta\n")
    (notes / "blob.bin").write_bytes(b"\x00\x01binary")
    doc = write_doc(
        tmp_path / "doc.dlm",
        body="Intro prose.\n\n::instruction::\n### Q\nq1\n### A\na1\n\n### Q\nq2\n### A\na2\n",
        frontmatter="system_prompt: Be brief.\ntraining:\n  sources:\n    - path: notes\n",
    )
    result = runner.invoke(cli, ["show", str(doc), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["dlm_id"] == VALID_ID
    assert summary["path"] == str(doc)
    assert summary["base_model"]["name"] == "smollm2-135m"
    assert summary["base_model"]["kind"] == "builtin"
    assert summary["system_prompt"] == "Be brief."
    assert summary["sections"] == {"prose": 1, "instruction": 1, "preference": 0}
    assert summary["source_sections"] == 2
    assert summary["rows"] == {"text": 3, "messages": 2, "preference": 0}
    (source,) = summary["sources"]
    assert source["directive"] == "notes"
    assert source["files_included"] == 2
    assert source["skipped_binary"] == 1
    assert summary["store"] == {"path": str(dlm_home / "store" / VALID_ID), "exists": False}
    assert not (dlm_home / "store").exists()  # show is read-only


def test_show_prints_a_readable_summary(runner: CliRunner, tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    result = runner.invoke(cli, ["show", str(doc)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"document: {doc}"
    assert lines[1] == f"id:       {VALID_ID}"
    assert "sections: 1 prose, 0 instruction, 0 preference; 0 from sources" in lines


def test_show_of_a_missing_file_says_how_to_create_one(runner: CliRunner, tmp_path: Path) -> None:
    missing = tmp_path / "nope.dlm"
    result = runner.invoke(cli, ["show", str(missing)])
    assert result.exit_code == 1
    assert result.output == (
        f"error: {missing}: no such file\nhint: run `dlm init {missing}` to create one\n"
    )


def test_a_malformed_document_is_one_error_line_with_file_and_line(runner: CliRunner, tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm", body="::instruction::\n### Q\nquestion only\n")
    result = runner.invoke(cli, ["show", str(doc)])
    assert result.exit_code == 1
    first = result.output.splitlines()[0]
    assert first.startswith(f"error: {doc}:")
    assert "Traceback" not in result.output


def test_show_reports_every_frontmatter_mistake_on_its_own_error_line(
    runner: CliRunner, tmp_path: Path
) -> None:
    doc = write_doc(
        tmp_path / "doc.dlm",
        frontmatter=(
            "base_modl: smollm2-135m\n"  # line 3
            "training:\n"
            "  r: 8\n"  # 5
            "  seed: x\n"  # 6
            "  sequence_len: 32\n"  # 7
            "  cache:\n"
            "    enabled: maybe\n"  # 9
        ),
    )
    result = runner.invoke(cli, ["show", str(doc)])
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {doc}:3: unknown key 'base_modl'",
        f"error: {doc}:5: unknown key 'training.r': dlmstore now uses DLM's name 'lora_r'",
        f"error: {doc}:6: training.seed: must be a whole number, not 'x'",
        f"error: {doc}:7: training.sequence_len: must be between 64 and 32768",
        f"error: {doc}:9: training.cache.enabled: must be true or false, not 'maybe'",
    ]
    lines = result.output.splitlines()
    assert lines[lines.index(errors[1]) + 1] == (
        f"hint: rename it to 'lora_r', or run `dlm migrate {doc}` to rename every such key"
    )
    assert "Traceback" not in result.output


def test_show_reports_a_frontmatter_and_a_body_problem_in_one_run(runner: CliRunner, tmp_path: Path) -> None:
    doc = write_doc(
        tmp_path / "doc.dlm", body="Intro.\n::INSTRUCTION::\n", frontmatter="training:\n  epochs: 2\n"
    )
    result = runner.invoke(cli, ["show", str(doc)])
    assert result.exit_code == 1
    assert [line for line in result.output.splitlines() if line.startswith("error: ")] == [
        f"error: {doc}:4: unknown key 'training.epochs': dlmstore now uses DLM's name 'num_epochs'",
        f"error: {doc}:7: unknown section fence '::INSTRUCTION::'",
    ]


def test_show_json_lists_the_keys_dlmstore_does_not_use_and_warns(runner: CliRunner, tmp_path: Path) -> None:
    doc = write_doc(
        tmp_path / "doc.dlm",
        frontmatter="export:\n  default_quant: Q8_0\ntraining:\n  cpt:\n    schedule: dapt\n",
    )
    result = runner.invoke(cli, ["show", str(doc), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["not_used"] == ["training.cpt.schedule"]  # export: is dlm export's
    assert summary["warnings"] == [f"{doc}: not used by dlmstore: training.cpt.schedule"]
    assert [f"warning: {w}" for w in summary["warnings"]] == result.stderr.splitlines()


def test_show_json_of_a_plain_document_has_nothing_unused(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["show", str(write_doc(tmp_path / "doc.dlm")), "--json"])
    summary = json.loads(result.stdout)
    assert (summary["not_used"], summary["warnings"], summary["dlm_version"]) == ([], [], 1)


def test_show_rows_prints_one_json_object_per_row_with_its_key(runner: CliRunner, tmp_path: Path) -> None:
    from dlmstore.corpus.show import document_rows

    doc = write_doc(
        tmp_path / "doc.dlm",
        body="  Intro prose.  \n\n::instruction::\n### Q\nq1\n### A\na1\n"
        "::preference::\n### Prompt\np\n### Chosen\nc\n### Rejected\nr\n",
        frontmatter="system_prompt: Be brief.\n",
    )
    result = runner.invoke(cli, ["show", str(doc), "--rows"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    keys = [row.row_key for row in document_rows(doc)]
    assert rows == [
        {"text": "Intro prose.", "row_key": keys[0]},
        {
            "messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}],
            "row_key": keys[1],
        },
        {"prompt": "p", "chosen": "c", "rejected": "r", "row_key": keys[2]},
    ]
    assert all(key.startswith("sha256:") and len(key) == 71 for key in keys)


def test_show_rows_of_a_malformed_document_is_an_error(runner: CliRunner, tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm", body="::instruction::\n### Q\nq\n")
    result = runner.invoke(cli, ["show", str(doc), "--rows"])
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr.startswith(f"error: {doc}:5: question at line 5 has no `### A` answer\n")


def test_a_missing_source_directory_is_a_clear_error(runner: CliRunner, tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm", frontmatter="training:\n  sources:\n    - path: nowhere\n")
    result = runner.invoke(cli, ["show", str(doc)])
    assert result.exit_code == 1
    assert result.output.startswith("error: ")
    assert "nowhere" in result.output.splitlines()[0]


def test_an_unknown_option_is_a_usage_error_with_exit_code_2(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["show", "--bogus"], prog_name="dlm")
    assert result.exit_code == 2
    # Click may add "Did you mean ...?" after the sentence (it suggests --rows for --bogus).
    assert result.output.splitlines()[-1].startswith("Error: No such option '--bogus'.")


def test_the_installed_dlm_script_runs() -> None:
    dlm = Path(sys.executable).with_name("dlm")
    out = subprocess.run([str(dlm), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout == "dlm 0.1.0\n"


def test_the_command_summaries_dlm_help_shows_without_importing_are_each_commands_own() -> None:
    import click

    from dlmstore.cli.main import COMMANDS

    ctx = click.Context(cli)
    for name, (_, _, summary) in COMMANDS.items():
        command = cli.get_command(ctx, name)
        assert command is not None and command.name == name
        assert (command.help or "").split("\n\n")[0].strip() == summary, name


def test_dlm_help_imports_no_command_module() -> None:
    code = "import sys; from dlmstore.cli.main import cli; print(sorted(m for m in sys.modules if m.startswith('dlmstore.cli.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['dlmstore.cli.main']"

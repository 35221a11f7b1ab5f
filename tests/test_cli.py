"""The `dlm` command: init, show, version, help, and how errors look."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.document.parser import parse_document
from dlmstore.ulid import is_valid_ulid

from .helpers import VALID_ID, leaf_commands, write_doc


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


#: The commands that run a model, and so load torch (dlmstore/torch_loader.py); no other may.
RUNS_A_MODEL = {("train",), ("eval",), ("prompt",), ("export",)}

#: How each other command is run by the torch probe, in this order (one store, built up as it goes),
#: and the exit it ends with: ``lock`` has no lock to show before a training run, ``pack`` no adapter to
#: carry, and ``unpack`` and ``verify`` are given a file that is not a pack (each reads it as far as
#: it can: through the zstd reader, never a model).
WITHOUT_TORCH: dict[tuple[str, ...], tuple[list[str], int]] = {
    ("init",): (["init", "new.dlm"], 0),
    ("show",): (["show", "doc.dlm"], 0),
    ("tokenize",): (["tokenize", "doc.dlm"], 0),
    ("cache", "show"): (["cache", "show", "doc.dlm"], 0),
    ("cache", "verify"): (["cache", "verify", "doc.dlm"], 0),
    ("cache", "prune"): (["cache", "prune", "doc.dlm"], 0),
    ("replay", "show"): (["replay", "show", "doc.dlm"], 0),
    ("replay", "prune"): (["replay", "prune", "doc.dlm", "--superseded"], 0),
    ("metrics",): (["metrics", "doc.dlm"], 0),
    ("report",): (["report", "doc.dlm", "-o", "report.html"], 0),
    ("lock", "show"): (["lock", "show", "doc.dlm"], 1),
    ("lock", "diff"): (["lock", "diff", "doc.dlm"], 1),
    ("migrate",): (["migrate", "doc.dlm"], 0),
    ("pack",): (["pack", "doc.dlm"], 1),
    ("unpack",): (["unpack", "notes/a.md", "--to", "unpacked"], 1),
    ("verify",): (["verify", "notes/a.md"], 1),
    ("cache", "clear"): (["cache", "clear", "doc.dlm", "--force"], 0),
    ("stores",): (["stores"], 0),
    ("stores", "gc"): (["stores", "gc"], 0),
    ("templates", "list"): (["templates", "list"], 0),
    ("data", "build", "pretrain"): (["data", "build", "pretrain", "--from", "texts", "--out", "pretrain"], 0),
    ("data", "build", "sft"): (["data", "build", "sft", "--from", "chats.jsonl", "--out", "sft"], 0),
    ("data", "build-all"): (["data", "build-all", "--cache-dir", "built", "--only", "roam", "--local", "roam=texts"], 0),
    ("data", "show"): (["data", "show", "pretrain"], 0),
    ("data", "validate"): (["data", "validate", "pretrain"], 0),
}  # fmt: skip

#: Runs each command in a child forked from a process that imported only the CLI, and records
#: its exit and whether torch was imported or its native library mapped into the child.
TORCH_PROBE = """
import json, os, sys
from dlmstore.cli.main import cli
for number, args in enumerate(json.loads(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        try:
            cli(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        else:
            code = 0
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            native = "libtorch" in maps.read()
        with open(f"probe-{number}.json", "w") as out:
            json.dump({"exit": code, "torch": "torch" in sys.modules, "libtorch": native}, out)
        sys.stdout.flush()
        os._exit(0)
    os.waitpid(pid, 0)
"""


@pytest.fixture(scope="module")
def torch_probe(
    tokenizer: Any, session_bases: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Each command of WITHOUT_TORCH run once in a fresh process: its exit, torch imported, libtorch mapped."""
    folder = tmp_path_factory.mktemp("torch-probe")
    home = folder / "home"
    home.mkdir()
    (home / "bases").symlink_to(session_bases, target_is_directory=True)  # converted by `tokenizer`
    (folder / "notes").mkdir()
    (folder / "notes" / "a.md").write_text("Notes to train on.\n", encoding="utf-8")
    write_doc(
        folder / "doc.dlm",
        body="Prose.\n\n::instruction::\n### Q\nWhat?\n### A\nThis.\n",
        frontmatter="training:\n  sources:\n    - path: notes\n",
    )
    (folder / "texts").mkdir()
    for index in range(4):
        (folder / "texts" / f"t{index}.txt").write_text(f"Document {index} of the pretrain set.\n")
    chat = {"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]}
    (folder / "chats.jsonl").write_text(json.dumps(chat) + "\n", encoding="utf-8")
    order = [args for args, _ in WITHOUT_TORCH.values()]
    env = {**os.environ, "DLM_HOME": str(home), "DLM_QUIET": "1"}
    run = subprocess.run(
        [sys.executable, "-c", TORCH_PROBE, json.dumps(order)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    return {
        " ".join(path): (json.loads((folder / f"probe-{number}.json").read_text()), run.stderr)
        for number, path in enumerate(WITHOUT_TORCH)
    }


def test_the_torch_probe_runs_every_command_that_does_not_run_a_model() -> None:
    assert set(WITHOUT_TORCH) == set(leaf_commands()) - RUNS_A_MODEL


@pytest.mark.parametrize("path", list(WITHOUT_TORCH), ids=" ".join)
def test_no_command_that_does_not_run_a_model_loads_torch(
    path: tuple[str, ...], torch_probe: dict[str, Any]
) -> None:
    result, stderr = torch_probe[" ".join(path)]
    assert result == {"exit": WITHOUT_TORCH[path][1], "torch": False, "libtorch": False}, stderr


#: Runs `dlm ARGS...` in a working directory made ``depth`` folders of 200 bytes below ``start``,
#: one relative mkdir and chdir at a time (no path string can name it: it is longer than PATH_MAX);
#: depth -1 runs it in a folder removed after the chdir.
IN_A_DEEP_DIRECTORY = """
import os, sys
from dlmstore.cli.main import cli
os.chdir(sys.argv[1])
depth = int(sys.argv[2])
if depth < 0:
    os.mkdir("gone"); os.chdir("gone"); os.rmdir("../gone")
for _ in range(depth):
    os.mkdir("d" * 200); os.chdir("d" * 200)
cli(sys.argv[3:])
"""

#: 23 folders of 200 bytes: 4,623 bytes below any start, beyond PATH_MAX (4,096) wherever it is.
DEPTH = 23


def _in_deep_directory(start: Path, depth: int, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", IN_A_DEEP_DIRECTORY, str(start), str(depth), *args]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, "DLM_QUIET": "1"})


def test_tokenize_works_from_a_working_directory_longer_than_path_max(tmp_path: Path, tokenizer: Any) -> None:
    doc = write_doc(tmp_path / "doc.dlm", body="Prose from far below.\n")
    run = _in_deep_directory(tmp_path, DEPTH, "tokenize", str(doc), "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["tokenization"]["cache_misses"] == 1


def test_train_from_a_working_directory_longer_than_path_max_says_why_torch_cannot_load(
    tmp_path: Path,
) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    run = _in_deep_directory(tmp_path, DEPTH, "train", str(doc))
    length = len(os.fsencode(tmp_path)) + DEPTH * 201
    assert (run.returncode, run.stdout) == (1, "")
    assert run.stderr == (
        "error: dlm train trains the adapter in torch, and torch's native library (libtorch_cpu.so, through "
        f"Intel oneMKL) cannot load with a working directory of {length:,} bytes, beyond PATH_MAX (4,096)\n"
        "hint: cd to a shorter directory that exists and run the command again\n"
    )


@pytest.mark.parametrize(
    ("command", "needs"),
    [
        (["eval"], "dlm eval runs the base model and the adapter in torch"),
        (["prompt", "Q?"], "dlm prompt --backend transformers runs the base model and the adapter in torch"),
        (["export"], "dlm export merges the adapter into the base model in torch"),
    ],
    ids=lambda value: value[0] if isinstance(value, list) else "",
)
def test_a_command_that_runs_a_model_in_a_removed_working_directory_says_why_torch_cannot_load(
    tmp_path: Path, command: list[str], needs: str
) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    run = _in_deep_directory(tmp_path, -1, command[0], str(doc), *command[1:])
    assert (run.returncode, run.stdout) == (1, "")
    assert run.stderr == (
        f"error: {needs}, and torch's native library (libtorch_cpu.so, through Intel oneMKL) cannot load with "
        "the working directory gone or unreadable (No such file or directory)\n"
        "hint: cd to a shorter directory that exists and run the command again\n"
    )


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
        "template": None,
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

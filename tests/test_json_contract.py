"""Every command's --json prints exactly what docs/json.md promises.

docs/json.md is rendered from ``dlmstore.cli.contract.json_schema`` of the
dataclass each command names (``json_option``); here every command runs
with ``--json`` through ``CliRunner`` on a small store, and its stdout is
validated against that same schema. A new command without ``--json``, a
field added without a description, or output that drifts from its class
fails here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner

from dlmstore.cli.contract import dataclasses_of, field_docs, json_schema, resolve
from dlmstore.cli.main import cli

from .helpers import REPO, write_doc


def _docgen() -> Any:
    spec = importlib.util.spec_from_file_location("docgen", REPO / "scripts" / "docgen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _schemas() -> dict[str, dict[str, Any]]:
    """``dlm ...`` command -> the JSON Schema of what its --json prints."""
    return {command: json_schema(resolve(reference)) for command, reference in _docgen().json_commands()}


BODY = """Caching tokens saves time on the second run.

::instruction::
### Q
What does the cache key include?
### A
The row's content, the tokenizer and the sequence length.

::preference::
### Prompt
Is a cache worth it?
### Chosen
Yes, when most rows do not change between runs.
### Rejected
No.
"""

FRONT = (
    "training:\n  sequence_len: 64\n  max_steps: 1\n  micro_batch_size: 2\n  seed: 7\n"
    "  preference:\n    enabled: false\n"
)


def test_every_command_has_json_naming_a_result_dataclass() -> None:
    commands = _docgen().json_commands()
    assert {command for command, _ in commands} >= {"dlm stores", "dlm stores gc", "dlm cache clear"}
    for _, reference in commands:
        assert dataclasses.is_dataclass(resolve(reference))


def test_every_field_of_every_json_shape_is_described() -> None:
    undescribed = [
        f"{cls.__name__}.{item.name}"
        for _, reference in _docgen().json_commands()
        for cls in dataclasses_of(resolve(reference))
        for item in dataclasses.fields(cls)
        if not field_docs(cls).get(item.name)
    ]
    assert sorted(set(undescribed)) == []


def test_attributes_sections_are_read_with_their_continuation_lines() -> None:
    @dataclasses.dataclass(frozen=True)
    class Shape:
        """A shape.

        Attributes:
            size: How big it is, in bytes,
                counted on disk.
            name (str): What it is called.

        Returns nothing else.
        """

        size: int
        name: str

    assert field_docs(Shape) == {
        "size": "How big it is, in bytes, counted on disk.",
        "name": "What it is called.",
    }


def test_a_field_with_no_json_form_is_refused_when_the_schema_is_built() -> None:
    @dataclasses.dataclass(frozen=True)
    class Pair:
        ends: tuple[int, int]

    with pytest.raises(TypeError, match="has no JSON form"):
        json_schema(Pair)


def test_a_schema_rejects_a_missing_field_an_extra_key_and_a_wrong_type() -> None:
    schema = _schemas()["dlm cache clear"]
    good = {"entries_removed": 1, "bytes_removed": 2, "files_removed": 3}
    jsonschema.validate(good, schema)
    for bad in (
        {"entries_removed": 1, "bytes_removed": 2},
        {**good, "extra": 1},
        {**good, "files_removed": "3"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def _dataset_inputs(root: Path) -> dict[str, Path]:
    (root / "notes").mkdir(parents=True)
    for i in range(4):
        (root / "notes" / f"note{i}.md").write_text(f"# Note {i}\n\nSomething worth remembering, {i}.\n")
    chats = root / "chats.jsonl"
    with open(chats, "w") as out:
        for i in range(6):
            messages = [{"role": "user", "content": f"Ping {i}"}, {"role": "assistant", "content": "Pong"}]
            out.write(json.dumps({"messages": messages}) + "\n")
    return {"notes": root / "notes", "chats": chats}


@pytest.mark.slow
def test_every_command_prints_json_its_schema_validates(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    """One small store, every command with --json, each output checked against its schema."""
    schemas = _schemas()
    runner = CliRunner()
    doc = write_doc(tmp_path / "doc.dlm", body=BODY, frontmatter=f"base_model: {tiny_base}\n" + FRONT)
    inputs = _dataset_inputs(tmp_path / "inputs")
    # its own id: a store is orphaned only when every document that used it is gone
    gone = tmp_path / "gone.dlm"
    gone.write_text(f"---\ndlm_id: 01M8C5YP65PT8FTKM6458WPF7A\nbase_model: {tiny_base}\n---\nSome prose.\n")
    base = str(tiny_base)
    runs = [
        ["init", str(tmp_path / "new.dlm"), "--base-model", base],
        ["init", str(tmp_path / "from-template.dlm"), "--template", "tool-use", "--base-model", base],
        ["templates", "list"],
        ["show", str(doc)],
        ["migrate", str(doc), "--dry-run"],
        ["tokenize", str(doc)],
        ["train", str(doc)],
        ["prompt", str(doc), "What does the cache key include?", "--max-new-tokens", "2"],
        ["eval", str(doc)],
        ["export", str(doc), "--quant", "Q4_K_M"],
        ["metrics", str(doc)],
        ["metrics", str(doc), "--run-id", "2"],
        ["report", str(doc)],
        ["lock", "show", str(doc)],
        ["lock", "diff", str(doc)],
        ["replay", "show", str(doc)],
        ["replay", "prune", str(doc), "--superseded", "--dry-run"],
        ["cache", "show", str(doc)],
        ["cache", "verify", str(doc)],
        ["cache", "prune", str(doc), "--older-than", "30d"],
        ["pack", str(doc), "--adapters", "all", "--include-cache", "--include-exports", "-o",
         str(tmp_path / "doc.dlm.pack")],
        ["verify", str(tmp_path / "doc.dlm.pack")],
        ["unpack", str(tmp_path / "doc.dlm.pack"), "--home", str(tmp_path / "home2"), "--to", str(tmp_path / "there")],
        ["cache", "clear", str(doc), "--force"],
        ["data", "build", "pretrain", "--from", str(inputs["notes"]), "--out", str(tmp_path / "pt"),
         "--base", base, "--val-frac", "0.25"],
        ["data", "build", "sft", "--from", str(inputs["chats"]), "--out", str(tmp_path / "sft"), "--base", base],
        ["data", "validate", str(tmp_path / "pt")],
        ["data", "show", str(tmp_path / "pt")],
        ["data", "build-all", "--cache-dir", str(tmp_path / "all"), "--base", base, "--only", "roam",
         "--local", f"roam={inputs['notes']}"],
        ["stores"],
    ]  # fmt: skip
    ran: set[str] = set()
    for args in runs:
        result = runner.invoke(cli, [*args, "--json"])
        assert result.exit_code == 0, (args, result.output, result.exception)
        command = _command_of(args, schemas)
        jsonschema.validate(json.loads(result.stdout), schemas[command])
        ran.add(command)
    # gc last: a store whose document is gone, removed and printed as a StoreListing
    assert runner.invoke(cli, ["tokenize", str(gone)]).exit_code == 0
    gone.unlink()
    result = runner.invoke(cli, ["stores", "gc", "--force", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    jsonschema.validate(payload, schemas["dlm stores gc"])
    assert [store["document"] for store in payload["removed"]] == [str(gone)]
    ran.add("dlm stores gc")
    assert ran == set(schemas), "a command with --json is not run above: add it"


def _command_of(args: list[str], schemas: dict[str, Any]) -> str:
    """The longest ``dlm ...`` prefix of ``args`` that names a command with --json."""
    words = ["dlm"]
    found = ""
    for arg in args:
        words.append(arg)
        if " ".join(words) in schemas:
            found = " ".join(words)
    assert found, args
    return found

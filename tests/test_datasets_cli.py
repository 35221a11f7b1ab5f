"""`dlm data`: build from local files, build-all offline, validate, show, and the JSON shapes."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli

FINEWEB_OFFLINE = (
    "fineweb-edu: cannot read HuggingFaceFW/fineweb-edu (CC-MAIN-2024-10) from the Hugging Face hub "
    "(HF_HUB_OFFLINE is set): Couldn't reach 'HuggingFaceFW/fineweb-edu' on the Hub (OfflineModeIsEnabled); "
    "point it at local files with --local fineweb-edu=PATH (Parquet/JSONL files with a 'text' field, or text files)"
)


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    """Tiny local copies of every build-all source."""
    root = tmp_path / "inputs"
    (root / "notes").mkdir(parents=True)
    for i in range(5):
        (root / "notes" / f"note{i}.md").write_text(f"# Note {i}\n\nSomething worth remembering, {i}.\n")
    pq.write_table(
        pa.table({"text": [f"Educational page {i} on photosynthesis." for i in range(40)]}),
        root / "fineweb.parquet",
    )
    (root / "wikitext").mkdir()
    for split, title in (("train", "Alpha"), ("validation", "Beta")):
        lines = ["", f" = {title} = \n", f" {title} is a letter . \n"]
        (root / "wikitext" / f"{split}.jsonl").write_text(
            "".join(json.dumps({"text": t}) + "\n" for t in lines)
        )
    with open(root / "dolly.jsonl", "w") as out:
        for i in range(12):
            out.write(
                json.dumps({"instruction": f"Count to {i}.", "context": "", "response": f"{i}."}) + "\n"
            )
    with open(root / "oasst.jsonl", "w") as out:
        for i in range(6):
            out.write(
                json.dumps({"message_id": f"q{i}", "parent_id": None, "role": "prompter", "text": f"Hi {i}"})
                + "\n"
            )
            out.write(
                json.dumps(
                    {
                        "message_id": f"a{i}",
                        "parent_id": f"q{i}",
                        "role": "assistant",
                        "text": "Hello!",
                        "rank": 0,
                    }
                )
                + "\n"
            )
    with open(root / "chats.jsonl", "w") as out:
        for i in range(10):
            messages = [{"role": "user", "content": f"Ping {i}"}, {"role": "assistant", "content": "Pong"}]
            out.write(json.dumps({"messages": messages}) + "\n")
    return root


def test_build_pretrain_from_a_folder_registers_it_and_validate_prints_the_reader(
    runner: CliRunner, inputs: Path, tmp_path: Path
) -> None:
    out = tmp_path / "notes-ds"
    result = runner.invoke(
        cli,
        [
            "data",
            "build",
            "pretrain",
            "--from",
            str(inputs / "notes"),
            "--out",
            str(out),
            "--val-frac",
            "0.2",
            "--shard-bytes",
            "1KiB",
        ],
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"built pretrain dataset notes-ds at {out}")
    assert lines[-1] == f"next:   dlm data validate {out}"
    assert f"store:  {out / 'store.db'} (dataset 1)" in lines
    validated = runner.invoke(cli, ["data", "validate", str(out), "--base", "smollm2-135m"])
    assert validated.exit_code == 0, validated.output
    assert validated.output.startswith(f"ok: {out} (pretrain notes-ds, uint16, ")
    assert f"--data.dataset_path={out / 'train'} --data.file_pattern='shard_*.bin'" in validated.output
    assert "PretrainTokenStreamDataset(" in validated.output


def test_build_sft_json_is_the_build_and_registration_contract(
    runner: CliRunner, inputs: Path, tmp_path: Path
) -> None:
    result = runner.invoke(
        cli,
        [
            "data",
            "build",
            "sft",
            "--from",
            str(inputs / "chats.jsonl"),
            "--out",
            str(tmp_path / "chats"),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {"build", "registered", "uploaded"}
    assert data["uploaded"] is None  # a local --out
    assert set(data["build"]) == {
        "path",
        "kind",
        "name",
        "token_dtype",
        "vocab_size",
        "tokenizer_sha256",
        "seed",
        "splits",
        "skipped",
        "seconds",
        "driver_bytes",
    }
    assert data["build"]["driver_bytes"] is None  # the local engine: no driver
    assert set(data["build"]["splits"]["train"]) == {"tokens", "docs", "files", "bytes"}
    assert data["build"]["splits"]["train"]["docs"] + data["build"]["splits"]["val"]["docs"] == 10
    assert data["registered"]["db_path"] == str(tmp_path / "chats" / "store.db")


def test_validate_lists_each_problem_and_exits_1(runner: CliRunner, inputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    assert (
        runner.invoke(
            cli,
            [
                "data",
                "build",
                "pretrain",
                "--from",
                str(inputs / "notes"),
                "--out",
                str(out),
                "--val-frac",
                "0",
            ],
        ).exit_code
        == 0
    )
    shard = out / "train" / "shard_00000.bin"
    shard.write_bytes(shard.read_bytes()[:-1])
    result = runner.invoke(cli, ["data", "validate", str(out)])
    assert result.exit_code == 1
    assert (
        f"problem: {shard} has {shard.stat().st_size} bytes, not a multiple of 2 (uint16): "
        "the file is cut mid-token" in result.output
    )
    assert f"error: {out}: 1 problem" in result.output


def test_build_all_offline_fails_an_unreachable_source_in_one_line_and_builds_the_others(
    runner: CliRunner, inputs: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    result = runner.invoke(
        cli,
        [
            "data",
            "build-all",
            "--cache-dir",
            str(cache),
            "--only",
            "fineweb-edu",
            "--only",
            "dolly-15k",
            "--local",
            f"dolly-15k={inputs / 'dolly.jsonl'}",
        ],
    )
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert f"fineweb-edu  failed    {FINEWEB_OFFLINE}" in lines
    assert any(line.startswith("dolly-15k    built     train ") for line in lines)
    assert "error: 1 of 6 sources failed: fineweb-edu" in lines
    assert (cache / "sft" / "dolly15k" / "meta.json").is_file()


def test_build_all_on_local_copies_builds_every_source_and_sqlite_lists_the_shards(
    runner: CliRunner, inputs: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    local = {
        "fineweb-edu": "fineweb.parquet",
        "wikitext": "wikitext",
        "roam": "notes",
        "dolly-15k": "dolly.jsonl",
        "oasst1": "oasst.jsonl",
    }
    args = [
        "data",
        "build-all",
        "--cache-dir",
        str(cache),
        "--seed",
        "3",
        "--json",
        "--fineweb-train-tokens",
        "150",
        "--fineweb-val-tokens",
        "30",
        "--shuffle-buffer",
        "8",
    ]
    for name, path in local.items():
        args += ["--local", f"{name}={inputs / path}"]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    status = {s["name"]: s["status"] for s in data["sources"]}
    assert status == {
        "fineweb-edu": "built",
        "wikitext": "built",
        "roam": "built",
        "gutenberg": "not built",
        "dolly-15k": "built",
        "oasst1": "built",
    }
    fineweb = next(s for s in data["sources"] if s["name"] == "fineweb-edu")
    assert 150 <= fineweb["tokens"]["train"] < 200 and fineweb["tokens"]["val"] >= 30
    assert json.loads((cache / "pretrain" / "gutenberg" / "meta.json").read_text())["built"] is False
    assert (
        json.loads((cache / "tokenizer" / "meta.json").read_text())["tokenizer_sha256"]
        == data["tokenizer_sha256"]
    )
    conn = sqlite3.connect(cache / "store.db")
    names = {row[0] for row in conn.execute("SELECT DISTINCT name FROM dataset_split_totals")}
    conn.close()
    assert names == {"fineweb-edu", "wikitext", "roam", "dolly-15k", "oasst1"}
    shown = json.loads(runner.invoke(cli, ["data", "show", str(cache), "--json"]).output)
    assert [d["name"] for d in shown["datasets"]] == [
        "fineweb-edu",
        "gutenberg",
        "roam",
        "wikitext",
        "dolly-15k",
        "oasst1",
    ]
    wikitext = next(d for d in shown["datasets"] if d["name"] == "wikitext")
    assert wikitext["split_rule"] == "the source's own train and validation splits"
    assert wikitext["splits"]["val"]["docs"] == 1


def test_an_unknown_source_name_is_a_usage_error(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["data", "build-all", "--cache-dir", str(tmp_path), "--local", "c4=/x"])
    assert result.exit_code == 2
    assert (
        "unknown source 'c4' (sources: fineweb-edu, wikitext, roam, gutenberg, dolly-15k, oasst1)"
        in result.output
    )


def test_a_size_flag_takes_suffixes_and_rejects_nonsense(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["data", "build-all", "--cache-dir", str(tmp_path), "--shard-bytes", "lots"])
    assert result.exit_code == 2 and "'lots' is not a size such as 5000000, 5M or 128MiB" in result.output


def test_show_on_a_directory_without_datasets_is_an_error(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["data", "show", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output.splitlines()[0] == (
        f"error: {tmp_path} holds no dataset: no meta.json in it or in <kind>/<name>/ below it"
    )


def test_data_help_imports_neither_torch_nor_numpy() -> None:
    code = (
        "import sys; from dlmstore.cli.main import cli\n"
        "try:\n    cli(['data', 'build-all', '--help'])\nexcept SystemExit:\n    pass\n"
        "print([m for m in ('torch', 'numpy', 'transformers', 'datasets', 'ray') if m in sys.modules], file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip() == "[]"

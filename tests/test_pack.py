"""``dlm pack``, ``dlm unpack`` and ``dlm verify``: a store that travels, every member checked.

One store is trained per module on the tiny base (``trained_store``); each
test copies it into its own home, packs it, and unpacks into another home.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli

from .helpers import VALID_ID, export_doc


@pytest.fixture
def doc(tmp_path: Path, tiny_base: Path, trained_store: Path, dlm_home: Path) -> Path:
    """The trained document, with its store copied into this test's home."""
    shutil.copytree(trained_store, dlm_home / "store" / VALID_ID)
    (tmp_path / "project").mkdir()
    return export_doc(tmp_path / "project", tiny_base)


def _dlm(*args: str, home: Path | None = None, code: int = 0) -> Any:
    env = {"DLM_HOME": str(home)} if home is not None else {}
    result = CliRunner().invoke(cli, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        traceback.print_exception(result.exception)
    assert result.exit_code == code, result.output
    return result


def _json(*args: str, home: Path | None = None) -> Any:
    return json.loads(_dlm(*args, "--json", home=home).stdout)


def _other_home(tmp_path: Path, dlm_home: Path) -> Path:
    home = tmp_path / "other-home"
    home.mkdir()
    (home / "bases").symlink_to((dlm_home / "bases").resolve(), target_is_directory=True)
    return home


def test_a_pack_unpacked_into_a_fresh_home_answers_as_the_original(
    doc: Path, tmp_path: Path, dlm_home: Path
) -> None:
    packed = _json("pack", str(doc))
    assert packed["path"] == str(doc) + ".pack" and packed["adapters"] == [1]
    home = _other_home(tmp_path, dlm_home)
    installed = _json("unpack", packed["path"], "--home", str(home), "--to", str(tmp_path / "elsewhere"))
    moved = Path(installed["document"])
    assert moved == tmp_path / "elsewhere" / doc.name and moved.read_bytes() == doc.read_bytes()
    assert installed["store"] == str(home / "store" / VALID_ID) and installed["adapters"] == [1]
    question = "Where is the metadata kept?"
    here = _json("prompt", str(doc), question, "--max-new-tokens", "8")
    there = _json("prompt", str(moved), question, "--max-new-tokens", "8", home=home)
    assert there["answer"] == here["answer"]
    with sqlite3.connect(home / "store" / VALID_ID / "store.db") as conn:
        paths = [row[0] for row in conn.execute("SELECT path FROM document_paths")]
    assert paths == [str(moved.resolve())]


def test_the_pack_of_an_unchanged_store_is_the_same_bytes_every_time(doc: Path, tmp_path: Path) -> None:
    first = _json("pack", str(doc), "-o", str(tmp_path / "one.dlm.pack"))
    second = _json("pack", str(doc), "-o", str(tmp_path / "two.dlm.pack"))
    assert first["sha256"] == second["sha256"]
    assert (tmp_path / "one.dlm.pack").read_bytes() == (tmp_path / "two.dlm.pack").read_bytes()


def test_verify_checks_every_member_and_the_adapter_against_store_db(doc: Path) -> None:
    packed = _json("pack", str(doc))
    report = _json("verify", packed["path"])
    assert report["ok"] and report["document_matches"] is True
    assert [a["version"] for a in report["adapters"]] == [1] and report["signed_by"] is None


def _self_contained(folder: Path, tiny_base: Path) -> Path:
    """A document whose base (``./tiny``) and sources (``./notes``) lie beside it."""
    folder.mkdir(parents=True)
    shutil.copytree(tiny_base, folder / "tiny")
    notes = folder / "notes"
    (notes / "deep").mkdir(parents=True)
    (notes / "a.md").write_text("The store keeps its metadata in one SQLite file.\n", encoding="utf-8")
    (notes / "deep" / "b.txt").write_text("Adapters are published before their rows.\n", encoding="utf-8")
    doc = export_doc(folder, tiny_base)
    text = doc.read_text(encoding="utf-8").replace(f"base_model: {tiny_base}", "base_model: ./tiny")
    text = text.replace("training:\n", "training:\n  sources:\n    - path: ./notes\n", 1)
    doc.write_text(text, encoding="utf-8")
    return doc


@pytest.mark.slow
def test_verify_retrain_reproduces_the_packed_adapter_from_its_packed_sources_and_base(
    tmp_path: Path, tiny_base: Path, dlm_home: Path
) -> None:
    doc = _self_contained(tmp_path / "project", tiny_base)
    trained = _json("train", str(doc))
    packed = _json("pack", str(doc), "--include-sources", "--include-base")
    assert packed["sources"] == 2 and packed["base"] == "./tiny"
    report = _json("verify", packed["path"], "--retrain")
    assert report["ok"] and report["retrain"]["reproduced"]
    assert report["retrain"]["sha256"] == trained["adapter_sha256"] == report["retrain"]["packed_sha256"]
    plain = _json("pack", str(doc), "-o", str(tmp_path / "plain.dlm.pack"))
    assert _dlm("verify", plain["path"], "--retrain", code=1).output == (
        "error: the pack carries no training.sources files, so --retrain cannot train what was trained\n"
        "hint: verify a pack made with --include-sources (and --include-base)\n"
    )
    home = _other_home(tmp_path, dlm_home)
    to = tmp_path / "colleague"
    installed = _json("unpack", packed["path"], "--home", str(home), "--to", str(to))
    assert installed["files_written"] == 1 + 2 + len(
        [p for p in (doc.parent / "tiny").rglob("*") if p.is_file()]
    )
    assert (to / "notes" / "deep" / "b.txt").read_bytes() == (
        doc.parent / "notes" / "deep" / "b.txt"
    ).read_bytes()
    assert _json("show", str(to / doc.name), home=home)["dlm_id"] == VALID_ID


@pytest.mark.parametrize("with_cache", [False, True])
def test_the_token_cache_travels_only_with_include_cache(
    doc: Path, tmp_path: Path, dlm_home: Path, with_cache: bool
) -> None:
    flags = ["--include-cache"] if with_cache else []
    packed = _json("pack", str(doc), *flags)
    home = _other_home(tmp_path, dlm_home)
    installed = _json("unpack", packed["path"], "--home", str(home), "--to", str(tmp_path / "there"))
    verified = _json("cache", "verify", installed["document"], home=home)
    assert verified["problems"] == [] and (verified["entries_checked"] > 0) == with_cache
    summary = _json("tokenize", installed["document"], home=home)
    event = summary["tokenization"]
    assert (event["cache_hits"] > 0, event["cache_misses"] == 0) == (with_cache, with_cache)


def test_adapters_all_carries_every_version_and_newest_only_the_last(
    doc: Path, tmp_path: Path, dlm_home: Path
) -> None:
    _dlm("train", str(doc))  # v0002 beside the trained store's v0001
    newest = _json("pack", str(doc), "-o", str(tmp_path / "newest.dlm.pack"))
    every = _json("pack", str(doc), "--adapters", "all", "-o", str(tmp_path / "all.dlm.pack"))
    chosen = _json("pack", str(doc), "--adapters", "v1", "-o", str(tmp_path / "v1.dlm.pack"))
    assert (newest["adapters"], every["adapters"], chosen["adapters"]) == ([2], [1, 2], [1])
    home = _other_home(tmp_path, dlm_home)
    installed = _json("unpack", newest["path"], "--home", str(home), "--to", str(tmp_path / "there"))
    left_out = home / "store" / VALID_ID / "adapter" / "versions" / "v0001"
    assert _dlm("eval", installed["document"], "--adapter", "1", home=home, code=1).output.startswith(
        f"error: adapter v0001: its folder {left_out} is not there (removed, or left out of the pack this "
        "store was unpacked from: `dlm pack --adapters` chooses the versions a pack carries)\n"
    )
    assert _dlm("pack", str(doc), "--adapters", "v7", "-o", str(tmp_path / "x"), code=1).output == (
        "error: --adapters: the store has no adapter v0007 (it has v0001, v0002)\n"
    )
    assert not (tmp_path / "x").exists()

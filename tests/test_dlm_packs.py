"""Packs written by DocumentLanguageModel: `dlm unpack` checks them and installs a dlmstore store.

The packs are laid out by ``dlm_packs.py`` from DLM's source; the adapter
they carry is the tiny base's, trained by dlmstore once per module
(``trained_store``): DLM saves its adapters with PEFT as dlmstore does.
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
from dlmstore.document.rows import section_rows
from dlmstore.document.sections import Section

from .dlm_packs import dlm_pack_members, write_dlm_pack
from .helpers import VALID_ID, export_doc

#: Sections an earlier version of the document held, and one it still holds.
REMOVED = [
    ("instruction", f"### Q\nWhat was the store called in version {n}?\n### A\nThe notebook {n}.")
    for n in range(4)
]
KEPT = ("instruction", "### Q\nWhere is the metadata kept?\n### A\nIn store.db, beside the token blobs.")


def _dlm(*args: str, code: int = 0) -> Any:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == code, result.output
    return result


@pytest.fixture
def members(tmp_path: Path, tiny_base: Path, trained_store: Path) -> dict[str, bytes]:
    (tmp_path / "made-by-dlm").mkdir()
    document = export_doc(tmp_path / "made-by-dlm", tiny_base)
    adapter = trained_store / "adapter" / "versions" / "v0001"
    return dlm_pack_members(
        document, dlm_id=VALID_ID, base_model=str(tiny_base), adapters={1: adapter}, sections=[KEPT, *REMOVED]
    )


def test_a_dlm_pack_installs_its_adapter_and_its_replay_corpus_as_history(
    tmp_path: Path, members: dict[str, bytes], trained_store: Path, dlm_home: Path
) -> None:
    pack = write_dlm_pack(tmp_path / "doc.dlm.pack", members)
    result = _dlm("unpack", str(pack), "--to", str(tmp_path / "here"), "--json")
    installed = json.loads(result.stdout)
    assert installed["format"] == "dlm" and installed["adapters"] == [1]
    assert installed["notes"] == [
        "from DLM's pack, not carried over: DLM's dlm.lock (the next dlm train writes dlmstore's), optimizer "
        "state (training_state.pt), the replay corpus's timestamps (its sections are one generation of history here)"
    ]
    document = installed["document"]
    with sqlite3.connect(dlm_home / "store" / VALID_ID / "store.db") as conn:
        runs = conn.execute("SELECT command, status, dlmstore_version, dlm_path FROM runs").fetchall()
        adapter = conn.execute("SELECT version, sha256 FROM adapters").fetchone()
    assert runs == [("train", "completed", "DocumentLanguageModel 0.9.4", document)]
    assert adapter == (1, next(iter(_adapter_sha(trained_store))))
    replay = json.loads(_dlm("replay", "show", document, "--json").stdout)
    # Every row of the corpus is history; the removed pairs are candidates but the one the
    # retention slice took; the pair the document still holds is not.
    assert replay["history_rows"] == 5 and replay["retention_rows"] == 1
    removed = {row.row_key for kind, text in REMOVED for row in section_rows(Section(kind, text))}
    candidates = {candidate["row_key"] for candidate in replay["candidates"]}
    assert len(candidates) == 3 and candidates < removed
    answer = json.loads(
        _dlm("prompt", document, "Where is the metadata kept?", "--max-new-tokens", "6", "--json").stdout
    )
    shutil.rmtree(dlm_home / "store" / VALID_ID)
    shutil.copytree(trained_store, dlm_home / "store" / VALID_ID)
    original = json.loads(
        _dlm("prompt", document, "Where is the metadata kept?", "--max-new-tokens", "6", "--json").stdout
    )
    assert answer["answer"] == original["answer"]


def _adapter_sha(store: Path) -> list[str]:
    with sqlite3.connect(store / "store.db") as conn:
        return [row[0] for row in conn.execute("SELECT sha256 FROM adapters WHERE version = 1")]


def test_a_dlm_pack_whose_manifest_names_another_document_is_refused(
    tmp_path: Path, members: dict[str, bytes], dlm_home: Path
) -> None:
    manifest = json.loads(members["manifest.json"])
    manifest["dlm_id"] = "01M8HHSDSRXJ33QF518TVHA9KD"  # DLM does not checksum its manifest
    members["manifest.json"] = json.dumps(manifest).encode()
    pack = write_dlm_pack(tmp_path / "doc.dlm.pack", members)
    assert _dlm("unpack", str(pack), "--to", str(tmp_path / "here"), code=1).output == (
        f"error: pack member manifest.json says dlm_id 01M8HHSDSRXJ33QF518TVHA9KD, but the packed document "
        f"declares {VALID_ID}: refused (the manifest was swapped)\n"
    )
    assert not (tmp_path / "here").exists() and [p.name for p in (dlm_home / "store").iterdir()] == []


@pytest.mark.parametrize("change", ["damaged", "extra", "missing"])
def test_a_dlm_pack_with_a_member_damaged_extra_or_missing_is_refused(
    tmp_path: Path, members: dict[str, bytes], dlm_home: Path, change: str
) -> None:
    name = "store/adapter/versions/v0001/adapter_config.json"
    if change == "damaged":
        members[name] = members[name].replace(b"{", b"{ ", 1)
    elif change == "extra":
        members["store/extra.bin"] = b"not listed"
    else:
        del members[name]
    pack = write_dlm_pack(tmp_path / "doc.dlm.pack", members)
    said = _dlm("unpack", str(pack), "--to", str(tmp_path / "here"), code=1).output
    expected = {
        "damaged": f"error: pack member {name} is damaged",
        "extra": "error: pack member store/extra.bin is not listed in CHECKSUMS.sha256",
        "missing": f"error: pack member {name} is listed in CHECKSUMS.sha256 but missing",
    }[change]
    assert said.startswith(expected) and said.count("\n") == 1
    assert not (tmp_path / "here").exists() and [p.name for p in (dlm_home / "store").iterdir()] == []


def test_a_dlm_pack_of_a_newer_format_is_refused(tmp_path: Path, members: dict[str, bytes]) -> None:
    header = json.loads(members["PACK_HEADER.json"])
    header["pack_format_version"] = 2
    members["PACK_HEADER.json"] = json.dumps(header).encode()
    pack = write_dlm_pack(tmp_path / "doc.dlm.pack", members)
    assert _dlm("unpack", str(pack), code=1).output == (
        "error: the pack's format is 2, newer than the 1 this dlmstore reads\nhint: upgrade dlmstore to unpack it\n"
    )

"""Packs written by DocumentLanguageModel: read, checked, and installed as a dlmstore store.

The packs are laid out by ``dlm_packs.py`` from DLM's source; their two
adapter versions are LoRAs made by peft on the tiny base (DLM saves its
adapters with PEFT), with DLM's optimizer state and sidecars beside them.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import warnings
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.document.rows import section_rows
from dlmstore.document.sections import Section
from dlmstore.errors import PackError
from dlmstore.pack.archive import extract
from dlmstore.pack.dlm_layout import DlmPack, build_store, is_dlm_layout, read_dlm_pack

from .dlm_packs import DLM_VERSION, dlm_adapter, dlm_pack_members, section_id, write_dlm_pack
from .helpers import VALID_ID, export_doc

#: Sections an earlier version of the document held, and one it still holds.
REMOVED = [
    ("instruction", f"### Q\nWhat was the store called in version {n}?\n### A\nThe notebook {n}.")
    for n in range(4)
]
KEPT = ("instruction", "### Q\nWhere is the metadata kept?\n### A\nIn store.db, beside the token blobs.")
#: What the store does not take from the packs ``members`` makes, as the note names it.
LEFT = (
    "optimizer state (training_state.pt), DLM's dlm.lock (the next dlm train writes dlmstore's), "
    "DLM's adapter sidecars (pinned_versions.json, training_run.json, training_state.rng.json), "
    "the replay corpus's timestamps (its sections are one generation of history here)"
)
QUESTION = "Where is the metadata kept?"


def _dlm(*args: str, code: int = 0) -> Any:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == code, result.output
    return result


@pytest.fixture(scope="module")
def adapters(tiny_base: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Versions 1 and 2 as DLM's trainer leaves them, two LoRAs on the tiny base."""
    return {
        version: dlm_adapter(tiny_base, tmp_path_factory.mktemp(f"v{version}"), seed=version)
        for version in (1, 2)
    }


@pytest.fixture
def members(tmp_path: Path, tiny_base: Path, adapters: dict[int, Path]) -> dict[str, bytes]:
    (tmp_path / "made-by-dlm").mkdir()
    document = export_doc(tmp_path / "made-by-dlm", tiny_base)
    return dlm_pack_members(
        document, dlm_id=VALID_ID, base_model=str(tiny_base), adapters=adapters, sections=[KEPT, *REMOVED]
    )


def _read(tmp_path: Path, members: dict[str, bytes]) -> DlmPack:
    """The pack ``members`` make, written as DLM does, extracted as ``dlm unpack`` does, then read."""
    staging = tmp_path / "staging"
    staging.mkdir()
    extracted = extract(write_dlm_pack(tmp_path / "doc.dlm.pack", members), staging)
    return read_dlm_pack(staging, extracted.checksums)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_dlm_pack_reads_back_its_document_adapters_runs_and_replay_corpus(
    tmp_path: Path, members: dict[str, bytes]
) -> None:
    header = json.loads(members["PACK_HEADER.json"])
    assert is_dlm_layout(header) and not is_dlm_layout({**header, "tool": "dlmstore"})
    pack = _read(tmp_path, members)
    assert (pack.dlm_id, pack.document.name, pack.tool_version) == (VALID_ID, "doc.dlm", DLM_VERSION)
    assert pack.document.read_bytes() == members["dlm/doc.dlm"]
    assert pack.packed_at == "2026-03-01T12:00:00" and pack.adapter_versions == (1, 2)
    assert {version: run["steps"] for version, run in pack.runs.items()} == {1: 3, 2: 3}
    # index.json is sorted by section id, and the sections come back in its order
    assert pack.sections == tuple(sorted([KEPT, *REMOVED], key=lambda section: section_id(*section)))
    assert ", ".join(pack.left) == LEFT


def test_build_store_gives_a_store_whose_adapters_verify_and_whose_history_holds_the_corpus_rows(
    tmp_path: Path, members: dict[str, bytes]
) -> None:
    from dlmstore.replay.history import read_rows
    from dlmstore.store.database import open_store_at
    from dlmstore.train.adapters import checked_folder, find_version, latest

    pack = _read(tmp_path, members)
    folder = tmp_path / "store"
    folder.mkdir()
    assert build_store(pack, folder, tmp_path / "doc.dlm") == [f"from DLM's pack, not carried over: {LEFT}"]
    with open_store_at(folder, VALID_ID) as store:
        for version in (1, 2):
            adapter = find_version(store, version)
            assert adapter is not None and (adapter.phase, adapter.steps, adapter.final_loss) == (
                "sft",
                3,
                1.25,
            )
            weights = members[f"store/adapter/versions/v{version:04d}/adapter_model.safetensors"]
            assert adapter.sha256 == "sha256:" + _sha256(weights) and adapter.bytes == len(weights)
            kept = checked_folder(store, adapter)
            assert sorted(path.name for path in kept.iterdir()) == [
                "README.md", "adapter_config.json", "adapter_model.safetensors", "chat_template.jinja",
                "tokenizer.json", "tokenizer_config.json",
            ]  # fmt: skip
        assert latest(store) == find_version(store, 2)
        with store.read() as conn:
            runs = [tuple(row) for row in conn.execute(
                "SELECT id, command, status, started_at, finished_at, dlmstore_version, dlm_path FROM runs"
            )]  # fmt: skip
            rows = read_rows(conn)
    stamp = "2026-03-01T12:00:00.000Z"
    assert runs == [
        (
            run,
            "train",
            "completed",
            stamp,
            stamp,
            f"DocumentLanguageModel {DLM_VERSION}",
            str(tmp_path / "doc.dlm"),
        )
        for run in (1, 2)
    ]
    expected = {
        row.row_key: row.data for kind, text in [KEPT, *REMOVED] for row in section_rows(Section(kind, text))
    }
    assert {row.row_key: row.data for row in rows} == expected
    assert {(row.first_run_id, row.last_run_id, row.origin) for row in rows} == {(2, 2, "body")}
    assert (folder / "high-water.json").is_file()


def test_a_dlm_pack_unpacks_and_prompt_answers_with_its_newest_adapter(
    tmp_path: Path, members: dict[str, bytes], tiny_base: Path, adapters: dict[int, Path], dlm_home: Path
) -> None:
    pack = write_dlm_pack(tmp_path / "doc.dlm.pack", members)
    installed = json.loads(_dlm("unpack", str(pack), "--to", str(tmp_path / "here"), "--json").stdout)
    assert (installed["format"], installed["adapters"], installed["dlm_id"]) == ("dlm", [1, 2], VALID_ID)
    assert installed["notes"] == [f"from DLM's pack, not carried over: {LEFT}"]
    document = installed["document"]
    assert Path(document).read_bytes() == members["dlm/doc.dlm"]
    with sqlite3.connect(dlm_home / "store" / VALID_ID / "store.db") as conn:
        paths = {row[0] for row in conn.execute("SELECT dlm_path FROM runs")}
    assert paths == {document}
    replay = json.loads(_dlm("replay", "show", document, "--json").stdout)
    # Every row of the corpus is history; the removed pairs are candidates but the one the
    # retention slice took; the pair the document still holds is not.
    assert replay["history_rows"] == 5 and replay["retention_rows"] == 1
    removed = {row.row_key for kind, text in REMOVED for row in section_rows(Section(kind, text))}
    candidates = {candidate["row_key"] for candidate in replay["candidates"]}
    assert len(candidates) == 3 and candidates < removed
    answer = json.loads(_dlm("prompt", document, QUESTION, "--max-new-tokens", "6", "--json").stdout)
    assert answer["adapter_version"] == 2
    assert answer["adapter_sha256"] == "sha256:" + _sha256(
        (adapters[2] / "adapter_model.safetensors").read_bytes()
    )
    # peft's answer with the packed folder itself, and the base's without it
    assert answer["answer"] == _greedy(tiny_base, adapters[2]) != _greedy(tiny_base, None)


def _greedy(base: Path, adapter: Path | None) -> str:
    """What ``dlm prompt`` asks (the document's system prompt, then QUESTION), answered greedily in 6 tokens."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    model: Any = AutoModelForCausalLM.from_pretrained(base)
    if adapter is not None:
        with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
            warnings.filterwarnings("ignore", category=FutureWarning)
            model = PeftModel.from_pretrained(model, str(adapter))
    messages = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": QUESTION}]
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        output = model.eval().generate(
            **inputs,
            max_new_tokens=6,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
    return str(tokenizer.decode(output[0][inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip())


def test_what_a_dlm_pack_holds_that_the_store_cannot_take_is_named_in_one_note(
    tmp_path: Path, tiny_base: Path, adapters: dict[int, Path]
) -> None:
    extra = {
        "store/exports/Q8_0/adapter.gguf": b"gguf", "store/logs/train-20260301-120000.log": b"log",
        "store/adapter/current.txt": b"adapter/versions/v0001\n", "store/tokenized-cache/abc.npz": b"cache",
    }  # fmt: skip
    document = export_doc(tmp_path, tiny_base)
    members = dlm_pack_members(
        document, dlm_id=VALID_ID, base_model=str(tiny_base), adapters=adapters, sections=[KEPT], extra=extra
    )
    pack = _read(tmp_path, members)
    assert pack.left == (
        "adapter/current.txt's choice of version (dlmstore answers with the newest, adapter/versions/v0002)",
        "optimizer state (training_state.pt)",
        "DLM's dlm.lock (the next dlm train writes dlmstore's)",
        "exports",
        "run logs",
        "DLM's tokenized-section cache",
        "DLM's adapter sidecars (pinned_versions.json, training_run.json, training_state.rng.json)",
        "the replay corpus's timestamps (its sections are one generation of history here)",
    )


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


@pytest.mark.parametrize("field", ["entries", "content_sha256"])
def test_a_dlm_pack_whose_manifest_disagrees_with_its_members_is_refused(
    tmp_path: Path, members: dict[str, bytes], field: str
) -> None:
    manifest = json.loads(members["manifest.json"])
    if field == "entries":
        manifest["entries"]["dlm/doc.dlm"] += 1
    else:
        manifest["content_sha256"] = "0" * 64
    members["manifest.json"] = json.dumps(manifest).encode()
    with pytest.raises(PackError) as refused:
        _read(tmp_path, members)
    assert (
        str(refused.value)
        == {
            "entries": "pack member manifest.json disagrees with member dlm/doc.dlm: the pack is damaged",
            "content_sha256": "pack member manifest.json disagrees with the members' content_sha256: the pack is damaged",
        }[field]
    )


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
    with pytest.raises(PackError, match="^the pack's format is 2, newer than the 1 this dlmstore reads$"):
        _read(tmp_path, members)

"""Packs laid out as DocumentLanguageModel writes them (pack format 1), for the tests that read them.

Written from DLM's source, never by running DLM:

* the pack (``src/dlm/pack/packer.py``, ``integrity.py``, ``format.py``):
  a zstd-10 tar of the staging folder's entries, folders too, in the order
  ``sorted(staging.rglob("*"))`` gives (by path parts), mtime, uid and gid
  zeroed, mode 0644/0755; ``CHECKSUMS.sha256`` over every file but itself
  and ``manifest.json``; ``content_sha256`` DLM's rollup over those but the
  header; header and manifest as pydantic's ``model_dump_json(indent=2)``;
* the store (``src/dlm/store/layout.py``, ``manifest.py``, ``lock/writer.py``):
  ``manifest.json`` and ``dlm.lock`` as sorted JSON, ``adapter/current.txt``
  pointing at the newest version, each ``adapter/versions/vNNNN/`` as DLM's
  trainer leaves it (``train/trainer.py`` ``_write_checkpoint``: PEFT's
  ``save_pretrained`` plus the tokenizer, then ``train/state_sidecar.py``'s
  optimizer state and its sidecars);
* the replay corpus (``src/dlm/replay/corpus.py``, ``index.py``,
  ``models.py``, ``doc/sections.py``): one zstd-3 frame of canonical CBOR
  per section snapshot, appended in order; ``index.json`` sorted by section
  id, whose ``section_id`` is ``sha256(type "\\n" content)[:16]``.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import warnings
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

STAMP = datetime(2026, 3, 1, 12, 0, 0)
#: The DLM version the packs say wrote them.
DLM_VERSION = "0.9.4"


def _json(value: Any, *, sort_keys: bool = False) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=sort_keys, ensure_ascii=False) + "\n").encode()


def dlm_adapter(base: Path, folder: Path, *, seed: int) -> Path:
    """An adapter version folder as DLM's trainer writes it, a LoRA on ``base`` made by peft.

    The LoRA's B matrices are random too (``init_lora_weights=False``), so
    the adapter changes what the base answers.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
        init_lora_weights=False,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)  # peft reads a deprecated transformers flag
        torch.manual_seed(seed)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), config)
        rng = torch.get_rng_state()
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    pinned = {"peft": "0.13.2", "torch": "2.5.1", "transformers": "4.46.3", "trl": "0.12.1"}
    state = {
        "_state_sidecar_version": 2, "optimizer_state_dict": {"state": {}, "param_groups": [{"lr": 2e-4}]},
        "scheduler_state_dict": {"last_epoch": 3}, "scaler_state_dict": None, "torch_rng_state": rng,
        "cuda_rng_state": None, "global_step": 3, "epoch": 1.0, "best_val_loss": None,
        "dlm_manifest_hash": "0" * 64, "base_model_revision": None, "pinned_versions": pinned, "use_qlora": False,
    }  # fmt: skip
    buffer = io.BytesIO()
    torch.save(state, buffer)
    (folder / "training_state.pt").write_bytes(buffer.getvalue())
    (folder / "training_state.pt.sha256").write_text(hashlib.sha256(buffer.getvalue()).hexdigest() + "\n")
    rng_sidecar = {"_rng_sidecar_version": 2, "numpy_rng_state": None, "python_random_state": None}
    (folder / "training_state.rng.json").write_bytes(_json(rng_sidecar))
    (folder / "pinned_versions.json").write_bytes(_json(pinned, sort_keys=True))
    (folder / "training_run.json").write_bytes(_json({"use_qlora": False}))
    return folder


def section_id(kind: str, content: str) -> str:
    """DLM's section id (``doc/sections.py``) of a section whose content is already LF-only."""
    return hashlib.sha256(f"{kind}\n{content}".encode()).hexdigest()[:16]


def replay_corpus(sections: Sequence[tuple[str, str]]) -> tuple[bytes, bytes]:
    """``corpus.zst`` and ``index.json`` holding ``sections`` (type, content), appended in order."""
    import cbor2
    import zstandard

    corpus = b""
    index = []
    for kind, content in sections:
        snapshot = {
            "section_id": section_id(kind, content), "section_type": kind, "content": content,
            "auto_mined": False, "first_seen_at": STAMP, "last_seen_at": STAMP, "training_runs_seen": [1],
        }  # fmt: skip
        frame = zstandard.ZstdCompressor(level=3).compress(
            cbor2.dumps(snapshot, timezone=UTC, canonical=True)
        )
        index.append({"section_id": snapshot["section_id"], "byte_offset": len(corpus), "length": len(frame),
                      "added_at": STAMP.isoformat(), "weight": 1.0})  # fmt: skip
        corpus += frame
    index.sort(key=lambda entry: str(entry["section_id"]))
    return corpus, (json.dumps(index, sort_keys=True, indent=2) + "\n").encode()


def dlm_pack_members(
    document: Path,
    *,
    dlm_id: str,
    base_model: str,
    adapters: Mapping[int, Path],
    sections: Sequence[tuple[str, str]] = (),
    training_state: bool = True,
    extra: Mapping[str, bytes] | None = None,
) -> dict[str, bytes]:
    """Every member of DLM's pack of ``document``, by name (the header, manifest and checksums included).

    ``adapters``: version -> a folder made by :func:`dlm_adapter`;
    ``training_state``: the store also holds a ``training_state.pt`` (and its
    sha256) beside ``adapter/``, as the store layout documents it;
    ``extra``: more members (exports, logs, ...), checksummed like the rest.
    """
    files: dict[str, bytes] = {f"dlm/{document.name}": document.read_bytes()}
    newest = max(adapters, default=0)
    runs = [
        {"run_id": version, "started_at": STAMP.isoformat(), "ended_at": STAMP.isoformat(),
         "adapter_version": version, "seed": 42, "steps": 3, "final_train_loss": 1.25, "status": "completed"}
        for version in sorted(adapters)
    ]  # fmt: skip
    store_manifest = {
        "dlm_id": dlm_id, "schema_version": 1, "created_at": STAMP.isoformat(), "updated_at": STAMP.isoformat(),
        "base_model": base_model, "adapter_version": newest, "training_runs": runs, "exports": [],
        "content_hashes": {}, "pinned_versions": {},
    }  # fmt: skip
    files["store/manifest.json"] = _json(store_manifest, sort_keys=True)
    lock = {
        "lock_version": 1, "created_at": STAMP.isoformat(), "dlm_id": dlm_id,
        "dlm_sha256": hashlib.sha256(files[f"dlm/{document.name}"]).hexdigest(), "base_model_revision": "local",
        "hardware_tier": "cpu", "seed": 42, "determinism_class": "best-effort", "last_run_id": max(newest, 1),
    }  # fmt: skip
    files["store/dlm.lock"] = _json(lock, sort_keys=True)
    if training_state:
        files["store/training_state.pt"] = b"\x80\x02optimizer state"
        files["store/training_state.pt.sha256"] = (
            hashlib.sha256(b"\x80\x02optimizer state").hexdigest().encode()
        )
    for version, folder in adapters.items():
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                relpath = path.relative_to(folder).as_posix()
                files[f"store/adapter/versions/v{version:04d}/{relpath}"] = path.read_bytes()
    if adapters:
        files["store/adapter/current.txt"] = f"adapter/versions/v{newest:04d}\n".encode()
    if sections:
        files["store/replay/corpus.zst"], files["store/replay/index.json"] = replay_corpus(sections)
    files.update(extra or {})
    header = {"pack_format_version": 1, "created_at": STAMP.isoformat(), "tool_version": DLM_VERSION,
              "content_type": "minimal", "platform_hint": "linux-cpu", "licensee_acceptance_url": None}  # fmt: skip
    files["PACK_HEADER.json"] = _json(header)
    sums = {name: hashlib.sha256(files[name]).hexdigest() for name in sorted(files)}
    files["CHECKSUMS.sha256"] = "".join(f"{digest}  {name}\n" for name, digest in sums.items()).encode()
    content = {name: digest for name, digest in sums.items() if name != "PACK_HEADER.json"}
    rollup = hashlib.sha256(
        "".join(f"{name}\n{content[name]}\n" for name in sorted(content)).encode()
    ).hexdigest()
    manifest = {"dlm_id": dlm_id, "base_model": base_model, "base_model_revision": None, "base_model_sha256": None,
                "adapter_version": newest, "entries": {name: len(files[name]) for name in sums},
                "content_sha256": rollup}  # fmt: skip
    files["manifest.json"] = _json(manifest)
    return files


def write_dlm_pack(path: Path, members: Mapping[str, bytes]) -> Path:
    """``members`` as DLM's packer writes them: a tar of every entry, folders too, through zstd 10."""
    import zstandard

    folders = {"/".join(name.split("/")[:i]) for name in members for i in range(1, name.count("/") + 1)}
    # DLM tars `sorted(staging.rglob("*"))`: paths compare part by part, not as strings.
    names = sorted([*members, *folders], key=lambda name: PurePosixPath(name).parts)
    with open(path, "wb") as out, zstandard.ZstdCompressor(level=10).stream_writer(out) as stream:
        with tarfile.open(fileobj=stream, mode="w|") as tar:
            for name in names:
                info = tarfile.TarInfo(name)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                if name in members:
                    info.size, info.mode = len(members[name]), 0o644
                    tar.addfile(info, io.BytesIO(members[name]))
                else:
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
    return path

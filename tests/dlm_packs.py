"""Packs laid out as DocumentLanguageModel writes them (pack format 1), for the tests that read them.

Written from DLM's source (``src/dlm/pack/packer.py``, ``integrity.py``,
``format.py``, ``src/dlm/replay/corpus.py``, ``index.py``, ``models.py``,
``src/dlm/store/manifest.py``), never by running DLM: a zstd-10 tar of
sorted entries with mtime, uid and gid zeroed; ``CHECKSUMS.sha256`` over
every file but itself and ``manifest.json``; ``content_sha256`` DLM's
rollup over those but the header; the replay corpus one zstd-3 frame of
canonical CBOR per section snapshot, its index sorted by section id.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

STAMP = datetime(2026, 3, 1, 12, 0, 0)


def _corpus(sections: list[tuple[str, str]]) -> tuple[bytes, bytes]:
    """``corpus.zst`` and ``index.json`` holding ``sections`` (type, content)."""
    import cbor2
    import zstandard

    corpus = b""
    index = []
    for kind, content in sections:
        section_id = hashlib.sha256(f"{kind}\n{content}".encode()).hexdigest()[:16]
        snapshot = {
            "section_id": section_id, "section_type": kind, "content": content, "auto_mined": False,
            "first_seen_at": STAMP, "last_seen_at": STAMP, "training_runs_seen": [1],
        }  # fmt: skip
        frame = zstandard.ZstdCompressor(level=3).compress(
            cbor2.dumps(snapshot, timezone=UTC, canonical=True)
        )
        index.append({"section_id": section_id, "byte_offset": len(corpus), "length": len(frame),
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
    sections: list[tuple[str, str]] = (),  # type: ignore[assignment]
) -> dict[str, bytes]:
    """Every member of DLM's pack of ``document``, by name (the header, manifest and checksums included)."""
    files: dict[str, bytes] = {f"dlm/{document.name}": document.read_bytes()}
    runs = [
        {"run_id": version, "started_at": STAMP.isoformat(), "ended_at": STAMP.isoformat(),
         "adapter_version": version, "seed": 42, "steps": 3, "final_train_loss": 1.25}
        for version in sorted(adapters)
    ]  # fmt: skip
    store_manifest = {
        "dlm_id": dlm_id, "schema_version": 1, "created_at": STAMP.isoformat(), "updated_at": STAMP.isoformat(),
        "base_model": base_model, "adapter_version": max(adapters, default=0), "training_runs": runs,
        "exports": [],
    }  # fmt: skip
    files["store/manifest.json"] = json.dumps(store_manifest, indent=2).encode()
    files["store/dlm.lock"] = json.dumps({"lock_version": 1, "dlm_id": dlm_id}).encode()
    files["store/training_state.pt"] = b"\x80\x02optimizer state"
    for version, folder in adapters.items():
        for path in sorted(folder.iterdir()):
            if path.name in ("adapter_config.json", "adapter_model.safetensors"):
                files[f"store/adapter/versions/v{version:04d}/{path.name}"] = path.read_bytes()
    if sections:
        files["store/replay/corpus.zst"], files["store/replay/index.json"] = _corpus(list(sections))
    header = {"pack_format_version": 1, "created_at": STAMP.isoformat(), "tool_version": "0.9.4",
              "content_type": "minimal", "platform_hint": "linux-cpu", "licensee_acceptance_url": None}  # fmt: skip
    files["PACK_HEADER.json"] = (json.dumps(header, indent=2) + "\n").encode()
    sums = {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())}
    files["CHECKSUMS.sha256"] = "".join(f"{digest}  {name}\n" for name, digest in sums.items()).encode()
    content = {name: digest for name, digest in sums.items() if name != "PACK_HEADER.json"}
    rollup = hashlib.sha256(
        "".join(f"{name}\n{content[name]}\n" for name in sorted(content)).encode()
    ).hexdigest()
    manifest = {"dlm_id": dlm_id, "base_model": base_model, "base_model_revision": None, "base_model_sha256": None,
                "adapter_version": max(adapters, default=0),
                "entries": {name: len(files[name]) for name in sums}, "content_sha256": rollup}  # fmt: skip
    files["manifest.json"] = (json.dumps(manifest, indent=2) + "\n").encode()
    return files


def write_dlm_pack(path: Path, members: Mapping[str, bytes]) -> Path:
    """``members`` as DLM's packer writes them: a tar of sorted entries (folders too), through zstd 10."""
    import zstandard

    folders = sorted(
        {"/".join(name.split("/")[:i]) for name in members for i in range(1, name.count("/") + 1)}
    )
    with open(path, "wb") as out, zstandard.ZstdCompressor(level=10).stream_writer(out) as stream:
        with tarfile.open(fileobj=stream, mode="w|") as tar:
            for name in sorted([*members, *folders]):
                info = tarfile.TarInfo(name)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                if name in members:
                    info.size, info.mode = len(members[name]), 0o644
                    tar.addfile(info, io.BytesIO(members[name]))
                else:
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
    return path

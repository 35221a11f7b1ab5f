"""Tokenizer fingerprints change whenever tokens could, and need no transformers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlmstore.bases import resolve_base, tokenizer_source
from dlmstore.fingerprint import files_sha256, fingerprint_tokenizer, tokenizer_sha256


@pytest.fixture
def tokenizer_copy(tmp_path: Path) -> Path:
    source = Path(tokenizer_source(resolve_base("smollm2-135m")))
    copy = tmp_path / "tok"
    shutil.copytree(source, copy)
    return copy


def test_the_fingerprint_has_a_scheme_prefix_and_is_stable(tokenizer_copy: Path) -> None:
    first = files_sha256(tokenizer_copy)
    assert first is not None and first.startswith("sha256:") and len(first) == 7 + 64
    assert files_sha256(tokenizer_copy) == first


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(
            lambda d: _edit_json(d / "tokenizer.json", ["model", "vocab", "hello"], 5), id="vocabulary"
        ),
        pytest.param(lambda d: (d / "chat_template.jinja").write_text("{{ messages }}"), id="chat template"),
        pytest.param(
            lambda d: _edit_json(d / "tokenizer_config.json", ["eos_token"], "<|endoftext|>"),
            id="special tokens",
        ),
        pytest.param(lambda d: (d / "special_tokens_map.json").write_text("{}"), id="a new file"),
    ],
)
def test_every_file_that_shapes_the_tokens_changes_the_fingerprint(tokenizer_copy: Path, edit) -> None:  # type: ignore[no-untyped-def]
    before = files_sha256(tokenizer_copy)
    edit(tokenizer_copy)
    assert files_sha256(tokenizer_copy) != before


def test_a_tokenizers_library_upgrade_changes_the_fingerprint(
    tokenizer_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = files_sha256(tokenizer_copy)
    upgraded = tmp_path / "site" / "tokenizers-99.0.dist-info"
    upgraded.mkdir(parents=True)
    (upgraded / "METADATA").write_text("Metadata-Version: 2.1\nName: tokenizers\nVersion: 99.0\n")
    monkeypatch.syspath_prepend(str(upgraded.parent))  # found before the installed one
    assert files_sha256(tokenizer_copy) != before


@pytest.mark.parametrize(
    ("name", "text"),
    [
        pytest.param(
            "METADATA", "Metadata-Version: 2.1\nName: x\nVersion: 1.2.3\n\nVersion: 9\n", id="plain"
        ),
        pytest.param("METADATA", "Name: x\nversion:\t 1.0 \nSummary: s\n", id="lower case, blanks"),
        pytest.param("METADATA", "Name: x\nVersion: 1.0\n  .post1\n", id="folded"),
        pytest.param("METADATA", "Name: x\nSummary: s\n", id="none"),
        pytest.param("PKG-INFO", "Metadata-Version: 1.0\nName: x\nVersion: 2.0\n", id="PKG-INFO"),
        pytest.param("METADATA", "Name: x\nnot a header\nVersion: 3.0\n", id="headers end at a non-header"),
        pytest.param("METADATA", "Name: x\r\nVersion: 4.0\r\n\r\n", id="CRLF"),
        pytest.param("METADATA", "Name: x\x0cy\nVersion: 5.0\n", id="a form feed is no line break"),
        pytest.param("METADATA", " indented\nVersion: 6.0\n", id="a continuation first"),
    ],
)
def test_a_librarys_version_is_the_one_importlib_metadata_reads(tmp_path: Path, name: str, text: str) -> None:
    from importlib import metadata

    from dlmstore.fingerprint import _version

    (tmp_path / name).write_text(text)
    dist = metadata.PathDistribution(tmp_path)
    assert _version(dist) == dist.version


def test_every_installed_librarys_version_is_the_one_importlib_metadata_reads() -> None:
    from importlib import metadata

    from dlmstore.fingerprint import _version

    dists = list(metadata.distributions())
    assert dists
    assert [_version(dist) for dist in dists] == [dist.version for dist in dists]


def test_a_folder_without_tokenizer_files_has_no_fingerprint(tmp_path: Path) -> None:
    assert files_sha256(tmp_path) is None


def test_the_base_model_fingerprint_imports_no_transformers() -> None:
    tokenizer_source(resolve_base("smollm2-135m"))  # make sure the conversion exists
    code = (
        "import sys; from dlmstore.bases import resolve_base; from dlmstore.fingerprint import tokenizer_sha256; "
        "print(tokenizer_sha256(resolve_base('smollm2-135m'))); print('transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    value, imported = out.stdout.split()
    assert imported == "False"
    assert value == tokenizer_sha256(resolve_base("smollm2-135m"))


def test_a_loaded_tokenizer_has_the_same_fingerprint_as_its_base(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    assert fingerprint_tokenizer(smollm2_tokenizer) == tokenizer_sha256(resolve_base("smollm2-135m"))


def _edit_json(path: Path, keys: list[str], value: object) -> None:
    data = json.loads(path.read_text())
    node = data
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    path.write_text(json.dumps(data))


def test_every_installed_librarys_version_is_found_where_importlib_metadata_finds_it() -> None:
    from importlib import metadata

    from dlmstore.fingerprint import _installed_version

    names = sorted({dist.metadata["Name"] for dist in metadata.distributions() if dist.metadata["Name"]})
    assert "tokenizers" in names and "transformers" in names
    assert {name: _installed_version(name) for name in names} == {
        name: metadata.distribution(name).version for name in names
    }


def test_a_library_that_is_not_installed_is_absent() -> None:
    from dlmstore.fingerprint import _installed_version

    assert _installed_version("no-such-library-of-dlmstore") == "absent"


@pytest.mark.parametrize(
    ("folders", "wanted"),
    [
        pytest.param(["My_Pkg-1.0.dist-info"], "my.pkg", id="normalised name"),
        pytest.param(["my_pkg-1.0.egg-info", "my_pkg-2.0.dist-info"], "my-pkg", id="two: the first listed"),
        pytest.param(["other-1.0.dist-info"], "my-pkg", id="absent"),
    ],
)
def test_a_metadata_folder_on_the_path_is_the_one_importlib_metadata_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folders: list[str], wanted: str
) -> None:
    import sys
    from importlib import metadata

    from dlmstore.fingerprint import _installed_version

    for folder in folders:
        (tmp_path / folder).mkdir()
        version = folder.rpartition("-")[2].rpartition(".")[0]
        (tmp_path / folder / "METADATA").write_text(f"Name: my-pkg\nVersion: {version}\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    try:
        expected = metadata.distribution(wanted).version
    except metadata.PackageNotFoundError:
        expected = "absent"
    assert _installed_version(wanted) == expected

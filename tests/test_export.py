"""`dlm export`: the files it writes, where it may write them, what it records, and its faults.

One store is trained per module on ``tiny_base`` (``trained_store`` in
conftest.py) and copied into each test's home, so every test starts from a trained adapter without
training again. llama.cpp's parity with transformers is checked in
test_export_parity.py.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.errors import ExportError
from dlmstore.home import store_dir

from .helpers import EXPORT_BODY, REPO, VALID_ID, export_doc


@pytest.fixture
def doc(tmp_path: Path, tiny_base: Path, trained_store: Path, dlm_home: Path) -> Path:
    """The document, with its trained store copied into this test's home."""
    shutil.copytree(trained_store, dlm_home / "store" / VALID_ID)
    return export_doc(tmp_path, tiny_base)


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def _export(runner: CliRunner, *args: str) -> Any:
    result = runner.invoke(cli, ["export", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _db() -> sqlite3.Connection:
    return sqlite3.connect(store_dir(VALID_ID) / "store.db")


def _hashes(folder: Path) -> dict[str, str]:
    from dlmstore.store.digests import file_sha256

    return {
        p.relative_to(folder).as_posix(): file_sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()
    }


# --- what an export writes ---------------------------------------------------------------------


def test_an_ollama_export_writes_the_merged_folder_the_ggufs_a_modelfile_and_a_manifest(
    runner: CliRunner, doc: Path
) -> None:
    result = _export(runner, str(doc), "--target", "ollama")
    folder = store_dir(VALID_ID) / "exports" / "v0001-Q8_0"  # the document's export.default_quant
    assert result["folder"] == str(folder)
    assert (result["quant"], result["model_gguf"], result["adapter_gguf"], result["base_gguf"]) == (
        "Q8_0",
        "model.Q8_0.gguf",
        "adapter.gguf",
        "base.Q8_0.gguf",
    )
    top = sorted(p.name for p in folder.iterdir())
    assert top == ["Modelfile", "adapter.gguf", "base.Q8_0.gguf", "dlm-export.json", "hf", "model.Q8_0.gguf"]
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in (folder / "hf").iterdir()
    }
    manifest = json.loads((folder / "dlm-export.json").read_text())
    hashes = _hashes(folder)
    assert {name: entry["sha256"] for name, entry in manifest["files"].items()} == {
        name: digest for name, digest in hashes.items() if name != "dlm-export.json"
    }
    assert manifest["adapter"]["version"] == 1 and manifest["tools"]["llama_cpp"] == "0.3.36"
    modelfile = (folder / "Modelfile").read_text()
    assert "\nFROM ./model.Q8_0.gguf\n" in modelfile
    assert "\nPARAMETER stop <|im_end|>\nPARAMETER stop <|im_start|>\n" in modelfile
    assert "\nPARAMETER temperature 0.3\nPARAMETER top_p 0.9\nPARAMETER num_ctx 64\n" in modelfile
    assert modelfile.endswith("\nSYSTEM You answer briefly.\n")
    row = _db().execute("SELECT adapter_version, target, quant, path, files FROM exports").fetchall()
    assert [(r[0], r[1], r[2], r[3]) for r in row] == [(1, "ollama", "Q8_0", str(folder))]
    assert json.loads(row[0][4]) == manifest["files"]


def test_the_modelfile_template_renders_every_checked_conversation_as_the_chat_template(
    smollm2_tokenizer: Any,
) -> None:
    from dlmstore.export.targets import CHECKED_CONVERSATIONS, chat_framing

    framing = chat_framing(smollm2_tokenizer, where="smollm2")
    for system, turns in CHECKED_CONVERSATIONS:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": role, "content": content} for role, content in turns
        ]
        expected = smollm2_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert framing.render(system, turns) == expected
    template = framing.go_template()
    assert template.startswith("{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ else }}")
    assert template.endswith("{{ end }}{{ end }}<|im_start|>assistant\n")


def test_a_chat_template_a_role_by_role_framing_cannot_reproduce_is_one_error(smollm2_tokenizer: Any) -> None:
    from dlmstore.export.targets import chat_framing

    tokenizer = smollm2_tokenizer
    tokenizer.chat_template = (
        "{% for m in messages %}{{ loop.index }}:{{ m['role'] }}:{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    with pytest.raises(ExportError) as caught:
        chat_framing(tokenizer, where="tok")
    assert caught.value.message == (
        "tok: the chat template cannot be translated into an Ollama TEMPLATE "
        "(a message's beginning differs from one turn to the next)"
    )
    assert (
        caught.value.hint
        == "export for llama-server (--target llama-server), which renders the model's own template"
    )


def test_the_llama_server_target_writes_the_exact_command_line(
    runner: CliRunner, doc: Path, tmp_path: Path
) -> None:
    out = tmp_path / "served"
    result = _export(runner, str(doc), "--target", "llama-server", "--quant", "Q4_K_M", "-o", str(out))
    assert result["command"] == [
        sys.executable, "-m", "llama_cpp.server", "--model", str(out / "model.Q4_K_M.gguf"),
        "--n_ctx", "64", "--host", "127.0.0.1", "--port", "8000",
    ]  # fmt: skip
    script = (out / "llama-server.sh").read_text()
    assert script.startswith("#!/bin/sh\n") and (out / "llama-server.sh").stat().st_mode & 0o111
    assert script.endswith(
        f"exec {sys.executable} -m llama_cpp.server --model model.Q4_K_M.gguf --n_ctx 64 --host 127.0.0.1 "
        '--port 8000 "$@"\n'
    )
    assert not (out / "Modelfile").exists()


def test_the_hf_target_writes_the_merged_folder_alone_and_records_no_quantisation(
    runner: CliRunner, doc: Path
) -> None:
    result = _export(runner, str(doc), "--target", "hf")
    folder = Path(result["folder"])
    assert folder.name == "v0001-hf" and sorted(p.name for p in folder.iterdir()) == ["dlm-export.json", "hf"]
    assert (result["quant"], result["model_gguf"], result["command"]) == (None, None, None)
    assert _db().execute("SELECT target, quant FROM exports").fetchall() == [("hf", None)]


@pytest.mark.slow
def test_exporting_the_same_adapter_twice_gives_byte_identical_files_at_every_quantisation(
    runner: CliRunner, doc: Path, tmp_path: Path
) -> None:
    for quant in ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16"):
        first = _export(runner, str(doc), "--quant", quant, "-o", str(tmp_path / f"a-{quant}"))
        second = _export(runner, str(doc), "--quant", quant, "-o", str(tmp_path / f"b-{quant}"))
        assert first["files"] == second["files"], quant
        assert _hashes(tmp_path / f"a-{quant}") == _hashes(tmp_path / f"b-{quant}"), quant


def test_a_quantised_gguf_holds_the_types_llama_cpp_chose(
    runner: CliRunner, doc: Path, tmp_path: Path
) -> None:
    import gguf

    _export(runner, str(doc), "--quant", "Q8_0", "-o", str(tmp_path / "q8"))
    reader = gguf.GGUFReader(str(tmp_path / "q8" / "model.Q8_0.gguf"))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == "Q8_0" and types["blk.0.attn_norm.weight"] == "F32"
    assert "output.weight" not in types  # tied to token_embd, as llama.cpp's converter writes it
    fields = {
        name: field.contents()
        for name, field in reader.fields.items()
        if not name.startswith("tokenizer.ggml.t")
    }
    assert fields["general.architecture"] == "llama" and fields["general.file_type"] == 7  # MOSTLY_Q8_0
    assert fields["tokenizer.ggml.pre"] == "gpt-2" and fields["llama.rope.freq_base"] == 100000.0
    adapter = gguf.GGUFReader(str(tmp_path / "q8" / "adapter.gguf"))
    assert adapter.fields["general.type"].contents() == "adapter"
    assert adapter.fields["adapter.type"].contents() == "lora"
    assert adapter.fields["adapter.lora.alpha"].contents() == 16.0
    assert {t.name for t in adapter.tensors} >= {"blk.0.attn_q.weight.lora_a", "blk.1.ffn_down.weight.lora_b"}


# --- the output folder ------------------------------------------------------------------------


def test_an_out_folder_dlm_did_not_write_is_refused_naming_it_and_left_untouched(
    runner: CliRunner, doc: Path, tmp_path: Path
) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = runner.invoke(cli, ["export", str(doc), "-o", str(out)])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: {out} is not a folder dlm export wrote (it holds files and no dlm-export.json), so nothing "
        "is written into it",
        "hint: choose a new or empty folder with -o, or pass --force to write the export's files into it "
        "(hf/, *.gguf, Modelfile, llama-server.sh, dlm-export.json are replaced; other files are left alone)",
    ]
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".mine")] == []
    assert _db().execute("SELECT count(*) FROM exports").fetchone() == (0,)


def test_force_writes_the_export_beside_the_users_files_and_keeps_them(
    runner: CliRunner, doc: Path, tmp_path: Path
) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    _export(runner, str(doc), "--target", "hf", "-o", str(out), "--force")
    assert sorted(p.name for p in out.iterdir()) == ["dlm-export.json", "hf", "notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"


def test_exporting_into_an_earlier_export_replaces_it_and_removes_what_it_no_longer_writes(
    runner: CliRunner, doc: Path, tmp_path: Path
) -> None:
    out = tmp_path / "export"
    _export(runner, str(doc), "--quant", "F16", "-o", str(out))
    (out / "notes.txt").write_text("kept")
    _export(runner, str(doc), "--quant", "Q8_0", "--target", "llama-server", "-o", str(out))
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter.gguf", "base.Q8_0.gguf", "dlm-export.json", "hf", "llama-server.sh", "model.Q8_0.gguf",
        "notes.txt",
    ]  # fmt: skip
    assert json.loads((out / "dlm-export.json").read_text())["quant"] == "Q8_0"


def test_a_full_disk_while_exporting_is_one_error_and_leaves_no_folder_and_no_row(
    runner: CliRunner, doc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("dlmstore.export.exporter.write_adapter_gguf", full)
    out = tmp_path / "export"
    result = runner.invoke(cli, ["export", str(doc), "-o", str(out)])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-2:] == [
        f"error: cannot write the export {out}: No space left on device",
        "hint: free some disk space and export again (nothing was changed in the folder)",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dlm-home", "doc.dlm"]  # no folder, no staging left
    assert _db().execute("SELECT count(*) FROM exports").fetchone() == (0,)


# --- what a killed export leaves ---------------------------------------------------------------

#: The repository on the path of the `dlm export` processes the tests start, on one OpenMP thread.
_ENV = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
#: What a test waits for at most before it calls the export stuck (a hang guard, not a measurement).
PATIENCE_S = 300


def _exporting(doc: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    """`dlm export DOC ARGS` in a process of its own, once its staging folder holds the merged model."""
    command = subprocess.Popen(
        [sys.executable, "-m", "dlmstore.cli.main", "export", str(doc), *args],
        env={**os.environ, **_ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out = Path(args[args.index("-o") + 1]) if "-o" in args else store_dir(VALID_ID) / "exports" / "v0001-Q8_0"
    deadline = time.monotonic() + PATIENCE_S
    while not (
        found := [p for p in out.parent.glob(f".{out.name}-*") if (p / "hf" / "config.json").exists()]
    ):
        assert command.poll() is None, command.communicate()
        assert time.monotonic() < deadline, "the export wrote nothing"
        time.sleep(0.02)
    return command, found[0]


def _killed_export(doc: Path, *args: str) -> Path:
    """The staging folder a `dlm export DOC ARGS` killed with SIGKILL half way left behind."""
    command, staging = _exporting(doc, *args)
    command.kill()
    command.communicate()
    assert staging.is_dir()
    return staging


def _verified(*args: str) -> tuple[int, list[tuple[str, str, str, bool]]]:
    result = CliRunner().invoke(cli, ["cache", "verify", *args, "--json"])
    problems = json.loads(result.stdout)["problems"]
    return result.exit_code, [(p["kind"], p["path"], p["detail"], p["repaired"]) for p in problems]


KILLED = "leftover staging folder of an export that was killed before it finished"


@pytest.mark.slow
def test_a_killed_exports_staging_folder_is_reported_by_verify_removed_by_repair_and_swept_by_the_next_export(
    runner: CliRunner, doc: Path
) -> None:
    exports = store_dir(VALID_ID) / "exports"
    first = _killed_export(doc)
    assert _verified(str(doc)) == (1, [("staging_dir", f"exports/{first.name}", KILLED, False)])
    assert _verified(str(doc), "--repair") == (0, [("staging_dir", f"exports/{first.name}", KILLED, True)])
    assert not first.exists() and _verified(str(doc)) == (0, [])
    second = _killed_export(doc)
    result = runner.invoke(cli, ["export", str(doc), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["notes"] == [
        f"removed {second}: the staging folder of an export that was killed before it finished"
    ]
    assert f"note: removed {second}: the staging folder" in result.stderr
    assert sorted(p.name for p in exports.iterdir()) == ["v0001-Q8_0"]
    assert _verified(str(doc)) == (0, [])


@pytest.mark.slow
def test_a_killed_export_into_an_out_folder_is_swept_beside_it_and_a_users_look_alike_folders_are_kept(
    runner: CliRunner, doc: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    _export(runner, str(doc), "--target", "hf", "-o", str(out))
    mine = [tmp_path / ".out-notes", tmp_path / ".out-abcd1234"]  # named as staging is, but not dlm's
    for folder in mine:
        folder.mkdir()
        (folder / "keep.txt").write_text("mine")
    (tmp_path / ".out-linked").symlink_to(mine[0], target_is_directory=True)
    staging = _killed_export(doc, "--quant", "Q8_0", "-o", str(out))
    assert _verified(str(doc)) == (1, [("staging_dir", str(staging), KILLED, False)])
    result = runner.invoke(cli, ["export", str(doc), "--quant", "Q8_0", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert not staging.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out")) == [
        ".out-abcd1234", ".out-linked", ".out-notes",
    ]  # fmt: skip
    assert all((folder / "keep.txt").read_text() == "mine" for folder in mine)
    assert json.loads((out / "dlm-export.json").read_text())["quant"] == "Q8_0"
    assert _verified(str(doc)) == (0, [])


@pytest.mark.slow
def test_the_staging_folder_of_an_export_running_in_another_process_is_left_alone(
    runner: CliRunner, doc: Path, tmp_path: Path
) -> None:
    command, staging = _exporting(doc)
    command.send_signal(signal.SIGSTOP)  # held still with its staging folder half written
    try:
        before = sorted(p.relative_to(staging) for p in staging.rglob("*"))
        assert _verified(str(doc), "--repair") == (0, [])
        _export(runner, str(doc), "--target", "hf", "-o", str(tmp_path / "other"))
        _export(runner, str(doc), "--target", "hf")  # its staging sits beside the running one's
        assert sorted(p.relative_to(staging) for p in staging.rglob("*")) == before
    finally:
        command.send_signal(signal.SIGCONT)
    _, stderr = command.communicate(timeout=PATIENCE_S)
    assert command.returncode == 0, stderr
    exports = store_dir(VALID_ID) / "exports"
    assert sorted(p.name for p in exports.iterdir()) == ["v0001-Q8_0", "v0001-hf"]
    assert not staging.exists() and _verified(str(doc)) == (0, [])


# --- what is refused ----------------------------------------------------------------------------


def test_without_llama_cpp_python_export_names_the_exact_install_command(
    runner: CliRunner, doc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dlmstore.export.runtime.llama_cpp_version", lambda: None)
    result = runner.invoke(cli, ["export", str(doc)])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "error: dlm export needs llama-cpp-python (llama.cpp), which is not installed",
        'hint: CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" '
        "pip install 'llama-cpp-python[server]==0.3.36'",
    ]


def test_a_llama_cpp_that_dies_of_an_illegal_instruction_is_one_error_with_the_portable_rebuild(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlmstore.export.runtime import run_child

    (tmp_path / "crashing_llama.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(ExportError) as caught:
        run_child("crashing_llama", [], what="loading model.F16.gguf")
    assert caught.value.message == (
        "llama.cpp crashed with Illegal instruction (SIGILL) while loading model.F16.gguf: this "
        "llama-cpp-python was built for instructions this CPU cannot run"
    )
    assert caught.value.hint == (
        'rebuild it portable: CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON '
        '-DGGML_F16C=ON" pip install --force-reinstall --no-cache-dir --no-binary llama-cpp-python '
        "'llama-cpp-python[server]==0.3.36'"
    )
    assert signal.SIGILL == 4


def test_an_architecture_the_gguf_writer_does_not_support_is_one_error_naming_it_and_the_list() -> None:
    from transformers import GPT2Config

    from dlmstore.export.architectures import hyperparameters

    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ExportError) as caught:
        hyperparameters(config, where="base model 'gpt2'")
    assert (
        caught.value.message
        == "base model 'gpt2': the GGUF writer does not support architecture GPT2LMHeadModel"
    )
    assert caught.value.hint == (
        "supported: LlamaForCausalLM (SmolLM2, Llama 3.2), Qwen2ForCausalLM (Qwen2.5); "
        "`dlm export --target hf` writes the merged model without GGUF for any architecture"
    )


def test_a_tokenizer_gguf_cannot_represent_is_one_error_naming_its_pre_tokenizer(
    tiny_base: Path, tmp_path: Path
) -> None:
    from dlmstore.export.vocab import read_vocabulary

    data = json.loads((tiny_base / "tokenizer.json").read_text())
    data["pre_tokenizer"] = {"type": "Whitespace"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ExportError) as caught:
        read_vocabulary(tmp_path, vocab_size=49152)
    assert caught.value.message == (
        f'{tmp_path / "tokenizer.json"}: its pre-tokenizer {{"type": "Whitespace"}} is none that llama.cpp '
        "runs, so the tokenizer cannot be represented in GGUF"
    )
    data["model"]["byte_fallback"] = True
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ExportError) as caught:
        read_vocabulary(tmp_path, vocab_size=49152)
    assert caught.value.message == (
        f"{tmp_path / 'tokenizer.json'}: a BPE tokenizer with byte fallback cannot be represented in GGUF by "
        "dlm export"
    )


#: Text that tells pre-tokenizers apart: contractions, digit runs, newlines, runs of spaces, accents.
TRICKY = (
    "Hello  world!\n\n  It's 2026: 12345 items, naïve café; they'LL SEE\t\tdone.  \r\n"
    "x=1234567 'll 've don't ...!!! ¿Qué? 日本語 tokens"
)


@pytest.mark.parametrize("pre", ["qwen2", "llama-bpe"])
def test_a_qwen2_or_llama3_style_tokenizer_tokenizes_in_llama_cpp_as_in_transformers(
    pre: str, tmp_path: Path
) -> None:
    import torch
    from llama_cpp import Llama
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from dlmstore.export.model_gguf import write_model_gguf
    from dlmstore.export.vocab import PRE_TOKENIZERS

    block, ignore_merges = PRE_TOKENIZERS[pre]
    tokenizer = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(block["pretokenizers"][0]["pattern"]["Regex"]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([EXPORT_BODY, TRICKY, EXPORT_BODY.upper()] * 3, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", bos_token="<|im_start|>"
    )
    fast.save_pretrained(tmp_path)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=len(fast), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
        )  # fmt: skip
        LlamaForCausalLM(config).save_pretrained(tmp_path)
    write_model_gguf(tmp_path, tmp_path / "model.gguf")
    llm = Llama(model_path=str(tmp_path / "model.gguf"), vocab_only=True, verbose=False)
    try:
        for text in (TRICKY, EXPORT_BODY):
            expected = fast(text, add_special_tokens=False)["input_ids"]
            assert llm.tokenize(text.encode(), add_bos=False, special=False) == expected
    finally:
        llm.close()


def test_a_damaged_adapter_is_refused_before_anything_is_written(runner: CliRunner, doc: Path) -> None:
    weights = store_dir(VALID_ID) / "adapter" / "versions" / "v0001" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    result = runner.invoke(cli, ["export", str(doc)])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == _damaged(weights, "export another version with --adapter")
    assert not (store_dir(VALID_ID) / "exports").exists()


def _damaged(weights: Path, other: str | None) -> list[str]:
    """The two lines every command that loads an adapter prints for damaged ``weights`` of v0001."""
    from dlmstore.store.digests import file_sha256

    recorded = _db().execute("SELECT sha256 FROM adapters WHERE version = 1").fetchone()[0]
    return [
        f"error: adapter v0001: {weights} is damaged (its sha256 is {file_sha256(weights)}, not the {recorded} "
        "recorded when it was trained)",
        f"hint: train again (dlm train) or {other}"
        if other
        else "hint: train again (dlm train) to write a new adapter version",
    ]


@pytest.mark.parametrize(
    ("command", "other"),
    [
        (["prompt", "{doc}", "hi"], None),
        (["prompt", "{doc}", "hi", "--backend", "transformers"], None),
        (["eval", "{doc}"], "evaluate another version with --adapter"),
        (["eval", "{doc}", "--base", "--against", "v1"], "evaluate another version with --adapter"),
        (["export", "{doc}", "--target", "hf"], "export another version with --adapter"),
    ],
)
def test_every_command_that_loads_an_adapter_refuses_damaged_weights_the_same_way(
    runner: CliRunner, doc: Path, command: list[str], other: str | None
) -> None:
    weights = store_dir(VALID_ID) / "adapter" / "versions" / "v0001" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x40  # a weight's bits, not the header: it would still load
    weights.write_bytes(bytes(data))
    result = runner.invoke(cli, [part.format(doc=doc) for part in command])
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == _damaged(weights, other)


def test_a_preference_run_refuses_to_start_from_a_damaged_sft_adapter(doc: Path) -> None:
    from dlmstore.document.parser import parse_document
    from dlmstore.errors import StoreError
    from dlmstore.store.database import open_store
    from dlmstore.train.phases import starting_adapter

    weights = store_dir(VALID_ID) / "adapter" / "versions" / "v0001" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])  # truncated
    with open_store(VALID_ID, create=False) as store, pytest.raises(StoreError) as caught:
        starting_adapter(store, parse_document(str(doc)))
    assert [caught.value.message, caught.value.hint] == [
        line.split(": ", 1)[1] for line in _damaged(weights, None)[:1]
    ] + ["train SFT again first: `dlm train DOC --phase sft`"]


def test_an_adapter_version_that_does_not_exist_is_refused_with_the_ones_that_do(
    runner: CliRunner, doc: Path
) -> None:
    result = runner.invoke(cli, ["export", str(doc), "--adapter", "7"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: {doc}: there is no adapter v0007",
        "hint: adapters of this document: v0001",
    ]


def test_prompt_through_llama_cpp_before_any_export_says_to_export_first(
    runner: CliRunner, doc: Path
) -> None:
    result = runner.invoke(cli, ["prompt", str(doc), "hi", "--backend", "llama.cpp"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: {doc}: no GGUF export yet, so llama.cpp has nothing to answer with",
        f"hint: run `dlm export {doc}` first",
    ]


def test_prompt_through_llama_cpp_refuses_a_gguf_whose_bytes_changed(
    runner: CliRunner, doc: Path, tmp_path: Path
) -> None:
    _export(runner, str(doc), "--quant", "Q4_K_M", "-o", str(tmp_path / "e"))
    gguf = tmp_path / "e" / "model.Q4_K_M.gguf"
    data = bytearray(gguf.read_bytes())
    data[len(data) // 2] ^= 1
    gguf.write_bytes(bytes(data))
    result = runner.invoke(cli, ["prompt", str(doc), "hi", "--backend", "llama.cpp"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: export 1: {gguf} is damaged (its sha256 is not the one recorded when it was written)",
        "hint: export the adapter again: dlm export DOC",
    ]


# --- the lock -------------------------------------------------------------------------------------


def test_an_export_pins_llama_cpp_in_the_lock_and_a_changed_version_is_a_warning(
    runner: CliRunner, doc: Path, tmp_path: Path
) -> None:
    from dlmstore.lock import read_lock

    lock_path = store_dir(VALID_ID) / "dlm.lock"
    assert read_lock(lock_path).pinned_versions["llama_cpp"] is None  # type: ignore[union-attr]
    first = runner.invoke(cli, ["export", str(doc), "--quant", "F16", "-o", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    assert "warning" not in first.stderr  # pinned for the first time
    assert read_lock(lock_path).pinned_versions["llama_cpp"] == "0.3.36"  # type: ignore[union-attr]
    lock = json.loads(lock_path.read_text())
    lock["pinned_versions"]["llama_cpp"] = "0.3.35"
    lock_path.write_text(json.dumps(lock))
    second = runner.invoke(cli, ["export", str(doc), "--quant", "F16", "-o", str(tmp_path / "b")])
    assert second.exit_code == 0, second.output
    assert (
        "warning: dlm.lock: pinned_versions.llama_cpp: '0.3.35' -> '0.3.36' (WARN)"
        in second.stderr.splitlines()
    )
    rows = (
        _db()
        .execute("SELECT json_extract(lock_json, '$.pinned_versions.llama_cpp') FROM lock_records")
        .fetchall()
    )
    assert rows == [(None,), ("0.3.36",), ("0.3.36",)]


def test_a_training_run_keeps_the_llama_cpp_the_lock_pinned(doc: Path) -> None:
    from dlmstore.bases import resolve_base
    from dlmstore.determinism import apply_determinism
    from dlmstore.document.parser import parse_document
    from dlmstore.lock import begin_lock
    from dlmstore.store.database import open_store

    lock_path = store_dir(VALID_ID) / "dlm.lock"
    lock = json.loads(lock_path.read_text())
    lock["pinned_versions"]["llama_cpp"] = "0.3.36"
    lock_path.write_text(json.dumps(lock))
    document = parse_document(doc)
    with open_store(VALID_ID, create=False) as store:
        pending = begin_lock(
            store, document, resolve_base(document.base_model, relative_to=document.directory), seed=7,
            run_id=99, mode="validate", determinism=apply_determinism(),
        )  # fmt: skip
    assert pending.lock.pinned_versions["llama_cpp"] == "0.3.36"
    assert not [m for m in pending.decision.mismatches if "llama_cpp" in m.field]


# --- listing ----------------------------------------------------------------------------------------


def test_metrics_list_the_exports_of_the_document(runner: CliRunner, doc: Path, tmp_path: Path) -> None:
    _export(runner, str(doc), "--target", "hf", "-o", str(tmp_path / "e"))
    result = runner.invoke(cli, ["metrics", str(doc), "--json"])
    assert result.exit_code == 0, result.output
    exports = json.loads(result.stdout)["exports"]
    assert [(e["export_id"], e["adapter_version"], e["target"], e["quant"], e["path"]) for e in exports] == [
        (1, 1, "hf", None, str(tmp_path / "e"))
    ]
    text = runner.invoke(cli, ["metrics", str(doc)])
    assert f"export 1: adapter v0001, hf, {tmp_path / 'e'}" in text.stdout

"""llama.cpp runs what `dlm export` wrote as transformers runs the merged model.

The exports of this module are made once, from an adapter trained on
``tiny_base`` (SmolLM2's architecture and tokenizer, random weights) and
on a tiny Qwen2 built the same way, and loaded by llama-cpp-python, the
llama.cpp the project's set-up builds:

* llama.cpp tokenizes the chat prompt as transformers does;
* the F16 GGUF's greedy continuation of each of the document's probe
  prompts (DLM's probes, ``dlmstore.eval.probes``: its ``### Q !probe``
  pairs, else three of its Q/A pairs sampled by seed; each after the system
  prompt, in the chat template) is transformers' greedy continuation of the
  merged model, token for token;
* the Q8_0 GGUF picks transformers' top token at >= 95% of the positions
  of teacher-forced text;
* the adapter GGUF on the base GGUF continues as the merged F16 GGUF;
* the merged HF folder's logits are ``dlm prompt``'s adapter model's
  within 1e-4 (float32);
* ``dlm prompt --backend llama.cpp`` on the F16 export answers as the
  transformers backend;
* llama.cpp's OpenAI-compatible server answers a chat completion.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli

from .helpers import VALID_ID, write_doc

pytestmark = pytest.mark.slow  # trains two adapters and exports them at two quantisations

BODY = """Prose about dlmstore, the local-first store.

::instruction::
### Q
Where is the metadata kept?
### A
In store.db, beside the token blobs.

### Q
What writes adapters?
### A
dlm train writes them.

### Q
How do I see what the adapter answers?
### A
Run dlm prompt with a question.
"""
FRONT = (
    "system_prompt: You answer briefly.\n"
    "training:\n  sequence_len: 64\n  max_steps: 3\n  micro_batch_size: 2\n  seed: 7\n"
    "  learning_rate: 0.02\n  lora_r: 8\n  lora_alpha: 16\n"
    "  target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]\n"
    "  preference:\n    enabled: false\n"
)
#: New tokens of each greedy continuation.
NEW_TOKENS = 16


@dataclass(frozen=True)
class Exported:
    """A trained store and its F16 and Q8_0 exports, in a home of their own."""

    home: Path
    doc: Path
    f16: Path
    q8: Path
    adapter: Path


def _exported(base: Path, session_bases: Path, factory: pytest.TempPathFactory, name: str) -> Exported:
    import torch

    home = factory.mktemp(f"{name}-home")
    (home / "bases").symlink_to(session_bases, target_is_directory=True)
    doc = write_doc(
        factory.mktemp(f"{name}-doc") / "doc.dlm", body=BODY, frontmatter=f"base_model: {base}\n" + FRONT
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("DLM_HOME", str(home))
            from dlmstore.export.exporter import export_document
            from dlmstore.train.trainer import train_document

            train_document(str(doc))
            f16 = export_document(str(doc), quant="F16", target="llama-server")
            q8 = export_document(str(doc), quant="Q8_0", target="ollama")
    finally:
        torch.set_num_threads(threads)
    store = home / "store" / VALID_ID
    return Exported(home, doc, Path(f16.folder), Path(q8.folder), store / "adapter" / "versions" / "v0001")


@pytest.fixture(scope="module")
def smollm(tiny_base: Path, session_bases: Path, tmp_path_factory: pytest.TempPathFactory) -> Exported:
    return _exported(tiny_base, session_bases, tmp_path_factory, "smollm")


@pytest.fixture(scope="module")
def tiny_qwen2(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local-folder Qwen2 base: tiny, random weights (fixed seed), untied output layer, SmolLM2's tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder = tmp_path_factory.mktemp("tiny-qwen2")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                rope_theta=1000000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
            )
        )  # fmt: skip
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def qwen2(tiny_qwen2: Path, session_bases: Path, tmp_path_factory: pytest.TempPathFactory) -> Exported:
    return _exported(tiny_qwen2, session_bases, tmp_path_factory, "qwen2")


@pytest.fixture
def llama() -> Iterator[Any]:
    """Opens GGUFs in llama.cpp and closes them after the test."""
    from dlmstore.export.runtime import load_model

    opened: list[Any] = []

    def open_model(path: Path, **kwargs: Any) -> Any:
        opened.append(load_model(path, n_ctx=512, **kwargs))
        return opened[-1]

    yield open_model
    for llm in opened:
        llm.close()


def _hf(folder: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(str(folder))


def _probes(doc: Path) -> list[list[dict[str, str]]]:
    """The document's probe prompts (DLM's probes: ``dlmstore.eval.probes``), each after its system prompt."""
    from dlmstore.document.parser import parse_document
    from dlmstore.eval.probes import extract_probes

    document = parse_document(doc)
    system = [{"role": "system", "content": document.frontmatter.system_prompt or ""}]
    probes = extract_probes(document.sections, seed=document.frontmatter.training.seed)
    return [[*system, {"role": "user", "content": probe.question}] for probe in probes]


def _hf_greedy(model: Any, tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    import torch

    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    with torch.no_grad():
        out = model.generate(
            **ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tokenizer.eos_token_id
        )
    prompt = ids["input_ids"][0].tolist()
    new = out[0][len(prompt) :].tolist()
    if new and new[-1] == tokenizer.eos_token_id:
        new = new[:-1]
    return prompt, new


def _check_greedy_parity(exported: Exported, llama: Any) -> None:
    from dlmstore.export.runtime import chat_tokens, greedy

    model, tokenizer = _hf(exported.f16 / "hf")
    llm = llama(exported.f16 / "model.F16.gguf")
    probes = _probes(exported.doc)
    assert len(probes) == 3
    for messages in probes:
        prompt, expected = _hf_greedy(model, tokenizer, messages)
        assert chat_tokens(llm, messages) == prompt
        assert greedy(llm, prompt, max_new_tokens=NEW_TOKENS) == expected, messages[-1]["content"]


def test_llama_cpp_tokenizes_text_and_the_chat_prompt_as_transformers_does(
    smollm: Exported, llama: Any
) -> None:
    from dlmstore.export.runtime import chat_tokens

    _, tokenizer = _hf(smollm.f16 / "hf")
    llm = llama(smollm.f16 / "model.F16.gguf")
    text = "Hello  world!\n\n  It's 2026: 12345 items, naïve café — ok?\tdone.  "
    assert (
        llm.tokenize(text.encode(), add_bos=False, special=False)
        == tokenizer(text, add_special_tokens=False)["input_ids"]
    )
    for messages in _probes(smollm.doc):
        expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        assert chat_tokens(llm, messages) == expected["input_ids"]


def test_the_f16_gguf_continues_every_probe_prompt_as_transformers_does_token_for_token(
    smollm: Exported, llama: Any
) -> None:
    _check_greedy_parity(smollm, llama)


def test_a_tiny_qwen2_exports_and_its_f16_gguf_continues_as_transformers_does(
    qwen2: Exported, llama: Any
) -> None:
    import gguf

    reader = gguf.GGUFReader(str(qwen2.f16 / "model.F16.gguf"))
    assert reader.fields["general.architecture"].contents() == "qwen2"
    assert {"output.weight", "blk.0.attn_q.bias"} <= {t.name for t in reader.tensors}
    _check_greedy_parity(qwen2, llama)


def test_the_q8_0_gguf_picks_transformers_top_token_at_95_percent_of_teacher_forced_positions(
    smollm: Exported, llama: Any
) -> None:
    import numpy as np
    import torch

    model, tokenizer = _hf(smollm.q8 / "hf")
    llm = llama(smollm.q8 / "model.Q8_0.gguf", logits_all=True)
    agree = total = 0
    texts = [smollm.doc.read_text().split("---\n", 2)[2]]
    texts += [
        tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
        for m in _probes(smollm.doc)
    ]
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:200]
        with torch.no_grad():
            expected = model(torch.tensor([ids])).logits[0].argmax(-1).numpy()
        llm.reset()
        llm.eval(ids)
        got = np.asarray(llm.scores[: len(ids)]).argmax(-1)
        agree += int((got == expected).sum())
        total += len(ids)
    assert total > 150 and agree / total >= 0.95, (agree, total)


def test_the_adapter_gguf_on_the_base_gguf_continues_as_the_merged_f16_gguf(
    smollm: Exported, llama: Any
) -> None:
    import numpy as np

    from dlmstore.export.runtime import chat_tokens, greedy

    merged = llama(smollm.f16 / "model.F16.gguf", logits_all=True)
    with_lora = llama(smollm.f16 / "base.F16.gguf", lora=smollm.f16 / "adapter.gguf", logits_all=True)
    base = llama(smollm.f16 / "base.F16.gguf", logits_all=True)
    for messages in _probes(smollm.doc):
        prompt = chat_tokens(merged, messages)
        assert greedy(with_lora, prompt, max_new_tokens=NEW_TOKENS) == greedy(
            merged, prompt, max_new_tokens=NEW_TOKENS
        )
    prompt = chat_tokens(merged, _probes(smollm.doc)[0])
    logits = {}
    for name, llm in (("merged", merged), ("lora", with_lora), ("base", base)):
        llm.reset()
        llm.eval(prompt)
        logits[name] = np.asarray(llm.scores[: len(prompt)])
    # The adapter moves the logits, and the LoRA GGUF moves them as merging did.
    moved = np.abs(logits["base"] - logits["merged"]).max()
    assert np.abs(logits["lora"] - logits["merged"]).max() < moved / 10


@pytest.mark.filterwarnings("ignore::FutureWarning")  # peft asks transformers a deprecated question
def test_the_hf_folder_gives_the_logits_of_dlm_prompts_adapter_model_within_1e_4(
    smollm: Exported, tiny_base: Path
) -> None:
    import torch
    from peft import PeftModel

    from dlmstore.bases import load_model, resolve_base

    merged, tokenizer = _hf(smollm.f16 / "hf")
    adapted = PeftModel.from_pretrained(load_model(resolve_base(str(tiny_base))), str(smollm.adapter)).eval()
    ids = tokenizer.apply_chat_template(
        _probes(smollm.doc)[0], add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )["input_ids"]
    with torch.no_grad():
        expected = adapted(ids).logits
        got = merged(ids).logits
    assert got.dtype == torch.float32
    assert float((got - expected).abs().max()) < 1e-4


def test_prompt_through_llama_cpp_on_the_f16_export_answers_as_the_transformers_backend(
    smollm: Exported, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLM_HOME", str(smollm.home))
    runner = CliRunner()
    answers = {}
    # The newest export is the Q8_0 one; export F16 again so that it is the one prompted.
    from dlmstore.export.exporter import export_document

    export_document(str(smollm.doc), quant="F16", target="llama-server", out=str(smollm.f16))
    for backend in ("transformers", "llama.cpp"):
        result = runner.invoke(
            cli, ["prompt", str(smollm.doc), "Where is the metadata kept?", "--max-new-tokens", "12",
                  "--backend", backend, "--json"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        answers[backend] = json.loads(result.stdout)
    assert answers["llama.cpp"]["answer"] == answers["transformers"]["answer"]
    assert answers["llama.cpp"]["new_tokens"] == answers["transformers"]["new_tokens"]
    assert answers["llama.cpp"]["model_file"] == str(smollm.f16 / "model.F16.gguf")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_llama_cpp_server_answers_a_chat_completion_on_the_export(smollm: Exported, tmp_path: Path) -> None:
    port = _free_port()
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm.q8 / "model.Q8_0.gguf"), "--n_ctx", "256",
         "--host", "127.0.0.1", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as ready:
                    assert ready.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, "the server did not start within 60 s"
                time.sleep(0.25)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=json.dumps(
                {"messages": [{"role": "user", "content": "Where is the metadata kept?"}], "max_tokens": 8,
                 "temperature": 0}
            ).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            body = json.loads(response.read())
        choice = body["choices"][0]
        assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
        assert choice["finish_reason"] in ("stop", "length") and body["usage"]["completion_tokens"] >= 1
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()

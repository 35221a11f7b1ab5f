"""``dlm prompt``: ask the base model plus the latest adapter a question.

For a document with named adapters (``training.adapters``), ``--adapter
NAME`` chooses the adapter that answers; without it, a gated document
(``training.gate.enabled``) is answered by its adapters mixed with the
weights its learned gate gives the question (``--gate off``: equal
weights), and the answer says the weights it chose.

A quick way to see what training did: the question is wrapped in the base
model's chat template (with the document's system prompt, as in training)
and answered greedily, so the same adapter gives the same answer every time.

Two backends answer:

* ``transformers`` (the default): the base model with the newest adapter
  on top, through peft, in the process;
* ``llama.cpp``: the GGUF of the newest export (``dlm export``), checked
  against the sha256 recorded when it was written, through llama-cpp-python.
  The chat template is the one the GGUF carries (the adapter's, copied at
  export), rendered as transformers renders it and tokenized by llama.cpp;
  on an F16 export the greedy answer is transformers' answer (the tests
  check it token for token), on a quantised one it is the quantised model's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

#: The backends ``dlm prompt --backend`` offers.
BACKENDS = ("transformers", "llama.cpp")


@dataclass(frozen=True)
class PromptAnswer:
    """The JSON shape of ``dlm prompt --json``.

    Attributes:
        question: The question asked.
        answer: The adapter's greedy answer.
        adapter_version: The adapter version used (the newest; with llama.cpp, the newest export's).
        adapter_phase: Its phase: ``sft`` or ``preference``.
        adapter_sha256: sha256 of its ``adapter_model.safetensors``.
        base_model: The base model it was loaded on.
        backend: ``transformers`` or ``llama.cpp``.
        model_file: The GGUF that answered (llama.cpp); null for transformers.
        new_tokens: Tokens generated.
        seconds: Time spent generating them (the model's load left out).
        adapter: The named adapter that answered (``--adapter``); null for a document's one adapter
            and for a mix.
        mix: The named adapters mixed for the answer, with the weights the gate chose (or equal ones,
            ``--gate off``; with llama.cpp, the export's mix); empty unless mixed. ``adapter_version`` is
            then the most weighted one's (with llama.cpp, the export's first part's).
        routed_by: ``gate`` or ``uniform`` when the answer comes from a mix (with llama.cpp: ``gate``
            for a gated document's static mix, ``mix`` for an ``--adapter-mix`` export); null otherwise.
    """

    question: str
    answer: str
    adapter_version: int
    adapter_phase: str
    adapter_sha256: str
    base_model: str
    backend: str = "transformers"
    model_file: str | None = None
    new_tokens: int = 0
    seconds: float = 0.0
    adapter: str | None = None
    mix: list[MixWeight] = field(default_factory=list)
    routed_by: str | None = None


@dataclass(frozen=True)
class MixWeight:
    """One named adapter of a mixed answer.

    Attributes:
        name: The adapter.
        version: Its newest version, which answered.
        weight: Its weight in the mix (the weights add up to 1).
    """

    name: str
    version: int
    weight: float


#: ``dlm prompt --gate``: ``auto`` routes a gated document's question by its gate, ``off`` mixes equally.
GATE_MODES = ("auto", "off")


def answer_question(
    path: str,
    question: str,
    *,
    max_new_tokens: int = 128,
    backend: str = "transformers",
    adapter: str | None = None,
    gate: str = "auto",
) -> PromptAnswer:
    """Generate an answer to ``question`` with the document's latest adapter.

    The latest adapter of any phase: after a preference phase, the
    preference adapter. With ``backend="llama.cpp"``, the newest export's GGUF.
    ``adapter`` names the adapter of a multi-adapter document; without it,
    such a document answers through its gate (``gate="auto"``, when
    ``training.gate.enabled``) or an equal mix (``gate="off"``).

    Raises:
        AdapterChoiceError: ``adapter`` does not fit the document, or a multi-adapter document
            without a gate is asked without ``adapter`` (and ``gate`` is ``auto``).
        DocumentError: the document is invalid.
        StoreError: the document has no store or no adapter yet, or the adapter's
            weights no longer match the sha256 recorded when it was trained.
        ExportError: (llama.cpp) no export yet, a damaged GGUF, llama-cpp-python missing.
        BaseModelError: the base model cannot be loaded.
    """
    from dlmstore.document.adapter_routing import chosen_adapter
    from dlmstore.document.parser import parse_document

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if gate not in GATE_MODES:
        raise ValueError(f"unknown gate mode {gate!r}; expected one of {', '.join(GATE_MODES)}")
    document = parse_document(path)
    routed = adapter is None and (gate == "off" or document.frontmatter.training.gate.enabled)
    name = chosen_adapter(document, adapter, command="dlm prompt", routed=routed)
    messages = []
    if document.frontmatter.system_prompt is not None:
        messages.append({"role": "system", "content": document.frontmatter.system_prompt})
    messages.append({"role": "user", "content": question})
    if backend == "llama.cpp":
        return _llama_cpp(path, document, question, messages, max_new_tokens, name)
    if routed and name is None:
        return _mixed(path, document, question, messages, max_new_tokens, gate)
    return _transformers(path, document, question, messages, max_new_tokens, name)


def _mixed(
    path: str, document: Any, question: str, messages: list[dict[str, str]], max_new_tokens: int, gate: str
) -> PromptAnswer:
    """The answer of the named adapters mixed by the gate's weights (or equally), and those weights."""
    from dlmstore.prompt.gated import mixed_model

    mixed = mixed_model(path, document, question, gate=gate)
    text, new_tokens, seconds = generate(mixed.model, mixed.tokenizer, messages, max_new_tokens)
    top = mixed.versions[max(mixed.weights, key=lambda name: mixed.weights[name])]
    return PromptAnswer(
        question, text, top.version, top.phase, top.sha256, document.base_model, "transformers", None,
        new_tokens, seconds, None,
        [MixWeight(name, mixed.versions[name].version, round(w, 6)) for name, w in mixed.weights.items()],
        mixed.routed_by,
    )  # fmt: skip


def _transformers(
    path: str,
    document: Any,
    question: str,
    messages: list[dict[str, str]],
    max_new_tokens: int,
    name: str | None = None,
) -> PromptAnswer:
    from dlmstore.bases import load_model, load_tokenizer, resolve_base
    from dlmstore.errors import StoreError
    from dlmstore.store.database import open_store
    from dlmstore.store.path_text import utf8_alias
    from dlmstore.train.adapters import checked_folder, latest

    with open_store(document.dlm_id, create=False) as store:
        adapter = latest(store, name=name)
        folder = checked_folder(store, adapter) if adapter else None
    if adapter is None or folder is None:
        which = (
            "no adapter has been trained yet" if name is None else f"adapter {name} has not been trained yet"
        )
        raise StoreError(f"{path}: {which}", hint=f"run `dlm train {path}` first")
    import warnings

    from peft import PeftModel

    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")

    ref = resolve_base(document.base_model, relative_to=document.directory)
    tokenizer = load_tokenizer(ref)
    with utf8_alias(folder) as loadable:  # safetensors opens only UTF-8 paths
        model: Any = PeftModel.from_pretrained(load_model(ref), str(loadable))  # generate() is untyped
    text, new_tokens, seconds = generate(model, tokenizer, messages, max_new_tokens)
    return PromptAnswer(
        question, text, adapter.version, adapter.phase, adapter.sha256, document.base_model,
        "transformers", None, new_tokens, seconds, name,
    )  # fmt: skip


def generate(
    model: Any, tokenizer: Any, messages: list[dict[str, str]], max_new_tokens: int
) -> tuple[str, int, float]:
    """The greedy answer of ``model`` to ``messages`` in the base's chat template: its text, its new
    tokens and the seconds spent generating them."""
    import torch

    model.eval()
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    started = time.perf_counter()
    with torch.no_grad():
        output = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
    seconds = time.perf_counter() - started
    prompt_len = inputs["input_ids"].shape[1]
    new = output[0][prompt_len:]
    text = tokenizer.decode(new, skip_special_tokens=True).strip()
    return text, int(new.shape[0]), round(seconds, 4)


def _llama_cpp(
    path: str,
    document: Any,
    question: str,
    messages: list[dict[str, str]],
    max_new_tokens: int,
    name: str | None = None,
) -> PromptAnswer:
    from dlmstore.errors import ExportError
    from dlmstore.export.record import checked_file, newest_export
    from dlmstore.export.runtime import chat_tokens, greedy, load_model, require_llama_cpp
    from dlmstore.store.database import open_store
    from dlmstore.train.adapters import find_version

    require_llama_cpp("dlm prompt --backend llama.cpp")
    with open_store(document.dlm_id, create=False) as store:
        export = newest_export(store)
        if export is None:
            raise ExportError(
                f"{path}: no GGUF export yet, so llama.cpp has nothing to answer with",
                hint=f"run `dlm export {path}` first",
            )
        adapter = find_version(store, export.adapter_version)
    assert adapter is not None  # exports.adapter_version references adapters.version
    if name is not None and (adapter.name != name or export.mix is not None):
        raise ExportError(
            f"{path}: the newest GGUF export is of {_exported(None if export.mix else adapter.name, export.mix)}, "
            f"not of adapter {name}",
            hint=f"run `dlm export {path} --adapter {name}` first",
        )
    gguf = checked_file(export, f"model.{export.quant}.gguf")
    llm = load_model(gguf, n_ctx=_context(document, max_new_tokens))
    tokens = chat_tokens(llm, messages)
    started = time.perf_counter()
    new = greedy(llm, tokens, max_new_tokens=max_new_tokens)
    seconds = time.perf_counter() - started
    text = bytes(llm.detokenize(new)).decode("utf-8", errors="replace").strip()
    mixed = export.mix or {}
    parts = [
        MixWeight(str(part["name"]), int(part["version"]), float(part["weight"]))
        for part in mixed.get("parts", [])  # type: ignore[attr-defined]
    ]
    return PromptAnswer(
        question, text, adapter.version, adapter.phase, adapter.sha256, document.base_model,
        "llama.cpp", str(gguf), len(new), round(seconds, 4), name, parts,
        None if not parts else ("gate" if mixed.get("gate_id") is not None else "mix"),
    )  # fmt: skip


def _exported(name: str | None, mix: object = None) -> str:
    if mix is not None:
        return "a mix of named adapters"
    return "the document's adapter" if name is None else f"adapter {name}"


def _context(document: Any, max_new_tokens: int) -> int:
    """A context long enough for a prompt of the training window (2048 at least) plus the answer."""
    return max(int(document.frontmatter.training.sequence_len), 2048) + max_new_tokens

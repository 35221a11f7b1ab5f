"""``dlm prompt``: ask the base model plus the latest adapter a question.

A quick way to see what training did: the question is wrapped in the base
model's chat template (with the document's system prompt, as in training)
and answered greedily, so the same adapter gives the same answer every time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PromptAnswer:
    """The JSON shape of ``dlm prompt --json``.

    Attributes:
        question: The question asked.
        answer: The adapter's greedy answer.
        adapter_version: The adapter version used (the newest).
        adapter_phase: Its phase: ``sft`` or ``preference``.
        adapter_sha256: sha256 of its ``adapter_model.safetensors``.
        base_model: The base model it was loaded on.
    """

    question: str
    answer: str
    adapter_version: int
    adapter_phase: str
    adapter_sha256: str
    base_model: str


def answer_question(path: str, question: str, *, max_new_tokens: int = 128) -> PromptAnswer:
    """Generate an answer to ``question`` with the document's latest adapter.

    The latest adapter of any phase: after a preference phase, the
    preference adapter.

    Raises:
        DocumentError: the document is invalid.
        StoreError: the document has no store or no adapter yet.
        BaseModelError: the base model cannot be loaded.
    """
    from dlmstore.bases import load_model, load_tokenizer, resolve_base
    from dlmstore.document.parser import parse_document
    from dlmstore.errors import StoreError
    from dlmstore.store.database import open_store
    from dlmstore.train.adapters import latest

    document = parse_document(path)
    with open_store(document.dlm_id, create=False) as store:
        adapter = latest(store)
        folder = store.path / adapter.path if adapter else None
    if adapter is None or folder is None:
        raise StoreError(f"{path}: no adapter has been trained yet", hint=f"run `dlm train {path}` first")
    import warnings

    import torch
    from peft import PeftModel

    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")

    ref = resolve_base(document.base_model, relative_to=document.directory)
    tokenizer = load_tokenizer(ref)
    model: Any = PeftModel.from_pretrained(load_model(ref), str(folder))  # generate() is untyped
    model.eval()
    messages = []
    if document.frontmatter.system_prompt is not None:
        messages.append({"role": "system", "content": document.frontmatter.system_prompt})
    messages.append({"role": "user", "content": question})
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        output = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
    prompt_len = inputs["input_ids"].shape[1]
    text = tokenizer.decode(output[0][prompt_len:], skip_special_tokens=True).strip()
    return PromptAnswer(question, text, adapter.version, adapter.phase, adapter.sha256, document.base_model)

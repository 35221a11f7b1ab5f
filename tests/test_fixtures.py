"""The shared fixtures in conftest.py are what the tests that use them take them to be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlmstore.bases import BaseModelRef, load_model, load_tokenizer, resolve_base


def test_the_shared_tokenizer_is_smollm2_with_chatml_tokens(tokenizer: Any) -> None:
    assert len(tokenizer) == 49152
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]


def test_the_tiny_base_is_a_local_folder_with_smollm2s_architecture_and_tokenizer(
    tiny_base: Path, tokenizer: Any
) -> None:
    ref = resolve_base(str(tiny_base))
    assert ref == BaseModelRef(str(tiny_base), "local", str(tiny_base.resolve()))
    config = json.loads((tiny_base / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["vocab_size"], config["tie_word_embeddings"]) == (49152, True)
    assert (config["num_hidden_layers"], config["hidden_size"]) == (2, 64)
    assert sum(p.stat().st_size for p in tiny_base.iterdir()) < 20 * 2**20
    tiny_tokenizer = load_tokenizer(ref)
    text = "<|im_start|>user\nWhere is the metadata kept?<|im_end|>\n"
    assert tiny_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert tiny_tokenizer.chat_template == tokenizer.chat_template


def test_the_tiny_base_loads_as_a_causal_lm_over_the_full_vocabulary(tiny_base: Path) -> None:
    import torch

    model = load_model(resolve_base(str(tiny_base)))
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert tuple(logits.shape) == (1, 3, 49152)

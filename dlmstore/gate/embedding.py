"""A prompt as the base model sees it: its last hidden state, mean-pooled over its tokens.

The gate's input is what DLM's ``dlm.inference.gate.embed_prompt`` computes:
the prompt tokenized as plain text (truncated to ``max_length`` tokens),
run through the base with every adapter off, and the last hidden state
averaged over the prompt's real tokens. Adapters are off so the gate sees
the same vector at training time (after SFT, with adapters attached) and at
prompt time (before it knows which adapter to use).

Prompts run in batches, right-padded; the attention mask keeps the padding
out of both the attention (a causal model never looks right anyway) and
the mean, so a prompt gives the same vector alone or beside a longer one,
to float rounding. The backbone's output is what the causal LM's
``hidden_states[-1]`` is (after the final norm), taken without computing
the vocabulary logits, which for a 512-token batch of 8 would be a
50,000-wide matrix per token for nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: Tokens of a prompt the gate looks at (DLM's figure).
MAX_PROMPT_TOKENS = 512


def prompt_embeddings(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    batch_size: int = 8,
    max_length: int = MAX_PROMPT_TOKENS,
) -> torch.Tensor:
    """The mean-pooled last hidden state of each prompt, float32 on the CPU, shape ``[n, hidden]``.

    Args:
        model: a causal LM (transformers), or a PEFT model wrapping one:
            its adapters are disabled for the forward passes.
        tokenizer: the base's tokenizer; only called, never changed.
        prompts: the texts, in the order of the rows returned.
        batch_size: prompts per forward pass.
        max_length: tokens kept of each prompt (the rest is cut).

    Raises:
        ValueError: ``batch_size`` or ``max_length`` is below 1.
    """
    import torch

    if batch_size < 1 or max_length < 1:
        raise ValueError("batch_size and max_length must be at least 1")
    ids = [_token_ids(tokenizer, prompt, max_length) for prompt in prompts]
    hidden = _hidden_size(model)
    if not ids:
        return torch.zeros((0, hidden), dtype=torch.float32)
    device = _device(model)
    pooled: list[torch.Tensor] = []
    with _adapters_off(model), _evaluating(model), torch.no_grad():
        for start in range(0, len(ids), batch_size):
            batch = ids[start : start + batch_size]
            width = max(len(row) for row in batch)
            input_ids = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for i, row in enumerate(batch):
                input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
                mask[i, : len(row)] = 1
            states = _last_hidden_state(model, input_ids.to(device), mask.to(device)).float()
            weights = mask.to(states.device).unsqueeze(-1).to(states.dtype)
            means = (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
            pooled.append(means.cpu())
    return torch.cat(pooled).contiguous()


def _token_ids(tokenizer: Any, prompt: str, max_length: int) -> list[int]:
    """The prompt's ids as DLM's embedder gets them; an empty prompt becomes one pad/eos token."""
    ids = list(tokenizer(prompt, truncation=True, max_length=max_length)["input_ids"])
    if not ids:
        fallback = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
        ids = [int(fallback if fallback is not None else 0)]
    return [int(i) for i in ids]


def _hidden_size(model: Any) -> int:
    config = _inner(model).config
    size = getattr(config, "hidden_size", None)
    if size is None and hasattr(config, "get_text_config"):
        size = getattr(config.get_text_config(), "hidden_size", None)
    if size is None:
        raise ValueError(f"{type(config).__name__} has no hidden_size")
    return int(size)


def _inner(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (the model itself when there is none)."""
    return model.get_base_model() if _is_peft(model) else model


def _is_peft(model: Any) -> bool:
    return callable(getattr(model, "disable_adapter", None)) and callable(
        getattr(model, "get_base_model", None)
    )


def _device(model: Any) -> torch.device:
    import torch

    for parameter in model.parameters():
        return parameter.device  # type: ignore[no-any-return]
    return torch.device("cpu")


def _last_hidden_state(model: Any, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The final (normed) hidden states, from the backbone when the model names one."""
    inner = _inner(model)
    prefix = getattr(inner, "base_model_prefix", "")
    backbone = getattr(inner, prefix, None) if prefix else None
    if backbone is not None and backbone is not inner:
        out = backbone(input_ids=input_ids, attention_mask=mask, use_cache=False, return_dict=True)
        return out.last_hidden_state  # type: ignore[no-any-return]
    out = inner(
        input_ids=input_ids, attention_mask=mask, output_hidden_states=True, use_cache=False, return_dict=True
    )
    return out.hidden_states[-1]  # type: ignore[no-any-return]


def _adapters_off(model: Any) -> Any:
    return model.disable_adapter() if _is_peft(model) else nullcontext()


@contextmanager
def _evaluating(model: Any) -> Iterator[None]:
    """Eval mode (no dropout) for the forward passes, then the mode the caller had."""
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()

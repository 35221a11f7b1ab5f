"""The model architectures the GGUF writer knows, and how each maps onto llama.cpp's.

An architecture is named by the ``architectures`` entry of a model's
``config.json`` (``LlamaForCausalLM``) and becomes a llama.cpp
architecture (``general.architecture = llama``). What differs between
them, and so is written down here, is small:

* the hyperparameters, read from the transformers config into the keys
  llama.cpp reads (``llama.embedding_length``, ``llama.rope.freq_base``...);
* whether the query and key projections are permuted. transformers' Llama
  applies rotary embeddings to the two halves of each head (``rotate_half``),
  llama.cpp's ``llama`` architecture to adjacent pairs, so the rows of
  ``q_proj`` and ``k_proj`` are reordered within each head (llama.cpp's
  converter does the same; :func:`permute_rows`). Qwen2 runs llama.cpp's
  NEOX rotation, which is transformers' half rotation, so nothing moves;
* whether a tensor is expected at all (Qwen2 has biases on q/k/v; a model
  with tied embeddings has no ``lm_head``).

Tensor names are not listed here: gguf's :class:`gguf.TensorNameMap` maps
transformers' names to llama.cpp's for each architecture.

Anything outside this table (another architecture, a RoPE scaling llama.cpp
would need extra tensors for, fused projections) is refused by name with
the supported list, rather than written into a file llama.cpp would load
and answer wrongly from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlmstore.errors import ExportError


@dataclass(frozen=True)
class Architecture:
    """One transformers architecture the writer supports.

    Attributes:
        hf_name: the ``architectures`` entry of ``config.json``.
        gguf_name: llama.cpp's architecture (``general.architecture``).
        permute_qk: reorder q/k rows from half rotation to pair rotation.
        families: the base models of DLM's registry it covers, for messages.
    """

    hf_name: str
    gguf_name: str
    permute_qk: bool
    families: str


ARCHITECTURES: dict[str, Architecture] = {
    "LlamaForCausalLM": Architecture("LlamaForCausalLM", "llama", True, "SmolLM2, Llama 3.2"),
    "Qwen2ForCausalLM": Architecture("Qwen2ForCausalLM", "qwen2", False, "Qwen2.5"),
}


def supported() -> str:
    """The supported architectures, for messages: ``LlamaForCausalLM (SmolLM2, ...), ...``."""
    return ", ".join(f"{a.hf_name} ({a.families})" for a in ARCHITECTURES.values())


@dataclass(frozen=True)
class Hyperparameters:
    """What llama.cpp needs to know of a model's shape, read from its transformers config.

    Attributes:
        arch: the architecture.
        vocab_size: rows of the embedding.
        context_length: ``max_position_embeddings``.
        hidden_size: the embedding width.
        intermediate_size: the MLP's inner width.
        layers: transformer blocks.
        heads: attention heads.
        kv_heads: key/value heads (grouped-query attention).
        head_dim: width of one head.
        rms_norm_eps: the RMSNorm epsilon.
        rope_theta: the RoPE base frequency.
        tied_embeddings: the output layer is the embedding (no ``lm_head`` tensor).
    """

    arch: Architecture
    vocab_size: int
    context_length: int
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tied_embeddings: bool


def hyperparameters(config: Any, *, where: str) -> Hyperparameters:
    """Read a transformers config (``PretrainedConfig``) into :class:`Hyperparameters`.

    Args:
        config: the model's config.
        where: the folder it came from, for messages.

    Raises:
        ExportError: an architecture or a RoPE scaling the writer does not support.
    """
    names = list(getattr(config, "architectures", None) or [])
    arch = next((ARCHITECTURES[name] for name in names if name in ARCHITECTURES), None)
    if arch is None:
        shown = ", ".join(names) or f"model_type {getattr(config, 'model_type', None)!r}"
        raise ExportError(
            f"{where}: the GGUF writer does not support architecture {shown}",
            hint=f"supported: {supported()}; `dlm export --target hf` writes the merged model "
            "without GGUF for any architecture",
        )
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ExportError(
            f"{where}: {arch.hf_name} with RoPE scaling {rope_type!r} is not supported by the GGUF writer",
            hint="only the default RoPE is written; `dlm export --target hf` writes the merged model without GGUF",
        )
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    heads = int(config.num_attention_heads)
    hidden = int(config.hidden_size)
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return Hyperparameters(
        arch=arch,
        vocab_size=int(config.vocab_size),
        context_length=int(config.max_position_embeddings),
        hidden_size=hidden,
        intermediate_size=int(config.intermediate_size),
        layers=int(config.num_hidden_layers),
        heads=heads,
        kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(config.rms_norm_eps),
        rope_theta=float(theta if theta is not None else 10000.0),
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
    )


def add_hyperparameters(writer: Any, params: Hyperparameters) -> None:
    """Write the ``<arch>.*`` keys llama.cpp reads for these hyperparameters."""
    writer.add_vocab_size(params.vocab_size)
    writer.add_context_length(params.context_length)
    writer.add_embedding_length(params.hidden_size)
    writer.add_feed_forward_length(params.intermediate_size)
    writer.add_block_count(params.layers)
    writer.add_head_count(params.heads)
    writer.add_head_count_kv(params.kv_heads)
    writer.add_layer_norm_rms_eps(params.rms_norm_eps)
    writer.add_rope_freq_base(params.rope_theta)
    writer.add_rope_dimension_count(params.head_dim)
    if params.head_dim != params.hidden_size // params.heads:
        writer.add_key_length(params.head_dim)
        writer.add_value_length(params.head_dim)


def permute_rows(weight: Any, heads: int) -> Any:
    """Reorder the rows of a q or k projection (or of a LoRA B matrix) from half to pair rotation.

    Within each head the rows ``[x0..x(d/2-1), y0..y(d/2-1)]`` become
    ``[x0, y0, x1, y1, ...]``; ``heads`` is the number of heads the rows
    belong to (the key/value heads for ``k_proj``). Works on any numpy
    array whose first axis is the output rows.
    """
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def row_heads(hf_name: str, params: Hyperparameters) -> int | None:
    """How many heads the rows of tensor ``hf_name`` are grouped in, when they must be permuted; else None."""
    if not params.arch.permute_qk:
        return None
    if ".self_attn.q_proj." in hf_name:
        return params.heads
    if ".self_attn.k_proj." in hf_name:
        return params.kv_heads
    return None

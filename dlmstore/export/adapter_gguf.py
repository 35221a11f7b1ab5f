"""An adapter alone, as a GGUF LoRA that llama.cpp applies on top of its base's GGUF.

A peft LoRA adapter holds, for each adapted linear layer ``W`` (out x in),
two matrices ``A`` (r x in) and ``B`` (out x r); the adapted layer computes
``W x + (alpha / r) * B A x``. llama.cpp's LoRA format
(``general.type = adapter``, ``adapter.type = lora``) holds the same two
matrices per layer under the base tensor's name plus ``.lora_a`` /
``.lora_b``, and ``adapter.lora.alpha``; llama.cpp scales by
``alpha / r`` just as peft does. With rsLoRA (``alpha / sqrt(r)``) the
alpha written is scaled so that llama.cpp's ``alpha / r`` comes out the same.

Where the base's GGUF has the q/k rows permuted (:mod:`.architectures`),
``B`` is permuted the same way: ``B A`` then lines up with the permuted
``W`` row for row. ``A`` and ``B`` are written in F32; they are small.

What llama.cpp's format cannot hold is refused by name: DoRA (a magnitude
vector per layer), LoRA on the embedding or output layer, layers trained
in full (``modules_to_save``), biases.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dlmstore.errors import ExportError
from dlmstore.export.architectures import Hyperparameters, permute_rows, row_heads

#: peft's prefix of every key in ``adapter_model.safetensors``.
PEFT_PREFIX = "base_model.model."


def adapter_unsupported(adapter: Path) -> str | None:
    """Why the adapter in ``adapter`` cannot be a GGUF LoRA (DoRA, full layers), or None when it can."""
    config = adapter_config(adapter)
    if config.get("use_dora"):
        return "it is a DoRA adapter (llama.cpp's LoRA format has no magnitude vectors)"
    if config.get("modules_to_save"):
        return f"it trains whole layers too ({', '.join(config['modules_to_save'])})"
    if config.get("bias", "none") != "none":
        return "it trains biases"
    return None


def adapter_config(adapter: Path) -> dict[str, Any]:
    """The adapter's ``adapter_config.json`` as a dict.

    Raises:
        ExportError: it cannot be read, or is not a JSON object.
    """
    path = adapter / "adapter_config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot read the adapter config {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ExportError(f"{path} is not a JSON object")
    return data


def write_adapter_gguf(adapter: Path, out: Path, params: Hyperparameters, *, name: str = "") -> None:
    """Write the peft LoRA adapter in ``adapter`` as the GGUF LoRA ``out`` for a base of ``params``.

    Raises:
        ExportError: the adapter cannot be represented (:func:`adapter_unsupported`),
            or names a layer llama.cpp has no name for.
        OSError: the file cannot be written.
    """
    import gguf
    import torch
    from safetensors import safe_open

    why = adapter_unsupported(adapter)
    if why is not None:
        raise ExportError(f"{adapter}: the adapter cannot be written as a GGUF LoRA: {why}")
    config = adapter_config(adapter)
    rank = int(config["r"])
    alpha = float(config["lora_alpha"])
    if config.get("use_rslora"):
        alpha = alpha * math.sqrt(rank)  # llama.cpp scales by alpha / r; rsLoRA by lora_alpha / sqrt(r)
    names = gguf.TensorNameMap(gguf.MODEL_ARCH[params.arch.gguf_name.upper()], params.layers)
    weights = adapter / "adapter_model.safetensors"
    tensors: list[tuple[str, Any]] = []
    with safe_open(str(weights), framework="pt") as handle:
        for key in sorted(handle.keys()):
            layer, part = _split_key(key, weights)
            base = names.get_name(layer + ".weight", try_suffixes=(".weight",))
            if base is None or base.startswith(("token_embd", "output")):
                raise ExportError(
                    f"{weights}: LoRA on {layer!r} cannot be applied by llama.cpp to a "
                    f"{params.arch.gguf_name} model",
                    hint="llama.cpp applies LoRA to the blocks' linear layers; the merged GGUF carries it all",
                )
            array = handle.get_tensor(key).to(torch.float32).numpy()
            heads = row_heads(layer + ".", params)
            if part == "lora_b" and heads is not None:
                array = permute_rows(array, heads)
            tensors.append((f"{base}.{part}", array))
    writer = gguf.GGUFWriter(str(out), params.arch.gguf_name)
    try:
        writer.add_type("adapter")
        if name:
            writer.add_name(name)
        writer.add_string("adapter.type", "lora")
        writer.add_float32("adapter.lora.alpha", alpha)
        for tensor_name, array in sorted(tensors, key=lambda item: _order(item[0])):
            writer.add_tensor(tensor_name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()


def _split_key(key: str, weights: Path) -> tuple[str, str]:
    """``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` -> (``model.layers.0.self_attn.q_proj``, ``lora_a``)."""
    body = key.removeprefix(PEFT_PREFIX)
    for marker, part in ((".lora_A.weight", "lora_a"), (".lora_B.weight", "lora_b")):
        if body.endswith(marker):
            return body[: -len(marker)], part
    raise ExportError(
        f"{weights}: tensor {key!r} is not a LoRA A or B matrix",
        hint="only plain LoRA adapters (no DoRA, no trained embeddings or biases) can be written as a GGUF LoRA",
    )


def _order(name: str) -> tuple[int, str]:
    parts = name.split(".")
    return (int(parts[1]) if parts[0] == "blk" and parts[1].isdigit() else -1, name)

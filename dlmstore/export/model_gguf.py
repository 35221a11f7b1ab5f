"""A transformers model folder written as one GGUF file, in F16 (or F32), with gguf's writer.

The input is a folder ``save_pretrained`` wrote (``config.json``, the
``*.safetensors`` weights, the tokenizer files): the merged model of an
export, or the base model. The output is what llama.cpp's own converter
would write for it: the architecture's hyperparameters
(:mod:`.architectures`), the tokenizer (:mod:`.vocab`), and every tensor
under llama.cpp's name (gguf's ``TensorNameMap``), in a fixed order.

Types follow llama.cpp's converter: matrices in F16, vectors (norms,
biases) in F32, whose few bytes are not worth their precision. A matrix
holding a value F16 cannot represent (beyond +-65504) stays F32 rather
than becoming infinite. Quantised files are made from this one by
llama.cpp's quantiser (:mod:`.quantize`).

The file is written tensor by tensor (header, key/values and tensor infos
first, then each tensor as it is read from safetensors), so a model never
sits twice in memory. Nothing in it depends on the time or the machine:
the same folder gives the same bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmstore.errors import ExportError
from dlmstore.export.architectures import Hyperparameters, add_hyperparameters, hyperparameters, permute_rows
from dlmstore.export.architectures import row_heads as _row_heads
from dlmstore.export.vocab import add_vocabulary

#: The largest finite float16.
F16_MAX = 65504.0

#: ``general.file_type`` of an all-F16 (1) or all-F32 (0) model.
FILE_TYPES = {"F16": 1, "F32": 0}


@dataclass(frozen=True)
class GgufTensor:
    """One tensor to write: its GGUF name and how to read it as a numpy array."""

    name: str
    hf_name: str
    load: Callable[[], Any]


def read_config(folder: Path) -> Any:
    """The transformers config of ``folder`` (imports transformers).

    Raises:
        ExportError: there is no readable ``config.json``.
    """
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot read the model config in {folder}: {exc}") from None


def model_hyperparameters(folder: Path) -> Hyperparameters:
    """The :class:`Hyperparameters` of the model in ``folder``.

    Raises:
        ExportError: an unreadable config, or an architecture the writer does not support.
    """
    return hyperparameters(read_config(folder), where=str(folder))


def write_model_gguf(folder: Path, out: Path, *, file_type: str = "F16", name: str = "") -> Hyperparameters:
    """Write the model in ``folder`` to the GGUF file ``out``.

    Args:
        folder: a ``save_pretrained`` folder with config, safetensors and tokenizer.
        out: the file to write (its folder must exist); a staging path, the
            caller publishes it.
        file_type: ``F16`` (matrices in F16) or ``F32``.
        name: ``general.name``.

    Raises:
        ExportError: an unsupported architecture or tokenizer, or a tensor
            the architecture does not have a llama.cpp name for.
        OSError: the file cannot be written (the caller reports it).
    """
    import gguf
    import numpy as np

    params = model_hyperparameters(folder)
    tensors = model_tensors(folder, params)
    writer = gguf.GGUFWriter(str(out), params.arch.gguf_name)
    try:
        writer.add_type("model")
        if name:
            writer.add_name(name)
        add_hyperparameters(writer, params)
        writer.add_file_type(FILE_TYPES[file_type])
        add_vocabulary(writer, folder, vocab_size=params.vocab_size)
        # Each tensor is read twice (its type depends on its values, and the
        # header lists every type before any data) rather than held in memory.
        planned: list[tuple[GgufTensor, Any]] = []
        for tensor in tensors:
            array = _typed(tensor.load(), file_type, np)
            writer.add_tensor_info(tensor.name, array.shape, array.dtype, array.nbytes)
            planned.append((tensor, array.dtype))
            del array
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor, dtype in planned:
            writer.write_tensor_data(_typed(tensor.load(), file_type, np, dtype=dtype))
    finally:
        writer.close()
    return params


def _typed(array: Any, file_type: str, np: Any, dtype: Any = None) -> Any:
    """``array`` in the type it is written in: F32 vectors, F16 matrices that fit."""
    if dtype is not None:
        return np.ascontiguousarray(array.astype(dtype))
    if file_type == "F32" or array.ndim < 2 or np.abs(array).max(initial=0.0) > F16_MAX:
        return np.ascontiguousarray(array.astype(np.float32))
    return np.ascontiguousarray(array.astype(np.float16))


def model_tensors(folder: Path, params: Hyperparameters) -> list[GgufTensor]:
    """Every tensor of the model in ``folder`` under its llama.cpp name, in writing order.

    The q/k rows are permuted where the architecture asks for it; a tied
    ``lm_head`` is left out (llama.cpp reuses the embedding).

    Raises:
        ExportError: a tensor without a llama.cpp name, or no safetensors at all.
    """
    import gguf

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ExportError(f"{folder}: no *.safetensors weights to convert")
    names = gguf.TensorNameMap(gguf.MODEL_ARCH[params.arch.gguf_name.upper()], params.layers)
    out: list[GgufTensor] = []
    for file in files:
        for hf_name in _keys(file):
            if hf_name == "lm_head.weight" and params.tied_embeddings:
                continue
            if hf_name.endswith(".rotary_emb.inv_freq"):
                continue  # a buffer some checkpoints carry; llama.cpp computes it
            name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
            if name is None:
                raise ExportError(
                    f"{folder}: tensor {hf_name!r} has no llama.cpp name for architecture {params.arch.hf_name}",
                    hint="the model has parts the GGUF writer does not know; `dlm export --target hf` "
                    "writes the merged model without GGUF",
                )
            out.append(GgufTensor(name, hf_name, _loader(file, hf_name, _row_heads(hf_name, params))))
    return sorted(out, key=lambda tensor: _order(tensor.name))


def _keys(file: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as handle:
        return list(handle.keys())


def _loader(file: Path, hf_name: str, heads: int | None) -> Callable[[], Any]:
    def load() -> Any:
        import torch
        from safetensors import safe_open

        with safe_open(str(file), framework="pt") as handle:
            array = handle.get_tensor(hf_name).to(torch.float32).numpy()
        return permute_rows(array, heads) if heads is not None else array

    return load


_BLOCK = re.compile(r"^blk\.(\d+)\.(.*)$")


def _order(name: str) -> tuple[int, int, str]:
    """Embedding first, then each block in order, then the output norm and layer."""
    match = _BLOCK.match(name)
    if match:
        return (1, int(match.group(1)), match.group(2))
    return (0 if name.startswith("token_embd") else 2, 0, name)

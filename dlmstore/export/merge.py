"""The merged model: base weights plus ``(alpha / r) * B A``, saved as a Hugging Face folder.

peft's ``merge_and_unload`` adds each LoRA product into the layer it
adapts, so the merged model computes what the base model with the adapter
computes, without the adapter. The base is loaded as ``dlm prompt`` loads
it (in its checkpoint's dtype), merged in float32 (a bfloat16 base would
otherwise round every sum), and saved back in the checkpoint's dtype, so
the folder reloads in transformers as the model ``dlm prompt`` answers
with and takes the room its base takes.

A folder holds what ``from_pretrained`` needs offline: ``config.json`` and
``generation_config.json``, the weights as ``model.safetensors``, and the
tokenizer files the adapter was trained with (kept in the adapter's
folder, copied byte for byte), chat template included. Every file's bytes
depend only on the base and the adapter, so merging the same adapter twice
gives the same folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dlmstore.bases import TOKENIZER_FILES, BaseModelRef
from dlmstore.errors import ExportError


def merge_adapter(model: Any, adapter: Path, ref: BaseModelRef) -> Any:
    """``model`` (the base of ``ref``) with the adapter in ``adapter`` merged in, in the model's own dtype.

    ``model`` is consumed: peft merges into its layers.

    Raises:
        ExportError: the adapter does not fit the model.
    """
    from peft import PeftModel

    dtype = next(model.parameters()).dtype
    model.float()
    try:
        merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    except (OSError, ValueError, RuntimeError) as exc:
        raise ExportError(f"cannot merge the adapter {adapter} into base model {ref.name!r}: {exc}") from None
    merged.eval()
    return merged.to(dtype)


def save_model(model: Any, adapter: Path, folder: Path) -> None:
    """Save ``model`` and the adapter's tokenizer files into ``folder`` (which exists).

    Raises:
        OSError, or what the writing libraries raise on a failed write (the caller reports it).
    """
    model.save_pretrained(str(folder), safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (adapter / name).is_file():
            shutil.copyfile(adapter / name, folder / name)

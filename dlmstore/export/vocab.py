"""A tokenizer as GGUF metadata: ``tokenizer.ggml.*`` and the chat template.

llama.cpp tokenizes with its own code, so a GGUF must describe the
tokenizer the adapter was trained with closely enough that llama.cpp
produces the same ids. For the byte-level BPE tokenizers of DLM's text
bases that is:

* ``tokenizer.ggml.model = gpt2`` (byte-level BPE), the vocabulary in id
  order with a type per token (normal, control for special added tokens,
  user-defined for other added tokens, unused for ids the tokenizer does
  not fill up to the embedding's rows), and the merges;
* ``tokenizer.ggml.pre``, the name of the pre-tokenizer llama.cpp runs
  before BPE. llama.cpp does not read the regular expressions of a
  ``tokenizer.json``; it knows a fixed set by name. :data:`PRE_TOKENIZERS`
  recognises the ``pre_tokenizer`` blocks of DLM's bases and names the one
  llama.cpp runs for it;
* the special token ids, whether BOS/EOS are added, and the chat template,
  which gguf's :class:`gguf.SpecialVocab` reads from the same folder.

The tokenizer is read from the ``tokenizer.json`` of the merged model's
folder (the files the adapter was trained with). A tokenizer that is not
byte-level BPE (SentencePiece, WordPiece, Unigram), a BPE with byte
fallback, or a pre-tokenizer none of the names matches cannot be
represented, and is one error naming what was found.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmstore.errors import ExportError

#: The regexes of Qwen2's and Llama 3's ``Split`` pre-tokenizers, as their tokenizer.json holds them.
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_BYTE_LEVEL_REGEX = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
_BYTE_LEVEL_PLAIN = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}


def _split(pattern: str) -> dict[str, Any]:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


#: llama.cpp's pre-tokenizer name -> the ``pre_tokenizer`` block it stands for (keys that
#: matter only; ``trim_offsets`` changes offsets, not ids) and whether BPE ignores merges
#: for whole-word vocabulary hits (llama.cpp sets that by the name too).
PRE_TOKENIZERS: dict[str, tuple[dict[str, Any], bool]] = {
    # GPT-2's regex alone: the built-in smollm2-135m as dlmstore converts it from GGUF.
    "gpt-2": (_BYTE_LEVEL_REGEX, False),
    # SmolLM2 on the hub: each digit apart, then GPT-2's regex.
    "smollm": (
        {
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTE_LEVEL_REGEX],
        },
        False,
    ),
    "qwen2": ({"type": "Sequence", "pretokenizers": [_split(_QWEN2), _BYTE_LEVEL_PLAIN]}, False),
    "llama-bpe": ({"type": "Sequence", "pretokenizers": [_split(_LLAMA3), _BYTE_LEVEL_PLAIN]}, True),
}

#: gguf's token types (``gguf.TokenType``), written as plain ints.
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


@dataclass(frozen=True)
class Vocabulary:
    """A byte-level BPE tokenizer, as llama.cpp reads it.

    Attributes:
        tokens: every token's text, in id order, padded to the embedding's rows.
        types: each token's type (:data:`NORMAL`, :data:`CONTROL`, ...).
        pre: llama.cpp's name for the pre-tokenizer.
    """

    tokens: list[str]
    types: list[int]
    pre: str


def read_vocabulary(folder: Path, *, vocab_size: int) -> Vocabulary:
    """Read the ``tokenizer.json`` in ``folder`` as a :class:`Vocabulary` of ``vocab_size`` rows.

    Raises:
        ExportError: the tokenizer cannot be represented in GGUF (see the module docstring).
    """
    path = folder / "tokenizer.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot read the tokenizer {path}: {exc}") from None
    model = data.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        kind = model.get("type") or "unknown"
        raise ExportError(
            f"{path}: a {kind} tokenizer{' with byte fallback' if model.get('byte_fallback') else ''} "
            "cannot be represented in GGUF by dlm export",
            hint="the GGUF writer supports byte-level BPE tokenizers (SmolLM2, Qwen2.5, Llama 3); "
            "`dlm export --target hf` writes the merged model for any tokenizer",
        )
    pre = _pre_tokenizer(data, path, ignore_merges=bool(model.get("ignore_merges")))
    by_id: dict[int, str] = {int(i): token for token, i in model.get("vocab", {}).items()}
    added = {int(item["id"]): item for item in data.get("added_tokens", [])}
    for i, item in added.items():
        by_id[i] = item["content"]
    if by_id and max(by_id) >= vocab_size:
        raise ExportError(
            f"{path}: token id {max(by_id)} does not fit the model's {vocab_size} embedding rows",
            hint="the tokenizer and the model do not belong together",
        )
    tokens: list[str] = []
    types: list[int] = []
    for i in range(vocab_size):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif i in added:
            tokens.append(token)
            types.append(CONTROL if added[i].get("special") else USER_DEFINED)
        else:
            tokens.append(token)
            types.append(NORMAL)
    return Vocabulary(tokens, types, pre)


def _pre_tokenizer(data: dict[str, Any], path: Path, *, ignore_merges: bool) -> str:
    normalizer = data.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        raise ExportError(
            f"{path}: a tokenizer with a {normalizer.get('type')} normalizer cannot be represented in GGUF",
            hint="llama.cpp applies no normalizer to byte-level BPE; `dlm export --target hf` writes the "
            "merged model for any tokenizer",
        )
    found = _essentials(data.get("pre_tokenizer"))
    for name, (expected, merges_ignored) in PRE_TOKENIZERS.items():
        if found == _essentials(expected) and merges_ignored == ignore_merges:
            return name
    raise ExportError(
        f"{path}: its pre-tokenizer {json.dumps(data.get('pre_tokenizer'), sort_keys=True)[:200]} "
        "is none that llama.cpp runs, so the tokenizer cannot be represented in GGUF",
        hint=f"supported pre-tokenizers: {', '.join(PRE_TOKENIZERS)} (GPT-2, SmolLM2, Qwen2, Llama 3); "
        "`dlm export --target hf` writes the merged model for any tokenizer",
    )


def _essentials(block: Any) -> Any:
    """A pre-tokenizer block without the keys that do not change ids."""
    if isinstance(block, dict):
        return {k: _essentials(v) for k, v in sorted(block.items()) if k not in ("trim_offsets",)}
    if isinstance(block, list):
        return [_essentials(item) for item in block]
    return block


def add_vocabulary(writer: Any, folder: Path, *, vocab_size: int) -> Vocabulary:
    """Write the tokenizer of ``folder`` into ``writer`` (a ``gguf.GGUFWriter``): tokens, merges, ids, template.

    Raises:
        ExportError: see :func:`read_vocabulary`.
    """
    import gguf

    vocabulary = read_vocabulary(folder, vocab_size=vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocabulary.pre)
    writer.add_token_list(vocabulary.tokens)
    writer.add_token_types(vocabulary.types)
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=vocab_size)
    if not special.merges:
        raise ExportError(
            f"{folder / 'tokenizer.json'}: a BPE tokenizer without merges cannot be represented"
        )
    special.add_to_gguf(writer, quiet=True)
    return vocabulary

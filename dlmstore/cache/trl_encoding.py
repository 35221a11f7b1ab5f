"""Rows to token ids exactly as TRL's ``SFTTrainer`` computes them, batched.

``text`` rows get EOS appended unless present and are encoded with special
tokens; ``messages`` rows are rendered with the chat template and encoded
without (as ``apply_chat_template(tokenize=True)`` does). Where a fast
tokenizer's ``__call__`` is exactly its Rust backend's ``encode_batch``,
the backend is called directly (:func:`encode_texts`). The parity tests
(``tests/test_tokenization.py``) compare this with TRL's own path; the
tokenize pass (``dlmstore.corpus.tokenize``) and the text-only tokenizer
(``dlmstore.cache.rust_tokenizer``) use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dlmstore.document.rows import Row

if TYPE_CHECKING:
    import numpy as np


def rendered_text(tokenizer: Any, row: Row) -> str:
    """The string TRL tokenizes for a text row (EOS appended unless present)."""
    text: str = row.data["text"]
    eos = tokenizer.eos_token
    return text if eos is None or text.endswith(eos) else text + eos


def encode_rows(
    tokenizer: Any, rows: Sequence[Row], *, prefix: Any = None, dtype: Any = None
) -> list[np.ndarray]:
    """Token ids of ``rows`` the way TRL would compute them, batched.

    ``text`` rows are encoded with special tokens, ``messages`` rows are
    rendered with the chat template and encoded without (as
    ``apply_chat_template(tokenize=True)`` does). Identical inputs are
    encoded once. With ``prefix`` (a ``dlmstore.prefix.PrefixCachedTokenizer``
    over the same tokenizer) the rendered chats go through the prefix cache,
    so a system prompt or conversation prefix shared by many rows is
    tokenized once; its output equals the tokenizer's. The arrays are
    ``dtype`` (default int64; the pass asks for its segment dtype, which holds
    every id of the vocabulary).
    """
    import numpy as np

    dtype = np.dtype(np.int64) if dtype is None else np.dtype(dtype)
    inputs: list[tuple[str, bool]] = []
    conversations = [row.data["messages"] for row in rows if row.kind == "messages"]
    rendered = iter(
        tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=False)
        if conversations
        else []
    )
    for row in rows:
        if row.kind == "messages":
            inputs.append((next(rendered), False))
        elif row.kind == "text":
            inputs.append((rendered_text(tokenizer, row), True))
        else:
            raise ValueError(f"{row.kind} rows are not tokenized")
    unique: dict[tuple[str, bool], int] = {}
    order = [unique.setdefault(item, len(unique)) for item in inputs]
    distinct = list(unique)
    encoded: list[np.ndarray] = [np.empty(0, dtype=dtype)] * len(distinct)
    for special in (True, False):
        positions = [i for i, (_, flag) in enumerate(distinct) if flag is special]
        if not positions:
            continue
        texts = [distinct[i][0] for i in positions]
        if prefix is not None and not special:
            ids = [prefix.encode(text, add_special_tokens=False) for text in texts]
        else:
            ids = encode_texts(tokenizer, texts, add_special_tokens=special)
        for position, row_ids in zip(positions, ids, strict=True):
            # fromiter with a count: one pass, no size guessing (a sixth
            # faster than np.array on lists of ids; both refuse an id the
            # dtype cannot hold)
            encoded[position] = np.fromiter(row_ids, dtype=dtype, count=len(row_ids))
    return [encoded[i] for i in order]


def encode_texts(tokenizer: Any, texts: list[str], *, add_special_tokens: bool) -> list[list[int]]:
    """``tokenizer(texts, add_special_tokens=...)["input_ids"]``, straight from the Rust tokenizer where that is the same.

    For a fast tokenizer whose backend has no truncation or padding set and
    splits special tokens as the wrapper says, ``transformers`` does exactly
    one thing: ``backend.encode_batch(texts)``, then builds a Python list of
    ids *and* one of attention-mask ones per row, and a ``BatchEncoding``.
    Calling the backend's ``encode_batch_fast`` gives the same ids (it only
    skips the character offsets, which nothing here reads) without the
    per-token lists nobody uses: roughly 9% of the tokenizer's time on
    stdlib files (a noisy measurement) and a few seconds of single-threaded
    Python on the whole stdlib. Anything else goes through the wrapper. The
    parity tests (``tests/test_tokenization.py``) compare the cached path,
    which takes this one, with TRL's.
    """
    if backend_encodes_alone(tokenizer):
        fast = tokenizer._tokenizer.encode_batch_fast
        return [encoding.ids for encoding in fast(texts, add_special_tokens=add_special_tokens)]
    ids: list[list[int]] = tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
    return ids


def backend_encodes_alone(tokenizer: Any) -> bool:
    """Whether ``tokenizer(texts)`` is exactly its Rust backend's ``encode_batch`` (see :func:`encode_texts`).

    A fast tokenizer whose backend has no truncation or padding set and
    splits special tokens as the wrapper says.
    """
    backend: Any = getattr(tokenizer, "_tokenizer", None)
    return (
        getattr(backend, "encode_batch_fast", None) is not None
        and bool(getattr(tokenizer, "is_fast", False))
        and backend.truncation is None
        and backend.padding is None
        and backend.encode_special_tokens == bool(getattr(tokenizer, "split_special_tokens", False))
    )

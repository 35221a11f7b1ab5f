"""Turning text into token ids for dataset builders, with any Hugging Face tokenizer.

:class:`TextEncoder` wraps a loaded tokenizer (fast ``tokenizers``-backed or
SentencePiece-backed) and offers the two encodings a builder needs:

* :meth:`TextEncoder.encode_texts` for *data* (document text, message
  content): batched (the Rust backend tokenizes a batch on all cores), no
  BOS/EOS added, and text that happens to spell a special token, such as a
  web page quoting ``<|im_end|>``, is tokenized as ordinary text. A
  document must not be able to end an assistant turn or a document early;
* :meth:`TextEncoder.encode_contents` for message content, which sits in
  the middle of a rendered conversation: the same, except that the
  tokenizer's word-start marker for the beginning of a string is not added
  (a SentencePiece ``Metaspace`` prepend, a ``Prepend("▁")`` normalizer, a
  byte-level ``add_prefix_space``), just as it is not added to content in
  ``<|im_start|>user\\nHello``;
* :meth:`TextEncoder.encode_markup` for *chat markup* (``<|im_start|>user\\n``)
  where special tokens are meant.

For fast tokenizers the data encoder is a private copy of the Rust
tokenizer with ``encode_special_tokens`` switched on, so the caller's
tokenizer is never mutated. The identity of the tokenizer
(``tokenizer_sha256``) is :func:`dlmstore.fingerprint.fingerprint_tokenizer`,
the same value ``dlm`` records everywhere else.
"""

from __future__ import annotations

import json
from typing import Any

from dlmstore.errors import DatasetError


class TextEncoder:
    """Batched, special-token-safe encoding with one tokenizer.

    Args:
        tokenizer: a loaded Hugging Face tokenizer.
        tokenizer_sha256: its fingerprint when already known (saves
            re-hashing its files); computed lazily otherwise.
    """

    def __init__(self, tokenizer: Any, *, tokenizer_sha256: str | None = None) -> None:
        self.tokenizer = tokenizer
        self._sha256 = tokenizer_sha256
        self.vocab_size = int(len(tokenizer))
        self.name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
        self._clone_backend()

    def _clone_backend(self) -> None:
        backend = getattr(self.tokenizer, "_tokenizer", None)
        self._data: DataEncoder | None = None
        self._contents: DataEncoder | None = None
        if backend is not None and hasattr(backend, "encode_batch") and hasattr(backend, "to_str"):
            self._data = DataEncoder(backend.to_str())

    def __getstate__(self) -> dict[str, Any]:
        # The Rust copies are the tokenizer's own JSON again: rebuilt on arrival, not sent twice.
        state = dict(self.__dict__)
        for key in ("_data", "_contents"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._clone_backend()

    @property
    def tokenizer_sha256(self) -> str:
        """The tokenizer's ``sha256:`` fingerprint."""
        if self._sha256 is None:
            from dlmstore.fingerprint import fingerprint_tokenizer

            self._sha256 = fingerprint_tokenizer(self.tokenizer)
        return self._sha256

    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text: no special tokens added, none parsed from the text."""
        if not texts:
            return []
        if self._data is not None:
            return self._data.encode_texts(texts)
        try:
            out = self.tokenizer(texts, add_special_tokens=False, split_special_tokens=True)
        except TypeError:  # a tokenizer without split_special_tokens
            out = self.tokenizer(texts, add_special_tokens=False)
        return [list(ids) for ids in out["input_ids"]]

    def for_data(self) -> TextEncoder | DataEncoder:
        """What :meth:`encode_texts` alone needs, to send to another process.

        With a Rust backend that is a :class:`DataEncoder`, which unpickles
        without importing transformers (about a second a Ray worker saves per
        build); otherwise, or when a subclass encodes its own way, this
        encoder itself.
        """
        if self._data is None or type(self).encode_texts is not TextEncoder.encode_texts:
            return self
        return self._data

    def encode_contents(self, texts: list[str]) -> list[list[int]]:
        """Token ids of message contents: :meth:`encode_texts` without a string-start marker."""
        if not texts:
            return []
        if self._data is None:
            return self.encode_texts(texts)
        if self._contents is None:  # built on first use: pretrain builds never need it
            config = json.loads(self._data.config)
            self._contents = DataEncoder(json.dumps(config)) if _drop_start_marker(config) else self._data
        return self._contents.encode_texts(texts)

    def encode_markup(self, text: str) -> list[int]:
        """Token ids of chat markup, special tokens parsed; ``[]`` for empty text."""
        if not text:
            return []
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def token_id(self, token: str, *, what: str) -> int:
        """The id of a single special token; an error naming ``what`` when it is not one."""
        ids = self.encode_markup(token)
        if len(ids) != 1:
            raise DatasetError(
                f"{what} {token!r} is not a single token of tokenizer {self.name} (it encodes to {ids})",
                hint="pass a token from the tokenizer's special tokens (e.g. its eos_token)",
            )
        return ids[0]

    def eos_token(self) -> str:
        """The tokenizer's end-of-sequence token; an error when it has none."""
        eos = getattr(self.tokenizer, "eos_token", None)
        if not eos:
            raise DatasetError(
                f"tokenizer {self.name} has no eos_token to put between documents",
                hint="name one with --eos-token (library: eos_token=...)",
            )
        return str(eos)

    def special_token_ids(self) -> dict[str, int]:
        """bos/eos/pad/unk ids the tokenizer declares (only those it has)."""
        found: dict[str, int] = {}
        for key in ("bos", "eos", "pad", "unk"):
            value = getattr(self.tokenizer, f"{key}_token_id", None)
            if isinstance(value, int):
                found[key] = value
        return found


class DataEncoder:
    """:meth:`TextEncoder.encode_texts` with nothing but the Rust backend (``tokenizers``).

    Built from the backend's JSON, with special-token text encoded as text
    (``encode_special_tokens``, which that JSON does not hold, so it is set
    again whenever one is unpickled): the same ids as the
    :class:`TextEncoder` it came from.
    """

    def __init__(self, config: str) -> None:
        self.config = config
        self._open()

    def _open(self) -> None:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(self.config)
        backend.encode_special_tokens = True
        self._batch = getattr(backend, "encode_batch_fast", backend.encode_batch)

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.config = state["config"]
        self._open()

    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text: no special tokens added, none parsed from the text."""
        if not texts:
            return []
        return [encoding.ids for encoding in self._batch(texts, add_special_tokens=False)]


def as_encoder(tokenizer: Any, tokenizer_sha256: str | None = None) -> TextEncoder:
    """A :class:`TextEncoder` for ``tokenizer`` (returned as is when it already is one)."""
    if isinstance(tokenizer, TextEncoder):
        return tokenizer
    return TextEncoder(tokenizer, tokenizer_sha256=tokenizer_sha256)


def _drop_start_marker(config: dict[str, Any]) -> bool:
    """Turn off what marks the start of a string in a ``tokenizers`` config; True if anything was."""
    changed = False

    def visit(node: Any) -> Any:
        nonlocal changed
        if isinstance(node, list):
            kept = [visit(child) for child in node]
            return [child for child in kept if child is not None]
        if not isinstance(node, dict):
            return node
        kind = node.get("type")
        if kind == "Prepend":  # Llama-2-style normalizer: "▁" before every text run
            changed = True
            return None
        if kind == "Metaspace" and node.get("prepend_scheme", "always") != "never":
            node["prepend_scheme"], changed = "never", True
        if kind == "Metaspace" and node.get("add_prefix_space"):  # configs of older tokenizers
            node["add_prefix_space"], changed = False, True
        if kind == "ByteLevel" and node.get("add_prefix_space"):
            node["add_prefix_space"], changed = False, True
        for key in ("normalizers", "pretokenizers"):
            if key in node:
                node[key] = visit(node[key])
        return node

    for part in ("normalizer", "pre_tokenizer"):
        if config.get(part) is not None:
            config[part] = visit(config[part])
    return changed

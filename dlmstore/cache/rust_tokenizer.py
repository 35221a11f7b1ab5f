"""The Rust tokenizer as transformers configures it, kept so text rows tokenize without transformers.

A text row is encoded by the fast tokenizer's Rust backend alone
(:func:`~dlmstore.cache.trl_encoding.encode_texts`): ``transformers`` only
loads and configures that backend (its added tokens, normalizer,
pre-tokenizer and post-processor) and tells the pass the EOS token and the
vocabulary size. Loading it that way imports torch and transformers first,
2.5-3.5 s on the 2-core machine before the first row is encoded, all on
one core. So the first time a pass loads a tokenizer whose backend the
text rows can use directly, the backend is written out (``to_str``, the
``tokenizer.json`` format, lossless) with those few facts to
``<home>/tokenizers/<fingerprint>.json``; a later pass whose misses are
all text rows loads that file with the ``tokenizers`` package (about
0.1 s) and never imports torch or transformers. Rows that need the chat
template (conversations, preference pairs) still load the tokenizer
through transformers.

Safe because the file is named by the tokenizer's fingerprint
(``dlmstore.fingerprint``), which covers every tokenizer file and the
versions of ``tokenizers`` and ``transformers``: anything that could make
transformers configure the backend differently gives another name. It is
written atomically and read whole; a file that cannot be read or parsed is
ignored (the tokenizer is loaded the usual way and the file rewritten).
The parity tests check that both routes give TRL's tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlmstore.home import dlm_home

SCHEME = "rust-tokenizer-v1"


def snapshot_path(fingerprint: str) -> Path:
    """Where the backend of the tokenizer with ``fingerprint`` (``sha256:<hex>``) is kept."""
    return dlm_home() / "tokenizers" / f"{fingerprint.removeprefix('sha256:')}.json"


class TextTokenizer:
    """The part of a transformers fast tokenizer that encodes text rows: its backend and two facts.

    Shaped like the transformers tokenizer where the pass reads it
    (``_tokenizer``, ``is_fast``, ``split_special_tokens``, ``eos_token``,
    ``len()``), so :func:`~dlmstore.cache.trl_encoding.encode_texts` takes its
    Rust fast path exactly as it does for the tokenizer it was saved from.
    """

    is_fast = True

    def __init__(
        self, backend: Any, *, eos_token: str | None, vocab_size: int, split_special_tokens: bool
    ) -> None:
        self._tokenizer = backend
        self.eos_token = eos_token
        self.split_special_tokens = split_special_tokens
        self._vocab_size = vocab_size

    def __len__(self) -> int:
        return self._vocab_size


def save_snapshot(tokenizer: Any, fingerprint: str) -> bool:
    """Keep the backend of ``tokenizer`` (just loaded through transformers) for later passes.

    Only a tokenizer whose text rows the backend encodes alone (the
    conditions of ``encode_texts``' fast path) is kept, and the file is
    written only when its bytes would change (it is there already after the
    first load; a damaged one is replaced). Returns whether a file was
    written; a write that fails (a read-only home, a full disk) is skipped:
    the file only saves time.
    """
    from dlmstore.cache.trl_encoding import backend_encodes_alone
    from dlmstore.store.atomic import write_bytes_atomic

    if not backend_encodes_alone(tokenizer):
        return False
    payload = {
        "scheme": SCHEME,
        "fingerprint": fingerprint,
        "eos_token": tokenizer.eos_token,
        "vocab_size": len(tokenizer),
        "split_special_tokens": bool(getattr(tokenizer, "split_special_tokens", False)),
        "backend": tokenizer._tokenizer.to_str(),
    }
    path = snapshot_path(fingerprint)
    data = json.dumps(payload).encode("utf-8")
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass  # not there yet, or unreadable: write it
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, data)
    except OSError:
        return False
    return True


def load_snapshot(fingerprint: str) -> TextTokenizer | None:
    """The kept backend of the tokenizer with ``fingerprint``; ``None`` when there is none usable."""
    path = snapshot_path(fingerprint)
    try:
        payload = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if (
        not isinstance(payload, dict)
        or payload.get("scheme") != SCHEME
        or payload.get("fingerprint") != fingerprint
    ):
        return None
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_str(payload["backend"])
        return TextTokenizer(
            backend,
            eos_token=payload["eos_token"],
            vocab_size=int(payload["vocab_size"]),
            split_special_tokens=bool(payload["split_special_tokens"]),
        )
    except Exception:  # a missing key, a wrong type; tokenizers raises a plain Exception on bad JSON
        return None


__all__ = ["TextTokenizer", "load_snapshot", "save_snapshot", "snapshot_path"]

"""Preference tokens: the token arrays a DPO or ORPO trainer builds a triple's inputs from.

A ``preference`` row (prompt, chosen, rejected) is trained as a
conversation: the prompt is one user message, each response one assistant
message, rendered with the base's chat template as instruction rows are.
TRL's trainers then derive every input from a few renderings of it:

* ``DPOTrainer`` (``_prepare_dataset``) encodes three chats with
  ``apply_chat_template(..., tokenize=True)``: the prompt alone with the
  generation prompt, prompt + chosen, and prompt + rejected, then splits
  each conversation where it stops agreeing with the prompt's tokens.
* ``ORPOTrainer`` renders the same three chats as text, cuts the prompt to
  the longest character prefix the three renderings share (a no-op for
  templates such as SmolLM2's ChatML, which render the prompt alone as a
  prefix of the conversation) and encodes that prefix and the two
  conversations without special tokens; BOS, EOS, truncation and labels
  come after, from these ids alone.

So each row is stored as four token arrays, its *parts*, which do not
depend on the method (switching between DPO and ORPO reuses them):

================  ==============================================================
``prompt``        the user message with the generation prompt (DPO's prompt)
``shared_prompt`` the character prefix all three renderings share (ORPO's prompt)
``chosen``        the user message, then the chosen assistant message
``rejected``      the user message, then the rejected assistant message
================  ==============================================================

Every part is the rendered text encoded without adding special tokens,
which is what ``apply_chat_template(tokenize=True)`` does; rows are
rendered and encoded in one batch per call.

Cache keys: each part is an entry of its own under a key derived from the
row's key (``dlmstore.document.rows``)::

    part_key = "sha256:" + sha256("pref-v1\\n{part}\\n{row_key}")

The row key already changes with the triple's text and position; the
tokenizer fingerprint and ``sequence_len`` complete the entry key as for
every row. Bump ``pref-v1`` when what a part holds changes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import sha256
from typing import TYPE_CHECKING, Any

from dlmstore.document.rows import Row

if TYPE_CHECKING:
    import numpy as np

PART_KEY_SCHEME = "pref-v1"

#: The parts of a preference row, in the order they are stored and returned.
PARTS = ("prompt", "shared_prompt", "chosen", "rejected")


def part_key(row_key: str, part: str) -> str:
    """The cache key of one part of a preference row (see the module docstring)."""
    return "sha256:" + sha256(f"{PART_KEY_SCHEME}\n{part}\n{row_key}".encode()).hexdigest()


def part_keys(row_key: str) -> tuple[str, ...]:
    """The keys of every part of a preference row, in :data:`PARTS` order."""
    return tuple(part_key(row_key, part) for part in PARTS)


def conversations(row: Row) -> tuple[list[dict[str, str]], list[dict[str, str]], list[dict[str, str]]]:
    """The conversational triple a trainer is given for ``row``: prompt, chosen, rejected message lists."""
    data = row.data
    return (
        [{"role": "user", "content": data["prompt"]}],
        [{"role": "assistant", "content": data["chosen"]}],
        [{"role": "assistant", "content": data["rejected"]}],
    )


def encode_preferences(tokenizer: Any, rows: Sequence[Row]) -> list[dict[str, np.ndarray]]:
    """The parts of each preference row, as TRL's trainers compute them, batched.

    Returns one ``{part: token ids}`` dict per row, in order.
    """
    import numpy as np

    if not rows:
        return []
    triples = [conversations(row) for row in rows]
    render = tokenizer.apply_chat_template
    prompts = render([p for p, _, _ in triples], tokenize=False, add_generation_prompt=True)
    chosen = render([p + c for p, c, _ in triples], tokenize=False)
    rejected = render([p + r for p, _, r in triples], tokenize=False)
    # ORPO (trl.data_utils.apply_chat_template) keeps the prompt up to where
    # it stops agreeing, character by character, with either conversation.
    shared = [os.path.commonprefix(list(texts)) for texts in zip(prompts, chosen, rejected, strict=True)]
    texts = [*prompts, *shared, *chosen, *rejected]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    n = len(rows)
    return [
        {part: np.asarray(ids[k * n + i], dtype=np.int64) for k, part in enumerate(PARTS)} for i in range(n)
    ]


@dataclass(frozen=True)
class Ragged:
    """Token arrays back to back: array ``i`` is ``values[offsets[i]:offsets[i+1]]`` (Arrow's list layout)."""

    offsets: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        return self.values[self.offsets[index] : self.offsets[index + 1]]

    def lengths(self) -> np.ndarray:
        import numpy as np

        return np.diff(self.offsets)

    @staticmethod
    def of(arrays: Sequence[np.ndarray]) -> Ragged:
        """Concatenate ``arrays`` (at least a ``uint16`` result, wider if any array is)."""
        import numpy as np

        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        if arrays:
            np.cumsum([len(a) for a in arrays], out=offsets[1:])
        dtype = np.result_type(np.uint16, *[a.dtype for a in arrays])
        values = np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.empty(0, dtype=dtype)
        return Ragged(offsets, values)


@dataclass(frozen=True)
class TokenizedPreferences:
    """The preference rows of a document and their parts, in corpus order.

    Attributes:
        path: the document, for messages (``doc.dlm:42: ...``).
        row_keys: each row's key.
        lines: the line of each row's ``::preference::`` fence in the document.
        indices: each row's position in its section (0-based).
        prompt, shared_prompt, chosen, rejected: the parts (module docstring).
    """

    path: str
    row_keys: tuple[str, ...]
    lines: tuple[int | None, ...]
    indices: tuple[int, ...]
    prompt: Ragged
    shared_prompt: Ragged
    chosen: Ragged
    rejected: Ragged

    def __len__(self) -> int:
        return len(self.row_keys)

    def where(self, index: int) -> str:
        """``doc.dlm:42: preference triple 2`` for row ``index``, the start of its messages."""
        line = self.lines[index]
        place = self.path if line is None else f"{self.path}:{line}"
        return f"{place}: preference triple {self.indices[index] + 1}"

    @staticmethod
    def of(
        path: str, rows: Sequence[Row], lines: Sequence[int | None], arrays: dict[str, np.ndarray]
    ) -> TokenizedPreferences:
        """Gather the parts of ``rows`` (at ``lines``) from ``arrays`` (part key -> token ids)."""
        keys = [part_keys(row.row_key) for row in rows]
        prompt, shared_prompt, chosen, rejected = (
            Ragged.of([arrays[k[i]] for k in keys]) for i in range(len(PARTS))
        )
        return TokenizedPreferences(
            path, tuple(row.row_key for row in rows), tuple(lines), tuple(row.index for row in rows),
            prompt, shared_prompt, chosen, rejected,
        )  # fmt: skip

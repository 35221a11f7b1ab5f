"""Chat formats: how a conversation becomes tokens and a per-token loss mask.

A :class:`ChatFormat` describes a tokenizer's chat markup in four strings:
the text that opens a turn (``<|im_start|>{role}\\n`` for ChatML), the
single special token that closes it (``<|im_end|>``, the EOT), the text
after it (``\\n``), and a preamble some templates insert when a
conversation has no system message (SmolLM2's default system prompt); plus
two habits of templates: trimming message content (Llama 3, Gemma) and
where a system message goes (its own turn; folded into the first user turn
as Gemma 3 does; or refused, as Gemma 2 does). :func:`chat_format_for`
picks the preset whose markers the tokenizer's chat template uses, settles
those habits, and *verifies* the result by rendering probe conversations
both ways; a template it cannot reproduce is an error asking for an
explicit format, never a silent mismatch between training data and
inference.

The loss mask is built from the message structure, not from character
offsets into a rendered string: each piece (turn opener, content, EOT,
separator) is encoded on its own and the content and EOT of assistant
turns are marked trained. So "exactly the assistant content and its
closing token" holds by construction, and message content that spells a
special token cannot open or close a turn. Each piece is encoded the way
it sits in the rendered string: content as the middle of a text run
(:meth:`~.encoding.TextEncoder.encode_contents`, so a SentencePiece
tokenizer adds no word-start ``▁`` to it) and markup after a special token
as text after that token. The price: a piece is encoded without its
neighbours, so content that starts with whitespace may tokenize slightly
differently than in one rendered string (tokens do not merge across the
piece boundary); ordinary content matches ``apply_chat_template`` exactly
for byte-level BPE and SentencePiece tokenizers alike (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypedDict

import numpy as np

from dlmstore.datasets.build.encoding import TextEncoder
from dlmstore.errors import DatasetError

ROLES = ("system", "user", "assistant")
SystemPlacement = Literal["turn", "first_user", "none"]
Turn = tuple[str, str]  # (role, content as the template writes it)


class Message(TypedDict):
    """One chat message, as builders accept it."""

    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True)
class ChatFormat:
    """A tokenizer's chat markup (see the module docstring).

    ``system`` says where a leading system message goes: ``turn`` (a turn
    of its own), ``first_user`` (its content and ``system_sep`` open the
    next turn's content, as Gemma 3 writes it) or ``none`` (the template
    has no system role; such an example is an error). ``trim`` strips
    message content as a template's ``| trim`` does.
    """

    name: str
    turn_start: str
    turn_end: str
    turn_sep: str = ""
    bos: str = ""
    preamble: str = ""
    assistant_role: str = "assistant"
    system: SystemPlacement = "turn"
    trim: bool = False
    system_sep: str = "\n\n"

    def role_name(self, role: str) -> str:
        return self.assistant_role if role == "assistant" else role

    def turns(self, messages: Sequence[Message]) -> list[Turn]:
        """The turns the template writes for ``messages``, content trimmed and system placed.

        Raises:
            DatasetError: a system message for a template without a system role.
        """
        prefix = ""
        turns: list[Turn] = []
        for position, message in enumerate(messages):
            content = message["content"].strip() if self.trim else message["content"]
            if position == 0 and message["role"] == "system" and self.system != "turn":
                if self.system == "none":
                    raise DatasetError(
                        f"the {self.name} chat template has no system role, and the example starts with "
                        "a system message",
                        hint="drop system messages or fold them into the first user message",
                    )
                prefix = message["content"] + self.system_sep
                continue
            turns.append((message["role"], prefix + content))
            prefix = ""
        return turns

    def render(self, messages: Sequence[Message]) -> str:
        """The conversation as text, the way the tokenizer's template writes it."""
        out = [self.bos]
        if messages and messages[0]["role"] != "system":
            out.append(self.preamble)
        for role, content in self.turns(messages):
            out.append(self.turn_start.format(role=self.role_name(role)))
            out.append(content + self.turn_end + self.turn_sep)
        return "".join(out)


PRESETS: dict[str, ChatFormat] = {
    "chatml": ChatFormat("chatml", "<|im_start|>{role}\n", "<|im_end|>", "\n"),
    "llama3": ChatFormat(
        "llama3", "<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>", "", bos="<|begin_of_text|>"
    ),
    "gemma": ChatFormat(
        "gemma", "<start_of_turn>{role}\n", "<end_of_turn>", "\n", bos="<bos>", assistant_role="model"
    ),
}

_PROBE_USER = "Name three primes."
_PROBE_REPLY = "Two, three and five."


def chat_format_for(tokenizer: Any, name: str = "auto") -> ChatFormat:
    """The chat format of ``tokenizer``: a preset by name, or detected (``auto``).

    Raises:
        DatasetError: unknown preset, no chat template, or a template the
            detected preset does not reproduce.
    """
    if name != "auto":
        if name not in PRESETS:
            raise DatasetError(
                f"unknown chat format {name!r}",
                hint=f"use auto or one of {', '.join(sorted(PRESETS))}",
            )
        return _fitted(tokenizer, PRESETS[name])
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise DatasetError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')} has no chat template to take special tokens from",
            hint=f"pass a chat format explicitly: --chat-format {'|'.join(sorted(PRESETS))}",
        )
    for preset in PRESETS.values():
        if preset.turn_end in template and preset.turn_start.split("{")[0] in template:
            return _fitted(tokenizer, preset)
    raise DatasetError(
        f"cannot tell the chat format of tokenizer {getattr(tokenizer, 'name_or_path', '')} "
        "from its chat template",
        hint=f"pass one of {', '.join(sorted(PRESETS))} with --chat-format",
    )


def _fitted(tokenizer: Any, preset: ChatFormat) -> ChatFormat:
    """``preset`` with the template's preamble, trimming and system placement, verified on probes."""
    if not getattr(tokenizer, "chat_template", None):
        return preset
    user_only: list[Message] = [{"role": "user", "content": _PROBE_USER}]
    rendered = _apply_template(tokenizer, user_only)
    opener = preset.turn_start.format(role="user")
    cut = rendered.find(opener)
    preamble = rendered[len(preset.bos) : cut] if cut >= 0 and rendered.startswith(preset.bos) else ""
    probes: list[list[Message]] = [
        [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_REPLY}],
        [
            {"role": "user", "content": f" {_PROBE_USER}\n"},
            {"role": "assistant", "content": f"{_PROBE_REPLY}  "},
        ],
    ]
    expected = [_apply_template(tokenizer, probe) for probe in probes]
    with_system: list[Message] = [{"role": "system", "content": "Be brief."}, *probes[0]]
    try:
        expected.append(_apply_template(tokenizer, with_system))
        probes.append(with_system)
        placements: tuple[SystemPlacement, ...] = ("turn", "first_user")
    except DatasetError:  # a template that refuses system messages (Gemma 2)
        placements = ("none",)
    for placement in placements:
        for trim in (False, True):
            fmt = replace(preset, preamble=preamble, system=placement, trim=trim)
            if all(fmt.render(probe) == text for probe, text in zip(probes, expected, strict=True)):
                return fmt
    raise DatasetError(
        f"chat format {preset.name!r} does not reproduce the chat template of tokenizer "
        f"{getattr(tokenizer, 'name_or_path', '')}: it renders {expected[-1]!r}",
        hint="pass a ChatFormat that matches the template (library: chat_format=ChatFormat(...))",
    )


def _apply_template(tokenizer: Any, messages: list[Message]) -> str:
    try:
        return str(tokenizer.apply_chat_template(messages, tokenize=False))
    except Exception as exc:  # jinja errors of arbitrary templates
        raise DatasetError(f"the tokenizer's chat template failed on a probe conversation: {exc}") from None


@dataclass(frozen=True)
class ChatEncoding:
    """Token ids of a chat format's markup, encoded once per build."""

    fmt: ChatFormat
    bos_ids: tuple[int, ...]
    preamble_ids: tuple[int, ...]
    start_ids: dict[str, tuple[int, ...]]
    eot_id: int
    sep_ids: tuple[int, ...]

    @classmethod
    def build(cls, fmt: ChatFormat, encoder: TextEncoder) -> ChatEncoding:
        eot_id = encoder.token_id(fmt.turn_end, what="the turn-closing token")
        bos_ids = tuple(encoder.encode_markup(fmt.bos))
        return cls(
            fmt=fmt,
            bos_ids=bos_ids,
            preamble_ids=_encode_after(encoder, fmt.bos, len(bos_ids), fmt.preamble),
            start_ids={
                role: tuple(encoder.encode_markup(fmt.turn_start.format(role=fmt.role_name(role))))
                for role in ROLES
            },
            eot_id=eot_id,
            sep_ids=_encode_after(encoder, fmt.turn_end, 1, fmt.turn_sep),
        )

    def special_token_ids(self) -> dict[str, Any]:
        """The spec's sys/usr/asst/eot ids (turn openers are token sequences)."""
        return {
            "sys": list(self.start_ids["system"]),
            "usr": list(self.start_ids["user"]),
            "asst": list(self.start_ids["assistant"]),
            "eot": self.eot_id,
        }

    def turns(self, messages: Sequence[Message], index: int) -> list[Turn]:
        """The turns of example ``index``; their contents are encoded with ``encode_contents``."""
        try:
            return self.fmt.turns(messages)
        except DatasetError as exc:
            raise DatasetError(f"example {index}: {exc.message}", hint=exc.hint) from None

    def assemble(
        self, messages: Sequence[Message], turns: Sequence[Turn], contents: Sequence[Sequence[int]]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """``(ids, mask)`` of one conversation from its :meth:`turns` and their encoded contents."""
        ids: list[int] = list(self.bos_ids)
        if messages[0]["role"] != "system":
            ids.extend(self.preamble_ids)
        mask = [0] * len(ids)
        for (role, _), content in zip(turns, contents, strict=True):
            opener = self.start_ids[role]
            trained = 1 if role == "assistant" else 0
            ids.extend(opener)
            ids.extend(content)
            ids.append(self.eot_id)
            ids.extend(self.sep_ids)
            mask.extend([0] * len(opener))
            mask.extend([trained] * (len(content) + 1))
            mask.extend([0] * len(self.sep_ids))
        return np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.uint8)


def _encode_after(encoder: TextEncoder, before: str, before_tokens: int, text: str) -> tuple[int, ...]:
    """Ids of markup ``text`` as it is encoded right after the special token(s) ``before``.

    After a special token a tokenizer may treat text differently than at the
    start of a string (a SentencePiece ``prepend_scheme="first"`` adds no
    ``▁`` there), so the pair is encoded together and ``before`` cut off.
    """
    if not text:
        return ()
    if not before:
        return tuple(encoder.encode_markup(text))
    return tuple(encoder.encode_markup(before + text)[before_tokens:])


def check_messages(example: object, index: int) -> list[Message] | None:
    """The example as a list of messages; ``None`` when it is empty or has no assistant turn.

    Raises:
        DatasetError: an example that is not a list of ``{role, content}``
            messages with known roles.
    """
    if isinstance(example, dict) and "messages" in example:
        example = example["messages"]
    if not isinstance(example, list):
        raise DatasetError(
            f"example {index} is a {type(example).__name__}, not a list of messages",
            hint='each example is [{"role": "user", "content": "..."}, {"role": "assistant", ...}]',
        )
    for position, message in enumerate(example):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise DatasetError(
                f"example {index}, message {position}: expected an object with a string 'content'",
                hint='each message is {"role": "user"|"assistant"|"system", "content": "..."}',
            )
        if message.get("role") not in ROLES:
            raise DatasetError(
                f"example {index}, message {position}: role {message.get('role')!r} "
                "is not system, user or assistant",
                hint="map the source's roles onto system, user and assistant",
            )
    if not any(message["role"] == "assistant" for message in example):
        return None
    return example

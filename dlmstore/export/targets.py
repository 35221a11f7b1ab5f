"""What a runtime needs beside the GGUF: Ollama's Modelfile, llama-server's command line.

**The Modelfile's TEMPLATE** is Ollama's Go template for the conversation,
translated from the model's Jinja chat template rather than picked from a
list of known families. The Jinja template is rendered (by transformers,
as training rendered it) for a few conversations whose contents are
sentinels, and the text around the sentinels gives the framing of each
role: what comes before and after a system, user and assistant message,
the default system block a template adds when there is no system message,
and the generation prompt (:class:`ChatFraming`). The Go template is built
from those pieces, and is only written after the same pieces, put together
the way the Go template puts them together (:meth:`ChatFraming.render`),
reproduce transformers' rendering of every conversation in
:data:`CHECKED_CONVERSATIONS`; a template that does something else (strips
reasoning from earlier turns, numbers turns) is an error naming the
template, never a Modelfile that prompts the model differently from training.

Stops are the end-of-sequence token and every special token of the
framing; temperature and top_p come from the document's ``export:`` block,
else DLM's defaults (0.7, 0.9); ``num_ctx`` is the training sequence length,
capped at the model's context; ``SYSTEM`` is the document's
``system_prompt``, verbatim. The framing is checked with that system prompt
too: a template that changes it (trims it, say) is refused, and an empty
one (``system_prompt: ""``, which training renders as an empty system
block) becomes the template's default. How each value is written so that
Ollama reads it back byte for byte is :mod:`.modelfile`'s business.

**llama-server** is llama-cpp-python's OpenAI-compatible server
(``python -m llama_cpp.server``) on the merged GGUF; it renders the chat
template the GGUF carries. The exact command is written to
``llama-server.sh`` and returned.

Nothing written depends on the time: two exports of the same adapter give
the same bytes.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from dlmstore.errors import ExportError
from dlmstore.export.modelfile import comment

#: DLM's sampling defaults for a Modelfile, when the document's ``export:`` block sets none.
DEFAULT_TEMPERATURE = 0.7
DEFAULT_TOP_P = 0.9

#: The address llama-server's command line binds (loopback: the user opens it up on purpose).
SERVER_HOST = "127.0.0.1"
SERVER_PORT = 8000

_S, _U1, _A1, _U2 = "QXSYSTEMQX", "QXUSERONEQX", "QXASSISTANTONEQX", "QXUSERTWOQX"

Message = dict[str, str]

#: Conversations the translated template must render exactly as the Jinja template does.
CHECKED_CONVERSATIONS: tuple[tuple[str | None, tuple[tuple[str, str], ...]], ...] = (
    (None, (("user", "Hi"),)),
    ("Be brief.", (("user", "Where is the metadata?"),)),
    (None, (("user", "a"), ("assistant", "b"), ("user", "c"))),
    (
        "S",
        (("user", "one"), ("assistant", "two"), ("user", "three"), ("assistant", "four"), ("user", "five")),
    ),
)


@dataclass(frozen=True)
class ChatFraming:
    """The text around each role's message in a chat template.

    Attributes:
        system_prefix: before a system message.
        system_suffix: after it.
        default_system: what the template writes when there is no system message ("" for none).
        user_prefix: before a user message.
        user_suffix: after it.
        assistant_prefix: before an assistant message.
        assistant_suffix: after it.
        generation: the generation prompt, after the last message.
    """

    system_prefix: str
    system_suffix: str
    default_system: str
    user_prefix: str
    user_suffix: str
    assistant_prefix: str
    assistant_suffix: str
    generation: str

    def render(self, system: str | None, messages: Sequence[tuple[str, str]]) -> str:
        """The conversation as :meth:`go_template` renders it (Ollama's ``.System`` and ``.Messages``)."""
        out = f"{self.system_prefix}{system}{self.system_suffix}" if system else self.default_system
        for role, content in messages:
            if role == "user":
                out += f"{self.user_prefix}{content}{self.user_suffix}"
            elif role == "assistant":
                out += f"{self.assistant_prefix}{content}{self.assistant_suffix}"
        return out + self.generation

    def go_template(self) -> str:
        """Ollama's TEMPLATE: one line of Go template, no trim markers (they would eat the framing's newlines)."""
        return (
            f"{{{{ if .System }}}}{self.system_prefix}{{{{ .System }}}}{self.system_suffix}"
            f"{{{{ else }}}}{self.default_system}{{{{ end }}}}"
            f'{{{{ range .Messages }}}}{{{{ if eq .Role "user" }}}}{self.user_prefix}{{{{ .Content }}}}{self.user_suffix}'
            f'{{{{ else if eq .Role "assistant" }}}}{self.assistant_prefix}{{{{ .Content }}}}{self.assistant_suffix}'
            f"{{{{ end }}}}{{{{ end }}}}{self.generation}"
        )

    def pieces(self) -> list[str]:
        """Every piece of framing text."""
        return [
            self.system_prefix, self.system_suffix, self.default_system, self.user_prefix, self.user_suffix,
            self.assistant_prefix, self.assistant_suffix, self.generation,
        ]  # fmt: skip


def _messages(system: str | None, turns: Sequence[tuple[str, str]]) -> list[Message]:
    out = [{"role": "system", "content": system}] if system is not None else []
    return out + [{"role": role, "content": content} for role, content in turns]


def chat_framing(tokenizer: Any, *, where: str, system: str | None = None) -> ChatFraming:
    """Translate the chat template of ``tokenizer`` (transformers') into a :class:`ChatFraming`.

    ``system`` is the system prompt the Modelfile will carry: every checked
    conversation is also rendered with it, as training rendered it. An
    empty one becomes the framing's default system block (Ollama's
    ``.System`` cannot be an empty message), so the framing returned renders
    it without a ``SYSTEM`` line.

    Raises:
        ExportError: the tokenizer has no chat template, or its template is
            not one a role-by-role framing reproduces (with ``system`` too).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ExportError(
            f"{where}: the tokenizer has no chat template, so no Modelfile TEMPLATE can be written"
        )

    def render(system: str | None, turns: Sequence[tuple[str, str]], generation: bool) -> str:
        text = tokenizer.apply_chat_template(
            _messages(system, turns), tokenize=False, add_generation_prompt=generation
        )
        return str(text)

    try:
        framing = _derive(render)
    except (ValueError, IndexError) as exc:
        raise _untranslatable(where, str(exc)) from None
    for checked, turns in CHECKED_CONVERSATIONS:
        if framing.render(checked, turns) != render(checked, turns, True):
            raise _untranslatable(where, f"a conversation of {len(turns)} messages renders differently")
    if system == "":
        framing = replace(framing, default_system=framing.system_prefix + framing.system_suffix)
    if system is not None:
        for _, turns in CHECKED_CONVERSATIONS:
            if framing.render(system or None, turns) != render(system, turns, True):
                raise ExportError(
                    f"{where}: the chat template renders system_prompt differently from how an Ollama "
                    "TEMPLATE passes it on (it changes the text, or its default when it is empty)",
                    hint="export for llama-server (--target llama-server), which renders the model's own template",
                )
    for piece in framing.pieces():
        if "{{" in piece:
            raise _untranslatable(where, "its text holds '{{', which a Go template would read as an action")
    return framing


def _derive(render: Any) -> ChatFraming:
    """The framing, from the text around sentinel contents (ValueError when the pieces do not line up)."""
    one = render(None, [("user", _U1)], False)
    with_generation = render(None, [("user", _U1)], True)
    answered = render(None, [("user", _U1), ("assistant", _A1)], False)
    two = render(None, [("user", _U1), ("assistant", _A1), ("user", _U2)], False)
    with_system = render(_S, [("user", _U1)], False)
    before_user, user_suffix = _around(one, _U1)
    if not with_generation.startswith(one):
        raise ValueError("the generation prompt is not added at the end")
    generation = with_generation[len(one) :]
    _, after_user = _around(answered, _U1)
    between, assistant_suffix = _around(after_user, _A1)
    assistant_prefix = _strip_prefix(between, user_suffix)
    _, after_answer = _around(two, _A1)
    between, _ = _around(after_answer, _U2)
    user_prefix = _strip_prefix(between, assistant_suffix)
    default_system = _strip_suffix(before_user, user_prefix)
    system_prefix, after_system = _around(with_system, _S)
    between, _ = _around(after_system, _U1)
    system_suffix = _strip_suffix(between, user_prefix)
    return ChatFraming(
        system_prefix, system_suffix, default_system, user_prefix, user_suffix, assistant_prefix,
        assistant_suffix, generation,
    )  # fmt: skip


def _around(text: str, sentinel: str) -> tuple[str, str]:
    if text.count(sentinel) != 1:
        raise ValueError(f"a message is written {text.count(sentinel)} times")
    before, after = text.split(sentinel)
    return before, after


def _strip_prefix(text: str, prefix: str) -> str:
    if not text.startswith(prefix):
        raise ValueError("a message's ending differs from one turn to the next")
    return text[len(prefix) :]


def _strip_suffix(text: str, suffix: str) -> str:
    if not text.endswith(suffix):
        raise ValueError("a message's beginning differs from one turn to the next")
    return text[: len(text) - len(suffix)]


def _untranslatable(where: str, why: str) -> ExportError:
    return ExportError(
        f"{where}: the chat template cannot be translated into an Ollama TEMPLATE ({why})",
        hint="export for llama-server (--target llama-server), which renders the model's own template",
    )


def stop_strings(framing: ChatFraming, *, eos: str | None, special: Sequence[str]) -> list[str]:
    """The end-of-sequence token, then each special token the framing uses, in the order first used."""
    text = "".join(framing.pieces())
    found = sorted((text.index(token), token) for token in set(special) if token and token in text)
    stops = [eos] if eos else []
    return stops + [token for _, token in found if token not in stops]


def server_command(gguf: str, *, num_ctx: int) -> list[str]:
    """llama-cpp-python's OpenAI-compatible server on ``gguf``, on :data:`SERVER_HOST`:``SERVER_PORT``."""
    return [
        sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--n_ctx", str(num_ctx),
        "--host", SERVER_HOST, "--port", str(SERVER_PORT),
    ]  # fmt: skip


def server_script(gguf: str, *, num_ctx: int, header: list[str]) -> str:
    """``llama-server.sh``: the server command, run from the export's folder (extra arguments pass through).

    Encode it with ``surrogateescape``: a Python whose path is not UTF-8 is named by its bytes.
    """
    command = " ".join(shlex.quote(part) for part in server_command(gguf, num_ctx=num_ctx))
    lines = ["#!/bin/sh", *(comment(line) for line in header)]  # a line break in a path stays a comment
    lines += [
        f"# llama.cpp's own server binary takes the same file: llama-server -m {gguf} --ctx-size {num_ctx} "
        f"--host {SERVER_HOST} --port {SERVER_PORT} --jinja",
        'cd "$(dirname "$0")" || exit 1',
        f'exec {command} "$@"',
    ]
    return "\n".join(lines) + "\n"

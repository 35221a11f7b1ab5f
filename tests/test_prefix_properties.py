"""Property tests: the prefix cache returns exactly what the uncached tokenizer does.

Random multi-turn chats (contents mixing words, whitespace runs, accents,
combining marks, "▁" and literal special tokens) are encoded turn by turn,
both with and without special tokens, through one cache per test whose
small cap makes it evict as it goes, and every result is compared with
``tokenizer(text, add_special_tokens=...)["input_ids"]``. Each tokenizer
also asserts whether L1 is on, so a test cannot pass by silently caching
nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlmstore.prefix import PrefixCachedTokenizer

from .helpers import byte_level_tokenizer, reference, sentencepiece_tokenizer

_ALPHABET = st.sampled_from(
    list("abcdehlowrtxyz ABZ  \n\n\t.,!?'0123éï中文") + ["\u0301", "\u0338", "▁", "ﬁ"]
)
_FRAGMENT = st.one_of(
    st.text(_ALPHABET, max_size=24),
    st.sampled_from(
        ["<|im_start|>", "<|im_end|>", "<s>", "</s>", "<|endoftext|>", " hello", "world ", "\r\n"]
    ),
)
_CONTENT = st.lists(_FRAGMENT, max_size=5).map("".join)
_ROLE = st.sampled_from(["system", "user", "assistant"])
_CHAT = st.lists(st.tuples(_ROLE, _CONTENT), min_size=1, max_size=6)

_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _chatml(messages: list[tuple[str, str]], generation_prompt: bool) -> str:
    text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)
    return text + ("<|im_start|>assistant\n" if generation_prompt else "")


def _check_conversation(
    cached: PrefixCachedTokenizer,
    tokenizer: Any,
    render: Callable[[list[tuple[str, str]]], str],
    chat: list[tuple[str, str]],
    expect_l1: bool,
) -> None:
    for add in (True, False):
        hits_before = cached.stats().hits
        for turn in range(1, len(chat) + 1):
            text = render(chat[:turn])
            assert cached.encode(text, add_special_tokens=add) == reference(tokenizer, text, add), text
        if expect_l1:  # every turn after the first extends the one before: a hit at least in L1
            assert cached.stats().hits - hits_before >= len(chat) - 1
    stats = cached.stats()
    assert stats.l1_enabled is expect_l1
    assert stats.memory_bytes <= stats.max_bytes


@pytest.fixture
def smollm2_cached(smollm2_tokenizer: Any) -> tuple[Any, PrefixCachedTokenizer]:
    return smollm2_tokenizer, PrefixCachedTokenizer(smollm2_tokenizer, max_bytes=256 * 1024)


@_SETTINGS
@given(chat=_CHAT, generation_prompt=st.booleans())
def test_smollm2_cached_ids_equal_uncached_ids_for_random_chats(
    smollm2_cached: tuple[Any, PrefixCachedTokenizer], chat: list[tuple[str, str]], generation_prompt: bool
) -> None:
    tokenizer, cached = smollm2_cached

    def render(messages: list[tuple[str, str]]) -> str:
        rows = [{"role": role, "content": content} for role, content in messages]
        return str(
            tokenizer.apply_chat_template(rows, tokenize=False, add_generation_prompt=generation_prompt)
        )

    _check_conversation(cached, tokenizer, render, chat, expect_l1=True)


# name -> (builder, whether L1 can be on)
_BUILT: dict[str, tuple[Callable[[], Any], bool]] = {
    "sentencepiece, Metaspace always, BOS": (
        lambda: sentencepiece_tokenizer("always", template="<s> $A"),
        True,
    ),
    "sentencepiece, Metaspace never, BOS and EOS": (
        lambda: sentencepiece_tokenizer("never", template="<s> $A </s>"),
        True,
    ),
    "sentencepiece, Metaspace first, BOS": (
        lambda: sentencepiece_tokenizer("first", template="<s> $A"),
        False,
    ),
    "sentencepiece, legacy Prepend normalizer, BOS": (lambda: _legacy_sentencepiece(), True),
    "byte-level BPE, BOS and EOS": (lambda: byte_level_tokenizer("<s> $A </s>"), True),
    "byte-level BPE, add_prefix_space": (lambda: _prefix_space_byte_level(), True),
}


def _prefix_space_byte_level() -> Any:
    """ByteLevel(add_prefix_space=True) adds a space to every piece, wherever it starts: safe."""
    from tokenizers import pre_tokenizers

    tokenizer = byte_level_tokenizer("$A")
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    return tokenizer


def _legacy_sentencepiece() -> Any:
    """Llama-1/2 style: the "▁" prefix comes from a Prepend normalizer, with no pre-tokenizer."""
    from tokenizers import normalizers

    tokenizer = sentencepiece_tokenizer("always", template="<s> $A")
    backend = tokenizer.backend_tokenizer
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.pre_tokenizer = None
    return tokenizer


@pytest.fixture(params=sorted(_BUILT))
def built_cached(request: pytest.FixtureRequest) -> tuple[Any, PrefixCachedTokenizer, bool]:
    build, expect_l1 = _BUILT[request.param]
    tokenizer = build()
    return tokenizer, PrefixCachedTokenizer(tokenizer, max_bytes=64 * 1024), expect_l1


@_SETTINGS
@given(chat=_CHAT, generation_prompt=st.booleans())
def test_offline_built_tokenizers_cached_ids_equal_uncached_ids_for_random_chats(
    built_cached: tuple[Any, PrefixCachedTokenizer, bool],
    chat: list[tuple[str, str]],
    generation_prompt: bool,
) -> None:
    tokenizer, cached, expect_l1 = built_cached
    _check_conversation(cached, tokenizer, lambda m: _chatml(m, generation_prompt), chat, expect_l1)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(_FRAGMENT, min_size=1, max_size=12))
def test_any_text_cut_after_special_tokens_tokenizes_like_the_whole(
    smollm2_cached: tuple[Any, PrefixCachedTokenizer], pieces: list[str]
) -> None:
    tokenizer, cached = smollm2_cached
    text = "".join(pieces)
    for end in range(1, len(pieces) + 1):  # every prefix of the pieces, so texts share prefixes
        part = "".join(pieces[:end])
        assert cached.encode(part, add_special_tokens=False) == reference(tokenizer, part, False)
    assert cached.encode(text) == reference(tokenizer, text)

"""SFT caches with SentencePiece-style tokenizers and real chat templates (ChatML, Llama 3, Gemma 2 and 3).

The tokenizers are trained offline on a tiny corpus, one per way a
tokenizer marks the start of a string: a ``Metaspace`` pre-tokenizer that
prepends ``▁`` always or only to the first text run, a Llama-2-style
``Prepend("▁")`` normalizer, a Gemma-style normalizer that only maps
spaces, and a byte-level BPE with ``add_prefix_space``. Whatever the marker and the template, the tokens of a built
example must be exactly ``apply_chat_template(..., tokenize=True)``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dlmstore.datasets.build.chat import chat_format_for
from dlmstore.datasets.build.pretrain import build_pretrain_cache
from dlmstore.datasets.build.sft import build_sft_cache
from dlmstore.errors import DatasetError

from .helpers import split_tokens

_rng = random.Random(3)
_WORDS = (
    "the quick brown fox jumps over lazy dog name three primes two and five colour blue green answer "
    "question user model assistant system be brief hello world"
).split()
CORPUS = [
    " ".join(_rng.choice(_WORDS) for _ in range(10)) + _rng.choice([".", "?", "\n", "!\n"])
    for _ in range(500)
]
SPECIAL = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}"
)
GEMMA2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content']"
    " | trim + '<end_of_turn>\\n' }}{% endfor %}"
)
GEMMA3 = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content']"
    " + '\\n\\n' -%}{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'assistant') -%}{%- set role = 'model' -%}{%- else -%}"
    "{%- set role = message['role'] -%}{%- endif -%}{{ '<start_of_turn>' + role + '\\n'"
    " + (first_user_prefix if loop.first else '') }}{{- message['content'] | trim -}}{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
)
TEMPLATES = {  # name: (template, bos token, expected preset, system placement, trims content)
    "chatml": (CHATML, "<bos>", "chatml", "turn", False),
    "llama3": (LLAMA3, "<|begin_of_text|>", "llama3", "turn", True),
    "gemma2": (GEMMA2, "<bos>", "gemma", "none", True),
    "gemma3": (GEMMA3, "<bos>", "gemma", "first_user", True),
}
MARKERS = (
    "metaspace-always",
    "metaspace-first",
    "prepend-normalizer",
    "spaces-only",
    "byte-level-prefix-space",
)


def sentencepiece_tokenizer(marker: str, template: str, bos: str) -> Any:
    """A tokenizer trained offline, marking the start of a string the way ``marker`` says."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.Unigram())
    trainer = trainers.UnigramTrainer(vocab_size=150, special_tokens=SPECIAL, unk_token="<unk>")
    if marker.startswith("byte-level"):  # GPT-2-style BPE that adds a space before a text run
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(
            CORPUS,
            trainers.BpeTrainer(
                vocab_size=400, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
            ),
        )
    elif marker.startswith("metaspace"):
        scheme = marker.split("-")[1]
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
        tok.train_from_iterator(CORPUS, trainer)
    else:  # Llama 2 and Gemma tokenizer.json files: a normalizer and no pre-tokenizer
        tok.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="never"
        )  # to train words
        tok.train_from_iterator(CORPUS, trainer)
        tok.pre_tokenizer = None
        spaces = normalizers.Replace(" ", "▁")
        tok.normalizer = (
            normalizers.Sequence([normalizers.Prepend("▁"), spaces])
            if marker.startswith("prepend")
            else spaces
        )
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse()])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token="<eos>", unk_token="<unk>")
    fast.chat_template = template
    return fast


CONVERSATIONS = [
    [
        {"role": "system", "content": "be brief."},
        {"role": "user", "content": "name three primes?"},
        {"role": "assistant", "content": "two and five."},
        {"role": "user", "content": "the colour\nof the fox?"},
        {"role": "assistant", "content": "brown. the quick brown fox!"},
    ],
    [
        {"role": "user", "content": "hello world"},
        {"role": "assistant", "content": "hello user. blue green"},
    ],
    [
        {"role": "user", "content": "  question with spaces around \n"},
        {"role": "assistant", "content": "answer with a trailing newline\n"},
    ],
]


def template_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def examples_of(directory: Path) -> list[tuple[list[int], list[int]]]:
    """(tokens, loss mask) of each example of the train split, in order."""
    tokens = np.fromfile(directory / "train_tokens.bin", dtype="<u2")
    mask = np.fromfile(directory / "train_mask.bin", dtype=np.uint8)
    offsets = [*np.load(directory / "train_idx.npy").tolist(), len(tokens)]
    return [
        (tokens[a:b].tolist(), mask[a:b].tolist()) for a, b in zip(offsets[:-1], offsets[1:], strict=True)
    ]


@pytest.mark.parametrize("marker", MARKERS)
@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_sft_tokens_are_exactly_the_chat_templates_tokens_whatever_marks_a_word_start(
    tmp_path: Path, marker: str, template: str
) -> None:
    text, bos, preset, placement, trims = TEMPLATES[template]
    tokenizer = sentencepiece_tokenizer(marker, text, bos)
    fmt = chat_format_for(tokenizer)
    assert (fmt.name, fmt.system, fmt.trim) == (preset, placement, trims)
    conversations = [c[1:] if placement == "none" and c[0]["role"] == "system" else c for c in CONVERSATIONS]
    build_sft_cache(
        conversations,
        tmp_path / "sft",
        tokenizer=tokenizer,
        tokenizer_sha256="sha256:" + "1" * 64,
        val_frac=0.0,
        seed=0,
    )
    eot = tokenizer.convert_tokens_to_ids(fmt.turn_end)
    for messages, (ids, mask) in zip(conversations, examples_of(tmp_path / "sft"), strict=True):
        assert ids == template_ids(tokenizer, messages)
        trained = np.array([token for token, bit in zip(ids, mask, strict=True) if bit])
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        spans = np.split(trained, np.flatnonzero(trained == eot) + 1)
        assert len(spans) == len(replies) + 1 and len(spans[-1]) == 0  # each reply ends with its EOT
        assert [tokenizer.decode(span[:-1].tolist()).split() for span in spans[:-1]] == [
            r.split() for r in replies
        ]


def test_a_template_without_a_system_role_refuses_an_example_that_has_one(tmp_path: Path) -> None:
    tokenizer = sentencepiece_tokenizer("spaces-only", GEMMA2, "<bos>")
    with pytest.raises(DatasetError) as info:
        build_sft_cache(
            [CONVERSATIONS[1], CONVERSATIONS[0]],
            tmp_path / "sft",
            tokenizer=tokenizer,
            tokenizer_sha256="sha256:" + "1" * 64,
            val_frac=0.0,
            seed=0,
        )
    assert info.value.message == (
        "example 1: the gemma chat template has no system role, and the example starts with a system message"
    )
    assert not (tmp_path / "sft" / "meta.json").exists()


def test_gemma3_folds_the_system_message_into_the_first_user_turn(tmp_path: Path) -> None:
    fmt = chat_format_for(sentencepiece_tokenizer("metaspace-first", GEMMA3, "<bos>"))
    assert fmt.turns(CONVERSATIONS[0])[0] == ("user", "be brief.\n\nname three primes?")
    assert len(fmt.turns(CONVERSATIONS[0])) == 4


@pytest.mark.parametrize("marker", MARKERS)
def test_pretrain_documents_with_a_sentencepiece_tokenizer_round_trip(tmp_path: Path, marker: str) -> None:
    tokenizer = sentencepiece_tokenizer(marker, CHATML, "<bos>")
    texts = [line.strip() for line in CORPUS[:40] if line.strip()]
    build_pretrain_cache(
        texts,
        tmp_path / "pt",
        tokenizer=tokenizer,
        tokenizer_sha256="sha256:" + "1" * 64,
        val_frac=0.0,
        seed=0,
    )
    tokens = split_tokens(tmp_path / "pt", "train")
    eos = tokenizer.eos_token_id
    documents = np.split(tokens, np.flatnonzero(tokens == eos) + 1)[:-1]
    assert len(documents) == len(texts)
    decoded = sorted(" ".join(tokenizer.decode(d[:-1].tolist()).split()) for d in documents)
    assert decoded == sorted(" ".join(t.split()) for t in texts)

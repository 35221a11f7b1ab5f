"""build_sft_cache and SFTExampleDataset: chat format, loss mask, round trip, truncation and padding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dlmstore.datasets.build.chat import ChatEncoding, chat_format_for
from dlmstore.datasets.build.sft import build_sft_cache
from dlmstore.datasets.read.packing import IGNORE_INDEX, loss_mask_from_tokens
from dlmstore.datasets.read.sft_dataset import SFTExampleDataset
from dlmstore.errors import DatasetError

SYS, USR, ASST, EOT, A, B = 101, 102, 103, 104, 7, 8

EXAMPLES = [
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": f"Colour number {i}?"},
        {"role": "assistant", "content": f"Blue{i}."},
        {"role": "user", "content": "And again?"},
        {"role": "assistant", "content": "Green."},
    ]
    for i in range(40)
]


def write_tokens(directory: Path, rows: list[list[int]]) -> tuple[Path, Path]:
    tokens = np.concatenate([np.asarray(r, dtype="<u2") for r in rows])
    offsets = np.cumsum([0] + [len(r) for r in rows[:-1]]).astype(np.int64)
    tokens.tofile(directory / "train_tokens.bin")
    np.save(directory / "train_idx.npy", offsets)
    return directory / "train_tokens.bin", directory / "train_idx.npy"


def test_sft_masking_trains_only_the_assistant_tokens_and_their_eot(tmp_path: Path) -> None:
    """Acceptance 1: a hand-made sys/usr/asst sequence; only A, B and EOT are targets."""
    seq = [SYS, 11, 12, EOT, USR, 13, 14, EOT, ASST, A, B, EOT]
    tokens, idx = write_tokens(tmp_path, [seq])
    dataset = SFTExampleDataset(
        tokens, idx, T=len(seq) - 1, eot_id=EOT, assistant_start=[ASST], dtype="uint16"
    )
    x, y, y_masked = dataset.get_batch(B=1, generator=torch.Generator().manual_seed(0))
    assert x[0].tolist() == seq[:-1] and y[0].tolist() == seq[1:]
    trained = [int(t) for t, m in zip(y[0], y_masked[0], strict=True) if m != IGNORE_INDEX]
    assert trained == [A, B, EOT]
    assert (y_masked[0] == IGNORE_INDEX).sum() == len(seq) - 1 - 3


def test_examples_are_truncated_to_t_plus_one_or_padded_with_eot_and_padding_is_never_trained(
    tmp_path: Path,
) -> None:
    long = [ASST] + list(range(1, 20)) + [EOT]
    short = [USR, 5, EOT, ASST, 6, EOT]
    tokens, idx = write_tokens(tmp_path, [long, short])
    dataset = SFTExampleDataset(tokens, idx, T=8, eot_id=EOT, assistant_start=[ASST], dtype="uint16")
    x, y, y_masked = dataset.batch_of([0, 1])
    assert x.shape == y.shape == y_masked.shape == (2, 8) and x.dtype == torch.int64
    assert x[0].tolist() == long[:8] and y[0].tolist() == long[1:9]
    assert x[1].tolist() == short + [EOT, EOT] and y[1].tolist() == short[1:] + [EOT, EOT, EOT]
    assert y_masked[1].tolist() == [-100, -100, -100, 6, EOT, -100, -100, -100]
    assert (y[:, :-1] == x[:, 1:]).all()


def test_the_chat_format_comes_from_the_tokenizers_template_and_reproduces_it(
    tokenizer: Any, encoder: Any
) -> None:
    fmt = chat_format_for(tokenizer)
    assert (fmt.name, fmt.turn_start, fmt.turn_end) == ("chatml", "<|im_start|>{role}\n", "<|im_end|>")
    assert fmt.preamble.startswith("<|im_start|>system\nYou are a helpful AI assistant")
    chat = ChatEncoding.build(fmt, encoder)
    for messages in (EXAMPLES[0], EXAMPLES[0][1:]):
        turns = chat.turns(messages, 0)
        ids, _ = chat.assemble(messages, turns, encoder.encode_contents([content for _, content in turns]))
        expected = tokenizer.apply_chat_template(messages, tokenize=True)
        expected = expected["input_ids"] if hasattr(expected, "keys") else expected
        assert ids.tolist() == list(expected)


def test_an_unknown_chat_format_is_an_error_listing_the_presets(tokenizer: Any) -> None:
    with pytest.raises(DatasetError) as info:
        chat_format_for(tokenizer, "vicuna")
    assert (info.value.message, info.value.hint) == (
        "unknown chat format 'vicuna'",
        "use auto or one of chatml, gemma, llama3",
    )


def test_the_stored_mask_is_exactly_assistant_content_and_closing_token(tmp_path: Path, encoder: Any) -> None:
    build_sft_cache(EXAMPLES, tmp_path / "sft", tokenizer=encoder, val_frac=0.25, seed=3)
    out = tmp_path / "sft"
    meta = json.loads((out / "meta.json").read_text())
    ids = meta["special_token_ids"]
    assert (
        ids["asst"] == encoder.encode_markup("<|im_start|>assistant\n") and ids["eot"] == meta["eot_id"] == 2
    )
    for split in ("train", "val"):
        tokens = np.fromfile(out / f"{split}_tokens.bin", dtype="<u2")
        mask = np.fromfile(out / f"{split}_mask.bin", dtype=np.uint8)
        assert np.array_equal(mask.astype(bool), loss_mask_from_tokens(tokens, ids["asst"], ids["eot"]))
        offsets = np.append(np.load(out / f"{split}_idx.npy"), len(tokens))
        for start, end in zip(offsets[:-1], offsets[1:], strict=True):
            trained = tokens[start:end][mask[start:end] == 1].tolist()
            number = encoder.tokenizer.decode(trained).split("Blue")[1].split(".")[0]
            replies = encoder.encode_texts([f"Blue{number}.", "Green."])
            assert trained == replies[0] + [2] + replies[1] + [2]


def test_sft_cache_round_trip_recovers_each_examples_tokens(
    tmp_path: Path, tokenizer: Any, encoder: Any
) -> None:
    """Acceptance 3: tokens parse as uint16, offsets are valid, sequences match the tokenization."""
    result = build_sft_cache(EXAMPLES, tmp_path / "sft", tokenizer=encoder, val_frac=0.25, seed=3)
    out = tmp_path / "sft"
    recovered = []
    for split in ("train", "val"):
        tokens = np.fromfile(out / f"{split}_tokens.bin", dtype="<u2")
        offsets = np.load(out / f"{split}_idx.npy")
        assert offsets.dtype == np.int64 and offsets[0] == 0 and np.all(np.diff(offsets) > 0)
        assert offsets[-1] < len(tokens)
        bounds = np.append(offsets, len(tokens))
        recovered.extend(tokens[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:], strict=True))
    assert result.splits["train"].docs + result.splits["val"].docs == len(EXAMPLES) == len(recovered)
    expected = {tuple(tokenizer.apply_chat_template(ex, tokenize=True)["input_ids"]) for ex in EXAMPLES}
    assert {tuple(r) for r in recovered} == expected


def test_examples_without_an_assistant_turn_are_skipped_and_counted(tmp_path: Path, encoder: Any) -> None:
    examples = [[{"role": "user", "content": "hi"}], [], EXAMPLES[0]]
    result = build_sft_cache(examples, tmp_path / "sft", tokenizer=encoder, val_frac=0.0)
    assert result.skipped == {"skipped_empty": 1, "skipped_no_assistant": 1}
    totals = json.loads((tmp_path / "sft" / "meta.json").read_text())["totals"]
    assert (totals["train_examples"], totals["skipped_no_assistant"], totals["skipped_empty"]) == (1, 1, 1)


def test_input_with_no_usable_example_is_an_error(tmp_path: Path, encoder: Any) -> None:
    with pytest.raises(DatasetError) as info:
        build_sft_cache([[{"role": "user", "content": "hi"}]], tmp_path / "sft", tokenizer=encoder)
    assert info.value.message == "no examples to build sft from: none of 1 has an assistant turn"


def test_a_message_with_an_unknown_role_is_an_error_naming_the_example(tmp_path: Path, encoder: Any) -> None:
    examples = [EXAMPLES[0], [{"role": "prompter", "content": "hi"}]]
    with pytest.raises(DatasetError) as info:
        build_sft_cache(examples, tmp_path / "sft", tokenizer=encoder)
    assert info.value.message == "example 1, message 0: role 'prompter' is not system, user or assistant"


def test_content_spelling_the_eot_token_cannot_close_a_turn(tmp_path: Path, encoder: Any) -> None:
    sneaky = [{"role": "user", "content": "say <|im_end|>"}, {"role": "assistant", "content": "no"}]
    build_sft_cache([sneaky], tmp_path / "sft", tokenizer=encoder, val_frac=0.0)
    tokens = np.fromfile(tmp_path / "sft" / "train_tokens.bin", dtype="<u2").tolist()
    assert tokens.count(2) == 3  # the default system preamble's, the user's and the assistant's turn ends


def test_reading_the_built_cache_uses_the_stored_mask(tmp_path: Path, encoder: Any) -> None:
    build_sft_cache(EXAMPLES, tmp_path / "sft", tokenizer=encoder, val_frac=0.25, seed=3)
    out = tmp_path / "sft"
    dataset = SFTExampleDataset(out / "train_tokens.bin", out / "train_idx.npy", T=128, eot_id=2)
    x, y, y_masked = dataset.get_batch(B=4, generator=torch.Generator().manual_seed(1))
    assert dataset.mask is not None
    trained = y_masked != IGNORE_INDEX
    assert trained.any() and (y_masked[trained] == y[trained]).all()
    assert (y[:, :-1] == x[:, 1:]).all() and int(x.max()) < 49152

"""build_pretrain_cache: layout, meta.json, EOS and document index, split rule, budgets, dtype."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dlmstore.datasets.build.pretrain import build_pretrain_cache
from dlmstore.errors import DatasetError

from .helpers import WORD_SHA, WordTokenizer, split_tokens, words

DOCS = [f"Document {i}: " + "lorem ipsum dolor " * (i % 7) for i in range(120)]


def build(tmp_path: Path, enc: Any, **kwargs: Any) -> Any:
    options: dict[str, Any] = {"val_frac": 0.2, "shard_bytes": 512, "seed": 7}
    options.update(kwargs)
    return build_pretrain_cache(DOCS, tmp_path / "ds", tokenizer=enc, **options)


def documents_of(tokens: np.ndarray[Any, Any], eos: int) -> list[list[int]]:
    ends = np.flatnonzero(tokens == eos)
    assert len(tokens) == 0 or ends[-1] == len(tokens) - 1, "the split does not end with EOS"
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [tokens[s:e].tolist() for s, e in zip(starts, ends, strict=True)]


def test_pretrain_build_writes_shards_indexes_and_meta_with_the_recorded_dtype(
    tmp_path: Path, encoder: Any
) -> None:
    result = build(tmp_path, encoder, name="lorem", config="v1")
    out = tmp_path / "ds"
    meta = json.loads((out / "meta.json").read_text())
    assert result.token_dtype == meta["token_dtype"] == "uint16"
    assert meta["byte_order"] == "little" and meta["kind"] == "pretrain" and meta["built"] is True
    assert (meta["dataset_name"], meta["dataset_config"], meta["seed"]) == ("lorem", "v1", 7)
    assert meta["vocab_size"] == 49152 and meta["tokenizer_sha256"] == encoder.tokenizer_sha256
    assert meta["special_token_ids"]["eos"] == meta["eos_token_id"] == 2
    assert meta["shard_bytes"] == 512 and meta["shard_tokens"] == 256 and meta["streaming"] is False
    assert "never split" in meta["split_rule"]
    train = sorted(p.name for p in (out / "train").iterdir())
    assert train[:2] == ["shard_00000.bin", "shard_00000.docs.npy"]
    assert all((out / "train" / name).stat().st_size == 512 for name in train[:-2:2])  # full shards
    assert meta["totals"]["train_tokens"] == result.splits["train"].tokens == len(split_tokens(out, "train"))
    listed = {f["path"] for f in meta["files"]}
    assert listed == {str(p.relative_to(out)) for p in out.rglob("shard_*")}


def test_every_document_is_followed_by_eos_and_indexed_and_lands_whole_in_one_split(
    tmp_path: Path, encoder: Any
) -> None:
    build(tmp_path, encoder)
    out = tmp_path / "ds"
    expected = list(encoder.encode_texts(DOCS))
    found: list[list[int]] = []
    for split in ("train", "val"):
        tokens = split_tokens(out, split)
        docs = documents_of(tokens, 2)
        found.extend(docs)
        starts = []
        offset = 0
        for shard in sorted((out / split).glob("shard_*.bin")):
            index = np.load(shard.with_name(shard.name.replace(".bin", ".docs.npy")))
            assert index.dtype == np.int64
            starts.extend((index + offset).tolist())
            offset += shard.stat().st_size // 2
        assert starts == [0] + (np.flatnonzero(tokens == 2)[:-1] + 1).tolist()
    assert sorted(map(tuple, found)) == sorted(map(tuple, expected))
    assert len(found) == len(DOCS)  # no document in both splits, none lost


def test_budgets_stop_each_split_at_a_document_boundary(tmp_path: Path) -> None:
    texts = [words(*range(10 * i + 1, 10 * i + 11)) for i in range(100)]  # 10 words + EOS = 11 tokens
    result = build_pretrain_cache(
        texts,
        tmp_path / "ds",
        tokenizer=WordTokenizer(),
        tokenizer_sha256=WORD_SHA,
        train_tokens=100,
        val_tokens=30,
        seed=1,
        shard_bytes=64,
    )
    assert result.splits["train"].tokens == 110 and result.splits["val"].tokens == 33
    meta = json.loads((tmp_path / "ds" / "meta.json").read_text())
    assert meta["budgets"] == {"train_tokens": 100, "val_tokens": 30}
    assert meta["val_frac"] == pytest.approx(30 / 130)


def test_a_sources_own_splits_are_kept_and_a_full_train_split_is_not_read_to_the_end(tmp_path: Path) -> None:
    read = []

    def train_texts() -> Any:
        for i in range(1, 1000):
            read.append(i)
            yield words(i)

    result = build_pretrain_cache(
        train_texts(),
        tmp_path / "ds",
        tokenizer=WordTokenizer(),
        tokenizer_sha256=WORD_SHA,
        val_texts=[words(900), words(901)],
        train_tokens=10,
        seed=1,
        batch_docs=4,
    )
    assert result.splits["train"].tokens == 10 and len(read) < 20
    assert split_tokens(tmp_path / "ds", "val").tolist() == [900, 0, 901, 0]


def test_the_shuffle_buffer_permutes_documents_reproducibly(tmp_path: Path) -> None:
    texts = [words(i) for i in range(1, 50)]

    def run(name: str, seed: int) -> list[int]:
        build_pretrain_cache(
            texts,
            tmp_path / name,
            tokenizer=WordTokenizer(),
            tokenizer_sha256=WORD_SHA,
            val_frac=0.0,
            seed=seed,
            shuffle_buffer=8,
        )
        return [t for t in split_tokens(tmp_path / name, "train").tolist() if t]

    first, again, other = run("a", 3), run("b", 3), run("c", 4)
    assert first == again and first != other
    assert sorted(first) == list(range(1, 50)) and first != sorted(first)


def test_a_vocabulary_over_65536_is_written_as_uint32(tmp_path: Path) -> None:
    result = build_pretrain_cache(
        [words(70000, 1)],
        tmp_path / "ds",
        tokenizer=WordTokenizer(100_000),
        tokenizer_sha256=WORD_SHA,
        val_frac=0.0,
    )
    assert result.token_dtype == "uint32"
    assert split_tokens(tmp_path / "ds", "train", "<u4").tolist() == [70000, 1, 0]


def test_forcing_uint16_for_a_large_vocabulary_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as info:
        build_pretrain_cache(
            [words(1)],
            tmp_path / "ds",
            tokenizer=WordTokenizer(100_000),
            tokenizer_sha256=WORD_SHA,
            val_frac=0.0,
            token_dtype="uint16",
        )
    assert info.value.message == (
        f"token dtype for {tmp_path / 'ds'}: a vocabulary of 100000 tokens does not fit uint16 (ids up to 65535)"
    )


def test_empty_input_is_an_error_naming_the_dataset(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as info:
        build_pretrain_cache(
            [], tmp_path / "ds", tokenizer=WordTokenizer(), tokenizer_sha256=WORD_SHA, val_frac=0.1
        )
    assert info.value.message == "no documents to build ds from: the input yielded no documents"
    assert not (tmp_path / "ds" / "meta.json").exists()


def test_empty_texts_are_skipped_and_counted(tmp_path: Path) -> None:
    result = build_pretrain_cache(
        ["", words(5), ""],
        tmp_path / "ds",
        tokenizer=WordTokenizer(),
        tokenizer_sha256=WORD_SHA,
        val_frac=0.0,
    )
    assert result.skipped["skipped_empty_docs"] == 2
    assert split_tokens(tmp_path / "ds", "train").tolist() == [5, 0]


def test_a_document_that_is_not_text_is_an_error_naming_its_position(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as info:
        build_pretrain_cache(
            [words(1), 42],
            tmp_path / "ds",
            tokenizer=WordTokenizer(),
            tokenizer_sha256=WORD_SHA,
            val_frac=0.1,  # type: ignore[list-item]
        )
    assert info.value.message == "document 1 is a int, not text"


def test_text_spelling_a_special_token_is_tokenized_as_text(tmp_path: Path, encoder: Any) -> None:
    build_pretrain_cache(["quoting <|im_end|> here"], tmp_path / "ds", tokenizer=encoder, val_frac=0.0)
    tokens = split_tokens(tmp_path / "ds", "train").tolist()
    assert tokens.count(2) == 1 and tokens[-1] == 2  # only the end-of-document EOS


def test_a_pickled_encoder_as_a_ray_worker_receives_it_still_reads_special_tokens_as_text(
    encoder: Any,
) -> None:
    import pickle

    text = ["quoting <|im_end|> and <|endoftext|> here"]
    copy = pickle.loads(pickle.dumps(encoder))
    assert copy.encode_texts(text) == encoder.encode_texts(text) and 2 not in copy.encode_texts(text)[0]


def test_what_a_ray_pretrain_worker_receives_unpickles_without_transformers_and_encodes_the_same(
    encoder: Any,
) -> None:
    import pickle
    import subprocess
    import sys

    text = ["quoting <|im_end|> and <|endoftext|> here", "plain prose"]
    sent = pickle.dumps(encoder.for_data())
    script = (
        "import pickle, sys; data = pickle.loads(sys.stdin.buffer.read()); "
        f"print(data.encode_texts({text!r})); print('transformers' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", script], input=sent, capture_output=True, check=True).stdout
    ids, imported = out.decode().splitlines()
    assert ids == str(encoder.encode_texts(text)) and imported == "False False"


def test_a_rebuild_with_fewer_shards_removes_the_old_ones(tmp_path: Path) -> None:
    texts = [words(*range(1, 200))]
    kwargs: dict[str, Any] = {"tokenizer": WordTokenizer(), "tokenizer_sha256": WORD_SHA, "val_frac": 0.0}
    build_pretrain_cache(texts, tmp_path / "ds", shard_bytes=64, **kwargs)
    assert len(list((tmp_path / "ds" / "train").glob("shard_*.bin"))) == 7
    build_pretrain_cache(texts, tmp_path / "ds", shard_bytes=1024, **kwargs)
    assert [p.name for p in sorted((tmp_path / "ds" / "train").glob("shard_*"))] == [
        "shard_00000.bin",
        "shard_00000.docs.npy",
    ]

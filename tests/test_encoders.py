"""Encoding a pass's batches on threads (dlmstore.cache.encoders): same tokens, same segments, bounded text."""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import dlmstore.corpus.tokenize as tokenize_module
from dlmstore.cache.encoders import TextBudget, calling_thread_encoding, pipelined, tokenizer_threads
from dlmstore.corpus.tokenize import tokenize_document
from dlmstore.home import store_dir

from .helpers import VALID_ID, write_doc


def test_the_thread_count_is_rayons_setting_or_the_usable_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")
    assert tokenizer_threads() == 3
    monkeypatch.setenv("RAYON_NUM_THREADS", "lots")  # not a count: ignored, as rayon ignores it
    assert tokenizer_threads() == len(os.sched_getaffinity(0))
    monkeypatch.delenv("RAYON_NUM_THREADS")
    assert tokenizer_threads() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("off", ["false", "0", "off", "FALSE"])
def test_tokenizer_parallelism_switched_off_means_one_thread(
    monkeypatch: pytest.MonkeyPatch, off: str
) -> None:
    monkeypatch.setenv("RAYON_NUM_THREADS", "4")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", off)
    assert tokenizer_threads() == 1


def test_calling_thread_encoding_puts_the_setting_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    with calling_thread_encoding():
        assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
    monkeypatch.delenv("TOKENIZERS_PARALLELISM")
    with pytest.raises(RuntimeError), calling_thread_encoding():
        raise RuntimeError("an encoding failed")
    assert "TOKENIZERS_PARALLELISM" not in os.environ


def _numbers(batches: int, size: int) -> Iterator[tuple[list[int], int]]:
    for b in range(batches):
        yield list(range(b * size, (b + 1) * size)), size


def _pairs(chunk: list[int]) -> Iterator[tuple[list[int], int]]:
    for i in range(0, len(chunk), 2):
        yield chunk[i : i + 2], len(chunk[i : i + 2])


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_batches_come_back_in_order_whole_whatever_the_thread_count(threads: int) -> None:
    def encode(chunk: list[int], nbytes: int) -> dict[str, int]:
        time.sleep(0.001 * (chunk[0] % 3))  # chunks finish out of order
        return {str(n): n * n for n in chunk}

    results = list(pipelined(_numbers(6, 7), encode, threads=threads, chunks=_pairs, budget=100))
    assert [batch for batch, _ in results] == [batch for batch, _ in _numbers(6, 7)]
    for batch, fresh in results:
        assert list(fresh) == [str(n) for n in batch]  # merged in the chunks' order
        assert all(fresh[str(n)] == n * n for n in batch)


def test_an_encoding_error_reaches_the_caller_and_the_setting_is_put_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")

    def encode(chunk: list[int], nbytes: int) -> dict[str, int]:
        if 9 in chunk:
            raise ValueError("row 9 cannot be encoded")
        return {str(n): n for n in chunk}

    with pytest.raises(ValueError, match="row 9"):
        list(pipelined(_numbers(4, 4), encode, threads=3, chunks=_pairs, budget=100))
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"


def test_chunks_being_encoded_never_hold_more_text_than_the_budget() -> None:
    budget = TextBudget(10)
    active: list[int] = []
    seen: list[int] = []
    lock = threading.Lock()

    def encode(chunk: list[int], nbytes: int) -> dict[str, int]:
        with lock:
            active.append(nbytes)
            seen.append(sum(active))
        time.sleep(0.002)
        with lock:
            active.remove(nbytes)
        return {str(n): n for n in chunk}

    def sized(chunk: list[int]) -> Iterator[tuple[list[int], int]]:
        for n in chunk:  # one row a chunk, of n % 7 bytes (0 to 6)
            yield [n], n % 7

    def encode_within(chunk: list[int], nbytes: int) -> dict[str, int]:
        with budget.holding(nbytes):
            return encode(chunk, nbytes)

    list(pipelined(_numbers(5, 8), encode_within, threads=4, chunks=sized, budget=1000))
    assert max(seen) <= 10 and budget.peak <= 10 and budget.used == 0
    # and the pipeline's own budget: at most 10 bytes of text in encode at once
    active.clear()
    seen.clear()
    list(pipelined(_numbers(5, 8), encode, threads=4, chunks=sized, budget=10))
    assert max(seen) <= 10


def test_a_chunk_larger_than_the_budget_is_encoded_alone() -> None:
    budget = TextBudget(10)
    running: list[str] = []
    overlapped: list[bool] = []
    lock = threading.Lock()

    def work(name: str, nbytes: int) -> None:
        with budget.holding(nbytes):
            with lock:
                running.append(name)
                overlapped.append(name == "big" and len(running) > 1)
            time.sleep(0.01)
            with lock:
                running.remove(name)

    threads = [threading.Thread(target=work, args=(f"small{i}", 3)) for i in range(3)]
    threads.append(threading.Thread(target=work, args=("big", 50)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not any(overlapped) and budget.used == 0 and budget.peak <= 10


def _segment_bytes(dlm_id: str) -> list[bytes]:
    """The bytes of the store's segments in the order they were registered (their names are random)."""
    root = store_dir(dlm_id)
    with sqlite3.connect(root / "store.db") as conn:
        paths = [path for (path,) in conn.execute("SELECT path FROM token_segments ORDER BY id")]
    conn.close()
    return [(root / path).read_bytes() for path in paths]


def _tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"{i:02d}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * (i % 9 + 1))
    (src / "same_a.py").write_text("print('twice')\n")
    (src / "same_b.py").write_text("print('twice')\n")
    return write_doc(tmp_path / "doc.dlm", frontmatter="training:\n  sources:\n    - path: src\n")


def _threads_encoding(monkeypatch: pytest.MonkeyPatch, *, parallelism: str) -> set[str]:
    """The names of the threads that call ``encode_rows`` from now on, each call checking the
    tokenizer's own parallelism is ``parallelism`` while it encodes."""
    seen: set[str] = set()
    real_encode_rows = tokenize_module.encode_rows

    def encode_rows(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.add(threading.current_thread().name)
        assert os.environ["TOKENIZERS_PARALLELISM"] == parallelism
        return real_encode_rows(*args, **kwargs)

    monkeypatch.setattr(tokenize_module, "encode_rows", encode_rows)
    return seen


def test_several_threads_give_the_same_tokens_and_the_same_segment_bytes_as_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _tree(tmp_path)
    monkeypatch.setattr(tokenize_module, "BATCH_ROWS", 16)  # several batches
    monkeypatch.setattr(tokenize_module, "CHUNK_ROWS", 3)  # several chunks a batch
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    assert tokenizer_threads() == 1
    _, one = tokenize_document(str(doc))
    segments_one = _segment_bytes(VALID_ID)
    assert len(segments_one) > 1 and one is not None
    shutil.rmtree(store_dir(VALID_ID))
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")
    encoders_seen = _threads_encoding(monkeypatch, parallelism="false")  # the tokenizer's own pool off
    summary, several = tokenize_document(str(doc))
    assert len(encoders_seen) > 1, encoders_seen  # chunks really ran on several threads
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
    assert several is not None and summary.tokenization.cache_misses == 43
    assert np.array_equal(several.values, one.values) and np.array_equal(several.offsets, one.offsets)
    assert _segment_bytes(VALID_ID) == segments_one  # the same segments, byte for byte


def test_a_pass_with_conversations_to_encode_stays_on_one_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _tree(tmp_path)
    doc.write_text(
        doc.read_text().replace(
            "Some prose.\n", "Some prose.\n\n::instruction::\n### Q\nWhat is two?\n### A\nTwo.\n"
        )
    )
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")
    encoders_seen = _threads_encoding(monkeypatch, parallelism="true")  # left to the tokenizer
    summary, rows = tokenize_document(str(doc))
    assert rows is not None and "messages" in rows.kinds
    assert len(encoders_seen) == 1

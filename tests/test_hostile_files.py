"""Files that would hang or exhaust a reader: a FIFO where a segment belongs, and document
rows too large to tokenize in bounded memory (FIFO dataset files: test_datasets_bad_input.py).

A FIFO opened for a blocking read waits forever for a writer, so every FIFO
case runs the command in a subprocess with a timeout: a hang fails the test
instead of stalling the suite. Each asserts one clear outcome (a problem
line and ``error:``, or a warning and a re-tokenized row), never a
traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import dlmstore.corpus.tokenize as tokenize_module
from dlmstore.cli.main import cli
from dlmstore.corpus.tokenize import tokenize_document
from dlmstore.document.rows import MAX_ROW_BYTES, text_bytes
from dlmstore.home import store_dir

from .helpers import REPO, VALID_ID, write_doc

DLM = str(Path(sys.executable).with_name("dlm"))


def run_dlm(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``dlm ARGS`` in a subprocess of this test's home; a hang raises ``TimeoutExpired``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([DLM, *args], capture_output=True, text=True, timeout=timeout, env=env)


def no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr


# -- a segment file that is a FIFO ----------------------------------------------------------------


@pytest.fixture
def fifo_segment(tmp_path: Path, tiny_base: Path) -> Path:
    """A tokenized document whose only segment file was replaced by a FIFO; returns the document."""
    doc = write_doc(tmp_path / "doc.dlm", body="Some prose.\n", frontmatter=f"base_model: {tiny_base}\n")
    result = CliRunner().invoke(cli, ["tokenize", str(doc)])
    assert result.exit_code == 0, result.output
    (segment,) = (store_dir(VALID_ID) / "tokens").glob("segment-*.bin")
    segment.unlink()
    os.mkfifo(segment)
    return doc


def test_cache_verify_reports_a_fifo_segment_as_damage_without_hanging(fifo_segment: Path) -> None:
    result = run_dlm("cache", "verify", str(fifo_segment))
    no_traceback(result)
    assert result.returncode == 1
    kinds = [line.split(":")[1].strip() for line in result.stdout.splitlines() if line.startswith("problem:")]
    assert kinds == ["missing_segment", "bad_entry"]


def test_tokenize_treats_a_fifo_segment_as_damage_and_re_tokenizes_without_hanging(
    fifo_segment: Path,
) -> None:
    expected = tokenize_document(str(fifo_segment), no_cache=True)[1]
    result = run_dlm("-q", "tokenize", str(fifo_segment))  # -q: the warning alone, no progress
    no_traceback(result)
    assert result.returncode == 0
    assert result.stderr.startswith(
        "warning: 1 cache entry pointed at missing or damaged token files; its row was re-tokenized"
    )
    _, rows = tokenize_document(str(fifo_segment))
    assert rows is not None and expected is not None
    assert rows.values.tolist() == expected.values.tolist()


# -- in-body rows too large to tokenize in bounded memory --------------------------------------


def test_a_30_mb_single_line_body_is_one_error_line_not_an_aborted_process(tmp_path: Path) -> None:
    body = "lorem ipsum dolor sit amet " * (30_000_000 // 27) + "\n"
    doc = write_doc(tmp_path / "doc.dlm", body=body)
    size = len(body.strip()) / 2**20
    for command in (["tokenize"], ["show"], ["train"]):
        result = CliRunner().invoke(cli, ["-q", *command, str(doc)])  # -q: train converts the base first
        assert result.exit_code == 1, result.output
        assert result.stderr == (
            f"error: {doc}:4: this prose section is one training row of {size:.1f} MiB; a row may hold at "
            "most 4 MiB (tokenizing takes about 200 bytes of memory per byte of a row)\n"
            "hint: split it into smaller sections (a ::prose:: fence line starts a new one); training "
            "reads only the first sequence_len tokens of a row anyway\n"
        )


def test_an_answer_over_the_row_limit_is_named_by_its_pair(tmp_path: Path) -> None:
    answer = "é" * (MAX_ROW_BYTES // 2 + 1)  # two bytes each: just over the limit in UTF-8
    doc = write_doc(
        tmp_path / "doc.dlm", body=f"::instruction::\n### Q\nq?\n### A\nshort\n\n### Q\nq?\n### A\n{answer}\n"
    )
    result = CliRunner().invoke(cli, ["show", str(doc)])
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"error: {doc}:4: question/answer pair 2 of this instruction section is one training row of 4.0 MiB;"
    )
    assert "hint: shorten it; training reads only" in result.stderr


def test_a_body_section_just_under_the_row_limit_is_accepted(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm", body="x" * (MAX_ROW_BYTES - 1) + "\n")
    result = CliRunner().invoke(cli, ["show", str(doc)])
    assert result.exit_code == 0, result.output
    assert "rows:     1 text" in result.stdout


# -- the tokenize pass batches by bytes as well as by rows -------------------------------------


def test_tokenize_batches_stop_at_the_byte_bound_and_give_the_same_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"{i:02d}.md").write_text(f"file {i} " + "some words here " * (10 * i + 1))
    doc = write_doc(tmp_path / "doc.dlm", frontmatter="training:\n  sources:\n    - path: src\n")
    expected = tokenize_document(str(doc), no_cache=True)[1]
    batches: list[list[int]] = []
    real_encode = tokenize_module.encode_rows

    def encode_rows(tokenizer: Any, rows: Any, **kw: Any) -> Any:
        batches.append([text_bytes(row.data) for row in rows])
        return real_encode(tokenizer, rows, **kw)

    monkeypatch.setattr(tokenize_module, "encode_rows", encode_rows)
    monkeypatch.setattr(tokenize_module, "BATCH_BYTES", 600)
    _, rows = tokenize_document(str(doc), no_cache=True)
    assert rows is not None and expected is not None
    assert len(batches) > 2
    assert all(sum(sizes) <= 600 or len(sizes) == 1 for sizes in batches), batches
    assert sum(len(sizes) for sizes in batches) == len(rows) == 13  # the body and 12 files
    assert np.array_equal(rows.values, expected.values) and np.array_equal(rows.offsets, expected.offsets)

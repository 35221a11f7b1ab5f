"""`dlm train --resume` says how many steps this run trained and how many the phase has (#32 item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.train.trainer import train_document

from .test_resume import ctrl_c_after, resume_doc
from .test_train_datasets import build_pretrain

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_resumed_run_prints_the_steps_it_trained_beside_the_phases_total(
    tmp_path: Path, tiny_base: Path
) -> None:
    doc = resume_doc(tmp_path, tiny_base, build_pretrain(tmp_path, tiny_base), steps=8, every=2)
    with pytest.raises(KeyboardInterrupt), ctrl_c_after(5):  # the last checkpoint is step 4
        train_document(str(doc))
    result = CliRunner().invoke(cli, ["train", str(doc), "--resume"])
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("run 2 sft:")]
    assert line.startswith("run 2 sft: 4 of 8 steps (from step 5) on 1 row (")
    assert "resumed: run 1 from step 4" in result.output.splitlines()


def test_a_run_that_did_not_resume_trained_every_step_of_its_phases(tmp_path: Path, tiny_base: Path) -> None:
    doc = resume_doc(tmp_path, tiny_base, build_pretrain(tmp_path, tiny_base), steps=2, every=2)
    result = CliRunner().invoke(cli, ["train", str(doc), "--json"])
    assert result.exit_code == 0, result.output
    (phase,) = json.loads(result.output)["phases"]
    assert (phase["steps"], phase["steps_this_run"]) == (2, 2)

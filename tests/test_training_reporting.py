"""``training.report_to``: TRL's reporters (TensorBoard, Trackio) beside the store's own step log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.document.parser import parse_text
from dlmstore.errors import DocumentError, TrainingError
from dlmstore.home import store_dir
from dlmstore.train import plan as plan_module
from dlmstore.train.loops.reporting import TENSORBOARD_ENV, reporting, tensorboard_dir
from dlmstore.train.plan import Hardware, check_settings, resolve_plan, sft_config_kwargs
from dlmstore.train.trainer import train_document

from .helpers import VALID_ID, write_doc

CPU = Hardware("cpu", False, 16.0, frozenset())


def _settings(yaml: str):  # type: ignore[no-untyped-def]
    return parse_text(f"---\ndlm_id: {VALID_ID}\ntraining:\n{yaml}\n---\n").frontmatter.training


def test_report_to_defaults_to_none_and_takes_trls_spellings() -> None:
    assert _settings("  seed: 1").report_to == []
    assert _settings("  report_to: none").report_to == []
    assert _settings("  report_to: tensorboard").report_to == ["tensorboard"]
    assert _settings("  report_to: [tensorboard, trackio]").report_to == ["tensorboard", "trackio"]


def test_an_unknown_or_repeated_reporter_is_an_error_naming_the_key() -> None:
    for value in ("wandb", "[tensorboard, tensorboard]"):
        with pytest.raises(DocumentError) as info:
            _settings(f"  report_to: {value}")
        assert "training.report_to" in str(info.value)


def test_the_plan_passes_report_to_through_to_the_trainer_arguments() -> None:
    hardware = Hardware("cpu", False, 16.0, frozenset({"tensorboard"}))
    plan = resolve_plan(_settings("  report_to: tensorboard"), hardware, base_params=1000)
    assert plan.report_to == ("tensorboard",)
    assert sft_config_kwargs(plan, "out")["report_to"] == ["tensorboard"]
    assert (
        sft_config_kwargs(resolve_plan(_settings("  seed: 1"), CPU, base_params=1000), "out")["report_to"]
        == []
    )


def test_a_missing_reporter_package_is_one_error_naming_the_pip_extra() -> None:
    with pytest.raises(TrainingError) as info:
        check_settings(_settings("  report_to: [tensorboard, trackio]"), CPU)
    assert str(info.value) == (
        "training.report_to: tensorboard and trackio needs the tensorboard and trackio packages, "
        "which are not installed"
    )
    assert info.value.hint == (
        "pip install 'dlmstore[tensorboard,trackio]', or remove tensorboard and trackio from training.report_to"
    )


def test_dlm_train_refuses_a_missing_reporter_before_the_model_loads(
    tmp_path: Path, tiny_base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlmstore.train import stages

    monkeypatch.setattr(plan_module, "probe_hardware", lambda: CPU)

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(stages, "load_base_model", no_model)
    doc = write_doc(
        tmp_path / "doc.dlm", frontmatter=f"base_model: {tiny_base}\ntraining:\n  report_to: trackio\n"
    )
    result = CliRunner().invoke(cli, ["train", str(doc)])
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[-2:] == [
        "error: training.report_to: trackio needs the trackio package, which is not installed",
        "hint: pip install 'dlmstore[trackio]', or remove trackio from training.report_to",
    ]


def test_reporting_names_the_tensorboard_folder_only_while_the_trainer_is_built(tmp_path: Path) -> None:
    before = os.environ.get(TENSORBOARD_ENV)
    with reporting((), store_path=tmp_path, dlm_id=VALID_ID, run_id=3, phase="sft") as names:
        assert names == {} and os.environ.get(TENSORBOARD_ENV) == before
    with reporting(("tensorboard",), store_path=tmp_path, dlm_id=VALID_ID, run_id=3, phase="sft") as names:
        assert names == {"run_name": f"{VALID_ID} run 3 sft"}
        assert os.environ[TENSORBOARD_ENV] == str(tmp_path / "runs" / "3" / "tb" / "sft")
        assert (tmp_path / "runs" / "3" / "tb" / "sft").is_dir()
    assert os.environ.get(TENSORBOARD_ENV) == before


@pytest.mark.slow
def test_two_steps_with_report_to_tensorboard_write_an_event_file_per_phase_in_the_store(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    body = (
        "Prose about the store. " * 20 + "\n\n::preference::\n### Prompt\np\n### Chosen\nc\n### Rejected\nr\n"
    )
    doc = write_doc(
        tmp_path / "doc.dlm",
        body=body,
        frontmatter=f"base_model: {tiny_base}\ntraining:\n  sequence_len: 64\n  max_steps: 2\n"
        "  micro_batch_size: 1\n  report_to: tensorboard\n",
    )
    summary = train_document(str(doc))
    assert [(phase.phase, phase.steps) for phase in summary.phases] == [("sft", 2), ("preference", 2)]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for phase in ("sft", "preference"):
        folder = tensorboard_dir(store_dir(VALID_ID), summary.run_id, phase)
        events = list(folder.glob("events.out.tfevents.*"))
        assert len(events) == 1, sorted(p.name for p in folder.rglob("*"))
        accumulator = EventAccumulator(str(folder))
        accumulator.Reload()
        assert [event.step for event in accumulator.Scalars("train/loss")] == [1, 2]
    assert TENSORBOARD_ENV not in os.environ

"""`dlm metrics` says what happened in each run: how long it took, its phases' steps with final
and best loss, why it failed, and whether its pass bypassed the cache (#32 item 2)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.store.database import Store, open_store
from dlmstore.store.events import TokenizationEvent, record_tokenization_event
from dlmstore.store.metrics import PhaseMetrics, run_metrics
from dlmstore.store.runs import finish_run, start_run

from .helpers import VALID_ID, write_doc


def _times(store: Store, run_id: int, started: str, finished: str | None) -> None:
    with store.write() as conn:
        conn.execute(
            "UPDATE runs SET started_at = ?, finished_at = ? WHERE id = ?", (started, finished, run_id)
        )


def _losses(store: Store, run_id: int, phase: str, losses: list[float | None]) -> None:
    with store.write() as conn:
        conn.executemany(
            "INSERT INTO train_steps (run_id, phase, step, epoch, loss, learning_rate, tokens_per_second, "
            "recorded_at) VALUES (?, ?, ?, 1.0, ?, 0.0001, 100.0, 'x')",
            [(run_id, phase, step, loss) for step, loss in enumerate(losses, start=1)],
        )


def _pass(store: Store, run_id: int, mode: str, hits: int, misses: int, seconds: float) -> None:
    event = TokenizationEvent(3, hits + misses, hits, misses, seconds, 1024, mode, None)
    record_tokenization_event(store, run_id, event, tokenizer_sha256="sha256:" + "0" * 64, sequence_len=64)


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    """Run 1: a 15-minute train run (a 0.88 s tokenize pass, SFT then DPO); run 2: a --no-cache
    train run that failed; run 3: a tokenize run still going."""
    path = write_doc(tmp_path / "doc.dlm")
    with open_store(VALID_ID) as store:
        first = start_run(store, command="train", dlm_path=path, dlm_sha256="ab")
        _pass(store, first, "on", 0, 4, 0.88)
        _losses(store, first, "sft", [3.0, 2.5, None, 2.75])
        _losses(store, first, "preference", [0.6931, 0.6, 0.65])
        finish_run(store, first, status="completed")
        _times(store, first, "2026-11-23T03:00:00.000Z", "2026-11-23T03:15:02.500Z")
        second = start_run(store, command="train", dlm_path=path, dlm_sha256="ab")
        _pass(store, second, "bypassed", 0, 4, 0.5)
        _losses(store, second, "sft", [3.0, 2.0])
        finish_run(store, second, status="failed", error="train rank 1 was killed by SIGKILL")
        _times(store, second, "2026-11-23T04:00:00.000Z", "2026-11-23T04:00:42.125Z")
        third = start_run(store, command="tokenize", dlm_path=path, dlm_sha256="ab")
        _times(store, third, "2026-11-23T05:00:00.000Z", None)
    return path


def test_each_run_carries_its_duration_from_start_to_finish_not_its_tokenize_time(doc: Path) -> None:
    with open_store(VALID_ID) as store:
        runs = {run.run_id: run for run in run_metrics(store).runs}
    assert runs[1].duration_seconds == 902.5
    assert runs[1].tokenization is not None and runs[1].tokenization.total_tokenize_seconds == 0.88
    assert runs[2].duration_seconds == 42.125
    assert runs[3].duration_seconds is None  # still running


def test_each_phase_carries_its_steps_final_loss_and_best_loss_with_its_step(doc: Path) -> None:
    with open_store(VALID_ID) as store:
        runs = {run.run_id: run for run in run_metrics(store).runs}
        (one,) = run_metrics(store, run_id=1).runs
    assert runs[1].phases == [
        PhaseMetrics("sft", 4, 2.75, 2.5, 2),
        PhaseMetrics("preference", 3, 0.65, 0.6, 2),
    ]
    assert one.phases == runs[1].phases  # the same with --run-id, read from its steps
    assert runs[2].phases == [PhaseMetrics("sft", 2, 2.0, 2.0, 2)]
    assert runs[3].phases == []


def test_a_phase_whose_every_loss_was_nan_has_no_best_loss() -> None:
    assert PhaseMetrics.of("sft", [(1, None), (2, None)]) == PhaseMetrics("sft", 2, None, None, None)


def test_metrics_prints_the_duration_the_tokenize_time_and_bypassed_in_their_own_columns(doc: Path) -> None:
    result = CliRunner().invoke(cli, ["metrics", str(doc)])
    assert result.exit_code == 0, result.output
    header, third, second, first = result.output.splitlines()[:4]
    assert header.split()[:12] == [
        "run", "command", "status", "started", "(UTC)", "duration", "rows", "hits", "misses", "hit", "rate",
        "tokenize",
    ]  # fmt: skip
    assert first.split()[4:11] == ["15m02s", "4", "0", "4", "0.0%", "0.88s", "1.0"]
    assert second.split()[4:11] == ["42.1s", "4", "0", "4", "bypassed", "0.50s", "1.0"]
    assert third.split()[:5] == ["3", "tokenize", "running", "2026-11-23T05:00:00.000Z", "-"]


def test_metrics_says_why_a_run_failed_and_each_phases_steps_and_losses(doc: Path) -> None:
    lines = CliRunner().invoke(cli, ["metrics", str(doc)]).output.splitlines()
    assert [line for line in lines if line.startswith("run 2")] == [
        "run 2: failed: train rank 1 was killed by SIGKILL",
        "run 2 sft: 2 steps, final loss 2.0000, best 2.0000 at step 2",
    ]
    assert [line for line in lines if line.startswith("run 1")] == [
        "run 1 sft: 4 steps, final loss 2.7500, best 2.5000 at step 2",
        "run 1 preference: 3 steps, final loss 0.6500, best 0.6000 at step 2",
    ]


def test_metrics_json_carries_duration_phases_error_and_cache_mode(doc: Path) -> None:
    result = CliRunner().invoke(cli, ["metrics", str(doc), "--json"])
    runs = {run["run_id"]: run for run in json.loads(result.output)["runs"]}
    assert runs[2]["duration_seconds"] == 42.125
    assert runs[2]["error"] == "train rank 1 was killed by SIGKILL"
    assert runs[2]["tokenization"]["cache_mode"] == "bypassed"
    assert runs[1]["phases"][1] == {
        "phase": "preference", "steps": 3, "final_loss": 0.65, "best_loss": 0.6, "best_step": 2,
    }  # fmt: skip


def test_metrics_csv_carries_duration_and_each_phases_steps_final_and_best_loss(doc: Path) -> None:
    result = CliRunner().invoke(cli, ["metrics", str(doc), "--csv"])
    rows = {row["run_id"]: row for row in csv.DictReader(io.StringIO(result.output))}
    assert {key: rows["1"][key] for key in (
        "duration_seconds", "sft_steps", "sft_final_loss", "sft_best_loss", "preference_steps",
        "preference_final_loss", "preference_best_loss", "cache_mode", "total_tokenize_seconds",
    )} == {
        "duration_seconds": "902.5", "sft_steps": "4", "sft_final_loss": "2.75", "sft_best_loss": "2.5",
        "preference_steps": "3", "preference_final_loss": "0.65", "preference_best_loss": "0.6",
        "cache_mode": "on", "total_tokenize_seconds": "0.88",
    }  # fmt: skip
    assert (rows["2"]["error"], rows["2"]["cache_mode"], rows["2"]["preference_steps"]) == (
        "train rank 1 was killed by SIGKILL", "bypassed", "",
    )  # fmt: skip
    assert rows["3"]["duration_seconds"] == ""

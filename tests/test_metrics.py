"""`dlm metrics` of train runs: the adapters each registered, and steps of each phase with TRL's rewards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.store.database import Store, open_store
from dlmstore.store.metrics import RunAdapter, TrainStep, run_metrics
from dlmstore.store.runs import finish_run, start_run
from dlmstore.train.adapters import Phase, PreferenceMethod, save_version

from .helpers import VALID_ID, write_doc

REWARDS = {
    "rewards/chosen": 0.125,
    "rewards/rejected": -0.25,
    "rewards/margins": 0.375,
    "rewards/accuracies": 0.75,
}


def _adapter(
    store: Store,
    run_id: int,
    phase: Phase = "sft",
    method: PreferenceMethod | None = None,
    parent: int | None = None,
) -> int:
    def write(folder: Path) -> None:
        (folder / "adapter_model.safetensors").write_bytes(f"{run_id}{phase}".encode())

    return save_version(
        store, run_id=run_id, write=write, base_model="smollm2-135m", steps=2, final_loss=0.5,
        phase=phase, method=method, parent_version=parent,
    ).version  # fmt: skip


def _step(store: Store, run_id: int, phase: Phase, step: int, loss: float, metrics: dict[str, float]) -> None:
    with store.write() as conn:
        conn.execute(
            "INSERT INTO train_steps (run_id, phase, step, epoch, loss, learning_rate, tokens_per_second, "
            "recorded_at) VALUES (?, ?, ?, 0.5, ?, 0.0001, 1000.0, 'x')",
            (run_id, phase, step, loss),
        )
        conn.executemany(
            "INSERT INTO train_step_metrics (run_id, phase, step, name, value) VALUES (?, ?, ?, ?, ?)",
            [(run_id, phase, step, name, value) for name, value in metrics.items()],
        )


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    """A document whose store holds an SFT-only run 1 and a run 2 of both phases (DPO from run 2's SFT adapter)."""
    path = write_doc(tmp_path / "doc.dlm")
    with open_store(VALID_ID) as store:
        first = start_run(store, command="train", dlm_path=path, dlm_sha256="ab")
        _step(store, first, "sft", 1, 3.0, {"grad_norm": 1.0})
        _adapter(store, first)
        finish_run(store, first, status="completed")
        second = start_run(store, command="train", dlm_path=path, dlm_sha256="ab")
        for step, loss in ((1, 2.0), (2, 1.5)):
            _step(store, second, "sft", step, loss, {"grad_norm": 0.5})
        sft = _adapter(store, second)
        _step(store, second, "preference", 1, 0.6931, REWARDS)
        _step(store, second, "preference", 2, 0.625, {**REWARDS, "rewards/margins": float("nan")})
        _adapter(store, second, "preference", "dpo", sft)
        finish_run(store, second, status="completed")
    return path


def test_each_train_run_lists_the_adapters_it_registered_oldest_first(doc: Path) -> None:
    with open_store(VALID_ID) as store:
        report = run_metrics(store)
        with store.read() as conn:
            shas = {
                row["version"]: row["sha256"] for row in conn.execute("SELECT version, sha256 FROM adapters")
            }
    adapters = [run.training.adapters for run in report.runs if run.training is not None]
    assert adapters == [
        [
            RunAdapter(2, "sft", None, None, shas[2], 2, 0.5),
            RunAdapter(3, "preference", "dpo", 2, shas[3], 2, 0.5),
        ],
        [RunAdapter(1, "sft", None, None, shas[1], 2, 0.5)],
    ]
    assert [run.training.steps for run in report.runs if run.training is not None] == [None, None]


def test_one_run_lists_its_steps_sft_first_with_the_numbers_trl_logged(doc: Path) -> None:
    with open_store(VALID_ID) as store:
        (run,) = run_metrics(store, run_id=2).runs
    assert run.training is not None and run.training.steps is not None
    assert [(s.phase, s.step, s.loss) for s in run.training.steps] == [
        ("sft", 1, 2.0), ("sft", 2, 1.5), ("preference", 1, 0.6931), ("preference", 2, 0.625),
    ]  # fmt: skip
    assert run.training.steps[0] == TrainStep("sft", 1, 0.5, 2.0, 0.0001, 1000.0, {"grad_norm": 0.5})
    assert run.training.steps[2].metrics == REWARDS
    assert run.training.steps[3].metrics == {**REWARDS, "rewards/margins": None}  # NaN is stored as NULL


def test_the_report_reads_each_table_once_however_many_runs_and_steps(doc: Path) -> None:
    statements: list[str] = []
    with open_store(VALID_ID) as store:
        with store.read() as conn:
            conn.set_trace_callback(statements.append)
        run_metrics(store, run_id=2)
        run_metrics(store)
    selects = [s for s in statements if s.lstrip().startswith("SELECT")]
    # runs, adapters, steps, metrics, exports, evaluations, val steps, val splits, contaminated rows;
    # then runs, adapters, losses, exports, evaluations, val steps, val splits, contaminated rows
    assert len(selects) == 9 + 8


def test_metrics_json_prints_adapters_and_steps_with_their_phase(doc: Path) -> None:
    result = CliRunner().invoke(cli, ["metrics", str(doc), "--json", "--run-id", "2"])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.stdout)["runs"]
    assert [(a["version"], a["phase"], a["method"], a["parent_version"]) for a in run["training"]["adapters"]] == [
        (2, "sft", None, None), (3, "preference", "dpo", 2),
    ]  # fmt: skip
    assert run["training"]["steps"][2] == {
        "phase": "preference", "step": 1, "epoch": 0.5, "loss": 0.6931, "learning_rate": 0.0001,
        "tokens_per_second": 1000.0, "metrics": REWARDS,
    }  # fmt: skip


def test_metrics_shows_the_steps_of_each_phase_with_rewards_for_the_preference_phase(doc: Path) -> None:
    result = CliRunner().invoke(cli, ["metrics", str(doc), "--run-id", "2"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    start = lines.index("run 2, sft steps:")
    assert lines[start - 2].startswith("run 2: adapter v0002 (sft), 2 steps, final loss 0.5000, sha256:")
    assert lines[start - 1].startswith(
        "run 2: adapter v0003 (preference, dpo from v0002), 2 steps, final loss 0.5000, sha256:"
    )
    assert [line.split() for line in lines[start:]] == [
        ["run", "2,", "sft", "steps:"],
        ["step", "epoch", "loss", "learning", "rate", "tokens/s"],
        ["1", "0.500", "2.0000", "0.0001", "1,000"],
        ["2", "0.500", "1.5000", "0.0001", "1,000"],
        ["run", "2,", "preference", "steps:"],
        ["step", "epoch", "loss", "learning", "rate", "tokens/s", "chosen", "rejected", "margin", "accuracy"],
        ["1", "0.500", "0.6931", "0.0001", "1,000", "0.1250", "-0.2500", "0.3750", "75.0%"],
        ["2", "0.500", "0.6250", "0.0001", "1,000", "0.1250", "-0.2500", "75.0%"],
    ]


def test_metrics_without_run_id_lists_the_adapters_but_no_steps(doc: Path) -> None:
    lines = CliRunner().invoke(cli, ["metrics", str(doc)]).output.splitlines()
    assert [line.split(",")[0] for line in lines if ": adapter " in line] == [
        "run 2: adapter v0002 (sft)", "run 2: adapter v0003 (preference", "run 1: adapter v0001 (sft)",
    ]  # fmt: skip


def test_each_train_run_carries_its_losses_by_phase_with_or_without_run_id(doc: Path) -> None:
    with open_store(VALID_ID) as store:
        every = {run.run_id: run.training.losses for run in run_metrics(store).runs if run.training}
        (one,) = run_metrics(store, run_id=2).runs
    assert every == {2: {"sft": [2.0, 1.5], "preference": [0.6931, 0.625]}, 1: {"sft": [3.0]}}
    assert one.training is not None and one.training.losses == every[2]


def test_metrics_draws_each_phases_loss_as_a_sparkline_beside_the_hit_rate(doc: Path) -> None:
    lines = CliRunner().invoke(cli, ["metrics", str(doc)]).output.splitlines()
    assert lines[0].split()[-3:] == ["tokenize", "cache", "loss"]
    assert lines[1].split()[:3] == ["2", "train", "completed"]
    assert lines[1].endswith("  sft █▁  pref █▁")
    assert lines[2].endswith("  sft ▄")  # one step: a flat line, drawn at mid height


def test_metrics_csv_prints_one_line_per_run_for_a_spreadsheet(doc: Path) -> None:
    import csv

    result = CliRunner().invoke(cli, ["metrics", str(doc), "--csv"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(result.stdout.splitlines()))
    assert [(r["run_id"], r["command"], r["status"], r["adapter_versions"], r["final_loss"]) for r in rows] == [
        ("2", "train", "completed", "2 3", "0.5"), ("1", "train", "completed", "1", "0.5"),
    ]  # fmt: skip
    assert rows[0]["cache_hits"] == rows[0]["error"] == ""  # no tokenization event, no error: empty cells


def test_metrics_csv_with_run_id_prints_the_steps_with_a_column_per_logged_metric(doc: Path) -> None:
    result = CliRunner().invoke(cli, ["metrics", str(doc), "--csv", "--run-id", "2"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "run_id,phase,step,epoch,loss,learning_rate,tokens_per_second,grad_norm,"
        "rewards/accuracies,rewards/chosen,rewards/margins,rewards/rejected"
    )
    assert lines[1:] == [
        "2,sft,1,0.5,2.0,0.0001,1000.0,0.5,,,,",
        "2,sft,2,0.5,1.5,0.0001,1000.0,0.5,,,,",
        "2,preference,1,0.5,0.6931,0.0001,1000.0,,0.75,0.125,0.375,-0.25",
        "2,preference,2,0.5,0.625,0.0001,1000.0,,0.75,0.125,,-0.25",
    ]


def test_metrics_json_and_csv_together_are_a_usage_error(doc: Path) -> None:
    result = CliRunner().invoke(cli, ["metrics", str(doc), "--json", "--csv"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == "Error: --json and --csv cannot be combined; pass one of them"

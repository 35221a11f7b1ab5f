"""Progress of long work: the library's tasks, and how the CLI draws them on a pipe and a terminal."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.cli.progress import BuildTasks, ProgressRenderer
from dlmstore.datasets.build.output import BuildProgress
from dlmstore.progress import ProgressUpdate, Task, reporting

from .helpers import write_doc


class FakeClock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _piped(clock: FakeClock) -> tuple[ProgressRenderer, io.StringIO]:
    stream = io.StringIO()
    return ProgressRenderer(stream=stream, tty=False, clock=clock), stream


def test_a_task_reports_nothing_and_costs_nothing_without_a_sink() -> None:
    task = Task("tokenizing", total=3, unit="rows")
    task.update(2)
    task.finish()
    assert (task.reporting, task.done, task.finished) == (False, 2, True)


def test_a_task_sends_its_start_updates_and_one_end_to_the_sink_installed_when_it_started() -> None:
    seen: list[ProgressUpdate] = []
    with reporting(seen.append):
        with Task("tokenizing", total=3, unit="rows") as task:
            task.update(1, tokens=10)
            task.advance()
            task.finish(3)
        task.update(5)  # after the end: ignored
    assert [(u.done, u.total, dict(u.details), u.finished) for u in seen] == [
        (0, 3, {}, False),
        (1, 3, {"tokens": 10}, False),
        (2, 3, {"tokens": 10}, False),
        (3, 3, {"tokens": 10}, True),
    ]


def test_a_failed_task_reports_no_end() -> None:
    seen: list[ProgressUpdate] = []
    with reporting(seen.append), pytest.raises(ValueError), Task("walking notes", unit="files"):
        raise ValueError("boom")
    assert [u.finished for u in seen] == [False]


def test_piped_progress_prints_a_status_line_with_rate_and_eta_at_most_every_ten_seconds() -> None:
    clock = FakeClock()
    renderer, stream = _piped(clock)
    with reporting(renderer):
        task = Task("tokenizing", total=1000, unit="rows")
        for at, done in [(3, 100), (9.9, 200), (10, 250), (15, 400), (19.9, 490), (20, 500)]:
            clock.now = 100.0 + at
            task.update(done)
        clock.now = 140.0
        task.finish(1000)
    assert stream.getvalue().splitlines() == [
        "tokenizing: 250/1,000 rows (25.0%), 25 rows/s, ETA 30s",
        "tokenizing: 500/1,000 rows (50.0%), 25 rows/s, ETA 20s",
        "tokenizing: 1,000 rows in 40s (25 rows/s)",
    ]


def test_piped_progress_of_a_short_task_is_its_final_line_only() -> None:
    clock = FakeClock()
    renderer, stream = _piped(clock)
    with reporting(renderer):
        with Task("training sft", total=2, unit="steps") as task:
            clock.now += 1.5
            task.update(1, loss=2.5)
            clock.now += 1.5
            task.update(2, loss=2.25)
    assert stream.getvalue() == "training sft: 2 steps in 3.0s (1.5s/step), loss 2.2500\n"


def test_a_task_that_cannot_count_gets_a_line_with_its_time_every_ten_seconds_from_the_timer() -> None:
    clock = FakeClock()
    renderer, stream = _piped(clock)
    with reporting(renderer):
        task = Task("converting smollm2-135m tokenizer from GGUF")
        for at in (4, 10, 15, 21):
            clock.now = 100.0 + at
            renderer.tick()
        clock.now = 125.0
        task.finish()
    assert stream.getvalue().splitlines() == [
        "converting smollm2-135m tokenizer from GGUF: 10s so far",
        "converting smollm2-135m tokenizer from GGUF: 21s so far",
        "converting smollm2-135m tokenizer from GGUF: done in 25s",
    ]


def test_on_a_terminal_each_task_is_a_tqdm_bar() -> None:
    from tqdm import tqdm

    stream = io.StringIO()
    renderer = ProgressRenderer(stream=stream, tty=True)
    with reporting(renderer):
        task = Task("tokenizing", total=4, unit="rows")
        task.update(2)
        bar = renderer.tasks["tokenizing"].bar
        assert isinstance(bar, tqdm) and (bar.n, bar.total, bar.disable) == (2, 4, False)
        task.finish(4)
    assert (bar.n, "tokenizing" in renderer.tasks) == (4, False)
    drawn = stream.getvalue()
    assert "tokenizing: 100%" in drawn and "4/4" in drawn


def test_a_bar_left_open_by_a_failed_step_is_closed_with_the_renderer() -> None:
    renderer = ProgressRenderer(stream=io.StringIO(), tty=True)
    with reporting(renderer):
        Task("loading smollm2-135m").update(0)
    bar = renderer.tasks["loading smollm2-135m"].bar
    renderer.close()
    assert bar.disable and renderer.tasks == {}  # tqdm disables a closed bar


def test_dataset_builds_report_each_source_as_a_task() -> None:
    seen: list[ProgressUpdate] = []
    with reporting(seen.append):
        tasks = BuildTasks()
        tasks(BuildProgress("wikitext", docs=10, tokens=500, seconds=1.0))
        tasks(BuildProgress("wikitext", docs=20, tokens=900, seconds=2.0, finished=True))
    assert [(u.task, u.done, dict(u.details), u.finished) for u in seen] == [
        ("building wikitext", 0, {}, False),
        ("building wikitext", 10, {"tokens": 500, "tokens/s": 500.0}, False),
        ("building wikitext", 20, {"tokens": 900, "tokens/s": 450.0}, True),
    ]


def test_the_gguf_converters_own_bar_counts_the_tensors_into_the_conversion_task() -> None:
    """transformers converts a GGUF model's tensors under a tqdm bar of its own; dlm counts them instead."""
    import importlib

    from dlmstore.bases import _quiet_transformers

    gguf_utils = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    their_bar = gguf_utils.tqdm
    seen: list[ProgressUpdate] = []
    with reporting(seen.append), Task("converting smollm2-135m model from GGUF", unit="tensors") as task:
        with _quiet_transformers(tensors=task):
            # as modeling_gguf_pytorch_utils calls it: for tensor in tqdm(reader.tensors, desc=...)
            converted = list(gguf_utils.tqdm(["a", "b", "c"], desc="Converting GGUF tensors..."))
    assert converted == ["a", "b", "c"] and gguf_utils.tqdm is their_bar
    assert [(u.done, u.total, u.finished) for u in seen] == [
        (0, None, False), (0, 3, False), (1, 3, False), (2, 3, False), (3, 3, False), (3, 3, True),
    ]  # fmt: skip


def test_a_build_shows_documents_and_tokens_per_second_in_a_log_and_on_a_terminal() -> None:
    clock = FakeClock()
    renderer, stream = _piped(clock)
    with reporting(renderer):
        tasks = BuildTasks()
        for at, docs, tokens in [(0, 500, 20_000), (12, 6_000, 240_000)]:
            clock.now = 100.0 + at
            tasks(BuildProgress("web", docs=docs, tokens=tokens, seconds=at + 0.5))
        clock.now = 124.0
        tasks(BuildProgress("web", docs=9_600, tokens=384_000, seconds=24.5, finished=True))
    assert stream.getvalue().splitlines() == [
        "building web: 6,000 docs, 500 docs/s, tokens 240,000, tokens/s 19,200",
        "building web: 9,600 docs in 24s (400 docs/s), tokens 384,000, tokens/s 15,673",
    ]
    terminal = io.StringIO()
    with reporting(ProgressRenderer(stream=terminal, tty=True)):
        tasks = BuildTasks()
        tasks(BuildProgress("web", docs=500, tokens=20_000, seconds=2.0))
        tasks(BuildProgress("web", docs=900, tokens=36_000, seconds=4.0, finished=True))
    bar = terminal.getvalue().strip("\r\n").split("\r")[-1]
    assert bar.startswith("building web: 900 docs [") and "docs/s, tokens 36,000, tokens/s 9,000]" in bar


@pytest.fixture
def tiny_doc(tmp_path: Path, tiny_base: Path) -> Path:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("Notes on caching tokens.\n")
    return write_doc(
        tmp_path / "doc.dlm",
        body="One paragraph of prose.\n",
        frontmatter=f"base_model: {tiny_base}\ntraining:\n  sources:\n    - path: notes\n",
    )


def test_piped_tokenize_reports_its_steps_on_stderr_and_only_its_summary_on_stdout(tiny_doc: Path) -> None:
    result = CliRunner().invoke(cli, ["tokenize", str(tiny_doc)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith("run 1: 2 rows, ")
    assert all(
        line.split(":")[0] in {"run 1", "cache", "time", "size"} for line in result.stdout.splitlines()
    )
    stderr = result.stderr.splitlines()
    assert [line.split(":")[0] for line in stderr] == ["walking notes", "tokenizing"]
    assert stderr[0].startswith("walking notes: 1 file in ")
    assert stderr[1].startswith("tokenizing: 2 rows in ")


@pytest.mark.parametrize("args", [[], ["--rows"]])
def test_show_reports_its_source_walk_on_stderr_and_keeps_stdout_for_its_data(
    tiny_doc: Path, args: list[str]
) -> None:
    result = CliRunner().invoke(cli, ["show", str(tiny_doc), *args])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0].startswith("walking notes: 1 file in ")
    assert len(result.stderr.splitlines()) == 1
    first = result.stdout.splitlines()[0]
    assert first.startswith("document: ") if not args else first.startswith('{"text": ')


@pytest.mark.slow  # converts the SmolLM2 tokenizer from GGUF afresh
def test_a_first_conversion_from_gguf_reports_its_progress_in_data_validate(
    tmp_path: Path, dlm_home: Path
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("A note worth a dataset.\n")
    out = tmp_path / "ds"
    built = CliRunner().invoke(cli, ["data", "build", "pretrain", "--from", str(notes), "--out", str(out)])
    assert built.exit_code == 0, built.output
    (dlm_home / "bases").unlink()  # a new home: the built-in base is not converted yet
    result = CliRunner().invoke(cli, ["data", "validate", str(out), "--base", "smollm2-135m"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[-1].startswith("converting smollm2-135m tokenizer from GGUF: done in ")
    assert result.stdout.startswith(f"ok: {out} (pretrain ds, ")


def test_quiet_turns_progress_off(tiny_doc: Path) -> None:
    result = CliRunner().invoke(cli, ["-q", "tokenize", str(tiny_doc)])
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout.startswith("run 1: 2 rows, ")


def test_json_output_has_no_progress_beside_it(tiny_doc: Path) -> None:
    import json

    result = CliRunner().invoke(cli, ["tokenize", str(tiny_doc), "--json"])
    assert (result.exit_code, result.stderr) == (0, "")
    assert json.loads(result.stdout)["tokens"] > 0


def test_the_timer_keeps_a_terminal_bar_of_a_task_that_cannot_count_moving() -> None:
    stream = io.StringIO()
    renderer = ProgressRenderer(stream=stream, tty=True)
    with reporting(renderer):
        Task("loading smollm2-135m")
        drawn = len(stream.getvalue())
        renderer.tick()
    assert len(stream.getvalue()) > drawn
    renderer.close()


def test_a_counted_task_with_nothing_done_yet_says_how_long_it_has_waited() -> None:
    clock = FakeClock()
    renderer, stream = _piped(clock)
    with reporting(renderer):
        Task("training sft", total=3, unit="steps")
        clock.now += 12
        renderer.tick()
    assert stream.getvalue() == "training sft: 0/3 steps (0.0%), 12s so far\n"


def test_slow_work_is_timed_per_unit_and_fast_work_per_second() -> None:
    clock = FakeClock()
    renderer, stream = _piped(clock)
    with reporting(renderer):
        task = Task("training sft", total=10, unit="steps")
        clock.now += 97
        task.update(1, loss=4.5)
    assert stream.getvalue() == "training sft: 1/10 steps (10.0%), 1m37s/step, ETA 14m33s, loss 4.5000\n"


def test_the_eta_counts_down_during_a_slow_step_instead_of_climbing() -> None:
    clock = FakeClock()
    renderer, stream = _piped(clock)
    with reporting(renderer):
        task = Task("training sft", total=4, unit="steps")
        clock.now += 10
        task.update(1, loss=4.5)  # 10 s a step: 30 s left
        for _ in range(3):  # the second step takes 35 s: the ETA never goes up
            clock.now += 10
            renderer.tick()
    assert stream.getvalue().splitlines() == [
        "training sft: 1/4 steps (25.0%), 10s/step, ETA 30s, loss 4.5000",
        "training sft: 1/4 steps (25.0%), 10s/step, ETA 20s, loss 4.5000",
        "training sft: 1/4 steps (25.0%), 10s/step, ETA 20s, loss 4.5000",
        "training sft: 1/4 steps (25.0%), 10s/step, ETA 20s, loss 4.5000",
    ]


def test_a_terminal_bar_of_work_that_is_not_counted_shows_its_name_and_time_only() -> None:
    stream = io.StringIO()
    renderer = ProgressRenderer(stream=stream, tty=True)
    with reporting(renderer):
        Task("loading smollm2-135m").finish()
    assert stream.getvalue().strip("\r\n").split("\r")[-1] == "loading smollm2-135m: 00:00"

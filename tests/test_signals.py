"""Signals: `dlm train --nproc` stops its ranks with it, a killed rank is one error line, a dead run is
failed by the next command that writes, a Ray build ends on SIGTERM like on Ctrl-C, leaving no Ray behind,
and `dlm export` (its quantiser running), a cold `dlm tokenize` and `dlm eval` stopped either way leave
nothing running and a store that verifies clean, and run again to the bytes of an uninterrupted run.

The process tests start real processes (the launcher and its ranks on the
tiny model, a local Ray) and signal them once they are at work; each waits
on a condition (a step logged, Ray's reaper started), never for a time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.errors import Terminated
from dlmstore.home import store_dir
from dlmstore.train.distributed import LAUNCHER_ENV, LAUNCHER_GONE, RANK_0_STOPPED, RankReport
from dlmstore.train.launch import _Rank, _verdict

from .helpers import VALID_ID, export_doc, file_hashes, write_doc

#: What a test waits for at most before it calls the process stuck (a hang guard, not a measurement).
PATIENCE_S = 300


def _doc(tmp_path: Path, base: Path) -> Path:
    return write_doc(
        tmp_path / "doc.dlm",
        "Prose about light.\n\nA second paragraph of prose.\n",
        f"base_model: {base}\ntraining:\n  sequence_len: 64\n  max_steps: 5000\n  micro_batch_size: 1\n"
        "  grad_accum: 1\n",
    )


def _db() -> Path:
    return store_dir(VALID_ID) / "store.db"


def _query(sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(_db())
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _steps_logged() -> int:
    try:
        return int(_query("SELECT COUNT(*) FROM train_steps")[0][0])
    except sqlite3.OperationalError:  # not created, or not migrated yet
        return 0


def _started(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``dlm *args`` started, with ``env`` added to this process's environment."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "dlmstore.cli.main", *args], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _training(tmp_path: Path, base: Path, *extra: str) -> tuple[subprocess.Popen[str], list[psutil.Process]]:
    """`dlm train` started (with ``extra``), once it has logged a step; with its ranks, if any."""
    command = _started("train", str(_doc(tmp_path, base)), *extra)
    deadline = time.monotonic() + PATIENCE_S
    while _steps_logged() < 1:
        assert command.poll() is None, command.communicate()
        assert time.monotonic() < deadline, "no training step was logged"
        time.sleep(0.05)
    return command, psutil.Process(command.pid).children()


def _errors(stderr: str) -> list[str]:
    prefixes = ("error:", "hint:", "Traceback", "***", "Exception ignored")
    return [line for line in stderr.splitlines() if line.startswith(prefixes)]


def _ended(processes: list[psutil.Process]) -> bool:
    """Whether every one of ``processes`` has ended (a zombie has: only its exit status is left)."""
    _, alive = psutil.wait_procs(processes, timeout=PATIENCE_S)
    return all(process.status() == psutil.STATUS_ZOMBIE for process in alive)


def _no_adapter_and_no_lock() -> bool:
    return (
        _query("SELECT COUNT(*) FROM adapters") == [(0,)] and not (store_dir(VALID_ID) / "dlm.lock").exists()
    )


@pytest.mark.slow
def test_sigterm_to_the_nproc_launcher_stops_both_ranks_and_is_one_error_line(
    tmp_path: Path, tiny_base: Path
) -> None:
    launcher, ranks = _training(tmp_path, tiny_base, "--nproc", "2")
    assert len(ranks) == 2
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=PATIENCE_S)  # returns once the ranks (holding stderr) are gone
    assert launcher.returncode == 143
    assert _errors(stderr) == ["error: terminated by SIGTERM"]
    assert _ended(ranks)
    assert _query("SELECT status, error FROM runs") == [("failed", "terminated by SIGTERM")]
    assert _no_adapter_and_no_lock()


@pytest.mark.slow
def test_sigkill_to_the_nproc_launcher_takes_its_ranks_with_it(tmp_path: Path, tiny_base: Path) -> None:
    launcher, ranks = _training(tmp_path, tiny_base, "--nproc", "2")
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    assert _ended(ranks)  # they would otherwise train on, then publish an adapter and dlm.lock
    assert _query("SELECT status, error FROM runs") == [("failed", f"terminated by SIGTERM: {LAUNCHER_GONE}")]
    assert _no_adapter_and_no_lock()


@pytest.mark.slow
def test_a_rank_killed_by_sigkill_is_one_error_line_naming_it_and_the_runs_error(
    tmp_path: Path, tiny_base: Path
) -> None:
    launcher, ranks = _training(tmp_path, tiny_base, "--nproc", "2")
    ranks[1].send_signal(signal.SIGKILL)
    _, stderr = launcher.communicate(timeout=PATIENCE_S)
    assert launcher.returncode == 1
    assert _errors(stderr) == ["error: train rank 1 was killed by SIGKILL"]
    assert _ended(ranks)
    assert _query("SELECT status, error FROM runs") == [("failed", "train rank 1 was killed by SIGKILL")]


@pytest.mark.slow
def test_sigterm_to_rank_0_alone_mid_training_ends_both_ranks_instead_of_waiting_on_each_other(
    tmp_path: Path, tiny_base: Path
) -> None:
    # Rank 0 stops while rank 1 is inside a step's collectives: a rank that waited for its peer at a
    # barrier on the way out would wait forever for a peer waiting for it (seen once in the suite).
    launcher, ranks = _training(tmp_path, tiny_base, "--nproc", "2")
    ranks[0].send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=PATIENCE_S)
    assert launcher.returncode == 1
    assert _errors(stderr) == ["error: train rank 0 was stopped by SIGTERM"]
    assert _ended(ranks)
    assert _query("SELECT status, error FROM runs") == [("failed", "train rank 0 was stopped by SIGTERM")]
    assert _no_adapter_and_no_lock()


@pytest.mark.slow
def test_sigterm_to_a_single_process_train_fails_the_run_with_one_error_line(
    tmp_path: Path, tiny_base: Path
) -> None:
    command, _ = _training(tmp_path, tiny_base)
    command.send_signal(signal.SIGTERM)
    _, stderr = command.communicate(timeout=PATIENCE_S)
    assert (command.returncode, _errors(stderr)) == (143, ["error: terminated by SIGTERM"])
    assert _query("SELECT status, error FROM runs") == [("failed", "terminated by SIGTERM")]


@pytest.mark.slow
def test_a_ranks_own_error_reads_as_it_does_without_nproc(tmp_path: Path, tiny_base: Path) -> None:
    doc = _doc(tmp_path, tiny_base)
    alone = CliRunner().invoke(cli, ["train", str(doc), "--dataset", str(tmp_path / "nowhere")])
    assert alone.exit_code == 1 and alone.stderr.startswith("error: ")
    ranks = _started("train", str(doc), "--dataset", str(tmp_path / "nowhere"), "--nproc", "2")
    _, stderr = ranks.communicate(timeout=PATIENCE_S)
    assert (ranks.returncode, stderr) == (1, alone.stderr)


@pytest.mark.parametrize("rank_0s_report", ["its error", "a signal", "nothing"])
def test_rank_0s_error_is_the_verdict_even_when_rank_0_was_stopped_after_the_rank_repeating_it_ended(
    rank_0s_report: str,
) -> None:
    # The race CI once lost: rank 1 repeats rank 0's error and ends first; the launcher then
    # stops rank 0, which is still on its way out (reported its error, or not yet).
    ranks = []
    for rank, (code, report) in enumerate(
        [
            (
                1 if rank_0s_report == "its error" else 143,
                {"its error": RankReport(errors=(("no such dataset folder", "build one"),)),
                 "a signal": RankReport(signal=signal.SIGTERM), "nothing": None}[rank_0s_report],
            ),
            (1, RankReport(errors=((f"{RANK_0_STOPPED}no such dataset folder", "build one"),))),
        ]
    ):  # fmt: skip
        process = subprocess.Popen([sys.executable, "-c", f"import sys; sys.exit({code})"])
        process.wait()
        file = tempfile.TemporaryFile()
        if report is not None:
            file.write(json.dumps({"errors": [list(pair) for pair in report.errors], "signal": report.signal,
                                   "crash": report.crash}).encode())  # fmt: skip
        ranks.append(_Rank(rank, process, file, seen_at=1 - rank, stopped=rank == 0))
    error = _verdict(ranks)
    assert (type(error).__name__, error.message, error.hint) == (
        "RankError",
        "no such dataset folder",
        "build one",
    )


def test_a_rank_binds_itself_to_the_launcher_and_stops_at_once_when_the_launcher_is_already_gone() -> None:
    code = (
        "import ctypes, sys\n"
        "from dlmstore.errors import Terminated\n"
        "from dlmstore.train.distributed import bind_to_launcher\n"
        "try:\n"
        "    bind_to_launcher()\n"
        "except Terminated as exc:\n"
        "    print(exc); sys.exit(0)\n"
        "value = ctypes.c_int()\n"
        "ctypes.CDLL(None).prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG\n"
        "print(value.value)\n"
    )

    def bound(launcher: int) -> str:
        env = {**os.environ, LAUNCHER_ENV: str(launcher)}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    assert bound(os.getpid()) == str(int(signal.SIGTERM))  # its parent: SIGTERM when it ends
    assert bound(1) == f"terminated by SIGTERM: {LAUNCHER_GONE}"  # not its parent: it already ended
    assert str(Terminated(signal.SIGTERM)) == "terminated by SIGTERM"


@pytest.mark.parametrize(
    ("sig", "raised"), [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)]
)
def test_a_signal_that_lands_in_a_finalizer_still_stops_the_command(
    sig: signal.Signals, raised: type[BaseException]
) -> None:
    # Raised inside a __del__, the exception would be printed as "Exception ignored" and lost: a
    # SIGTERM that landed in a regex object's __del__ let a Ray build run on to exit 0.
    from dlmstore.cli.main import _sigterm_raises

    landed: list[bool] = []

    class Finalized:
        def __del__(self) -> None:
            os.kill(os.getpid(), sig)
            deadline = time.monotonic() + 0.2
            while time.monotonic() < deadline:  # the handler runs here, inside __del__
                pass
            landed.append(True)

    with pytest.raises(raised), _sigterm_raises():
        Finalized()  # dropped at once: its __del__ runs, the signal arrives inside it
        assert landed == [True]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.001)
        pytest.fail(f"{sig.name} that came inside a __del__ was lost")


@pytest.mark.parametrize(
    ("sig", "raised"), [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)]
)
def test_a_signal_that_lands_in_an_import_that_swallows_it_still_stops_the_command(
    sig: signal.Signals, raised: type[BaseException], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Cython module registers its memoryviews inside `try: ... except: pass`: a SIGTERM that landed
    # there, in numpy.random's first import halfway through a Ray build, let the build run on to exit 0.
    from dlmstore.cli.main import _sigterm_raises

    name = f"swallows_{sig.name.lower()}"
    (tmp_path / f"{name}.py").write_text(
        "import os, time\n"
        "try:\n"
        f"    os.kill(os.getpid(), {int(sig)})\n"
        "    deadline = time.monotonic() + 0.2\n"
        "    while time.monotonic() < deadline:  # the handler runs here, inside the import\n"
        "        pass\n"
        "except:\n"
        "    pass\n"
        "LANDED = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(raised), _sigterm_raises():
        module = __import__(name)
        assert module.LANDED
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.001)
        pytest.fail(f"{sig.name} that came inside an import was lost")


@pytest.mark.parametrize(
    ("sig", "raised"), [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)]
)
def test_a_signal_that_lands_between_a_temp_files_creation_and_its_record_waits_and_leaves_no_temp_file(
    sig: signal.Signals, raised: type[BaseException], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Raised just after mkstemp made the temp file, before AtomicFile recorded its name, the
    # exception left a .high-water.json.*.tmp that `dlm cache verify` then reported (a Ctrl-C during
    # `dlm tokenize`, as its run row was written).
    import tempfile

    from dlmstore.cli.main import _sigterm_raises
    from dlmstore.store import atomic

    made = tempfile.mkstemp

    def mkstemp_then_signalled(**kwargs: Any) -> tuple[int, str]:
        made_now = made(**kwargs)
        os.kill(os.getpid(), sig)
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:  # the handler runs here, the temp file made, not yet recorded
            pass
        return made_now

    monkeypatch.setattr(atomic.tempfile, "mkstemp", mkstemp_then_signalled)
    store = tmp_path / "store"
    store.mkdir()
    target = store / "high-water.json"
    with pytest.raises(raised), _sigterm_raises():
        atomic.write_bytes_atomic(target, b"{}")
        monkeypatch.undo()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.001)
        pytest.fail(f"{sig.name} that came inside an atomic write was lost")
    assert sorted(p.name for p in store.iterdir()) == ["high-water.json"]
    assert target.read_bytes() == b"{}"


#: A command stopped by each signal: its exit status and its one line.
STOPPED = [(signal.SIGTERM, 143, "error: terminated by SIGTERM"), (signal.SIGINT, 130, "error: interrupted")]


def _stopped_by(driver: subprocess.Popen[str], sig: signal.Signals) -> tuple[int, list[str]]:
    """``sig`` sent to ``driver``: its exit status and its error lines."""
    driver.send_signal(sig)
    _, stderr = driver.communicate(timeout=PATIENCE_S)
    return driver.returncode, _errors(stderr)


def _ray_source(tmp_path: Path, documents: int) -> Path:
    """A JSONL file of ``documents`` documents of about 1 KB each (Ray installed, or the test skipped)."""
    ray = pytest.importorskip("ray")
    del ray
    source = tmp_path / "docs.jsonl"
    with source.open("w") as out:
        for i in range(documents):
            out.write(json.dumps({"text": f"Document {i}: " + "lorem ipsum dolor sit amet " * 40}) + "\n")
    return source


def _ray_driver(tmp_path: Path, base: Path) -> subprocess.Popen[str]:
    """`dlm data build pretrain --engine ray` (a local Ray) started on 60,000 documents."""
    source = _ray_source(tmp_path, 60_000)
    return _started(
        "data", "build", "pretrain", "--from", str(source), "--out", str(tmp_path / "out"), "--base", str(base),
        "--engine", "ray", "--workers", "1",
    )  # fmt: skip


def _reapers(children: list[psutil.Process]) -> list[psutil.Process]:
    return [child for child in children if child.cmdline()[1:2] == ["-c"]]


def _ray_build(
    tmp_path: Path, base: Path
) -> tuple[subprocess.Popen[str], psutil.Process, list[psutil.Process]]:
    """`dlm data build pretrain --engine ray` at work: (driver, Ray's reaper, the local Ray's processes)."""
    driver = _ray_driver(tmp_path, base)
    deadline = time.monotonic() + PATIENCE_S
    while True:  # the reaper starts once Ray is up, just before the build is handed the session
        assert driver.poll() is None, driver.communicate()
        assert time.monotonic() < deadline, "Ray did not start"
        children = psutil.Process(driver.pid).children(recursive=True)
        if reapers := _reapers(children):
            others = [child for child in children if child not in reapers]
            return driver, reapers[0], others
        time.sleep(0.05)


def _ray_starting(tmp_path: Path, base: Path) -> tuple[subprocess.Popen[str], list[psutil.Process]]:
    """The same build while ``ray.init`` is still at work (its agents up, no reaper yet): (driver, its processes)."""
    driver = _ray_driver(tmp_path, base)
    deadline = time.monotonic() + PATIENCE_S
    while True:
        assert driver.poll() is None, driver.communicate()
        assert time.monotonic() < deadline, "Ray's agents did not start"
        children = psutil.Process(driver.pid).children(recursive=True)
        if any("Agent" in " ".join(child.cmdline()) for child in children):
            assert not _reapers(children), "ray.init was over before its agents were seen"
            return driver, children
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "status", "line"), STOPPED)
def test_sigterm_or_ctrl_c_to_a_ray_build_is_one_error_line_and_shuts_ray_down(
    tmp_path: Path, tiny_base: Path, sig: signal.Signals, status: int, line: str
) -> None:
    driver, reaper, ray_processes = _ray_build(tmp_path, tiny_base)
    assert _stopped_by(driver, sig) == (status, [line])  # no stack dump, no traceback
    assert _ended([reaper, *ray_processes])


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "status", "line"), STOPPED)
def test_sigterm_or_ctrl_c_while_ray_starts_is_one_error_line_and_leaves_no_ray_process_behind(
    tmp_path: Path, tiny_base: Path, sig: signal.Signals, status: int, line: str
) -> None:
    # Stopped inside ray.init, a build once left Ray's agents running for a minute (no reaper
    # had been handed them yet), and a Ctrl-C there could crash the process on its way out
    # (exit status -11 after its error line).
    driver, ray_processes = _ray_starting(tmp_path, tiny_base)
    assert _stopped_by(driver, sig) == (status, [line])
    _, alive = psutil.wait_procs(ray_processes, timeout=20)  # the agents alone waited 60-75 s
    assert [p.cmdline() for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []


@pytest.mark.slow
def test_a_ray_driver_killed_with_sigkill_leaves_no_ray_agent_behind(tmp_path: Path, tiny_base: Path) -> None:
    driver, reaper, ray_processes = _ray_build(tmp_path, tiny_base)
    agents = [p for p in ray_processes if "Agent" in " ".join(p.cmdline())]
    assert (
        len(agents) == 2
    )  # the dashboard and runtime-env agents, which outlived a killed driver by a minute
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert _ended([reaper])  # it kills what is left as soon as the driver is gone, then ends
    assert all(not agent.is_running() or agent.status() == psutil.STATUS_ZOMBIE for agent in agents)


class _RayWithTasksDone:
    """What ``_in_order`` calls of Ray, every task done once waited for; cancelling one fails the test."""

    def __init__(self) -> None:
        self.waited: list[list[str]] = []

    def wait(
        self, refs: list[str], num_returns: int = 1, timeout: float | None = None
    ) -> tuple[list[str], list[str]]:
        self.waited.append(list(refs))
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref: str) -> str:
        return ref

    def cancel(self, ref: str) -> None:
        raise AssertionError(f"{ref} was cancelled")


def test_a_ray_build_stopped_mid_way_waits_for_its_blocks_in_flight_and_cancels_none() -> None:
    # ray.cancel racing a task's own completion aborted a driver stopped by Ctrl-C in Ray's core
    # ("Check failed: it != submissible_tasks_.end()", exit status 1 and a stack dump; ray-project/ray#54846).
    from dlmstore.datasets.build.output import Clock
    from dlmstore.datasets.build.ray_build import _in_order

    ray = _RayWithTasksDone()
    tasks = iter([(i, f"block {i}") for i in range(10)])
    taken = []
    with pytest.raises(KeyboardInterrupt):
        for info, _ in _in_order(ray, tasks, 3, Clock("web", None), lambda: (0, 0)):
            taken.append(info)
            raise KeyboardInterrupt
    assert taken == [0]
    assert ray.waited[-1] == ["block 1", "block 2"]  # the blocks in flight, waited for: their spills are kept
    assert next(tasks) == (3, "block 3")  # nothing more was submitted


# --- export, tokenize and eval, stopped and run again -------------------------------------------


def _at_work(command: subprocess.Popen[str], ready: Any, what: str) -> list[psutil.Process]:
    """Wait until ``ready(children)`` holds for ``command``'s process tree; returns the tree then."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        assert command.poll() is None, command.communicate()
        assert time.monotonic() < deadline, f"{what} did not start"
        try:
            children = psutil.Process(command.pid).children(recursive=True)
            if ready(children):
                return children
        except psutil.NoSuchProcess:  # a child ended while it was looked at
            pass
        time.sleep(0.01)


def _verifies_clean(doc: Path) -> None:
    result = CliRunner().invoke(cli, ["cache", "verify", str(doc), "--json"])
    assert (result.exit_code, json.loads(result.stdout)["problems"]) == (0, []), result.output


def _run_json(*args: str) -> Any:
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _quantizing(children: list[psutil.Process]) -> bool:
    return any("dlmstore.export.quantize" in child.cmdline() for child in children)


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "status", "line"), STOPPED)
def test_sigterm_or_ctrl_c_while_export_quantises_is_one_error_line_and_the_rerun_writes_the_same_files(
    tmp_path: Path, tiny_base: Path, trained_store: Path, sig: signal.Signals, status: int, line: str
) -> None:
    shutil.copytree(trained_store, store_dir(VALID_ID))
    doc = export_doc(tmp_path, tiny_base)
    reference = _run_json("export", str(doc), "-o", str(tmp_path / "uninterrupted"))
    command = _started("export", str(doc))
    tree = _at_work(command, _quantizing, "llama.cpp's quantiser")
    assert _stopped_by(command, sig) == (status, [line])
    assert _ended(tree)  # the quantiser went with it
    exports = store_dir(VALID_ID) / "exports"
    assert not exports.exists() or list(exports.iterdir()) == []  # no staging folder, no half export
    _verifies_clean(doc)
    again = _run_json("export", str(doc))
    assert again["notes"] == []  # nothing left to sweep
    assert again["files"] == reference["files"]


def _recorded(sql: str) -> bool:
    """Whether ``sql`` finds a row in the store (false while store.db is not there or not migrated)."""
    try:
        return bool(_query(sql))
    except sqlite3.OperationalError:
        return False


def _entries() -> list[tuple[Any, ...]]:
    """Every cache entry of the store: its row, tokenizer and sequence length, and its tokens' checksum."""
    return _query("SELECT row_key, checksum, bytes FROM cache_entries ORDER BY row_key, checksum")


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "status", "line"), STOPPED)
def test_sigterm_or_ctrl_c_during_a_cold_tokenize_of_5000_files_is_one_error_line_and_the_rerun_caches_the_same_tokens(
    tmp_path: Path, tiny_base: Path, dlm_home: Path, sig: signal.Signals, status: int, line: str
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(5000):
        (notes / f"n{i:04d}.md").write_text(f"Note {i}: tokens are cached per row.\n")
    doc = write_doc(
        tmp_path / "doc.dlm",
        "Prose.\n",
        f"base_model: {tiny_base}\ntraining:\n  sources:\n    - path: notes\n",
    )
    reference_home = tmp_path / "reference-home"
    reference_home.mkdir()
    (reference_home / "bases").symlink_to((dlm_home / "bases").resolve(), target_is_directory=True)
    result = CliRunner().invoke(cli, ["tokenize", str(doc)], env={"DLM_HOME": str(reference_home)})
    assert result.exit_code == 0, result.output
    reference = sqlite3.connect(reference_home / "store" / VALID_ID / "store.db")
    expected = reference.execute(
        "SELECT row_key, checksum, bytes FROM cache_entries ORDER BY row_key, checksum"
    )
    expected_entries = expected.fetchall()
    reference.close()
    command = _started("tokenize", str(doc))
    tree = _at_work(command, lambda _: _recorded("SELECT 1 FROM runs WHERE status = 'running'"), "tokenize")
    assert _stopped_by(command, sig) == (status, [line])
    assert _ended(tree)
    assert _query("SELECT command, status, error FROM runs") == [
        ("tokenize", "failed", line.removeprefix("error: "))
    ]
    _verifies_clean(doc)
    _run_json("tokenize", str(doc))
    assert _entries() == expected_entries


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "status", "line"), STOPPED)
def test_sigterm_or_ctrl_c_during_eval_is_one_error_line_and_the_rerun_scores_the_same(
    tmp_path: Path, tiny_base: Path, trained_store: Path, sig: signal.Signals, status: int, line: str
) -> None:
    shutil.copytree(trained_store, store_dir(VALID_ID))
    doc = export_doc(tmp_path, tiny_base)
    reference = _run_json("eval", str(doc))
    command = _started("eval", str(doc))
    running = (
        "SELECT 1 FROM runs AS r JOIN tokenization_events AS t ON t.run_id = r.id "
        "WHERE r.command = 'eval' AND r.status = 'running'"
    )  # its rows tokenized: the models load and evaluate next
    tree = _at_work(command, lambda _: _recorded(running), "eval")
    assert _stopped_by(command, sig) == (status, [line])
    assert _ended(tree)
    assert _query("SELECT status, error FROM runs WHERE command = 'eval' ORDER BY id") == [
        ("completed", None), ("failed", line.removeprefix("error: ")),
    ]  # fmt: skip
    _verifies_clean(doc)
    again = _run_json("eval", str(doc))
    assert _scores(again) == _scores(reference)


def _scores(report: dict[str, Any]) -> list[dict[str, Any]]:
    """What ``dlm eval --json`` found of each model, without the time it took."""
    return [{key: value for key, value in model.items() if key != "seconds"} for model in report["models"]]


# --- a Ray build, stopped and run again -----------------------------------------------------------

#: The environment variable a test sets on the build it starts: every process Ray starts inherits it.
MARK = "DLM_TEST_SIGNALS_MARK"


def _marked(mark: str) -> list[psutil.Process]:
    """Every process still running (not a zombie) whose environment holds ``MARK=mark``."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(MARK) == mark and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # ended meanwhile, or another user's
            continue
    return found


def _registered(store: Path) -> list[str]:
    """The dataset folders registered in ``store``'s store.db, in the order they were."""
    with sqlite3.connect(store / "store.db") as db:
        return [row[0] for row in db.execute("SELECT path FROM datasets ORDER BY id")]


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "status", "line"), STOPPED)
def test_sigterm_or_ctrl_c_mid_ray_build_registers_nothing_and_the_rerun_writes_the_bytes_of_an_uninterrupted_build(
    tmp_path: Path, tiny_base: Path, sig: signal.Signals, status: int, line: str
) -> None:
    source = _ray_source(tmp_path, 20_000)  # 20 blocks: Ray's worker is still at the first ones when stopped
    store = tmp_path / "store"

    def build(out: Path, *engine: str) -> list[str]:
        return ["data", "build", "pretrain", "--from", str(source), "--out", str(out), "--store", str(store),
                "--base", str(tiny_base), *engine]  # fmt: skip

    uninterrupted = tmp_path / "uninterrupted" / "web"
    done = CliRunner().invoke(cli, build(uninterrupted))  # in this process: the bytes Ray must give too
    assert done.exit_code == 0, done.output
    out = store / "web"  # inside the store: verify looks for a killed build's temp files there
    on_ray = build(out, "--engine", "ray", "--workers", "1")
    mark = str(tmp_path)
    driver = _started(*on_ray, env={MARK: mark})
    blocks = out / ".build" / "blocks"
    tree = _at_work(driver, lambda _: any(blocks.glob("*.npz")), "the Ray build's first block")
    started = _marked(mark)
    assert any("raylet" in " ".join(process.cmdline()) for process in started)  # the mark reaches Ray's
    assert _stopped_by(driver, sig) == (status, [line])
    assert _ended([*tree, *started])
    _, alive = psutil.wait_procs(_marked(mark), timeout=PATIENCE_S)  # a worker Ray started after the look
    assert [process.cmdline() for process in alive if process.status() != psutil.STATUS_ZOMBIE] == []
    assert _registered(store) == [str(uninterrupted)]  # nothing half-written is registered
    assert not (out / "meta.json").exists()  # nor claims to be complete
    assert (out / ".build" / "dlm-build").is_file()  # but is dlm's to rerun in
    _verifies_clean(store)
    again = CliRunner().invoke(cli, on_ray)
    assert again.exit_code == 0, again.output
    assert file_hashes(out) == file_hashes(uninterrupted)  # every shard, index and meta.json
    assert _registered(store) == [str(uninterrupted), str(out)]
    _verifies_clean(store)

"""`dlm train` faults: numbers that are not finite, the publish unit, and the debris of dead runs.

A run registers its adapters and its lock together or not at all
(``dlmstore.train.adapters``): each test provokes one way a run can fail
after training started (a diverged loss, NaN weights, a lock that cannot be
written, a commit that fails, Ctrl-C in the preference phase, a full disk
in the tokenizer's writer) and checks that the run is failed, no adapter
row or folder is left, and ``dlm.lock`` is as it was. The sweep tests leave
what a process killed mid-publish leaves and check the next run removes it,
and never a live run's folders.
"""

from __future__ import annotations

import errno
import math
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from safetensors import SafetensorError
from safetensors.torch import save_file

from dlmstore.cli.main import cli
from dlmstore.errors import LockError, StoreError, TrainingError
from dlmstore.home import store_dir
from dlmstore.lock import LOCK_NAME, check_lock, lock_history, lock_transaction
from dlmstore.store.database import open_store
from dlmstore.store.runs import finish_run, start_run
from dlmstore.train.adapters import VERSIONS_DIR, save_version, stage_version, sweep_debris
from dlmstore.train.loops.integrity import check_adapter_weights, check_logged
from dlmstore.train.trainer import train_document

from .helpers import VALID_ID, make_lock, write_doc

BODY = """Prose about dlmstore, the local-first store.

::instruction::
### Q
Where is the metadata kept?
### A
In store.db.

::preference::
### Prompt
How should a tool report a malformed document?
### Chosen
With one line naming the file and the line.
### Rejected
With a traceback.
"""


def _doc(tmp_path: Path, base: Path, extra: str = "", preference: str = "enabled: false") -> Path:
    front = (
        f"base_model: {base}\ntraining:\n  sequence_len: 64\n  max_steps: 2\n  micro_batch_size: 2\n  seed: 7\n"
        + "".join(f"  {line}\n" for line in extra.splitlines())
        + "  preference:\n"
        + "".join(f"    {line}\n" for line in preference.splitlines())
    )
    return write_doc(tmp_path / "doc.dlm", body=BODY, frontmatter=front)


@pytest.fixture
def base(tiny_base: Path, one_torch_thread: None) -> Path:
    return tiny_base


def _store() -> Path:
    return store_dir(VALID_ID)


def _db() -> sqlite3.Connection:
    return sqlite3.connect(_store() / "store.db")


def _versions() -> list[str]:
    """Every entry of adapter/versions, staging folders included."""
    folder = _store() / VERSIONS_DIR
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _leftovers() -> list[str]:
    """Trainer output folders, staging folders and temp files anywhere in the store."""
    return sorted(
        str(p.relative_to(_store()))
        for p in _store().rglob("*")
        if p.name.startswith((".trainer-run", ".incoming-run")) or p.name.endswith(".tmp")
    )


def _assert_failed_and_nothing_registered(lock_before: bytes | None, adapters: int = 0) -> None:
    db = _db()
    assert db.execute("SELECT status FROM runs ORDER BY id DESC LIMIT 1").fetchone() == ("failed",)
    assert db.execute("SELECT COUNT(*) FROM adapters").fetchone() == (adapters,)
    assert db.execute("SELECT COUNT(*) FROM lock_records").fetchone() == (adapters and 1,)
    assert _versions() == [f"v{n:04d}" for n in range(1, adapters + 1)]
    assert _leftovers() == []
    lock = _store() / LOCK_NAME
    assert (lock.read_bytes() if lock.exists() else None) == lock_before


# --- numbers that are not finite ------------------------------------------------------------


def test_a_learning_rate_of_1e308_fails_the_run_with_one_error_line_and_leaves_the_store_as_it_was(
    tmp_path: Path, base: Path
) -> None:
    runner = CliRunner()
    good = _doc(tmp_path, base)
    assert runner.invoke(cli, ["train", str(good)]).exit_code == 0
    lock_before = (_store() / LOCK_NAME).read_bytes()
    # no warmup: step 1 updates at the full rate, so step 2's loss is the first that diverged
    doc = _doc(tmp_path, base, "learning_rate: 1.0e+308\nwarmup_ratio: 0.0")
    result = runner.invoke(cli, ["train", str(doc)])
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: the sft phase diverged at step 2: grad_norm is nan; training stopped "
        "and nothing was registered"
    ], result.output
    assert "hint: lower training.learning_rate (it is 1e+308) and train again" in result.stderr
    assert "Traceback" not in result.output
    _assert_failed_and_nothing_registered(lock_before, adapters=1)
    # the steps up to the divergence are kept, for `dlm metrics --run-id`
    assert (
        _db().execute("SELECT step, loss FROM train_steps WHERE run_id = 2 ORDER BY step").fetchall()[0][0]
        == 1
    )


def test_a_learning_rate_of_inf_is_refused_when_the_document_is_read(tmp_path: Path, base: Path) -> None:
    doc = _doc(tmp_path, base, "learning_rate: .inf")
    result = CliRunner().invoke(cli, ["train", str(doc)])
    assert result.exit_code == 1
    assert result.output == f"error: {doc}:9: training.learning_rate: must be a finite number, not inf\n"
    assert not _store().exists() or _versions() == []


def test_weights_that_diverge_after_the_last_logged_step_are_refused_before_they_are_staged(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dlmstore.train.loops.callbacks as callbacks

    monkeypatch.setattr(callbacks, "check_logged", lambda *a, **k: None)  # only the weights gate is left
    doc = _doc(tmp_path, base, "learning_rate: 1.0e+308")
    with pytest.raises(TrainingError, match=r"^the sft adapter has \d+ of \d+ tensors holding NaN or inf"):
        train_document(str(doc))
    _assert_failed_and_nothing_registered(None)


def test_a_diverged_preference_phase_fails_the_run_and_does_not_register_the_sft_adapter_either(
    tmp_path: Path, base: Path
) -> None:
    doc = _doc(tmp_path, base, preference="enabled: true\nhyperparams:\n  learning_rate: 1.0e+308")
    with pytest.raises(TrainingError) as err:
        train_document(str(doc))
    assert str(err.value).startswith("the preference phase diverged at step ")
    assert err.value.hint is not None
    assert err.value.hint.startswith("lower training.preference.hyperparams.learning_rate (it is 1e+308)")
    _assert_failed_and_nothing_registered(None)
    assert _db().execute("SELECT DISTINCT phase FROM train_steps ORDER BY phase DESC").fetchall() == [
        ("sft",), ("preference",),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("logs", "message"),
    [
        ({"loss": math.nan, "grad_norm": 1.0}, "loss is nan"),
        ({"loss": 2.0, "grad_norm": math.inf}, "grad_norm is inf"),
        ({"loss": -math.inf, "grad_norm": math.nan}, "loss is -inf and grad_norm is nan"),
    ],
)
def test_a_logged_loss_or_gradient_norm_that_is_not_finite_stops_training(
    logs: dict[str, float], message: str
) -> None:
    with pytest.raises(TrainingError) as err:
        check_logged(logs, phase="sft", step=3, learning_rate=2e-4)
    assert str(err.value) == (
        f"the sft phase diverged at step 3: {message}; training stopped and nothing was registered"
    )
    assert err.value.hint is not None and err.value.hint.startswith(
        "lower training.learning_rate (it is 0.0002)"
    )


def test_finite_logs_and_logs_without_a_loss_pass() -> None:
    check_logged({"loss": 1.5, "grad_norm": 0.25, "rewards/margins": math.nan}, phase="preference", step=1,
                 learning_rate=None)  # fmt: skip
    check_logged({"train_runtime": 3.0}, phase="sft", step=2, learning_rate=None)


def test_an_adapter_file_with_one_nan_tensor_is_refused_and_a_finite_one_passes(tmp_path: Path) -> None:
    weights = tmp_path / "adapter_model.safetensors"
    save_file({"a.lora_A.weight": torch.ones(2, 2), "b.lora_B.weight": torch.zeros(2, 2)}, str(weights))
    check_adapter_weights(weights, phase="sft", learning_rate=2e-4)
    save_file(
        {"a.lora_A.weight": torch.ones(2, 2), "b.lora_B.weight": torch.tensor([[0.0, math.nan], [0.0, 0.0]])},
        str(weights),
    )
    with pytest.raises(TrainingError) as err:
        check_adapter_weights(weights, phase="preference", learning_rate=5e-6)
    assert str(err.value) == (
        "the preference adapter has 1 of 2 tensors holding NaN or inf (first: b.lora_B.weight); "
        "nothing was registered"
    )


# --- the publish unit: adapters and the lock commit together --------------------------------


def test_a_lock_that_cannot_be_written_fails_the_run_and_registers_no_adapter(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dlmstore.lock.records as records

    def full(path: Any, data: bytes, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(records, "write_bytes_atomic", full)
    doc = _doc(tmp_path, base)
    result = CliRunner().invoke(cli, ["-q", "train", str(doc)])
    assert result.exit_code == 1
    assert (
        result.stderr.splitlines()[0]
        == f"error: cannot write {_store() / LOCK_NAME}: No space left on device"
    )
    assert "Traceback" not in result.output
    _assert_failed_and_nothing_registered(None)


def test_a_run_of_both_phases_interrupted_in_the_preference_phase_registers_neither_adapter(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlmstore.train.loops.callbacks import StepRecorder

    original = StepRecorder.on_step_end

    def interrupt(self: StepRecorder, *args: Any, **kwargs: Any) -> None:
        if self.phase == "preference":
            raise KeyboardInterrupt
        original(self, *args, **kwargs)

    doc = _doc(tmp_path, base, preference="enabled: true")
    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(StepRecorder, "on_step_end", interrupt)
        train_document(str(doc))
    _assert_failed_and_nothing_registered(None)
    summary = train_document(str(doc))
    assert [(p.phase, p.adapter_version, p.parent_version) for p in summary.phases] == [
        ("sft", 1, None), ("preference", 2, 1),
    ]  # fmt: skip


def test_a_bare_exception_from_the_tokenizer_writer_on_a_full_disk_is_the_documented_store_error(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import PreTrainedTokenizerBase

    def full(self: Any, *args: Any, **kwargs: Any) -> None:
        raise Exception("No space left on device (os error 28)")  # what the tokenizers library raises

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", full)
    doc = _doc(tmp_path, base)
    result = CliRunner().invoke(cli, ["-q", "train", str(doc)])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: cannot write the adapter under {_store() / VERSIONS_DIR}: No space left on device (os error 28)",
        "hint: free some disk space (earlier adapter versions are untouched) and run again",
    ]
    _assert_failed_and_nothing_registered(None)


#: What each hint says after what to do: "... (earlier adapter versions are untouched) and run again".
UNTOUCHED = " (earlier adapter versions are untouched) and run again"


@pytest.mark.parametrize(
    ("raised", "expected", "hint"),
    [
        (OSError(errno.EROFS, "Read-only file system"), "Read-only file system",
         "make the store writable" + UNTOUCHED),
        (OSError(errno.ENOSPC, "No space left on device"), "No space left on device",
         "free some disk space" + UNTOUCHED),
        (Exception("No space left on device (os error 28)"), "No space left on device (os error 28)",
         "free some disk space" + UNTOUCHED),
        (SafetensorError("Error while serializing: I/O error"), "Error while serializing: I/O error",
         "check that the disk has free space and the store is writable" + UNTOUCHED),
        # what safetensors said of a home whose path is not UTF-8, before it was written through an alias
        (SafetensorError("Path /h\ufffd/adapter_model.safetensors is not valid UTF-8"),
         "Path /h\ufffd/adapter_model.safetensors is not valid UTF-8",
         "check that the disk has free space and the store is writable" + UNTOUCHED),
    ],
)  # fmt: skip
def test_each_librarys_way_of_saying_a_write_failed_is_the_store_error_and_leaves_no_staging_folder(
    raised: Exception, expected: str, hint: str
) -> None:
    def write(folder: Path) -> None:
        _weights(folder)
        raise raised

    with open_store(VALID_ID) as store:
        run_id = start_run(store, command="train", dlm_path=Path("/d.dlm"), dlm_sha256="ab")
        with pytest.raises(StoreError) as err:
            stage_version(store, run_id=run_id, write=write, base_model="b", steps=1, final_loss=1.0)
        assert str(err.value) == f"cannot write the adapter under {store.path / VERSIONS_DIR}: {expected}"
        assert err.value.hint == hint  # free disk space only when the disk is said to be full
        assert _versions() == []


def test_a_bug_in_the_writer_is_not_passed_off_as_a_full_disk() -> None:
    def write(folder: Path) -> None:
        raise TypeError("save_pretrained() got an unexpected keyword argument 'x'")

    with open_store(VALID_ID) as store:
        run_id = start_run(store, command="train", dlm_path=Path("/d.dlm"), dlm_sha256="ab")
        with pytest.raises(TypeError):
            stage_version(store, run_id=run_id, write=write, base_model="b", steps=1, final_loss=1.0)
        assert _versions() == []


@pytest.mark.parametrize("flag", [[], ["--update-lock"], ["--strict-lock"], ["--ignore-lock"]])
def test_a_dlm_lock_that_is_a_directory_is_one_error_line_before_any_training(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch, flag: list[str]
) -> None:
    import dlmstore.bases

    def no_load(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(dlmstore.bases, "load_model", no_load)
    doc = _doc(tmp_path, base)
    (_store() / LOCK_NAME).mkdir(parents=True)
    result = CliRunner().invoke(cli, ["train", str(doc), *flag])
    assert result.exit_code == 1
    lock = _store() / LOCK_NAME
    assert result.stderr.splitlines() == [
        f"error: {lock} is a directory, so no lock can be read from it or written to it",
        f"hint: move it out of the way (e.g. `mv {lock} {lock}.old`) and run again; dlm train writes a new "
        "dlm.lock",
    ]
    assert lock.is_dir()


@pytest.mark.parametrize("mode", ["validate", "strict", "update", "ignore"])
def test_a_dlm_lock_that_is_a_fifo_is_refused_without_reading_it(mode: str) -> None:
    with open_store(VALID_ID) as store:
        os.mkfifo(store.path / LOCK_NAME)  # reading it would block for ever
        with pytest.raises(LockError, match=r"dlm\.lock is not a regular file, so no lock can be read"):
            check_lock(store, make_lock(), mode=mode)


def test_a_commit_that_fails_after_dlm_lock_was_written_puts_the_previous_lock_back() -> None:
    with open_store(VALID_ID) as store:
        first = start_run(store, command="train", dlm_path=Path("/d.dlm"), dlm_sha256="ab")
        with lock_transaction(store, make_lock(last_run_id=first), decision="written"):
            pass
        before = (store.path / LOCK_NAME).read_bytes()
        second = start_run(store, command="train", dlm_path=Path("/d.dlm"), dlm_sha256="ab")
        with (
            pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"),
            lock_transaction(store, make_lock(last_run_id=second, seed=9), decision="written") as (conn, _),
        ):
            # a row the commit refuses: foreign keys checked at COMMIT, after dlm.lock is written
            conn.execute("PRAGMA defer_foreign_keys = ON")
            conn.execute(
                "INSERT INTO adapters (version, run_id, phase, path, sha256, bytes, base_model, steps, "
                "created_at) VALUES (1, 999, 'sft', 'x', 'y', 1, 'b', 1, 'now')"
            )
        assert (store.path / LOCK_NAME).read_bytes() == before
        assert [record.run_id for record in lock_history(store)] == [first]


def test_a_commit_that_fails_with_no_earlier_lock_leaves_no_dlm_lock() -> None:
    with open_store(VALID_ID) as store:
        run_id = start_run(store, command="train", dlm_path=Path("/d.dlm"), dlm_sha256="ab")
        with (
            pytest.raises(sqlite3.IntegrityError),
            lock_transaction(store, make_lock(last_run_id=run_id), decision="written") as (conn, _),
        ):
            conn.execute("PRAGMA defer_foreign_keys = ON")
            conn.execute(
                "INSERT INTO adapters (version, run_id, phase, path, sha256, bytes, base_model, steps, "
                "created_at) VALUES (1, 999, 'sft', 'x', 'y', 1, 'b', 1, 'now')"
            )
        assert not (store.path / LOCK_NAME).exists()
        assert lock_history(store) == []


# --- debris of dead runs --------------------------------------------------------------------


def _weights(folder: Path) -> None:
    (folder / "adapter_model.safetensors").write_bytes(b"weights")


def _published(folder: Path, run_id: int) -> Path:
    """A version folder as a run killed between the rename and the commit leaves it."""
    folder.mkdir()
    _weights(folder)
    (folder / f".pending-run{run_id}").touch()
    return folder


def _debris(store_path: Path, run_id: int) -> list[Path]:
    versions = store_path / VERSIONS_DIR
    versions.mkdir(parents=True, exist_ok=True)
    made = [versions / f".incoming-run{run_id}-sft", store_path / f".trainer-run{run_id}-k2x9"]
    for folder in made:
        folder.mkdir()
        (folder / "adapter_model.safetensors").write_bytes(b"partial")
    return made


def test_the_sweep_removes_a_dead_runs_folders_and_unregistered_versions_but_never_a_live_runs() -> None:
    with open_store(VALID_ID) as store:
        doc = Path("/d.dlm")
        versions = store.path / VERSIONS_DIR
        registered_run = start_run(store, command="train", dlm_path=doc, dlm_sha256="ab")
        registered = save_version(
            store, run_id=registered_run, write=_weights, base_model="b", steps=1, final_loss=1.0
        )
        assert [p.name for p in (store.path / registered.path).iterdir() if p.name.startswith(".")] == []
        stale_marker = store.path / registered.path / f".pending-run{registered_run}"
        stale_marker.touch()  # killed between the commit and the marker's removal
        finish_run(store, registered_run, status="completed")
        dead = start_run(store, command="train", dlm_path=doc, dlm_sha256="ab")
        dead_folders = [*_debris(store.path, dead), _published(versions / "v0002", dead)]
        finish_run(store, dead, status="failed", error="interrupted")
        live = start_run(store, command="train", dlm_path=doc, dlm_sha256="ab")  # this process: alive
        live_folders = [*_debris(store.path, live), _published(versions / "v0003", live)]
        users = versions / "v0009"  # registered in a store.db since moved aside: no row, no marker
        users.mkdir()
        me = start_run(store, command="train", dlm_path=doc, dlm_sha256="ab")

        removed = sweep_debris(store, run_id=me)
        assert removed == sorted(str(p.relative_to(store.path)) for p in dead_folders)
        assert all(p.exists() for p in [*live_folders, users, store.path / registered.path])
        assert not stale_marker.exists()

        finish_run(store, live, status="failed", error="interrupted")
        removed = sweep_debris(store, run_id=me)
        assert removed == sorted(str(p.relative_to(store.path)) for p in live_folders)
        assert _versions() == ["v0001", "v0009"]


def test_a_run_killed_between_publishing_and_registering_leaves_a_folder_the_next_run_removes(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dlmstore.train.adapters as adapters

    def killed(conn: Any, published: Any) -> None:
        raise SystemExit(137)  # stands for kill -9: the process ends before its INSERT

    with monkeypatch.context() as patch:
        patch.setattr(adapters, "register_versions", killed)
        patch.setattr(
            adapters, "withdraw_versions", lambda published: None
        )  # a killed process cleans nothing
        doc = _doc(tmp_path, base)
        with pytest.raises(SystemExit):
            train_document(str(doc))
    assert _versions() == ["v0001"]
    assert (_store() / VERSIONS_DIR / "v0001" / ".pending-run1").is_file()
    assert _db().execute("SELECT COUNT(*) FROM adapters").fetchone() == (0,)
    summary = train_document(str(doc))
    assert not (_store() / VERSIONS_DIR / "v0001" / ".pending-run2").exists()
    assert summary.adapter_version == 1 and _versions() == ["v0001"]
    assert _db().execute("SELECT version, run_id FROM adapters").fetchall() == [(1, 2)]


def test_a_dead_run_still_marked_running_is_failed_first_and_then_swept() -> None:
    with open_store(VALID_ID) as store:
        crashed = start_run(store, command="train", dlm_path=Path("/d.dlm"), dlm_sha256="ab")
        with store.write() as conn:  # its process is gone: a pid no process has
            conn.execute("UPDATE runs SET pid = ? WHERE id = ?", (_dead_pid(), crashed))
        folders = _debris(store.path, crashed)
        me = start_run(store, command="train", dlm_path=Path("/d.dlm"), dlm_sha256="ab")
        assert sweep_debris(store, run_id=me) == sorted(str(p.relative_to(store.path)) for p in folders)


def _dead_pid() -> int:
    """A pid that no running process has."""
    pid = 2**22 - 1
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1

"""`dlm train --resume` under faults: damaged checkpoints, changed inputs, runs in between, `--fresh`.

Every test starts from the same interrupted run, made once per module: the
tiny base, 6 steps with a checkpoint every 2, stopped with Ctrl-C after
step 5 (checkpoints 2 and 4 registered), and the adapter the same run gives
uninterrupted. Each test gets its own copy of the store and the document.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from dlmstore.cli.main import cli
from dlmstore.store.digests import file_sha256
from dlmstore.train.trainer import train_document
from tests.helpers import ctrl_c_after, write_doc
from tests.test_train_datasets import build_pretrain

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FRESH_HINT = (
    "hint: start over with `dlm train DOC --fresh` (the interrupted run's checkpoints go once it completes)"
)


@dataclass(frozen=True)
class Interrupted:
    """The template: a home whose store holds run 1, interrupted, and the document beside its sources."""

    home: Path
    folder: Path  # the document's folder: doc.dlm and notes/
    expected: str  # the adapter sha256 of the same run, uninterrupted


@pytest.fixture(scope="module")
def interrupted(
    tiny_base: Path, session_bases: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Interrupted]:
    import torch

    root = tmp_path_factory.mktemp("interrupted")
    folder = root / "doc"
    (folder / "notes").mkdir(parents=True)
    (folder / "notes" / "a.md").write_text("A source file about roots.\n")
    dataset = build_pretrain(root, tiny_base)
    frontmatter = (
        f"base_model: {tiny_base}\ntraining:\n  sequence_len: 64\n  max_steps: 6\n  micro_batch_size: 2\n"
        f"  grad_accum: 1\n  seed: 5\n  lora_dropout: 0.1\n  checkpoint_steps: 2\n"
        f"  sources:\n    - path: notes\n  datasets:\n    - path: {dataset}\n"
    )
    doc = write_doc(folder / "doc.dlm", "Prose about light and leaves.\n", frontmatter)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("DLM_HOME", str(_home(root / "reference-home", session_bases)))
            expected = train_document(str(doc)).adapter_sha256
            home = _home(root / "home", session_bases)
            patch.setenv("DLM_HOME", str(home))
            with pytest.raises(KeyboardInterrupt), ctrl_c_after(5):
                train_document(str(doc))
    finally:
        torch.set_num_threads(threads)
    yield Interrupted(home=home, folder=folder, expected=expected)


def _home(home: Path, session_bases: Path) -> Path:
    """A home sharing the session's bases/, as every test's."""
    home.mkdir()
    (home / "bases").symlink_to(session_bases, target_is_directory=True)
    return home


@dataclass(frozen=True)
class Case:
    """This test's copy of the template."""

    doc: Path
    store: Path
    expected: str

    def checkpoint(self, step: int) -> Path:
        return self.store / "checkpoints" / "run1" / f"checkpoint-{step}"

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.store / "store.db")

    def rehash(self, step: int) -> None:
        """Record the checkpoint's files as they are now: as if it had been written this way."""
        folder = self.checkpoint(step)
        files = {path.name: file_sha256(path) for path in sorted(folder.iterdir())}
        with self.db() as conn:
            conn.execute(
                "UPDATE checkpoints SET files = ? WHERE step = ?", (json.dumps(files, sort_keys=True), step)
            )


@pytest.fixture
def case(interrupted: Interrupted, tmp_path: Path) -> Case:
    home = Path(os.environ["DLM_HOME"])
    shutil.copytree(interrupted.home / "store", home / "store")
    shutil.copytree(interrupted.folder, tmp_path / "doc")
    (store,) = (home / "store").iterdir()
    return Case(doc=tmp_path / "doc" / "doc.dlm", store=store, expected=interrupted.expected)


def train(*args: str) -> Result:
    return CliRunner().invoke(cli, ["-q", "train", *args])


def refused(case: Case, *args: str, env: dict[str, str] | None = None) -> list[str]:
    """The stderr lines of ``dlm train DOC --resume ARGS``, which must exit 1."""
    result = CliRunner().invoke(cli, ["-q", "train", str(case.doc), "--resume", *args], env=env)
    assert result.exit_code == 1, result.output
    return result.stderr.splitlines()


def resume(case: Case, *args: str) -> dict[str, object]:
    result = CliRunner().invoke(cli, ["-q", "train", str(case.doc), "--resume", "--json", *args])
    assert result.exit_code == 0, result.output
    summary: dict[str, object] = json.loads(result.stdout)
    return summary


def flip(path: Path, offset: int, count: int = 64) -> None:
    data = bytearray(path.read_bytes())
    start = offset if offset >= 0 else len(data) + offset
    data[start : start + count] = bytes(b ^ 0xFF for b in data[start : start + count])
    path.write_bytes(bytes(data))


# --- checksums: a checkpoint is verified before it is resumed ------------------------------------


def test_the_template_run_registered_two_checkpoints_with_their_checksums(case: Case) -> None:
    rows = case.db().execute("SELECT step, files, rows_sha256, plan_sha256 FROM checkpoints ORDER BY step")
    for step, files, rows_sha256, plan_sha256 in rows.fetchall():
        recorded = json.loads(files)
        folder = case.checkpoint(step)
        assert sorted(recorded) == sorted(path.name for path in folder.iterdir())
        assert {"adapter_model.safetensors", "optimizer.pt", "dlm-rank0.npy", "dlm-plan.json"} <= set(
            recorded
        )
        assert all(recorded[name] == file_sha256(folder / name) for name in recorded)
        assert rows_sha256.startswith("sha256:") and plan_sha256.startswith("sha256:")
    assert [step for step, *_ in case.db().execute("SELECT step FROM checkpoints ORDER BY step")] == [2, 4]


def test_a_flipped_checkpoint_byte_falls_back_to_the_previous_checkpoint(case: Case) -> None:
    weights = case.checkpoint(4) / "adapter_model.safetensors"
    flip(weights, len(weights.read_bytes()) // 2)  # in the tensors: it would load, silently
    summary = resume(case)
    assert (summary["resumed_from"], summary["resumed_at_step"]) == (1, 2)
    assert summary["adapter_sha256"] == case.expected
    assert (
        f"checkpoint {case.checkpoint(4)} is damaged (adapter_model.safetensors differs from the sha256 "
        f"taken when it was written): resuming from {case.checkpoint(2)} (step 2) instead"
    ) in summary["warnings"]  # type: ignore[operator]


@pytest.mark.parametrize(
    ("damage", "problem"),
    [("missing", "is damaged (optimizer.pt is missing)"),
     ("extra", "is damaged (notes.txt was not in it when it was written)"),
     ("truncated", "is damaged (optimizer.pt differs from the sha256 taken when it was written)"),
     ("gone", "is damaged (its folder is gone)"),
     ("unreadable record", "cannot be verified (its recorded sha256s cannot be read)")],
)  # fmt: skip
def test_a_missing_extra_or_truncated_checkpoint_file_a_gone_folder_or_an_unreadable_record_falls_back(
    case: Case, damage: str, problem: str
) -> None:
    from dlmstore.store.database import open_store
    from dlmstore.train.checkpoints import resumable

    folder = case.checkpoint(4)
    if damage == "missing":
        (folder / "optimizer.pt").unlink()
    elif damage == "extra":
        (folder / "notes.txt").write_text("mine\n")
    elif damage == "truncated":
        os.truncate(folder / "optimizer.pt", 100)
    elif damage == "gone":
        shutil.rmtree(folder)
    else:
        with case.db() as conn:
            conn.execute("UPDATE checkpoints SET files = '{not json' WHERE step = 4")
    with open_store(case.store.name) as store:
        found = resumable(store, before=2)
    assert (found.run_id, found.checkpoint.step, found.checkpoint.path) == (1, 2, case.checkpoint(2))
    assert found.warnings == (
        f"checkpoint {folder} {problem}: resuming from {case.checkpoint(2)} (step 2) instead",
    )


def test_a_resume_whose_every_checkpoint_is_damaged_is_refused_in_one_line(case: Case) -> None:
    flip(case.checkpoint(4) / "optimizer.pt", 200)
    (case.checkpoint(2) / "rng_state.pth").unlink()
    assert refused(case) == [
        f"error: cannot resume run 1: checkpoint {case.checkpoint(4)} is damaged (optimizer.pt differs "
        "from the sha256 taken when it was written), and no older checkpoint of the run verifies",
        FRESH_HINT,
    ]


def test_a_checkpoint_written_before_checksums_were_recorded_is_refused(case: Case) -> None:
    with case.db() as conn:
        conn.execute("UPDATE checkpoints SET files = NULL, rows_sha256 = NULL, plan_sha256 = NULL")
    assert refused(case) == [
        f"error: cannot resume run 1: checkpoint {case.checkpoint(4)} cannot be verified (it was registered "
        "before dlmstore recorded the sha256 of checkpoint files, store revision 0011), and no older checkpoint "
        "of the run verifies",
        FRESH_HINT,
    ]


# --- files that verify but were written damaged: one error line naming the file -------------------


JSON_REASON = "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"


@pytest.mark.parametrize(
    ("name", "damage", "reason"),
    [("optimizer.pt", "flip the end", "a damaged torch archive: File is not a zip file"),
     ("optimizer.pt", "truncate", "a damaged torch archive: File is not a zip file"),
     ("rng_state.pth", "flip the pickle", "a damaged torch archive: rng_state/data.pkl does not match its CRC-32"),
     ("trainer_state.json", "invalid JSON", JSON_REASON),
     ("adapter_model.safetensors", "flip the header",
      "Error while deserializing header: invalid UTF-8 in header: invalid utf-8 sequence of 1 bytes from index 3"),
     ("dlm-rank0.json", "invalid JSON", JSON_REASON)],
)  # fmt: skip
def test_a_checkpoint_file_written_damaged_stops_the_resume_in_one_line_naming_it(
    case: Case, name: str, damage: str, reason: str
) -> None:
    path = case.checkpoint(4) / name
    if damage == "flip the end":
        flip(path, -64)  # the zip's central directory
    elif damage == "truncate":
        os.truncate(path, path.stat().st_size // 2)
    elif damage == "flip the pickle":
        flip(path, 100)  # the first member, data.pkl
    elif damage == "invalid JSON":
        path.write_text("{not json")
    else:
        flip(path, 9, 16)  # inside the JSON header that follows its 8-byte length
    case.rehash(4)  # as if it had been written this way: the checksums verify
    assert refused(case) == [
        f"error: cannot resume from checkpoint {case.checkpoint(4)}: {name} cannot be loaded ({reason})",
        FRESH_HINT,
    ]


# --- the whole identity: rows and every setting that changes the adapter ----------------------------


def test_a_source_file_edited_after_the_interrupt_is_refused_on_resume(case: Case) -> None:
    (case.doc.parent / "notes" / "a.md").write_text("A source file about roots, edited.\n")
    assert refused(case) == [
        "error: cannot resume run 1 from step 4: the rows the run trains on (a file under training.sources was "
        "added, removed or edited, or the rows drawn from the replay history) changed since the checkpoint",
        "hint: resume with what the run had (its command-line options and environment included), or start over "
        "with --fresh",
    ]


@pytest.mark.parametrize("where", ["--max-steps", "DLM_TRAIN_MAX_STEPS"])
def test_another_max_steps_on_the_command_line_or_in_the_environment_is_refused_on_resume(
    case: Case, where: str
) -> None:
    lines = refused(case, "--max-steps", "8") if where == "--max-steps" else refused(
        case, env={"DLM_TRAIN_MAX_STEPS": "8"}
    )  # fmt: skip
    assert lines == [
        "error: cannot resume run 1 from step 4: the training settings differ from the checkpoint "
        "(max_steps 6 then, 8 now)",
        "hint: resume with what the run had (its command-line options and environment included), or start over "
        "with --fresh",
    ]


def test_a_run_interrupted_with_an_override_resumes_only_with_the_same_override(case: Case) -> None:
    shutil.rmtree(case.store)  # a run of its own, with --max-steps 7
    with pytest.raises(KeyboardInterrupt), ctrl_c_after(5):
        train_document(str(case.doc), max_steps=7)
    lines = refused(case)
    assert lines[0].endswith("the training settings differ from the checkpoint (max_steps 7 then, 6 now)"), (
        lines
    )
    summary = resume(case, "--max-steps", "7")
    assert (summary["resumed_from"], summary["resumed_at_step"], summary["steps"]) == (1, 4, 7)


# --- an interrupted run stays resumable ----------------------------------------------------------


def test_a_failed_plain_run_after_an_interrupt_leaves_the_interrupted_run_resumable(case: Case) -> None:
    typo = train(str(case.doc), "--dataset", str(case.doc.parent / "no-such-dataset"))
    assert typo.exit_code == 1
    summary = resume(case)
    assert (summary["resumed_from"], summary["resumed_at_step"]) == (1, 4)
    assert summary["adapter_sha256"] == case.expected


def test_a_completed_plain_run_keeps_the_interrupted_runs_checkpoints_until_it_is_resumed(case: Case) -> None:
    plain = train(str(case.doc), "--json")
    assert plain.exit_code == 0, plain.output
    assert json.loads(plain.stdout)["warnings"] == [
        "the checkpoints of interrupted train run 1 are kept (the newest at step 4): `dlm train --resume` "
        "continues it, `dlm train --fresh` starts over and removes them"
    ]
    assert case.checkpoint(4).is_dir()
    summary = resume(case)
    assert (summary["resumed_from"], summary["resumed_at_step"]) == (1, 4)
    assert summary["adapter_sha256"] == case.expected
    assert case.db().execute("SELECT COUNT(*) FROM checkpoints").fetchone() == (0,)
    assert not (case.store / "checkpoints" / "run1").exists()


def test_a_completed_fresh_run_removes_the_interrupted_runs_checkpoints(case: Case) -> None:
    fresh = train(str(case.doc), "--fresh", "--json")
    assert fresh.exit_code == 0, fresh.output
    assert json.loads(fresh.stdout)["warnings"] == []
    assert case.db().execute("SELECT COUNT(*) FROM checkpoints").fetchone() == (0,)
    assert not (case.store / "checkpoints" / "run1").exists()
    assert refused(case)[0] == "error: nothing to resume: the newest train run (2) completed"


def test_deleted_checkpoints_are_named_as_gone_on_resume(case: Case) -> None:
    shutil.rmtree(case.store / "checkpoints")
    assert refused(case) == [
        f"error: nothing to resume: the checkpoints of train run 1 are gone from {case.store}/checkpoints/run1",
        FRESH_HINT,
    ]


def test_resume_and_fresh_together_are_a_usage_error(case: Case) -> None:
    result = train(str(case.doc), "--resume", "--fresh")
    assert result.exit_code == 2
    assert (
        result.stderr.splitlines()[-1] == "Error: --resume and --fresh cannot be combined; pass one of them"
    )

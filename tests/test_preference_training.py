"""`dlm train` with ::preference:: sections: SFT then DPO or ORPO on the same adapter.

Trained on ``tiny_base`` (conftest.py): what is checked is the phases'
mechanics (which phases run, what they register and record, the errors
before any model loads, byte-identical reruns), which hold for any causal
LM. The tokens TRL would have built itself are checked on the real
SmolLM2 tokenizer in test_preference_tokens.py.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.home import store_dir
from dlmstore.lock import current_lock
from dlmstore.store.database import open_store
from dlmstore.train.trainer import train_document

from .helpers import VALID_ID, write_doc

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

### Prompt
Where do adapters go?
### Chosen
Into adapter/versions beside store.db.
### Rejected
Somewhere.
"""


def _doc(tmp_path: Path, base: Path, preference: str = "", body: str = BODY) -> Path:
    front = f"base_model: {base}\ntraining:\n  sequence_len: 64\n  max_steps: 2\n  micro_batch_size: 2\n  seed: 7\n"
    if preference:
        front += "  preference:\n" + "".join(f"    {line}\n" for line in preference.splitlines())
    return write_doc(tmp_path / "doc.dlm", body=body, frontmatter=front)


@pytest.fixture
def doc(tmp_path: Path, tiny_base: Path, one_torch_thread: None) -> Path:
    return _doc(tmp_path, tiny_base)


def _db() -> sqlite3.Connection:
    return sqlite3.connect(store_dir(VALID_ID) / "store.db")


def test_preference_sections_train_dpo_after_sft_as_one_run_with_two_adapters(doc: Path) -> None:
    summary = train_document(str(doc))
    assert [
        (p.phase, p.method, p.rows, p.steps, p.adapter_version, p.parent_version) for p in summary.phases
    ] == [
        ("sft", None, 2, 2, 1, None),
        ("preference", "dpo", 2, 2, 2, 1),
    ]
    assert summary.adapter_version == 2 and summary.adapter_sha256 == summary.phases[1].adapter_sha256
    assert summary.phases[0].adapter_sha256 != summary.phases[1].adapter_sha256
    assert {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"} <= set(
        summary.phases[1].metrics
    )
    db = _db()
    assert db.execute("SELECT COUNT(*) FROM runs").fetchone() == (1,)
    assert db.execute(
        "SELECT version, phase, method, parent_version FROM adapters ORDER BY version"
    ).fetchall() == [
        (1, "sft", None, None),
        (2, "preference", "dpo", 1),
    ]
    assert db.execute("SELECT phase, step FROM train_steps ORDER BY phase DESC, step").fetchall() == [
        ("sft", 1), ("sft", 2), ("preference", 1), ("preference", 2),
    ]  # fmt: skip
    names = {
        row[0]
        for row in db.execute("SELECT DISTINCT name FROM train_step_metrics WHERE phase = 'preference'")
    }
    assert {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"} <= names
    # the preference rows went through the cache: 2 prose/instruction rows and 2 triples, all misses
    assert (summary.tokenization.total_rows, summary.tokenization.cache_misses) == (4, 4)


def test_two_runs_and_a_no_cache_run_give_the_same_preference_adapter(doc: Path) -> None:
    first = train_document(str(doc))
    second = train_document(str(doc))
    third = train_document(str(doc), no_cache=True)
    assert second.tokenization.cache_hits == 4 and third.tokenization.cache_mode == "bypassed"
    assert first.adapter_sha256 == second.adapter_sha256 == third.adapter_sha256
    assert [a.adapter_version for a in (first, second, third)] == [2, 4, 6]


def test_phase_sft_then_phase_preference_gives_the_all_runs_adapter(doc: Path) -> None:
    both = train_document(str(doc))
    sft = train_document(str(doc), phase="sft")
    preference = train_document(str(doc), phase="preference")
    assert [p.phase for p in sft.phases] == ["sft"] and [p.phase for p in preference.phases] == ["preference"]
    assert sft.adapter_sha256 == both.phases[0].adapter_sha256
    assert preference.phases[0].parent_version == sft.adapter_version
    assert preference.adapter_sha256 == both.adapter_sha256


def test_phase_preference_without_an_sft_adapter_is_an_error_before_the_model_loads(
    doc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dlmstore.train.stages as stages

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(stages, "load_base_model", no_model)
    result = CliRunner().invoke(cli, ["-q", "train", str(doc), "--phase", "preference"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: {doc}: the preference phase starts from an SFT adapter, and this store has none",
        "hint: train SFT first: `dlm train DOC --phase sft` (the document needs prose, instruction or source rows)",
    ]
    assert _db().execute("SELECT status FROM runs").fetchall() == [("failed",)]


def test_orpo_trains_without_a_reference_and_records_its_own_metrics(tmp_path: Path, tiny_base: Path) -> None:
    doc = _doc(tmp_path, tiny_base, preference="method: orpo")
    summary = train_document(str(doc))
    phase = summary.phases[1]
    assert (phase.phase, phase.method, phase.steps) == ("preference", "orpo", 2)
    assert {"log_odds_ratio", "nll_loss", "rewards/margins"} <= set(phase.metrics)
    again = train_document(str(doc))
    assert again.adapter_sha256 == summary.adapter_sha256


def test_the_reference_and_the_loss_type_change_what_dpo_learns(tmp_path: Path, tiny_base: Path) -> None:
    shas = {}
    for name, setting in [
        ("pre_adapter", ""),
        ("base", "reference: base"),
        ("hinge", "loss_type: hinge"),
    ]:
        folder = tmp_path / name
        folder.mkdir()
        shas[name] = train_document(str(_doc(folder, tiny_base, preference=setting))).adapter_sha256
    assert len(set(shas.values())) == 3


def test_the_lock_records_the_preference_method_and_hyperparameters(doc: Path) -> None:
    train_document(str(doc))
    with open_store(VALID_ID) as store:
        lock = current_lock(store)
    assert lock.preference == {
        "method": "dpo", "beta": 0.1, "loss_type": "sigmoid", "reference": "pre_adapter",
        "learning_rate": 5e-6, "num_epochs": 1,
    }  # fmt: skip
    train_document(str(doc), phase="sft")
    with open_store(VALID_ID) as store:
        assert current_lock(store).preference is None


def test_a_triple_whose_chosen_equals_its_rejected_is_refused_before_training(
    tmp_path: Path, tiny_base: Path
) -> None:
    body = BODY.replace("Somewhere.", "Into adapter/versions beside store.db.")
    doc = _doc(tmp_path, tiny_base, body=body)
    result = CliRunner().invoke(cli, ["train", str(doc)])
    assert result.exit_code == 1
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert error.startswith(f"error: {doc}:")
    assert "chosen" in error and "rejected" in error
    assert _db().execute("SELECT COUNT(*) FROM adapters").fetchone() == (0,)


def test_a_prompt_longer_than_sequence_len_is_refused_before_training(
    tmp_path: Path, tiny_base: Path
) -> None:
    body = BODY.replace("Where do adapters go?", "Where do adapters go? " * 40)
    doc = _doc(tmp_path, tiny_base, body=body)
    result = CliRunner().invoke(cli, ["train", str(doc)])
    assert result.exit_code == 1
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert error.startswith(f"error: {doc}:") and "sequence_len" in error
    assert _db().execute("SELECT COUNT(*) FROM adapters").fetchone() == (0,)


def test_enabled_true_without_preference_sections_warns_and_trains_sft(
    tmp_path: Path, tiny_base: Path
) -> None:
    body = BODY[: BODY.index("::preference::")]
    doc = _doc(tmp_path, tiny_base, preference="enabled: true", body=body)
    result = CliRunner().invoke(cli, ["train", str(doc), "--json"])
    assert result.exit_code == 0, result.output
    assert [p["phase"] for p in json.loads(result.stdout)["phases"]] == ["sft"]
    assert (
        f"warning: {doc}: training.preference.enabled is true but the document has no ::preference:: sections; "
        "the preference phase is skipped"
    ) in result.stderr.splitlines()


def test_dlm_train_and_metrics_show_the_preference_phase(doc: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["train", str(doc)])
    assert result.exit_code == 0, result.output
    # each phase's line, without the evaluation lines printed under it
    lines = [line for line in result.stdout.splitlines() if line.startswith("run ")]
    assert lines[0].startswith("run 1 sft: 2 steps on 2 rows") and lines[0].endswith("-> v0001")
    assert lines[1].startswith("run 1 preference (dpo): 2 steps on 2 triples") and lines[1].endswith(
        "-> v0002"
    )
    assert "reward margin" in lines[1]
    # Each phase reports its steps on stderr: on a pipe, a final line with the count and the loss.
    (dpo,) = [line for line in result.stderr.splitlines() if line.startswith("training preference: ")]
    assert dpo.startswith("training preference: 2 steps in ") and ", loss " in dpo
    metrics = runner.invoke(cli, ["metrics", str(doc), "--run-id", "1"])
    assert metrics.exit_code == 0, metrics.output
    assert "margin" in metrics.stdout and "accuracy" in metrics.stdout


def test_two_fresh_stores_train_the_same_preference_adapter(
    tmp_path: Path,
    tiny_base: Path,
    one_torch_thread: None,
    session_bases: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    doc = _doc(tmp_path, tiny_base)
    shas = []
    for name in ("first", "second"):
        home = tmp_path / name
        home.mkdir()
        (home / "bases").symlink_to(session_bases, target_is_directory=True)
        monkeypatch.setenv("DLM_HOME", str(home))
        shas.append(train_document(str(doc)).adapter_sha256)
    assert shas[0] == shas[1]

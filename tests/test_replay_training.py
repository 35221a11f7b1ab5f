"""Replay in training (issue 38): an edited document retrains on what its edit removed, and says what it kept."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli

from .helpers import VALID_ID, write_doc

FRONT = (
    "training:\n  sequence_len: 64\n  max_steps: 2\n  micro_batch_size: 2\n  seed: 7\n"
    "  preference:\n    enabled: false\n"
)
PROSE = "".join(
    f"::prose::\nParagraph {i} about the local-first store and its tables.\n\n" for i in range(10)
)
FACTS_V1 = """::instruction::
### Q !probe
What is the capital of Zarnia?
### A
Quillport.

### Q !probe
Who wrote the Ledger of Vask?
### A
Oda Venn.

### Q
What colour is the sky?
### A
Green.
"""
FACTS_V2 = """::instruction::
### Q !probe
What is the river of Ostmar called?
### A
The Pell.

### Q
What colour is the sky?
### A
Blue.
"""
REMOVED = "::prose::\nA paragraph that the second version removes.\n\n"
V1 = "Prose that stays.\n\n" + REMOVED + PROSE + FACTS_V1
V2 = "Prose that stays.\n\n" + PROSE + FACTS_V2


def _doc(folder: Path, body: str, base: Path, extra: str = "") -> Path:
    return write_doc(folder / "doc.dlm", body=body, frontmatter=f"base_model: {base}\n" + FRONT + extra)


def _db(home: Path) -> sqlite3.Connection:
    return sqlite3.connect(home / "store" / VALID_ID / "store.db")


def _keys(doc: Path) -> dict[str, str]:
    """Each row of ``doc`` by a short name: its text's first words, or its question."""
    from dlmstore.corpus.assemble import load_corpus
    from dlmstore.document.parser import parse_document

    named: dict[str, str] = {}
    for row in load_corpus(parse_document(doc)).rows():
        data = row.data
        named[data["text"][:20] if "text" in data else data["messages"][0]["content"]] = row.row_key
    return named


def _fresh_home(
    tmp_path: Path, name: str, dlm_home: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Path]:
    """A fresh home named ``name`` (sharing the session's converted bases), made DLM_HOME, and a folder
    for its document."""
    home = tmp_path / name
    home.mkdir()
    (home / "bases").symlink_to((dlm_home / "bases").resolve(), target_is_directory=True)
    monkeypatch.setenv("DLM_HOME", str(home))
    folder = tmp_path / f"doc-{name}"
    folder.mkdir()
    return home, folder


def _drawn(home: Path, run_id: int) -> set[str]:
    with _db(home) as conn:
        return {
            "sha256:" + key.hex()
            for (key,) in conn.execute("SELECT key FROM replay_draws WHERE run_id = ?", (run_id,))
        }


@pytest.mark.slow
def test_an_edited_document_replays_what_it_removed_and_never_a_superseded_answer(
    tmp_path: Path, dlm_home: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    from dlmstore.train.trainer import train_document

    doc = _doc(tmp_path, V1, tiny_base)
    old = _keys(doc)
    first = train_document(str(doc))
    assert first.replay is not None and first.replay.sft_candidates == 0 and first.replay.rows_drawn == 0
    doc = _doc(tmp_path, V2, tiny_base)
    second = train_document(str(doc))
    drawn = _drawn(dlm_home, second.run_id)
    removed = {
        old["A paragraph that the"],
        old["What is the capital of Zarnia?"],
        old["Who wrote the Ledger of Vask?"],
    }
    with _db(dlm_home) as conn:
        history = {key for (key,) in conn.execute("SELECT row_key FROM history")}
    assert (
        drawn == removed & history
    )  # every candidate (fewer than 32), those the split held out never trained
    assert old["What colour is the sky?"] not in drawn  # "Green." was corrected to "Blue.": superseded
    assert second.replay is not None and second.replay.rows_drawn == len(drawn)
    with _db(dlm_home) as conn:
        own = conn.execute("SELECT count(*) FROM history WHERE last_generation = 2").fetchone()[0]
        assert second.rows_trained == own + len(drawn)  # the document's train rows, then the replayed ones
        run = conn.execute(
            "SELECT generation, sft_candidates, sft_drawn, skipped FROM replay_runs WHERE run_id = ?",
            (second.run_id,),
        ).fetchone()
        assert run == (2, len(drawn), len(drawn), None)
        lock = json.loads(
            conn.execute("SELECT lock_json FROM lock_records ORDER BY run_id DESC LIMIT 1").fetchone()[0]
        )
    assert lock["replay"] == {
        "generation": 2, "draw_sha256": second.replay.draw_sha256, "rows": len(drawn), "triples": 0,
    }  # fmt: skip
    with open(dlm_home / "store" / VALID_ID / "dlm.lock") as handle:
        assert json.load(handle)["replay"] == lock["replay"]


@pytest.mark.slow
def test_two_fresh_homes_train_v1_then_v2_to_the_same_bytes_and_v2_again_gives_v0002s(
    tmp_path: Path, dlm_home: Path, tiny_base: Path, one_torch_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlmstore.train.trainer import train_document

    shas: list[list[str]] = []
    for name in ("one", "two"):
        home, folder = _fresh_home(tmp_path, name, dlm_home, monkeypatch)
        shas.append([train_document(str(_doc(folder, V1, tiny_base))).adapter_sha256])
        shas[-1].append(train_document(str(_doc(folder, V2, tiny_base))).adapter_sha256)
    assert shas[0] == shas[1]
    again = train_document(str(_doc(tmp_path / "doc-two", V2, tiny_base)))
    assert again.adapter_sha256 == shas[1][1]
    assert again.replay is not None and again.replay.rows_drawn > 0  # it replayed again, the same rows
    without = train_document(str(_doc(tmp_path / "doc-two", V2, tiny_base)), no_replay=True)
    assert without.adapter_sha256 != shas[1][1]
    assert (
        without.replay is not None
        and without.replay.rows_drawn == 0
        and without.replay.skipped == "--no-replay"
    )
    with _db(tmp_path / "two") as conn:
        assert conn.execute(
            "SELECT count(*) FROM replay_draws WHERE run_id = ?", (without.run_id,)
        ).fetchone() == (0,)
        assert conn.execute(
            "SELECT skipped FROM replay_runs WHERE run_id = ?", (without.run_id,)
        ).fetchone() == ("--no-replay",)


@pytest.mark.slow
def test_the_probes_of_earlier_versions_and_the_retention_slice_loss_are_recorded_beside_the_current_ones(
    tmp_path: Path, dlm_home: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    from dlmstore.train.trainer import train_document

    extra = "  replay:\n    retention_fraction: 0.5\n"
    doc = _doc(tmp_path, V1, tiny_base, extra)
    old = _keys(doc)
    first = train_document(str(doc))
    second = train_document(str(_doc(tmp_path, V2, tiny_base, extra)))
    evaluation = second.phases[0].evaluation
    assert evaluation is not None
    adapter, base = evaluation.adapter, evaluation.base
    asked = {p.row_key for p in adapter.retained}
    assert asked == {old["What is the capital of Zarnia?"], old["Who wrote the Ledger of Vask?"]}
    assert all(p.retained for p in adapter.retained) and not any(p.retained for p in adapter.probes)
    assert second.replay is not None and second.replay.retention_rows == adapter.retention_rows > 0
    assert adapter.retention_loss is not None and base.retention_loss is not None
    assert adapter.retention_previous_loss is not None
    assert adapter.retention_delta == pytest.approx(adapter.retention_loss - adapter.retention_previous_loss)
    with _db(dlm_home) as conn:
        rows = conn.execute(
            "SELECT model, retained_probes, retention_rows, retention_loss, retention_delta FROM evaluations "
            "WHERE run_id = ? ORDER BY model",
            (second.run_id,),
        ).fetchall()
        assert rows[0][:3] == ("base", 2, adapter.retention_rows) and rows[0][4] is None
        assert rows[1] == (
            "v0002",
            2,
            adapter.retention_rows,
            adapter.retention_loss,
            adapter.retention_delta,
        )
        kept = conn.execute(
            "SELECT p.row_key FROM probe_results p JOIN evaluations e ON e.id = p.evaluation_id "
            "WHERE e.run_id = ? AND e.model = 'v0002' AND p.retained = 1",
            (second.run_id,),
        ).fetchall()
        assert {key for (key,) in kept} == asked
        slice_keys = {key for (key,) in conn.execute("SELECT row_key FROM history WHERE retention = 1")}
    assert not slice_keys & _drawn(dlm_home, second.run_id)  # the slice is never drawn
    assert (
        first.phases[0].evaluation is not None and first.phases[0].evaluation.adapter.retention_loss is None
    )
    result = CliRunner().invoke(cli, ["metrics", str(tmp_path / "doc.dlm"), "--json"])
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_a_damaged_history_row_the_draw_takes_stops_the_run_with_one_line_naming_it(
    tmp_path: Path, dlm_home: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    doc = _doc(tmp_path, V1, tiny_base)
    removed = _keys(doc)["A paragraph that the"]
    assert CliRunner().invoke(cli, ["train", str(doc)]).exit_code == 0
    with _db(dlm_home) as conn:
        conn.execute(
            "UPDATE history_content SET content = X'789c0300000000' WHERE id = "
            "(SELECT content_id FROM history_rows WHERE key = ?)",
            (bytes.fromhex(removed[7:]),),
        )
    doc = _doc(tmp_path, V2, tiny_base)
    result = CliRunner().invoke(cli, ["train", str(doc)])
    assert result.exit_code == 1
    assert f"replay history row {removed} is damaged" in result.output
    assert "dlm cache verify --repair" in result.output
    assert "Traceback" not in result.output
    with _db(dlm_home) as conn:
        assert conn.execute("SELECT count(*) FROM adapters").fetchone() == (1,)
    assert CliRunner().invoke(cli, ["cache", "verify", "--repair", str(doc)]).exit_code in (0, 1)
    result = CliRunner().invoke(cli, ["train", str(doc)])
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_a_resumed_replaying_run_gives_the_uninterrupted_bytes_and_a_changed_draw_is_refused(
    tmp_path: Path, dlm_home: Path, tiny_base: Path, one_torch_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlmstore.errors import TrainingError
    from dlmstore.train.trainer import train_document

    from .helpers import ctrl_c_after

    extra = "  max_steps: 4\n  checkpoint_steps: 2\n"
    front = FRONT.replace("  max_steps: 2\n", "")
    expected: list[str] = []
    for name, interrupt in (("whole", False), ("resumed", True)):
        home, folder = _fresh_home(tmp_path, name, dlm_home, monkeypatch)
        doc = write_doc(folder / "doc.dlm", body=V1, frontmatter=f"base_model: {tiny_base}\n" + front + extra)
        train_document(str(doc))
        doc = write_doc(folder / "doc.dlm", body=V2, frontmatter=f"base_model: {tiny_base}\n" + front + extra)
        if not interrupt:
            expected.append(train_document(str(doc)).adapter_sha256)
            continue
        with pytest.raises(KeyboardInterrupt), ctrl_c_after(3):
            train_document(str(doc))
        resumed = train_document(str(doc), resume=True)
        assert resumed.replay is not None and resumed.replay.rows_drawn > 0
        assert resumed.adapter_sha256 == expected[0]
        with pytest.raises(KeyboardInterrupt), ctrl_c_after(3):
            train_document(str(doc), fresh=True)
        pruned = CliRunner().invoke(cli, ["replay", "prune", str(doc), "--row", next(iter(_drawn(home, 3)))])
        assert pruned.exit_code == 0, pruned.output
        with pytest.raises(TrainingError, match="from step 2: the rows the run trains on .* changed since"):
            train_document(str(doc), resume=True)


@pytest.mark.slow
def test_a_replaying_run_that_fails_in_its_publish_transaction_records_no_draw_no_history_and_no_adapter(
    tmp_path: Path, dlm_home: Path, tiny_base: Path, one_torch_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dlmstore.eval.results
    from dlmstore.train.trainer import train_document

    train_document(str(_doc(tmp_path, V1, tiny_base)))
    with _db(dlm_home) as conn:
        before = [
            conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in ("history_rows", "history_generations", "history_runs", "adapters")
        ]

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(dlmstore.eval.results, "record_evaluation", fail)
    with pytest.raises(OSError, match="disk gone"):
        train_document(str(_doc(tmp_path, V2, tiny_base)))
    with _db(dlm_home) as conn:
        after = [
            conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in ("history_rows", "history_generations", "history_runs", "adapters")
        ]
        assert conn.execute("SELECT count(*) FROM replay_runs WHERE run_id = 2").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM replay_draws").fetchone() == (0,)
    assert after == before
    assert json.loads((dlm_home / "store" / VALID_ID / "dlm.lock").read_text())["replay"] is None


PREFERENCE_V1 = """Prose about dlmstore, the local-first store.

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

::preference::
### Prompt
Where do adapters go?
### Chosen
Into adapter/versions beside store.db.
### Rejected
Somewhere.
"""
# The first triple is removed; the second keeps its prompt with another chosen answer.
PREFERENCE_V2 = (
    PREFERENCE_V1.split("::preference::")[0]
    + """::preference::
### Prompt
Where do adapters go?
### Chosen
Into adapter/versions, one folder per version.
### Rejected
Somewhere.
"""
)


@pytest.mark.slow
def test_the_preference_phase_replays_a_removed_triple_and_never_one_whose_prompt_is_still_there(
    tmp_path: Path, dlm_home: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    from dlmstore.train.trainer import train_document

    front = "training:\n  sequence_len: 64\n  max_steps: 2\n  micro_batch_size: 2\n  seed: 7\n"
    doc = write_doc(
        tmp_path / "doc.dlm", body=PREFERENCE_V1, frontmatter=f"base_model: {tiny_base}\n" + front
    )
    train_document(str(doc))
    with _db(dlm_home) as conn:  # recorded in corpus order: the first triple, then the second
        removed, edited = (
            key
            for (key,) in conn.execute(
                "SELECT row_key FROM history WHERE kind = 'preference' ORDER BY content_id"
            ).fetchall()
        )
    doc = write_doc(
        tmp_path / "doc.dlm", body=PREFERENCE_V2, frontmatter=f"base_model: {tiny_base}\n" + front
    )
    second = train_document(str(doc))
    assert [part.phase for part in second.phases] == ["sft", "preference"]
    assert second.replay is not None and (
        second.replay.preference_candidates,
        second.replay.triples_drawn,
    ) == (1, 1)
    with _db(dlm_home) as conn:
        drawn = conn.execute(
            "SELECT phase, key FROM replay_draws WHERE run_id = ?", (second.run_id,)
        ).fetchall()
    assert [(phase, "sha256:" + key.hex()) for phase, key in drawn] == [("preference", removed)]
    assert edited not in {"sha256:" + key.hex() for _, key in drawn}
    assert second.phases[1].rows == 2  # the document's triple, then the replayed one


@pytest.mark.slow
def test_two_ranks_replay_the_same_draw_and_measure_retention_together(
    tmp_path: Path, dlm_home: Path, tiny_base: Path
) -> None:
    import os
    import subprocess
    import sys

    extra = "  replay:\n    retention_fraction: 0.5\n"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "dlmstore.cli.main", "train", "--nproc", "2", "--json"]
    doc = _doc(tmp_path, V1, tiny_base, extra)
    done = subprocess.run([*command, str(doc)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = _doc(tmp_path, V2, tiny_base, extra)
    done = subprocess.run([*command, str(doc)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["world_size"] == 2 and summary["replay"]["rows_drawn"] > 0
    adapter = summary["phases"][0]["evaluation"]["adapter"]
    assert adapter["retention_rows"] > 0 and adapter["retention_delta"] is not None
    with _db(dlm_home) as conn:
        assert (
            conn.execute("SELECT count(*) FROM replay_draws WHERE run_id = 2").fetchone()[0]
            == (summary["replay"]["rows_drawn"])
        )
        own = conn.execute("SELECT count(*) FROM history WHERE last_generation = 2").fetchone()[0]
    assert summary["rows_trained"] == own + summary["replay"]["rows_drawn"]  # both ranks' epoch holds them


@pytest.mark.slow
def test_a_row_pruned_from_history_is_forgotten_on_purpose_the_next_run_never_replays_it(
    tmp_path: Path, dlm_home: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    from dlmstore.train.trainer import train_document

    doc = _doc(tmp_path, V1, tiny_base)
    old = _keys(doc)
    train_document(str(doc))
    doc = _doc(tmp_path, V2, tiny_base)
    replayed = train_document(str(doc))
    forgotten = old["A paragraph that the"]
    assert forgotten in _drawn(dlm_home, replayed.run_id)
    result = CliRunner().invoke(cli, ["replay", "prune", str(doc), "--row", forgotten])
    assert result.exit_code == 0, result.output
    again = train_document(str(doc))
    assert forgotten not in _drawn(dlm_home, again.run_id)
    assert again.replay is not None and again.replay.rows_drawn == replayed.replay.rows_drawn - 1  # type: ignore[union-attr]
    assert again.adapter_sha256 != replayed.adapter_sha256

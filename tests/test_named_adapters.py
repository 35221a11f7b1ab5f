"""Named adapters and the learned gate: DLM's multi-adapter documents, trained the same way.

One module-scoped store is trained once (two named adapters, a preference
phase for one of them, a source folder and a gate) on the tests' tiny base;
each test copies it into its own home. What is checked: the routing table,
one recorded run and version line per adapter, a shared row tokenized once,
the base loaded once, the same bytes in two homes, ``--adapter`` on prompt
and eval, the gate's record, routing and refusals, and ``--resume`` per
adapter.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.corpus.show import summarize
from dlmstore.document.adapter_routing import adapter_names, routed_sections, scoped
from dlmstore.document.parser import parse_document, parse_text
from dlmstore.errors import DocumentError, TrainingError
from dlmstore.home import store_dir
from dlmstore.train.adapters import file_sha256

from .helpers import VALID_ID, ctrl_c_after, write_doc

BODY = """Shared prose about the harbour.

::instruction::
### Q
Where is the harbour?
### A
North of the town.

::instruction#knowledge::
### Q
How deep is the harbour?
### A
Twelve metres.

::instruction#knowledge::
### Q
When does the ferry leave?
### A
At nine.

::instruction#tone::
### Q
Say hello.
### A
Ahoy there!

::instruction#tone::
### Q
Say goodbye.
### A
Fair winds!

::prose#tone::
Every answer sounds like a pirate.

::preference#tone::
### Prompt
Greet me.
### Chosen
Ahoy, matey!
### Rejected
Hello.
"""


def front(base: Path, *, gate: bool = True, extra: str = "") -> str:
    """The frontmatter: two adapters of different ranks and targets, a source folder, the gate."""
    text = (
        f"base_model: {base}\n"
        "training:\n  sequence_len: 64\n  max_steps: 2\n  micro_batch_size: 2\n  seed: 7\n"
        "  sources:\n    - path: notes\n"
        "  adapters:\n"
        "    knowledge: {lora_r: 8, learning_rate: 0.02}\n"
        "    tone: {lora_r: 4, learning_rate: 0.01, target_modules: [q_proj, v_proj]}\n"
    )
    if gate:
        text += "  gate: {enabled: true, cold_start_floor: 2, steps: 30}\n"
    return text + extra


def named_doc(folder: Path, base: Path, **kwargs: Any) -> Path:
    """The two-adapter document in ``folder``, beside its ``notes`` source folder."""
    notes = folder / "notes"
    notes.mkdir(exist_ok=True)
    (notes / "a.md").write_text("Notes on the tides and the harbour walls. " * 4, encoding="utf-8")
    return write_doc(folder / "doc.dlm", body=BODY, frontmatter=front(base, **kwargs))


@pytest.fixture(scope="module")
def trained(tiny_base: Path, session_bases: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The document trained once in a home of its own: the home, the summary, the document's folder."""
    import torch

    home = tmp_path_factory.mktemp("named-home")
    (home / "bases").symlink_to(session_bases, target_is_directory=True)
    folder = tmp_path_factory.mktemp("named-doc")
    doc = named_doc(folder, tiny_base)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DLM_HOME", str(home))
        from dlmstore.train.named.adapter_runs import train

        summary = train(str(doc))
    torch.set_num_threads(threads)
    return {"home": home, "summary": summary, "folder": folder, "doc": doc}


@pytest.fixture
def store(trained: dict[str, Any], dlm_home: Path) -> Path:
    """The trained store copied into this test's home; its document is ``trained["doc"]``."""
    target = dlm_home / "store" / VALID_ID
    shutil.copytree(trained["home"] / "store" / VALID_ID, target, symlinks=True)
    return target


def _db(store: Path) -> sqlite3.Connection:
    return sqlite3.connect(store / "store.db")


# --- routing ------------------------------------------------------------------------------------


def test_untagged_prose_trains_every_adapter_and_untagged_pairs_train_the_first_declared(
    tiny_base: Path,
) -> None:
    document = parse_text(f"---\ndlm_id: {VALID_ID}\n{front(tiny_base)}---\n{BODY}", "doc.dlm")
    assert adapter_names(document) == ("knowledge", "tone")
    shape = {
        name: [(s.type, s.adapter, s.content.splitlines()[0]) for s in routed_sections(document, name)]
        for name in ("knowledge", "tone")
    }
    assert shape == {
        "knowledge": [
            ("prose", None, "Shared prose about the harbour."),
            ("instruction", None, "### Q"),
            ("instruction", "knowledge", "### Q"),
            ("instruction", "knowledge", "### Q"),
        ],
        "tone": [
            ("prose", None, "Shared prose about the harbour."),
            ("instruction", "tone", "### Q"),
            ("instruction", "tone", "### Q"),
            ("prose", "tone", "Every answer sounds like a pirate."),
            ("preference", "tone", "### Prompt"),
        ],
    }


def test_an_adapters_view_of_the_document_carries_its_own_lora_settings_and_no_replay(
    tiny_base: Path,
) -> None:
    document = parse_text(f"---\ndlm_id: {VALID_ID}\n{front(tiny_base)}---\n{BODY}", "doc.dlm")
    tone = scoped(document, "tone").frontmatter.training
    assert (tone.lora_r, tone.learning_rate, tone.target_modules) == (4, 0.01, ["q_proj", "v_proj"])
    assert (tone.adapters, tone.gate.enabled, tone.replay.enabled) == (None, False, False)
    assert scoped(document, "tone").adapter == "tone"


def test_a_fence_routed_to_an_undeclared_adapter_is_one_error_naming_the_declared_ones(
    tmp_path: Path, tiny_base: Path
) -> None:
    body = BODY.replace("::instruction#tone::", "::instruction#style::", 1)
    with pytest.raises(DocumentError) as caught:
        parse_text(f"---\ndlm_id: {VALID_ID}\n{front(tiny_base)}---\n{body}", "doc.dlm")
    assert str(caught.value).endswith(
        "fence '::instruction#style::' routes the section to adapter 'style', which training.adapters does "
        "not declare (declared: knowledge, tone)"
    )


def test_dlm_show_says_the_rows_each_named_adapter_trains_on(tmp_path: Path, tiny_base: Path) -> None:
    summary = summarize(named_doc(tmp_path, tiny_base))
    assert [(item.name, item.rows) for item in summary.adapters] == [
        ("knowledge", {"text": 2, "messages": 3, "preference": 0}),
        ("tone", {"text": 3, "messages": 2, "preference": 1}),
    ]
    assert summary.not_used == []


# --- training -----------------------------------------------------------------------------------


def test_one_dlm_train_records_a_run_a_lock_and_a_version_line_per_adapter(
    trained: dict[str, Any], store: Path
) -> None:
    summary = trained["summary"]
    assert [run.adapter for run in summary.adapters] == ["knowledge", "tone"]
    with _db(store) as conn:
        runs = conn.execute("SELECT id, command, adapter, status FROM runs ORDER BY id").fetchall()
        versions = conn.execute(
            "SELECT version, run_id, name, phase, parent_version FROM adapters ORDER BY version"
        ).fetchall()
        locks = conn.execute("SELECT run_id FROM lock_records ORDER BY run_id").fetchall()
        evaluated = conn.execute(
            "SELECT DISTINCT run_id, model FROM evaluations ORDER BY run_id, model"
        ).fetchall()
    assert runs == [
        (1, "train", "knowledge", "completed"),
        (2, "train", "tone", "completed"),
        (3, "gate", None, "completed"),
    ]
    assert versions == [
        (1, 1, "knowledge", "sft", None),
        (2, 2, "tone", "sft", None),
        (3, 2, "tone", "preference", 2),
    ]
    assert locks == [(1,), (2,)]
    assert evaluated == [(1, "base"), (1, "v0001"), (2, "base"), (2, "v0002"), (2, "v0003")]
    # The tokenizer each run loaded (once, then kept for the next run) is saved unchanged beside each version.
    saved = [
        {
            path.name: file_sha256(path)
            for path in (store / f"adapter/versions/v000{n}").iterdir()
            if "token" in path.name
        }
        for n in (1, 2, 3)
    ]
    assert saved[0] and saved[0] == saved[1] == saved[2]


def test_each_adapter_trains_on_its_routed_rows_with_its_own_lora_settings(trained: dict[str, Any]) -> None:
    knowledge, tone = trained["summary"].adapters
    # knowledge: the shared prose, the source file, the untagged pair and its own two pairs
    assert knowledge.rows_trained + knowledge.val_rows == 5
    # tone: the shared prose, the source file, its prose and its two pairs; and its preference triple
    assert tone.rows_trained + tone.val_rows == 5
    assert (knowledge.preference_rows, tone.preference_rows) == (0, 1)
    assert [phase.phase for phase in tone.phases] == ["sft", "preference"]
    assert (knowledge.plan.lora_r, tone.plan.lora_r) == (8, 4)
    assert sorted(tone.plan.target_modules) == ["q_proj", "v_proj"]


def test_a_row_two_adapters_share_is_tokenized_once_and_the_base_loads_once(trained: dict[str, Any]) -> None:
    summary = trained["summary"]
    knowledge, tone = summary.adapters
    assert knowledge.tokenization.cache_hits == 0
    # The shared prose and the source file come from the cache the first adapter's pass filled.
    assert tone.tokenization.cache_hits == 2
    assert tone.tokenization.cache_misses == tone.tokenization.total_rows - 2
    assert summary.base_loads == 1


def test_two_fresh_homes_train_the_same_bytes_for_every_adapter_and_the_gate(
    trained: dict[str, Any], tiny_base: Path, dlm_home: Path, tmp_path: Path, one_torch_thread: None
) -> None:
    from dlmstore.train.named.adapter_runs import train

    again = train(str(named_doc(tmp_path, tiny_base)))
    first = trained["summary"]
    assert [run.adapter_sha256 for run in again.adapters] == [run.adapter_sha256 for run in first.adapters]
    assert [p.adapter_sha256 for run in again.adapters for p in run.phases] == [
        p.adapter_sha256 for run in first.adapters for p in run.phases
    ]
    assert again.gate is not None and first.gate is not None
    assert again.gate.sha256 == first.gate.sha256


def test_an_adapter_trained_on_the_lent_base_is_the_adapter_trained_alone(
    trained: dict[str, Any], tiny_base: Path, dlm_home: Path, tmp_path: Path, one_torch_thread: None
) -> None:
    from dlmstore.train.trainer import train_document

    alone = train_document(str(named_doc(tmp_path, tiny_base)), adapter="tone")
    assert alone.adapter == "tone"
    assert alone.adapter_sha256 == trained["summary"].adapters[1].adapter_sha256


def test_a_multi_adapter_document_is_refused_by_the_one_adapter_trainer(
    tmp_path: Path, tiny_base: Path, dlm_home: Path
) -> None:
    from dlmstore.train.trainer import train_document

    with pytest.raises(TrainingError) as caught:
        train_document(str(named_doc(tmp_path, tiny_base)))
    assert "declares named adapters (knowledge, tone)" in caught.value.message


def test_resume_continues_the_interrupted_adapter_and_passes_over_the_one_already_trained(
    tmp_path: Path, tiny_base: Path, dlm_home: Path, one_torch_thread: None
) -> None:
    from dlmstore.train.named.adapter_runs import train

    doc = named_doc(tmp_path, tiny_base, gate=False, extra="  checkpoint_steps: 1\n")
    text = doc.read_text(encoding="utf-8").replace("max_steps: 2", "max_steps: 3")
    doc.write_text(text, encoding="utf-8")
    with ctrl_c_after(2):  # the first adapter, knowledge, is stopped at its step 2 of 3: tone never starts
        with pytest.raises(KeyboardInterrupt):
            train(str(doc))
    resumed = train(str(doc), resume=True)
    assert [run.adapter for run in resumed.adapters] == ["knowledge", "tone"]
    assert (resumed.adapters[0].resumed_from, resumed.adapters[1].resumed_from) == (1, None)
    again = train(str(doc), resume=False)
    with pytest.raises(TrainingError) as caught:
        train(str(doc), resume=True)
    assert caught.value.message == (
        "nothing to resume: the newest train run of every adapter (knowledge, tone) completed on this document"
    )
    assert resumed.adapters[0].adapter_sha256 == again.adapters[0].adapter_sha256


def test_resume_passes_over_an_adapter_the_interrupted_invocation_had_trained(
    tmp_path: Path, tiny_base: Path, dlm_home: Path, one_torch_thread: None
) -> None:
    from dlmstore.progress import ProgressUpdate, reporting
    from dlmstore.train.named.adapter_runs import train

    doc = named_doc(
        tmp_path, tiny_base, gate=False, extra="  checkpoint_steps: 1\n  preference:\n    enabled: false\n"
    )
    doc.write_text(doc.read_text(encoding="utf-8").replace("max_steps: 2", "max_steps: 3"), encoding="utf-8")
    started: list[str] = []

    def sink(update: ProgressUpdate) -> None:  # stop the second adapter's SFT after its first checkpoint
        if update.task == "training sft" and update.done == 2 and not update.finished:
            started.append("sft")
            if len(started) > 1:
                raise KeyboardInterrupt

    with reporting(sink), pytest.raises(KeyboardInterrupt):
        train(str(doc))
    resumed = train(str(doc), resume=True)
    assert resumed.skipped == ["knowledge"]
    assert [run.adapter for run in resumed.adapters] == ["tone"]
    assert resumed.adapters[0].resumed_from is not None


# --- prompt and eval ----------------------------------------------------------------------------


def _dlm(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def test_dlm_prompt_needs_adapter_on_an_ungated_multi_adapter_document_and_names_the_adapters(
    store: Path, trained: dict[str, Any], tmp_path: Path, tiny_base: Path
) -> None:
    doc = named_doc(tmp_path, tiny_base, gate=False)
    result = _dlm("prompt", str(doc), "Say hello.")
    assert result.exit_code == 2
    assert result.output.splitlines()[:2] == [
        "error: doc.dlm declares named adapters (knowledge, tone): `dlm prompt` needs --adapter NAME",
        "hint: e.g. `dlm prompt doc.dlm --adapter knowledge`",
    ]
    result = _dlm("prompt", str(doc), "Say hello.", "--adapter", "style")
    assert result.exit_code == 2
    assert (
        result.output.splitlines()[0]
        == "error: doc.dlm: --adapter style: no such adapter (declared: knowledge, tone)"
    )


def test_dlm_prompt_refuses_adapter_on_a_one_adapter_document(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "one.dlm")
    result = _dlm("prompt", str(doc), "Hi?", "--adapter", "tone")
    assert result.exit_code == 2
    assert result.output.splitlines()[0] == (
        "error: one.dlm: --adapter tone: the document declares no named adapters (training.adapters), so it "
        "has one adapter"
    )


def test_dlm_prompt_adapter_answers_from_that_adapters_newest_version(
    store: Path, trained: dict[str, Any]
) -> None:
    for name, version in (("knowledge", 1), ("tone", 3)):
        result = _dlm(
            "prompt", str(trained["doc"]), "Say hello.", "--adapter", name, "--max-new-tokens", "3", "--json"
        )
        assert result.exit_code == 0, result.output
        answer = json.loads(result.stdout)
        assert (answer["adapter"], answer["adapter_version"], answer["mix"]) == (name, version, [])


def test_a_gated_document_answers_through_its_gate_and_says_the_weights_it_chose(
    store: Path, trained: dict[str, Any]
) -> None:
    result = _dlm("prompt", str(trained["doc"]), "Say hello.", "--max-new-tokens", "3", "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["routed_by"] == "gate"
    assert [(part["name"], part["version"]) for part in answer["mix"]] == [("knowledge", 1), ("tone", 3)]
    assert sum(part["weight"] for part in answer["mix"]) == pytest.approx(1.0, abs=1e-5)
    shown = _dlm("prompt", str(trained["doc"]), "Say hello.", "--max-new-tokens", "3")
    weights = ", ".join(f"{part['name']} {part['weight']:.2f}" for part in answer["mix"])
    assert f"gate: {weights}" in shown.stderr


def test_gate_off_mixes_the_adapters_equally(store: Path, trained: dict[str, Any]) -> None:
    result = _dlm(
        "prompt", str(trained["doc"]), "Say hello.", "--gate", "off", "--max-new-tokens", "3", "--json"
    )
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["routed_by"] == "uniform"
    assert [part["weight"] for part in answer["mix"]] == [0.5, 0.5]


def test_a_damaged_gate_is_refused_by_name_and_never_routes(store: Path, trained: dict[str, Any]) -> None:
    weights = store / trained["summary"].gate.path / "gate.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    result = _dlm("prompt", str(trained["doc"]), "Say hello.")
    assert result.exit_code == 1
    assert result.output.splitlines()[0].startswith(f"error: gate run3: {weights} is damaged (its sha256 is ")


def test_the_gate_is_recorded_with_its_checksum_the_versions_it_routes_and_its_mean_weights(
    store: Path, trained: dict[str, Any]
) -> None:
    gate = trained["summary"].gate
    assert (gate.mode, gate.prompts, gate.by_adapter) == ("trained", 6, {"knowledge": 2, "tone": 4})
    with _db(store) as conn:
        row = conn.execute("SELECT run_id, path, sha256, adapters, mean_weights FROM gates").fetchone()
    assert row[:3] == (3, "gate/run3", gate.sha256)
    assert json.loads(row[3]) == [{"name": "knowledge", "version": 1}, {"name": "tone", "version": 3}]
    assert json.loads(row[4]) == pytest.approx(gate.mean_weights)
    assert file_sha256(store / "gate/run3/gate.safetensors") == gate.sha256


def test_below_the_cold_start_floor_the_gate_is_uniform_and_says_why_in_one_note(
    tmp_path: Path, tiny_base: Path, dlm_home: Path, one_torch_thread: None
) -> None:
    from dlmstore.train.named.adapter_runs import train

    doc = named_doc(
        tmp_path, tiny_base, gate=False, extra="  gate: {enabled: true}\n  preference:\n    enabled: false\n"
    )
    summary = train(str(doc), max_steps=1)
    assert summary.gate is not None and summary.gate.mode == "uniform"
    assert summary.gate.mean_weights == {"knowledge": 0.5, "tone": 0.5}
    assert summary.gate.note in summary.warnings
    assert "knowledge" in (summary.gate.note or "") and "cold_start_floor" in (summary.gate.note or "")


def test_dlm_eval_adapter_evaluates_that_adapters_val_rows_and_probes(
    store: Path, trained: dict[str, Any]
) -> None:
    result = _dlm("eval", str(trained["doc"]), "--adapter", "knowledge", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [model["model"] for model in report["models"]] == ["v0001", "base"]
    refused = _dlm("eval", str(trained["doc"]), "--adapter", "tone", "--against", "v1")
    assert refused.exit_code == 1
    assert refused.output.splitlines()[0].endswith(
        "doc.dlm: --against v0001 is a version of adapter knowledge, not of adapter tone"
    )
    missing = _dlm("eval", str(trained["doc"]))
    assert missing.exit_code == 2


def test_dlm_metrics_names_the_adapter_of_each_run(store: Path, trained: dict[str, Any]) -> None:
    result = _dlm("metrics", str(trained["doc"]), "--json")
    assert result.exit_code == 0, result.output
    runs = json.loads(result.stdout)["runs"]
    assert [(run["command"], run["adapter"]) for run in runs] == [
        ("gate", None),
        ("train", "tone"),
        ("train", "knowledge"),
    ]


def test_dlms_multi_adapter_cookbook_document_trains_both_adapters_with_the_routing_tables_rows(
    tmp_path: Path, tiny_base: Path, dlm_home: Path, one_torch_thread: None
) -> None:
    from dlmstore.train.named.adapter_runs import train

    text = (Path(__file__).parent / "fixtures" / "dlm" / "cookbook" / "multi-adapter.dlm").read_text()
    doc = tmp_path / "mydoc.dlm"
    doc.write_text(
        text.replace("base_model: qwen2.5-1.5b", f"base_model: {tiny_base}")
        .replace("  num_epochs: 2\n", "  num_epochs: 2\n  max_steps: 1\n  sequence_len: 64\n")
        .replace("  sequence_len: 2048\n", ""),
        encoding="utf-8",
    )
    document = parse_document(doc)
    assert [len(routed_sections(document, name)) for name in ("knowledge", "tone")] == [2, 2]
    summary = train(str(doc))
    assert [(run.adapter, run.plan.lora_r) for run in summary.adapters] == [("knowledge", 8), ("tone", 4)]
    assert store_dir(VALID_ID) != store_dir(document.dlm_id)


def test_a_pack_carries_the_newest_version_of_every_named_adapter_and_the_gate_which_route_again_unpacked(
    store: Path, trained: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, session_bases: Path
) -> None:
    pack = tmp_path / "doc.dlm.pack"
    packed = _dlm("pack", str(trained["doc"]), "-o", str(pack), "--json")
    assert packed.exit_code == 0, packed.output
    assert json.loads(packed.stdout)["adapters"] == [1, 3]
    other = tmp_path / "other-home"
    other.mkdir()
    (other / "bases").symlink_to(session_bases, target_is_directory=True)
    monkeypatch.setenv("DLM_HOME", str(other))
    unpacked = _dlm("unpack", str(pack), "--to", str(tmp_path / "there"))
    assert unpacked.exit_code == 0, unpacked.output
    gate = trained["summary"].gate
    assert file_sha256(other / "store" / VALID_ID / gate.path / "gate.safetensors") == gate.sha256
    (tmp_path / "there" / "notes").mkdir(exist_ok=True)
    answer = _dlm(
        "prompt", str(tmp_path / "there" / "doc.dlm"), "Say hello.", "--max-new-tokens", "3", "--json"
    )
    assert answer.exit_code == 0, answer.output
    assert json.loads(answer.stdout)["routed_by"] == "gate"


def test_a_damaged_gate_is_never_packed(store: Path, trained: dict[str, Any], tmp_path: Path) -> None:
    weights = store / trained["summary"].gate.path / "gate.safetensors"
    data = bytearray(weights.read_bytes())
    data[0] ^= 0x01
    weights.write_bytes(bytes(data))
    result = _dlm("pack", str(trained["doc"]), "-o", str(tmp_path / "doc.dlm.pack"))
    assert result.exit_code == 1
    assert result.output.splitlines()[0].startswith("error: the learned gate gate/run3 is damaged")
    assert not (tmp_path / "doc.dlm.pack").exists()


@pytest.mark.slow
def test_nproc_2_trains_every_named_adapter_on_both_ranks_and_the_gate_once(
    tmp_path: Path, tiny_base: Path, dlm_home: Path
) -> None:
    doc = named_doc(tmp_path, tiny_base, extra="  preference:\n    enabled: false\n")
    result = CliRunner().invoke(cli, ["train", str(doc), "--nproc", "2"], env={"OMP_NUM_THREADS": "1"})
    assert result.exit_code == 0, result.output
    with _db(store_dir(VALID_ID)) as conn:
        assert conn.execute("SELECT command, adapter, world_size FROM runs ORDER BY id").fetchall() == [
            ("train", "knowledge", 2),
            ("train", "tone", 2),
            ("gate", None, 1),
        ]
        assert conn.execute("SELECT version, name FROM adapters ORDER BY version").fetchall() == [
            (1, "knowledge"),
            (2, "tone"),
        ]
        assert conn.execute("SELECT COUNT(*) FROM gates").fetchone() == (1,)


def test_verify_retrain_of_a_named_adapter_pack_reproduces_every_adapter(
    store: Path, trained: dict[str, Any], tmp_path: Path, one_torch_thread: None
) -> None:
    pack = tmp_path / "doc.dlm.pack"
    packed = _dlm("pack", str(trained["doc"]), "-o", str(pack), "--include-sources", "--include-base")
    assert packed.exit_code == 0, packed.output
    result = _dlm("verify", str(pack), "--retrain", "--json")
    assert result.exit_code == 0, result.output
    retrain = json.loads(result.stdout)["retrain"]
    assert retrain["reproduced"] is True
    # The scratch home holds the unpacked v1-v3: the retrain writes v4-v6.
    assert (retrain["adapter_version"], retrain["packed_version"]) == (6, 3)

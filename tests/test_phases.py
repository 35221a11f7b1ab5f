"""Which phases a run trains: DLM's auto-enable rule and the --phase rules (no model needed)."""

from __future__ import annotations

import pytest

from dlmstore.document.frontmatter import PreferenceSettings
from dlmstore.errors import TrainingError
from dlmstore.train.phases import plan_phases, preference_enabled

UNSET = PreferenceSettings()
ON = PreferenceSettings(enabled=True)
OFF = PreferenceSettings(enabled=False)


def plan(phase: str, settings: PreferenceSettings = UNSET, sft: int = 3, pref: int = 2):  # type: ignore[no-untyped-def]
    return plan_phases(phase, settings, path="doc.dlm", sft_rows=sft, preference_rows=pref)


def test_preference_sections_switch_the_phase_on_when_the_document_does_not_say() -> None:
    assert preference_enabled(UNSET, 2) is True
    assert preference_enabled(UNSET, 0) is False


def test_an_explicit_enabled_wins_over_the_content() -> None:
    assert preference_enabled(OFF, 5) is False
    assert preference_enabled(ON, 0) is True


def test_all_trains_sft_then_preference_on_a_document_with_both() -> None:
    phases = plan("all")
    assert (phases.sft, phases.preference, phases.needs_prior_adapter, phases.warnings) == (
        True,
        True,
        False,
        [],
    )


def test_all_with_enabled_false_trains_sft_and_says_the_triples_are_not_trained() -> None:
    phases = plan("all", OFF)
    assert (phases.sft, phases.preference) == (True, False)
    assert phases.warnings == ["doc.dlm: training.preference.enabled is false: 2 preference rows not trained"]


def test_enabled_true_without_preference_sections_warns_and_skips_the_phase() -> None:
    phases = plan("all", ON, pref=0)
    assert (phases.sft, phases.preference) == (True, False)
    assert phases.warnings == [
        "doc.dlm: training.preference.enabled is true but the document has no ::preference:: sections; "
        "the preference phase is skipped"
    ]


def test_a_document_of_only_preference_sections_starts_from_a_stored_adapter() -> None:
    phases = plan("all", sft=0)
    assert (phases.sft, phases.preference, phases.needs_prior_adapter) == (False, True, True)


def test_phase_sft_never_trains_preference() -> None:
    phases = plan("sft", ON)
    assert (phases.sft, phases.preference, phases.warnings) == (True, False, [])


def test_phase_preference_trains_only_preference_even_when_disabled() -> None:
    phases = plan("preference", OFF)
    assert (phases.sft, phases.preference, phases.needs_prior_adapter) == (False, True, True)


def test_phase_preference_without_preference_sections_is_an_error() -> None:
    with pytest.raises(TrainingError) as err:
        plan("preference", pref=0)
    assert str(err.value) == "doc.dlm: --phase preference, but the document has no ::preference:: sections"


def test_nothing_to_train_is_an_error() -> None:
    with pytest.raises(TrainingError) as err:
        plan("all", OFF, sft=0)
    assert str(err.value) == "doc.dlm: no text or instruction rows to train on"
    with pytest.raises(TrainingError):
        plan("sft", sft=0)


def test_the_method_comes_from_the_document() -> None:
    assert plan("all", PreferenceSettings(method="orpo")).method == "orpo"

"""Which training phases a ``dlm train`` run has: SFT, then the preference phase.

DLM's rules, decided before any model loads:

* ``training.preference.enabled`` is switched on by the document's content
  when the document does not set it: a document with ``::preference::``
  sections runs the preference phase unless it says ``enabled: false``.
* ``--phase sft`` runs SFT only, whatever the document holds.
* ``--phase preference`` runs the preference phase only (``enabled`` does not
  matter: asking is enabling). It needs ``::preference::`` rows and an SFT
  adapter to start from: the store's newest SFT-phase adapter, trained on
  the same base model.
* ``--phase all`` (the default) runs SFT when the document has prose,
  instruction or source rows, then the preference phase when it is enabled
  and there are preference rows. ``enabled: true`` with no preference rows
  is a warning and the phase is skipped (DLM does the same). A document with
  preference rows but nothing for SFT trains the preference phase on the
  newest SFT adapter, which must then exist.

The preference phase always starts from an SFT adapter: in a ``all`` run the
one this run just trained, otherwise the newest one in the store. Its
adapter is published as the next version, with its parent recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from dlmstore.errors import TrainingError
from dlmstore.plural import plural

if TYPE_CHECKING:
    from dlmstore.document.frontmatter import PreferenceSettings

Phase = Literal["sft", "preference", "all"]
PHASES: tuple[str, ...] = ("sft", "preference", "all")


@dataclass(frozen=True)
class PhasePlan:
    """The phases a run trains, decided from the request and the document's rows.

    Attributes:
        sft: run the SFT phase.
        preference: run the preference phase.
        method: ``dpo`` or ``orpo`` (the preference phase's method).
        needs_prior_adapter: the preference phase starts from an adapter
            already in the store (no SFT phase in this run).
        warnings: lines for stderr (a skipped phase and why).
    """

    sft: bool
    preference: bool
    method: str
    needs_prior_adapter: bool
    warnings: list[str] = field(default_factory=list)


def preference_enabled(settings: PreferenceSettings, preference_rows: int) -> bool:
    """``training.preference.enabled`` as DLM resolves it: set by the document, else by its content."""
    if "enabled" in settings.model_fields_set:
        return settings.enabled
    return preference_rows > 0


def plan_phases(
    phase: str,
    settings: PreferenceSettings,
    *,
    path: str,
    sft_rows: int,
    preference_rows: int,
    sft_datasets: int = 0,
) -> PhasePlan:
    """Decide the phases of a run (see the module docstring for the rules).

    Args:
        phase: ``sft``, ``preference`` or ``all`` (``--phase``).
        settings: the document's ``training.preference``.
        path: the document, for messages.
        sft_rows: text and instruction rows (prose, pairs, source files).
        preference_rows: prompt/chosen/rejected triples.
        sft_datasets: token datasets the run mixes in (``training.datasets``,
            ``--dataset``): SFT trains on them too.

    Raises:
        TrainingError: nothing to train, or ``--phase preference`` without
            preference rows.
    """
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; expected one of {', '.join(PHASES)}")
    method = settings.method
    sft_inputs = sft_rows + sft_datasets
    if phase == "sft":
        if sft_inputs == 0:
            raise TrainingError(
                f"{path}: no text or instruction rows to train on (--phase sft)",
                hint="add prose, ::instruction:: pairs or training.sources to the document",
            )
        return PhasePlan(True, False, method, False)
    if phase == "preference":
        if preference_rows == 0:
            raise TrainingError(
                f"{path}: --phase preference, but the document has no ::preference:: sections",
                hint="add ::preference:: sections (### Prompt / ### Chosen / ### Rejected) or train with --phase sft",
            )
        return PhasePlan(False, True, method, True)
    warnings: list[str] = []
    enabled = preference_enabled(settings, preference_rows)
    run_preference = enabled and preference_rows > 0
    if enabled and preference_rows == 0:
        warnings.append(
            f"{path}: training.preference.enabled is true but the document has no ::preference:: "
            "sections; the preference phase is skipped"
        )
    if not enabled and preference_rows > 0:
        warnings.append(
            f"{path}: training.preference.enabled is false: "
            f"{plural(preference_rows, 'preference row')} not trained"
        )
    if sft_inputs == 0 and not run_preference:
        raise TrainingError(
            f"{path}: no text or instruction rows to train on",
            hint="add prose, ::instruction:: pairs or training.sources to the document",
        )
    return PhasePlan(sft_inputs > 0, run_preference, method, run_preference and sft_inputs == 0, warnings)


def starting_adapter(store: Any, document: Any) -> Any:
    """The newest SFT adapter, where a run without an SFT phase starts its preference phase.

    Raises:
        TrainingError: the store has no SFT adapter, or it was trained on another base.
        StoreError: its weights no longer match the sha256 recorded when it was trained.
    """
    from dlmstore.train.adapters import checked_folder, latest

    parent = latest(store, phase="sft", name=document.adapter)
    if parent is None:
        whose = "this store has none" if document.adapter is None else f"adapter {document.adapter} has none"
        raise TrainingError(
            f"{document.path}: the preference phase starts from an SFT adapter, and {whose}",
            hint="train SFT first: `dlm train DOC --phase sft` (the document needs prose, instruction or source rows)",
        )
    if parent.base_model != document.base_model:
        raise TrainingError(
            f"{document.path}: the newest SFT adapter (v{parent.version:04d}) was trained on base_model "
            f"{parent.base_model!r}, the document now names {document.base_model!r}",
            hint="train SFT on the new base first: `dlm train DOC --phase sft`",
        )
    checked_folder(store, parent, hint="train SFT again first: `dlm train DOC --phase sft`")
    return parent

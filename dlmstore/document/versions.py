"""DLM's frontmatter schema versions, and how an older document reads today.

DocumentLanguageModel numbers its frontmatter schema with ``dlm_version``
(1 when unset) and upgrades an older document in memory before validating
it, one step per version; ``dlm migrate`` writes the upgrade to disk. Of its
fourteen steps only the first changes a key; the others exist because each
version *added* something with a default that keeps the old meaning, so an
older document reads unchanged:

====  ===========================================================
from  what the next version added
====  ===========================================================
1     ``training.dpo`` became ``training.preference`` (``method``;
      ``beta``/``learning_rate``/``num_epochs`` under ``hyperparams``;
      ``reference: pre_dpo_adapter`` became ``pre_adapter``; an empty
      ``dpo:`` is dropped)
2     ``training.cpt``
3     ``training.adapters`` and ``::type#adapter::`` fences
4     ``training.precision``
5     ``training.sources`` and ``training.sources_policy``
6     harvest markers on sections
7     ``training.gate``
8     ``training.cache``
9     ``::image ...::`` sections
10    ``::audio ...::`` sections
11    ``training.audio``
12    nothing in the document (DLM's base-model registry refresh)
13    auto-mined markers on ``::preference::`` sections
14    auto-synth markers on ``::instruction::`` sections
====  ===========================================================

So a version-2 document may not use ``training.dpo`` (it is an unknown key
there, as in DLM), and any version may use any later key: like DLM we
validate the upgraded mapping against the current schema.

Separately, :data:`LEGACY_KEYS` lists the names dlmstore used before it
adopted DLM's (``training.r`` and friends): they are errors whose hint names
the new key, and ``dlm migrate`` renames them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: The newest frontmatter schema version this dlmstore reads (DLM's current one).
CURRENT_DLM_VERSION = 15

Mapping = dict[str, Any]

#: dlmstore's own key names before it adopted DLM's, by key path.
LEGACY_KEYS: dict[tuple[str, str], str] = {
    ("training", "r"): "lora_r",
    ("training", "alpha"): "lora_alpha",
    ("training", "dropout"): "lora_dropout",
    ("training", "epochs"): "num_epochs",
    ("training", "batch_size"): "micro_batch_size",
}


def _dpo_to_preference(data: Mapping) -> Mapping:
    """Version 1 -> 2: ``training.dpo`` becomes ``training.preference``."""
    training = data.get("training")
    if not isinstance(training, dict) or "dpo" not in training:
        return data
    training = dict(training)
    dpo = training.pop("dpo")
    if dpo is None:  # an empty ``dpo:`` block holds nothing: DLM's step drops it, and so does this one
        return {**data, "training": training}
    if not isinstance(dpo, dict):
        training["preference"] = dpo  # the schema reports the bad value under its new name
        return {**data, "training": training}
    preference: Mapping = {"method": "dpo"}
    if "enabled" in dpo:
        preference["enabled"] = dpo["enabled"]
    hyper = {key: dpo[key] for key in ("beta", "learning_rate", "num_epochs") if key in dpo}
    if hyper:
        preference["hyperparams"] = hyper
    if "loss_type" in dpo:
        preference["loss_type"] = dpo["loss_type"]
    if "reference" in dpo:
        preference["reference"] = "pre_adapter" if dpo["reference"] == "pre_dpo_adapter" else dpo["reference"]
    # Keys DLM's step drops without a word would vanish here too; keep them so
    # the schema names them as unknown instead.
    for key, value in dpo.items():
        if key not in {"enabled", "beta", "learning_rate", "num_epochs", "loss_type", "reference"}:
            preference[key] = value
    training["preference"] = preference
    return {**data, "training": training}


def _additive(data: Mapping) -> Mapping:
    """A version that only added keys with defaults: the mapping reads unchanged."""
    return data


#: One upgrade per version, from ``n`` to ``n + 1``.
UPGRADES: dict[int, Callable[[Mapping], Mapping]] = {
    1: _dpo_to_preference,
    **dict.fromkeys(range(2, CURRENT_DLM_VERSION), _additive),
}

#: Where an upgrade moved a key: old key path -> new key path (for error lines).
MOVED_KEYS: dict[tuple[str | int, ...], tuple[str | int, ...]] = {
    ("training", "dpo"): ("training", "preference"),
    **{
        ("training", "dpo", key): ("training", "preference", "hyperparams", key)
        for key in ("beta", "learning_rate", "num_epochs")
    },
    **{
        ("training", "dpo", key): ("training", "preference", key)
        for key in ("enabled", "loss_type", "reference")
    },
}


def moved_path(path: tuple[str | int, ...]) -> tuple[str | int, ...] | None:
    """Where an upgrade moved the key at ``path``, or ``None`` if it stayed.

    The longest entry of :data:`MOVED_KEYS` that ``path`` starts with
    decides, so a key below a moved block (an unknown ``training.dpo.bogus``,
    which the upgrade carries along) moves with its block.
    """
    for length in range(len(path), 0, -1):
        new = MOVED_KEYS.get(path[:length])
        if new is not None:
            return new + path[length:]
    return None


def upgrade(data: Mapping, version: int) -> tuple[Mapping, list[int]]:
    """Upgrade a frontmatter mapping written at ``version`` to the current schema.

    Returns the upgraded mapping (``dlm_version`` not touched) and the
    versions whose step ran, oldest first. ``version`` must be between 1 and
    :data:`CURRENT_DLM_VERSION`.
    """
    applied: list[int] = []
    for step in range(version, CURRENT_DLM_VERSION):
        data = UPGRADES[step](data)
        applied.append(step)
    return data, applied

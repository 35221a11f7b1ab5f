"""What ``dlm export`` takes from the store: one adapter version, or named adapters mixed into one.

The arguments are checked against the document before the store opens
(:func:`choose`): ``--adapter`` is a version number (``3``, ``v3``) or a name
the document declares (``training.adapters``; a declared name wins over a
number, so an adapter called ``v2`` is reached by name); ``--adapter-mix``
is parsed by :func:`~dlmstore.export.mix.parse_mix`; a document of named
adapters needs one of them, unless it has a learned gate
(``training.gate``). Then :func:`resolve` finds the versions in the store:
the one asked for, or the newest; the newest version of each named
adapter; or, for a gated document given neither, DLM's static mix: the
newest gate's mean output over its training prompts
(``gates.mean_weights``) as the weights of the versions fitted with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmstore.document.adapter_routing import adapter_names, chosen_adapter
from dlmstore.document.parser import Document
from dlmstore.errors import AdapterChoiceError, ExportError, StoreError
from dlmstore.export.mix import MixPart, parse_mix
from dlmstore.gate.gates import GateRecord
from dlmstore.store.database import Store
from dlmstore.train.adapters import AdapterVersion

_CHOOSE = "or choose with --adapter NAME or --adapter-mix NAME:WEIGHT,NAME:WEIGHT"


@dataclass(frozen=True)
class Choice:
    """What the arguments ask for, checked against the document.

    ``adapter`` is a version number, a declared adapter's name, or None (the
    newest; a gated document's static mix when it declares named adapters);
    ``parts`` is ``--adapter-mix`` parsed (None without it).
    """

    adapter: int | str | None
    parts: tuple[MixPart, ...] | None
    declared: tuple[str, ...]


@dataclass(frozen=True)
class Chosen:
    """The versions an export takes (one, or the parts of a mix in order), and the gate that weighed them."""

    versions: list[AdapterVersion]
    parts: tuple[MixPart, ...] | None
    gate: GateRecord | None


@dataclass(frozen=True)
class MixPlan:
    """The named adapters an ``--adapter-mix`` export mixes, their checked folders, and how."""

    parts: tuple[MixPart, ...]
    versions: list[AdapterVersion]
    folders: list[Path]
    how: str
    gate_id: int | None = None  # the gate whose mean output gave the weights

    def folder_name(self) -> str:
        """``mix-v0003x1-v0004x0.5``: the default export folder's name before the quantisation."""
        return "mix-" + "-".join(
            f"v{v.version:04d}x{p.weight:g}" for p, v in zip(self.parts, self.versions, strict=True)
        )

    def record(self) -> dict[str, Any]:
        """What ``exports.mix`` and the manifest's ``mix`` say."""
        parts = [
            {"name": p.name, "version": v.version, "sha256": v.sha256, "weight": p.weight}
            for p, v in zip(self.parts, self.versions, strict=True)
        ]
        return {"parts": parts, "combination": self.how, "gate_id": self.gate_id}


def choose(document: Document, adapter: int | str | None, mix: str | None, method: str | None) -> Choice:
    """What to export, checked against the document before the store opens.

    A document of named adapters given neither ``adapter`` nor ``mix`` needs
    a learned gate, whose static mix :func:`resolve` finds in the store. A
    name is checked as ``dlm prompt`` and ``dlm eval`` check theirs
    (:func:`~dlmstore.document.adapter_routing.chosen_adapter`).

    Raises:
        AdapterChoiceError: a name the document does not declare, a name or a
            mix on a document of one adapter, both or neither on a document
            of named adapters without a gate, a method without a mix (usage
            errors, exit 2, as in DLM).
        ExportError: a malformed mix.
    """
    declared = adapter_names(document)
    shown = document.path.name
    if isinstance(adapter, str) and adapter not in declared and re.fullmatch(r"v?\d+", adapter):
        adapter = int(adapter.removeprefix("v"))
    if isinstance(adapter, str):
        chosen_adapter(
            document, adapter, command="dlm export"
        )  # refuses a name the document does not declare
    if mix is None:
        if method is not None:
            raise AdapterChoiceError("--adapter-mix-method says how to mix adapters; give --adapter-mix too")
        if adapter is None and declared and not document.frontmatter.training.gate.enabled:
            raise AdapterChoiceError(
                f"{shown} declares named adapters ({', '.join(declared)}): `dlm export` needs --adapter NAME "
                "or --adapter-mix NAME:WEIGHT,NAME:WEIGHT",
                hint=f"e.g. `dlm export {shown} --adapter {declared[0]}`",
            )
        return Choice(adapter, None, declared)
    if adapter is not None:
        raise AdapterChoiceError("--adapter and --adapter-mix both choose what to export; give one of them")
    if not declared:
        raise AdapterChoiceError(
            f"{shown}: --adapter-mix: the document declares no named adapters (training.adapters), "
            "so it has one adapter",
            hint="leave out --adapter-mix: `dlm export` exports the document's adapter",
        )
    return Choice(None, parse_mix(mix, declared), declared)


def resolve(store: Store, path: str, choice: Choice) -> Chosen:
    """The registered versions ``choice`` names (see the module docstring).

    Raises:
        StoreError: no such version, an adapter not trained yet, or no gate yet.
        ExportError: the gate routes other adapters than the document declares,
            or the parts of a mix were trained on different base models.
    """
    if choice.parts is not None:
        versions = [_named(store, path, part.name) for part in choice.parts]
        _one_base(versions)
        return Chosen(versions, choice.parts, None)
    if choice.adapter is None and choice.declared:
        gate, parts, versions = _gate_mix(store, path, list(choice.declared))
        _one_base(versions)
        return Chosen(versions, parts, gate)
    return Chosen([_adapter(store, path, choice.adapter)], None, None)


def _adapter(store: Store, path: str, wanted: int | str | None) -> AdapterVersion:
    """The version ``wanted`` (a number, or a declared adapter's name: its newest), else the newest."""
    from dlmstore.train.adapters import find_version, latest

    if isinstance(wanted, str):
        return _named(store, path, wanted)
    found = latest(store) if wanted is None else find_version(store, wanted)
    if found is not None:
        return found
    with store.read() as conn:
        versions = [row["version"] for row in conn.execute("SELECT version FROM adapters ORDER BY version")]
    if not versions:
        raise StoreError(f"{path}: no adapter has been trained yet", hint=f"run `dlm train {path}` first")
    shown = ", ".join(f"v{version:04d}" for version in versions[-10:])
    if wanted is None:  # only named adapters were trained, and the document no longer declares them
        raise StoreError(
            f"{path}: its adapter has not been trained yet (the store's versions are of named adapters)",
            hint=f"run `dlm train {path}`, or export a version by number ({shown})",
        )
    raise StoreError(f"{path}: there is no adapter v{wanted:04d}", hint=f"adapters of this document: {shown}")


def _gate_mix(
    store: Store, path: str, declared: list[str]
) -> tuple[GateRecord, tuple[MixPart, ...], list[AdapterVersion]]:
    """The newest gate, its mean output over its training prompts as weights, and the versions it routes.

    As in DLM, an export of a gated document takes the gate's average
    routing as a static mix (a runtime cannot run the gate); the versions
    are those fitted with the gate.
    """
    from dlmstore.gate.gates import latest_gate
    from dlmstore.train.adapters import find_version

    gate = latest_gate(store)
    if gate is None:
        raise StoreError(
            f"{path}: its learned gate has not been trained yet (training.gate)",
            hint=f"run `dlm train {path}`, {_CHOOSE}",
        )
    if sorted(gate.names) != sorted(declared):
        raise ExportError(
            f"{path}: the newest gate routes between {', '.join(gate.names)}, and the document declares "
            f"{', '.join(declared)}",
            hint=f"run `dlm train {path}` to fit a gate for them, {_CHOOSE}",
        )
    parts: list[MixPart] = []
    versions: list[AdapterVersion] = []
    for entry in gate.adapters:
        weight = float(gate.mean_weights.get(entry["name"], 0.0))
        found = find_version(store, int(entry["version"]))
        if found is None:
            raise StoreError(
                f"{path}: gate {gate.id} routes to adapter v{int(entry['version']):04d}, which is not registered",
                hint=f"run `dlm train {path}`, {_CHOOSE}",
            )
        if weight > 0:
            parts.append(MixPart(str(entry["name"]), weight))
            versions.append(found)
    return gate, tuple(parts), versions


def _named(store: Store, path: str, name: str) -> AdapterVersion:
    """The newest version of the declared adapter ``name``."""
    from dlmstore.train.adapters import latest

    found = latest(store, name=name)
    if found is None:
        raise StoreError(
            f"{path}: adapter {name!r} has not been trained yet", hint=f"run `dlm train {path}` first"
        )
    return found


def _one_base(versions: list[AdapterVersion]) -> None:
    bases = {v.base_model for v in versions}
    if len(bases) > 1:
        shown = ", ".join(f"{v.name} on {v.base_model}" for v in versions)
        raise ExportError(
            f"--adapter-mix: the adapters were trained on different base models ({shown})",
            hint="train them again on the document's base_model (dlm train), then mix them",
        )


def label(version: AdapterVersion, plan: MixPlan | None) -> str:
    """What the export carries, for the GGUF's name and the Modelfile's header."""
    if plan is not None:
        shown = ", ".join(
            f"{p.name} v{v.version:04d} x{p.weight:g}" for p, v in zip(plan.parts, plan.versions, strict=True)
        )
        return f"adapters mixed ({plan.how}): {shown}"
    named = f"{version.name} " if version.name else ""
    return f"adapter {named}v{version.version:04d}"


def gate_note(gate: GateRecord, parts: tuple[MixPart, ...]) -> str:
    """The note an export of a gate's static mix prints."""
    weights = ", ".join(f"{p.name} {p.weight:.4g}" for p in parts)
    how = (
        f"its mean output over its {gate.prompts} training prompts"
        if gate.mode == "trained"
        else "uniform, as the gate is (too few sections to train it)"
    )
    return f"the learned gate (gates.id {gate.id}) gives the static mix, {how}: {weights} " + (
        "(--adapter or --adapter-mix chooses otherwise)"
    )

"""A question to a multi-adapter document answered by its adapters mixed: the gate's weights, or equal ones.

``dlm prompt DOC "question"`` on a document whose ``training.gate`` is
enabled embeds the question as the gate was taught to see prompts (the
base's mean-pooled last hidden state, no adapter:
:mod:`dlmstore.gate.embedding`), asks the newest gate for a weight per
adapter, and answers with the adapters' newest versions mixed by those
weights through PEFT's ``add_weighted_adapter`` (the combination an
``--adapter-mix`` export would choose: :func:`dlmstore.export.mix.combination`).
``--gate off`` mixes them with equal weights without a gate. The gate's
file and every adapter's weights are checked against the sha256 recorded
when they were written before anything is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlmstore.train.adapters import AdapterVersion

#: The mixed adapter's name inside PEFT (no declared name starts with ``_``).
_GATED = "_gated"


@dataclass(frozen=True)
class MixedModel:
    """The base with the document's named adapters mixed on it, ready to answer.

    Attributes:
        model: the PEFT model, the mix active.
        tokenizer: the base's tokenizer.
        weights: each adapter's weight, in declaration order.
        versions: the version of each adapter that was mixed.
        routed_by: ``gate`` or ``uniform``.
    """

    model: Any
    tokenizer: Any
    weights: dict[str, float]
    versions: dict[str, AdapterVersion]
    routed_by: str


def mixed_model(path: str, document: Any, question: str, *, gate: str) -> MixedModel:
    """The document's named adapters mixed by its gate's weights for ``question`` (``gate="auto"``)
    or equally (``off``).

    Raises:
        StoreError: no store, an adapter not trained yet, no gate fitted yet, or a file that does not
            match the sha256 recorded for it.
        ExportError: adapters PEFT cannot mix (DoRA, ...).
    """
    import warnings

    from peft import PeftModel

    from dlmstore.bases import load_model, load_tokenizer, resolve_base
    from dlmstore.document.adapter_routing import adapter_names
    from dlmstore.errors import StoreError
    from dlmstore.export.mix import MixPart, combination
    from dlmstore.gate.gates import latest_gate, load_gate
    from dlmstore.store.database import open_store
    from dlmstore.store.path_text import utf8_alias
    from dlmstore.train.adapters import checked_folder, latest

    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    names = adapter_names(document)
    with open_store(document.dlm_id, create=False) as store:
        versions = {name: latest(store, name=name) for name in names}
        missing = [name for name, version in versions.items() if version is None]
        if missing:
            raise StoreError(
                f"{path}: adapter {', '.join(missing)} has not been trained yet",
                hint=f"run `dlm train {path}` first",
            )
        folders = {name: checked_folder(store, version) for name, version in versions.items() if version}
        loaded = None
        if gate == "auto":
            record = latest_gate(store)
            if record is None:
                raise StoreError(
                    f"{path}: training.gate is enabled and no gate has been fitted yet",
                    hint=f"run `dlm train {path}` first, or prompt with --adapter NAME or --gate off",
                )
            loaded = load_gate(store.path, record)
    ref = resolve_base(document.base_model, relative_to=document.directory)
    tokenizer = load_tokenizer(ref)
    base = load_model(ref)
    if loaded is None:
        weights = {name: 1.0 / len(names) for name in names}
    else:
        from dlmstore.gate.embedding import prompt_embeddings

        weights = loaded.route(prompt_embeddings(base, tokenizer, [question])[0])
        weights = {name: weights.get(name, 0.0) for name in names}
    parts = [MixPart(name, weight) for name, weight in weights.items() if weight > 0]
    chosen = [folders[part.name] for part in parts]
    how = combination(parts, chosen, None)
    with utf8_alias(chosen[0]) as loadable:
        model: Any = PeftModel.from_pretrained(base, str(loadable), adapter_name=parts[0].name)
    for part, folder in zip(parts[1:], chosen[1:], strict=True):
        with utf8_alias(folder) as loadable:
            model.load_adapter(str(loadable), adapter_name=part.name)
    if len(parts) > 1:
        model.add_weighted_adapter(
            adapters=[part.name for part in parts], weights=[part.weight for part in parts],
            adapter_name=_GATED, combination_type=how,
        )  # fmt: skip
        model.set_adapter(_GATED)
    found = {name: version for name, version in versions.items() if version is not None}
    return MixedModel(model, tokenizer, weights, found, "uniform" if loaded is None else "gate")

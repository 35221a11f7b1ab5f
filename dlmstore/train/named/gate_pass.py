"""The learned gate's pass: after every named adapter's SFT, fit the gate that routes between them.

``training.gate.enabled`` asks for it (DLM's ``train/gate`` pass). The
gate's training set is the prompt of each section routed to an adapter
(:mod:`dlmstore.gate.prompts`), embedded by the base with no adapter
(:mod:`dlmstore.gate.embedding`) - the base the invocation lent its
adapters' runs, given back with their layers removed, so it is not read
from disk again - and labelled by the adapter. The fitted MLP (or the
uniform gate, when an adapter has fewer prompts than
``training.gate.cold_start_floor``) is written as ``gate/run<N>`` beside
the adapters, its weights' sha256 recorded in ``gates`` with the adapter
versions it routes between, in one transaction. The pass is a recorded run
of its own (command ``gate``), so a concurrent ``dlm train`` never sweeps a
gate folder still being written, and a failed pass is recorded as failed. Unlike DLM, a gate that
cannot be fitted is an error, never a silent fall-back to no gate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlmstore.document.parser import Document
    from dlmstore.train.named.base_loan import BaseLoan
    from dlmstore.train.summary import GateSummary


def fit_document_gate(document: Document, loan: BaseLoan, *, seed: int) -> GateSummary:
    """Fit, write and record the gate of ``document`` over its named adapters' newest versions.

    Raises:
        TrainingError: the gate's loss stopped being a finite number.
        StoreError: its folder or row cannot be written.
    """
    import time

    from dlmstore.bases import load_tokenizer, resolve_base
    from dlmstore.gate.embedding import prompt_embeddings
    from dlmstore.gate.files import gate_folder, write_gate
    from dlmstore.gate.fitting import fit_gate
    from dlmstore.gate.gates import record_gate
    from dlmstore.gate.prompts import gate_prompts
    from dlmstore.store.database import open_store
    from dlmstore.store.runs import recorded_run
    from dlmstore.train.adapters import latest
    from dlmstore.train.summary import GateSummary

    started = time.perf_counter()
    settings = document.frontmatter.training.gate
    found = gate_prompts(document)
    ref = resolve_base(document.base_model, relative_to=document.directory)
    model = _base(loan, ref, seed)
    embeddings = prompt_embeddings(model, load_tokenizer(ref), found.prompts)
    fitted = fit_gate(embeddings, found.labels, found.names, settings, seed=seed)
    with (
        open_store(document.dlm_id) as store,
        recorded_run(store, command="gate", dlm_path=document.path, dlm_sha256=document.sha256) as run_id,
    ):
        adapters: list[dict[str, Any]] = []
        for name in found.names:
            version = latest(store, name=name)
            adapters.append({"name": name, "version": None if version is None else version.version})
        path = gate_folder(run_id)
        sha256, size = write_gate(store.path / path, fitted, seed=seed, settings=settings)
        with store.write() as conn:
            gate_id = record_gate(
                conn, run_id=run_id, path=path, fitted=fitted, sha256=sha256, bytes=size, adapters=adapters,
                seed=seed, settings=settings,
            )  # fmt: skip
    return GateSummary(
        id=gate_id,
        path=path,
        mode=fitted.mode,
        sha256=sha256,
        prompts=fitted.prompts,
        by_adapter=found.counts(),
        steps=fitted.steps,
        final_loss=fitted.final_loss,
        mean_weights=fitted.mean_weights,
        note=fitted.note,
        seconds=round(time.perf_counter() - started, 3),
    )


def _base(loan: BaseLoan, ref: Any, seed: int) -> Any:
    """The base the adapters' runs gave back, or (none given back: every adapter was passed over) loaded."""
    from dlmstore.train.stages import load_base_model

    if loan.model is not None:
        return loan.model
    loan.loads += 1
    return load_base_model(ref, "lora", "fp32", seed=seed)

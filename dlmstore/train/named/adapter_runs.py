"""``dlm train`` of a document that declares named adapters: each adapter as its own recorded run.

DLM's multi-adapter documents (``training.adapters``) train one LoRA
adapter per name, each on the rows the routing table gives it
(:mod:`dlmstore.document.adapter_routing`). One invocation trains them in
declaration order, each as an ordinary train run of the document's view for
that adapter, so everything a run records is per adapter: its version line
(``adapters.name``), lock record, evaluation (its own val split and probes),
checkpoints and steps; ``runs.adapter`` names it. What the adapters share
is shared, not repeated:

* the tokenize pass goes through the store's cache, so a row two adapters
  train on (untagged prose, every source file) is tokenized once: the
  second adapter's pass finds it cached;
* the base model loads once (:mod:`.base_loan`): each adapter's run
  borrows it and gives it back with its LoRA layers removed.

``--resume`` continues each adapter's own newest interrupted run; an adapter
whose newest run completed on this very document (the interrupted
invocation had trained it already) is passed over, and one the interrupted
invocation never reached trains from the start. ``--nproc`` launches
every rank into this same loop, so the ranks train each adapter together,
in one process group joined before the first adapter and left after the
last (leaving and joining again between adapters could hang on the
rendezvous: it did once, in a fresh clone's suite).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlmstore.document.parser import Document
    from dlmstore.train.distributed import World
    from dlmstore.train.summary import NamedTrainSummary, TrainSummary


def train(path: str, **options: Any) -> TrainSummary | NamedTrainSummary:
    """``dlm train``: :func:`train_named` for a document that declares named adapters, else
    :func:`dlmstore.train.trainer.train_document` (``options`` are its keyword arguments)."""
    from dlmstore.document.parser import parse_document
    from dlmstore.train.trainer import train_document

    document = parse_document(path)
    if document.frontmatter.training.adapters is None:
        return train_document(path, **options)
    return train_named(path, document=document, **options)


def train_named(path: str, *, document: Document | None = None, **options: Any) -> NamedTrainSummary:
    """Train every adapter the document at ``path`` declares, in order, the base loaded once.

    ``options`` are :func:`~dlmstore.train.trainer.train_document`'s.

    Raises:
        TrainingError: the document declares no named adapters; ``--resume``
            finds nothing to resume for any adapter; or what an adapter's run raises
            (the adapters trained before it keep their versions).
    """
    from dlmstore.bases import tokenizers_kept
    from dlmstore.document.adapter_routing import adapter_names
    from dlmstore.document.parser import parse_document
    from dlmstore.errors import TrainingError
    from dlmstore.train.distributed import current_world, join, leave
    from dlmstore.train.named.base_loan import BaseLoan
    from dlmstore.train.summary import NamedTrainSummary
    from dlmstore.train.trainer import train_document

    started = time.perf_counter()
    document = document or parse_document(path)
    names = adapter_names(document)
    if not names:
        raise TrainingError(
            f"{document.path}: the document declares no named adapters (training.adapters)",
            hint="train it with `dlm train DOC`",
        )
    loan = BaseLoan()
    world = current_world()
    join(world)  # one process group for every adapter's run (--nproc), left once at the end
    try:
        plan = (
            _shared_resumption(world, document, names)
            if options.get("resume")
            else dict.fromkeys(names, "fresh")
        )
        skipped = [name for name in names if plan[name] == "skip"]
        with tokenizers_kept():  # each adapter's run loads the base's tokenizer: once is enough
            summaries = [
                train_document(
                    path,
                    **{**options, "resume": plan[name] == "resume"},
                    adapter=name,
                    loan=loan,
                    keep_group=True,
                )
                for name in names
                if plan[name] != "skip"
            ]
    except BaseException:
        leave(world, failed=True)  # as train_document leaves on failure: no barrier
        raise
    leave(world)
    gate = None
    training = document.frontmatter.training
    if training.gate.enabled and world.is_main:
        from dlmstore.train.named.gate_pass import fit_document_gate

        seed = training.seed if options.get("seed") is None else options["seed"]
        gate = fit_document_gate(document, loan, seed=seed)
    warnings = [] if gate is None or gate.note is None else [gate.note]
    if document.frontmatter.training.replay.enabled:
        warnings.append(
            "replay: named adapters train on the document's current rows only (the replay history is kept "
            "per document, not per adapter)"
        )
    return NamedTrainSummary(
        dlm_id=document.dlm_id,
        adapters=summaries,
        skipped=skipped,
        base_loads=loan.loads,
        seconds=round(time.perf_counter() - started, 3),
        warnings=warnings,
        gate=gate,
    )


def _shared_resumption(world: World, document: Document, names: tuple[str, ...]) -> dict[str, str]:
    """Rank 0's :func:`_resumption` on every rank (no other rank opens the store: it may be on another machine)."""
    from dlmstore.errors import DlmError
    from dlmstore.train.distributed import share

    if not world.is_main:
        plan: dict[str, str] = share(world)
        return plan
    try:
        plan = _resumption(document, names)
    except DlmError as exc:
        share(world, error=exc)
        raise
    share(world, plan)
    return plan


def _resumption(document: Document, names: tuple[str, ...]) -> dict[str, str]:
    """What ``--resume`` does with each adapter: ``resume`` its newest interrupted run, ``skip`` it (its
    newest run completed on the document's current bytes: the interrupted invocation trained it), or
    train it ``fresh`` (the interrupted invocation never got to it, or stopped it before its first
    checkpoint).

    Raises:
        TrainingError: no adapter has anything to resume or pass over (what ``--resume`` of a
            one-adapter document says then, for the first adapter), or every adapter is passed over.
    """
    from dlmstore.errors import TrainingError
    from dlmstore.store.database import open_store
    from dlmstore.train.checkpoints import resumable

    plan: dict[str, str] = {}
    first: TrainingError | None = None
    with open_store(document.dlm_id) as store:
        for name in names:
            try:
                resumable(store, before=2**62, adapter=name)
            except TrainingError as exc:
                first = first or exc
                with store.read() as conn:
                    row = conn.execute(
                        "SELECT status, dlm_sha256 FROM runs WHERE command = 'train' AND adapter = ? "
                        "ORDER BY id DESC LIMIT 1",
                        (name,),
                    ).fetchone()
                done = (
                    row is not None and row["status"] == "completed" and row["dlm_sha256"] == document.sha256
                )
                plan[name] = "skip" if done else "fresh"
            else:
                plan[name] = "resume"
    if "resume" not in plan.values():
        if "skip" in plan.values() and "fresh" not in plan.values():
            raise TrainingError(
                f"nothing to resume: the newest train run of every adapter ({', '.join(names)}) completed on "
                "this document",
                hint="start a new run with `dlm train DOC` (without --resume)",
            )
        if "skip" not in plan.values():
            assert first is not None
            raise first
    return plan

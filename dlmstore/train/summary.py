"""What ``dlm train`` returns: the run summary ``dlm train --json`` prints, and its parts."""

from __future__ import annotations

from dataclasses import dataclass, field

from dlmstore.eval.results import PhaseEval
from dlmstore.store.events import TokenizationEvent
from dlmstore.train.data.usage import DatasetUse
from dlmstore.train.plan import TrainingPlan


@dataclass(frozen=True)
class TrainTimings:
    """Seconds spent in each phase of a run (what ``bench/bench_train.py`` prints).

    ``trainer_setup``, ``first_step``, ``train`` and ``save`` add up both
    training phases when a run has two.

    Attributes:
        startup: Parsing, resolving the base, opening the store, the lock check.
        framework_import: Importing torch, transformers, trl, peft and datasets.
        tokenize: Loading the tokenizer and the tokenize pass.
        dataset: Building the training examples (SFT) and the preference columns from the token arrays.
        model_load: Loading the base (and the SFT adapter for ``--phase preference``).
        trainer_setup: LoRA wrapping and TRL's own preparation.
        first_step: The first optimizer step.
        train: All steps, the first included (the val split's evaluations during them left out).
        save: Writing the adapter.
        restore: Loading the checkpoint a resumed run continues from (adapter, optimizer, scheduler, RNG); 0 otherwise.
        evaluate: The val loss during training and the base and adapter evaluated after each phase (val loss, probes).
    """

    startup: float  # parse, resolve, store, lock (ours)
    framework_import: float  # torch, transformers, trl, peft, datasets
    tokenize: float  # tokenizer load + the tokenize pass (ours)
    dataset: float  # training examples and preference columns from the token arrays (ours)
    model_load: float  # from_pretrained of the base (and the SFT adapter for --phase preference)
    trainer_setup: float  # LoRA wrapping and TRL's own preparation
    first_step: float
    train: float  # all steps, the first included
    save: float
    restore: float = 0.0
    evaluate: float = 0.0


@dataclass(frozen=True)
class PhaseSummary:
    """One training phase of a run: what it trained and the adapter it produced.

    ``metrics`` holds the last values TRL logged besides the loss (for the
    preference phase: ``rewards/chosen``, ``rewards/rejected``,
    ``rewards/margins``, ``rewards/accuracies``, ...).

    Attributes:
        phase: ``sft`` or ``preference``.
        method: ``dpo`` or ``orpo`` for the preference phase; null for SFT.
        rows: Rows (SFT) or triples (preference) trained on.
        steps: Optimizer steps: the phase's total, counted from its first step, also when
            ``--resume`` continued it from a checkpoint.
        final_loss: Loss at the last logged step; null when none was logged.
        adapter_version: The adapter version it wrote.
        adapter_sha256: sha256 of that adapter's ``adapter_model.safetensors``.
        parent_version: The adapter the preference phase started from; null for SFT.
        metrics: The last values TRL logged besides the loss.
        steps_this_run: The steps this invocation trained: ``steps`` less the checkpoint's step
            when ``--resume`` continued the phase, else ``steps``.
        evaluation: The base and this phase's adapter on the val split and the probes, and how the phase used its val split.
    """

    phase: str  # sft | preference
    method: str | None  # dpo | orpo for the preference phase
    rows: int
    steps: int
    final_loss: float | None
    adapter_version: int
    adapter_sha256: str
    parent_version: int | None
    metrics: dict[str, float] = field(default_factory=dict)
    steps_this_run: int = 0
    evaluation: PhaseEval | None = None


@dataclass(frozen=True)
class ReplaySummary:
    """What a train run replayed from the store's replay history (``dlm replay show`` lists it).

    Attributes:
        generation: The version of the document the run trained (history_generations).
        sft_candidates: History rows the document no longer holds that SFT could replay.
        preference_candidates: Preference triples the preference phase could replay.
        rows_drawn: SFT rows replayed (train split only).
        triples_drawn: Preference triples replayed.
        draw_sha256: The draw's identity (the lock records it too).
        retention_rows: Rows of the retention slice the adapters' loss was measured on.
        retained_probes: Probes of earlier versions asked beside the document's.
        skipped: Why the run drew nothing: ``--no-replay``; null when it drew.
    """

    generation: int
    sft_candidates: int
    preference_candidates: int
    rows_drawn: int
    triples_drawn: int
    draw_sha256: str
    retention_rows: int
    retained_probes: int
    skipped: str | None = None


@dataclass(frozen=True)
class TrainSummary:
    """The JSON shape of ``dlm train --json``.

    The top-level adapter, steps and loss are those of the run's last
    phase (the adapter ``dlm prompt`` uses); ``phases`` has each phase.

    Attributes:
        run_id: The run recorded (see ``dlm metrics``).
        dlm_id: The document id.
        adapter_version: The last phase's adapter version (what ``dlm prompt`` uses).
        adapter_path: Its folder.
        adapter_sha256: sha256 of its ``adapter_model.safetensors``.
        steps: The last phase's optimizer steps.
        final_loss: The last phase's final loss; null when none was logged.
        rows_trained: Rows SFT trained on (0 without an SFT phase).
        tokens: Tokens of those rows.
        val_rows: Rows of the document held out for validation (``dlmstore.eval.split``).
        preference_rows: Preference rows in the document.
        phases: Each phase the run trained, in order.
        tokenization: The run's tokenize pass.
        lock_decision: What happened to ``dlm.lock``: ``written``, ``updated`` or ``ignored``.
        lock_warnings: Differences from the previous lock that were allowed with a warning.
        plan: Every training setting, resolved.
        timings: Seconds spent in each stage of the run.
        datasets: The token datasets mixed in (``training.datasets``, ``--dataset``) and how much of each was used.
        world_size: Processes the run trained on (``--nproc``).
        resumed_from: The interrupted run this one continued (``--resume``); null otherwise.
        resumed_at_step: The step of the checkpoint it continued from; null otherwise.
        warnings: Other warnings (also printed on stderr).
        replay: What the run replayed from the store's replay history; null when
            ``training.replay.enabled`` is false.
        adapter: The named adapter the run trained (``training.adapters``); null for a document's one adapter.
    """

    run_id: int
    dlm_id: str
    adapter_version: int
    adapter_path: str
    adapter_sha256: str
    steps: int
    final_loss: float | None
    rows_trained: int
    tokens: int
    val_rows: int
    preference_rows: int
    phases: list[PhaseSummary]
    tokenization: TokenizationEvent
    lock_decision: str
    lock_warnings: list[str]
    plan: TrainingPlan
    timings: TrainTimings
    datasets: list[DatasetUse] = field(default_factory=list)
    world_size: int = 1
    resumed_from: int | None = None
    resumed_at_step: int | None = None
    warnings: list[str] = field(default_factory=list)
    replay: ReplaySummary | None = None
    adapter: str | None = None


@dataclass(frozen=True)
class GateSummary:
    """The gate a ``dlm train`` of a gated document fitted (``dlm train --json``'s ``gate``).

    Attributes:
        id: Its row in ``gates``.
        path: Its folder, relative to the store (``gate/run<N>``).
        mode: ``trained``, or ``uniform`` when an adapter had fewer prompts than the cold-start floor.
        sha256: sha256 of ``gate.safetensors``; null when uniform.
        prompts: The routed sections' prompts it was fitted on.
        by_adapter: How many of them each adapter had.
        steps: Optimizer steps (0 when uniform).
        final_loss: Its loss at the last step; null when uniform.
        mean_weights: Its mean output over the training prompts, by adapter (``dlm export``'s static mix).
        note: Why it is uniform; null when trained.
        seconds: Embedding the prompts, fitting and writing it.
    """

    id: int
    path: str
    mode: str
    sha256: str | None
    prompts: int
    by_adapter: dict[str, int]
    steps: int
    final_loss: float | None
    mean_weights: dict[str, float]
    note: str | None
    seconds: float


@dataclass(frozen=True)
class NamedTrainSummary:
    """The JSON shape of ``dlm train --json`` for a document that declares named adapters.

    Attributes:
        dlm_id: The document id.
        adapters: Each named adapter's run, in declaration order: the run summary of a one-adapter
            document, with its ``adapter``.
        skipped: Adapters ``--resume`` passed over: their newest run completed on this document, and
            nothing of theirs was interrupted.
        base_loads: Times the base model was read from disk (1: once per invocation, whatever the
            number of adapters; more when the adapters' kinds need it loaded differently).
        seconds: The whole invocation, in seconds.
        warnings: Warnings about the document as a whole (each run's own are in its summary).
        gate: The learned gate fitted after the adapters (``training.gate.enabled``); null without one.
    """

    dlm_id: str
    adapters: list[TrainSummary]
    skipped: list[str]
    base_loads: int
    seconds: float
    warnings: list[str] = field(default_factory=list)
    gate: GateSummary | None = None

"""``dlm train``: LoRA adapters from a document's rows, as one recorded run.

A run has up to two phases (``dlmstore.train.phases`` decides which): SFT
on the text and instruction rows, then the preference phase (DPO or ORPO,
``dlmstore.train.loops.preference``) on the prompt/chosen/rejected rows, starting
from the adapter SFT produced. The pipeline is a short run of named stages
(``dlmstore.train.stages``), each taking and returning typed values, each
step timed (the split ``bench/bench_train.py`` and
``bench/bench_preference.py`` print):

1. **startup** - parse the document, resolve the base model (a missing or
   unloadable base is an error before any work), check the training
   settings against this machine (``dlmstore.train.plan``: QLoRA without
   CUDA, an optimizer's missing package or a precision the device cannot
   train in is an error before any work too), open the store, validate the
   reproducibility lock (``dlmstore.lock``);
2. **tokenize** - the same pass as ``dlm tokenize`` (through the cache unless
   ``--no-cache``), recorded as this run's tokenization event; preference
   rows are tokenized there too;
3. **dataset** - the SFT phase's examples are views of the token arrays
   and of the token datasets' memory maps (``dlmstore.train.data.examples``: no
   per-token Python objects, no Arrow copy); the preference phase's columns
   are computed from the cached token arrays (``dlmstore.train.data.preference_data``),
   so TRL tokenizes nothing. The phases are decided here, and a preference
   row that cannot train (a prompt longer than ``sequence_len``, chosen
   equal to rejected) or a token dataset that cannot
   (``dlmstore.train.data.inputs``) is an error, all before the model loads;
4. **model load** - the base model from its converted folder, in the
   plan's precision, once for both phases; the rest of the plan (the
   automatic micro-batch needs the parameter count) is resolved;
5. **train** - transformers' ``Trainer`` with our loader and checkpoints
   (``dlmstore.train.loops.supervised``; LoRA or DoRA applied through peft),
   then TRL's ``DPOTrainer`` or ORPO trainer on the same model; every
   logged step goes to ``train_steps`` with its phase, and the other
   values TRL logs (the preference rewards) to ``train_step_metrics``;
6. **save** - each phase's adapter is checked finite
   (``dlmstore.train.loops.integrity``) and staged as soon as its phase ends;
   when every phase has trained, the staged folders are published as the
   next versions and registered with their sha256 and phase in the same
   transaction that records the lock and writes ``dlm.lock``
   (``dlmstore.train.adapters``, ``dlmstore.lock.commit_lock``). A run
   registers all its adapters and its lock, or nothing.

A run starts by sweeping what earlier runs that are no longer running
left behind (``dlmstore.train.adapters.sweep_debris``). A logged loss or
gradient norm that is not finite stops the run at that step.

Seeds (python, numpy, torch, the trainer's data order) and the deterministic
flags are set before the model is built and again before the preference
phase, so two runs with the same inputs on the same machine produce
byte-identical ``adapter_model.safetensors`` (``tests/test_training.py``,
``tests/test_preference_training.py`` and the golden test check this).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dlmstore.train import stages
from dlmstore.train.stages import Options, Prepared, Setup

if TYPE_CHECKING:
    from dlmstore.train.adapters import AdapterVersion
    from dlmstore.train.data.usage import DatasetUse
    from dlmstore.train.distributed import World
    from dlmstore.train.named.base_loan import BaseLoan
    from dlmstore.train.stages import Begun, Tokenized, Trained
    from dlmstore.train.summary import ReplaySummary, TrainSummary


def train_document(
    path: str,
    *,
    phase: str = "all",
    no_cache: bool = False,
    max_steps: int | None = None,
    epochs: int | None = None,
    seed: int | None = None,
    lock_mode: str = "validate",
    datasets: Sequence[str] = (),
    resume: bool = False,
    fresh: bool = False,
    no_share: bool = False,
    no_replay: bool = False,
    adapter: str | None = None,
    loan: BaseLoan | None = None,
    keep_group: bool = False,
) -> TrainSummary:
    """Train a LoRA adapter on the document at ``path``: SFT, then the preference phase.

    Args:
        path: the .dlm document.
        phase: ``all`` (default), ``sft`` or ``preference`` (``--phase``;
            the rules are in ``dlmstore.train.phases``).
        no_cache: tokenize every row, neither reading nor writing the cache.
        max_steps, epochs, seed: override ``training.max_steps`` /
            ``training.num_epochs`` / ``training.seed`` (``max_steps`` caps
            each phase; ``epochs`` is SFT's, the preference phase has its own).
        lock_mode: ``validate`` (default), ``strict``, ``update`` or ``ignore``
            (``--strict-lock`` / ``--update-lock`` / ``--ignore-lock``).
        datasets: ``DIR[:WEIGHT]`` token datasets to train on besides
            ``training.datasets`` (``--dataset``).
        resume: continue the newest train run that stopped with
            checkpoints from its newest one whose files verify (``--resume``).
        fresh: start over (``--fresh``): once this run completes, the
            checkpoints of interrupted runs are removed; without it they are
            kept, so ``--resume`` can still continue them.
        no_share: tokenize the rows the store misses here, even when another
            store of the home holds their tokens (``--no-share``).
        no_replay: draw nothing from the replay history (``--no-replay``):
            the run trains on the document's current rows only.
        adapter: the named adapter (``training.adapters``) to train, on
            the rows routed to it; a multi-adapter document needs one
            (``dlmstore.train.named.adapter_runs.train_named`` trains them all).
        loan: the base model lent to each named adapter's run in turn
            (``dlmstore.train.named.base_loan``); None loads it here.
        keep_group: under ``--nproc``, stay in the process group when the
            run succeeds: the caller leaves it (``train_named`` trains every
            adapter in one group; leaving and joining again between them
            could hang on the rendezvous).

    Launched as one of several ranks (``dlm train --nproc``, torchrun),
    rank 0 does everything that touches the store and every rank trains on
    its share (``dlmstore.train.distributed``); every rank returns the
    summary.

    Progress (``dlmstore.progress``): the tokenize pass, the model load and
    each phase's steps report as tasks to the sink installed by the caller.

    Raises:
        DocumentError, SourceError: the document or its sources are invalid.
        BaseModelError: the base model cannot be resolved or loaded.
        LockValidationError: the runtime differs from the lock in an ERROR field.
        StoreError: the store or the adapter cannot be written.
        TrainingError: the document has nothing to train on for the phases
            asked, the preference phase has no SFT adapter to start from or
            a preference row cannot train, the settings ask for what this
            machine cannot train (``dlmstore.train.plan.check_settings``), a
            token dataset cannot train (``dlmstore.train.data.inputs``), or there
            is no checkpoint to resume, none that verifies, one that cannot
            be loaded, or it belongs to another setup.
    """
    from dlmstore.train.distributed import current_world, join, leave

    options = Options(
        phase=phase, no_cache=no_cache, max_steps=max_steps, epochs=epochs, seed=seed,
        lock_mode=lock_mode, datasets=datasets, resume=resume, fresh=fresh, no_share=no_share,
        no_replay=no_replay,
    )  # fmt: skip
    world = current_world()
    join(world)
    try:
        setup = stages.resolve(path, options, adapter=adapter)
        if setup.document.adapter is None and setup.settings.adapters is not None:
            from dlmstore.errors import TrainingError

            raise TrainingError(
                f"{setup.document.path}: the document declares named adapters "
                f"({', '.join(setup.settings.adapters)}); each trains on its own rows",
                hint="train it with `dlm train DOC`, which trains every declared adapter",
            )
        if world.is_main:
            summary = _lead(setup, options, world, loan)
        else:
            summary = _follow(setup, options, world, loan)
    except BaseException:
        leave(world, failed=True)  # no barrier: a peer may be stuck in a collective this rank left
        raise
    if not keep_group:
        leave(world)
    return summary


def _lead(setup: Setup, options: Options, world: World, loan: BaseLoan | None) -> TrainSummary:
    """Rank 0: run the whole pipeline in a recorded run, and hand the other ranks what they need."""
    from dlmstore.errors import DlmError
    from dlmstore.store.database import open_store
    from dlmstore.store.runs import recorded_run
    from dlmstore.train.data.usage import gather_accounting, record_usage, write_rank_samples
    from dlmstore.train.distributed import mirror, peers_answering, share

    document = setup.document
    base = stages.locate(setup)
    with open_store(document.dlm_id) as store:
        with recorded_run(
            store, command="train", dlm_path=document.path, dlm_sha256=document.sha256, world_size=world.size,
            adapter=document.adapter,
        ) as run_id:  # fmt: skip
            try:
                begun = stages.begin(store, run_id, setup, base, options, world)
                tokenized = stages.tokenize(store, run_id, setup, base, begun.tokenizer, options)
                prepared = stages.prepare(store, run_id, setup, begun, tokenized, options)
            except DlmError as exc:
                share(world, error=exc)
                raise
            share(world, prepared)
            with peers_answering(world):
                mirror(world, store.path, _store_folders(prepared), store.path)
                trained = stages.train_phases(store, prepared, setup, begun.tokenizer, world, options, loan)
                per_rank = gather_accounting(world, trained.accounting)
            write_rank_samples(store.path, run_id, per_rank)
            uses = record_usage(store, run_id, prepared.inputs, per_rank)
            adapters, kept = stages.publish(store, trained, begun.lock, setup, prepared, options, tokenized)
    summary = _summarize(setup, begun, tokenized, prepared, trained, adapters, uses, world, kept)
    share(world, summary)
    return summary


def _follow(setup: Setup, options: Options, world: World, loan: BaseLoan | None) -> TrainSummary:
    """Every other rank: train on its share of what rank 0 prepared, and return rank 0's summary.

    It never opens the store, which may be on another machine: what it
    needs of it (the checkpoint resumed, the adapters a phase starts from or
    is compared with) arrives from rank 0 (:func:`~.distributed.mirror`)
    into a private folder standing for the store, where its own checkpoint
    files are written too before rank 0 collects them; the folder goes when
    the run ends.
    """
    import dataclasses
    import shutil
    import tempfile
    from pathlib import Path

    from dlmstore.bases import load_tokenizer
    from dlmstore.train.data.inputs import local_inputs
    from dlmstore.train.data.usage import gather_accounting
    from dlmstore.train.distributed import mirror, peers_answering, share

    prepared: Prepared = share(world)
    scratch = Path(tempfile.mkdtemp(prefix=f"dlm-rank{world.rank}-"))
    try:
        with peers_answering(world):
            # a dataset in a bucket: this node's copy (the first rank of a node to ask downloads it)
            prepared = dataclasses.replace(prepared, inputs=local_inputs(prepared.inputs))
            mirror(world, prepared.store_path, _store_folders(prepared), scratch)
            prepared = _standing_in(prepared, scratch)
            tokenizer = load_tokenizer(setup.ref)
            trained = stages.train_phases(None, prepared, setup, tokenizer, world, options, loan)
            gather_accounting(world, trained.accounting)
            summary: TrainSummary = share(world)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return summary


def _store_folders(prepared: Prepared) -> list[Path]:
    """The folders of rank 0's store every other rank reads: the checkpoint resumed, the adapters used."""
    folders = [] if prepared.resume is None else [prepared.resume.path]
    if prepared.parent is not None:
        folders.append(prepared.store_path / prepared.parent.path)
    folders += [prepared.store_path / version.path for version in prepared.previous.values()]
    return folders


def _standing_in(prepared: Prepared, scratch: Path) -> Prepared:
    """``prepared`` with ``scratch`` (holding what :func:`_store_folders` named) standing for the store."""
    import dataclasses

    resume = prepared.resume
    if resume is not None:
        resume = dataclasses.replace(resume, path=scratch / resume.path.relative_to(prepared.store_path))
    return dataclasses.replace(prepared, store_path=scratch, resume=resume)


def _summarize(
    setup: Setup,
    begun: Begun,
    tokenized: Tokenized,
    prepared: Prepared,
    trained: Trained,
    adapters: list[AdapterVersion],
    uses: list[DatasetUse],
    world: World,
    kept: list[str],
) -> TrainSummary:
    """What ``dlm train`` returns (and ``--json`` prints): the run, each phase, the timings."""
    from dlmstore.corpus.show import document_warnings
    from dlmstore.train.summary import PhaseSummary, TrainSummary, TrainTimings

    fits, phases, rows, preferences = trained.fits, prepared.phases, prepared.rows, prepared.preferences
    evaluations = {item.phase: item for item in trained.evaluations}
    last, final = fits[-1], adapters[-1]
    resumed_at = 0 if prepared.resume is None else prepared.resume.step  # --resume continues the SFT phase
    summaries = [
        PhaseSummary(
            phase=fit.phase,
            method=fit.method,
            rows=len(rows) if fit.phase == "sft" else len(preferences),
            steps=fit.steps,
            final_loss=fit.final_loss,
            adapter_version=adapter.version,
            adapter_sha256=adapter.sha256,
            parent_version=adapter.parent_version,
            metrics=fit.metrics,
            steps_this_run=fit.steps - (resumed_at if fit.phase == "sft" else 0),
            evaluation=evaluations.get(fit.phase),
        )  # fmt: skip
        for fit, adapter in zip(fits, adapters, strict=True)
    ]
    return TrainSummary(
        run_id=prepared.run_id,
        dlm_id=setup.document.dlm_id,
        adapter_version=final.version,
        adapter_path=str(prepared.store_path / final.path),
        adapter_sha256=final.sha256,
        steps=last.steps,
        final_loss=last.final_loss,
        rows_trained=len(rows) if phases.sft else 0,
        tokens=rows.token_count if phases.sft else 0,
        val_rows=0 if prepared.val_rows is None else len(prepared.val_rows),
        preference_rows=len(preferences),
        phases=summaries,
        tokenization=tokenized.result.event,
        lock_decision=begun.lock.decision.decision,
        lock_warnings=list(begun.lock.warnings),
        plan=trained.plan,
        timings=TrainTimings(
            startup=round(begun.startup, 3),
            framework_import=round(setup.framework_import, 3),
            tokenize=round(tokenized.seconds, 3),
            dataset=round(sum(f.dataset_seconds for f in fits), 3),
            model_load=round(trained.model_load, 3),
            trainer_setup=round(sum(f.trainer_setup for f in fits), 3),
            first_step=round(sum(f.first_step for f in fits), 3),
            train=round(sum(f.train for f in fits), 3),
            save=round(sum(f.save_seconds for f in fits), 3),
            restore=round(sum(f.restore_seconds for f in fits), 3),
            evaluate=round(sum(f.eval_seconds for f in fits), 3),
        ),
        datasets=uses,
        world_size=world.size,
        resumed_from=prepared.resumed_from,
        resumed_at_step=None if prepared.resume is None else prepared.resume.step,
        warnings=[
            *document_warnings(setup.document),
            *tokenized.source_warnings,
            *tokenized.result.warnings,
            *phases.warnings,
            *begun.warnings,
            *prepared.warnings,
            *kept,
        ],  # fmt: skip
        replay=_replay_summary(prepared),
        adapter=setup.document.adapter,
    )


def _replay_summary(prepared: Prepared) -> ReplaySummary | None:
    """What the run replayed, as its summary reports it."""
    from dlmstore.train.summary import ReplaySummary

    replay = prepared.replay
    if replay is None:
        return None
    rows = len(replay.rows("sft"))
    return ReplaySummary(
        generation=replay.generation, sft_candidates=replay.sft_candidates,
        preference_candidates=replay.preference_candidates, rows_drawn=rows,
        triples_drawn=len(replay.drawn) - rows, draw_sha256=replay.draw_sha256,
        retention_rows=len(replay.retention), retained_probes=len(replay.retained_probes), skipped=replay.skipped,
    )  # fmt: skip

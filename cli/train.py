"""``dlm train PATH``: train a LoRA adapter on the document's rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from .lock import lock_mode_options
from .params import SEED, DatasetText, LocalPath
from .render import emit_json, human_bytes, json_option, plural, warn

if TYPE_CHECKING:
    from dlmstore.eval.results import ModelEval, PhaseEval
    from dlmstore.train.launch import Nodes
    from dlmstore.train.summary import NamedTrainSummary, TrainSummary


@click.command("train")
@click.argument("path", type=LocalPath(dir_okay=False))
@click.option(
    "--phase",
    type=click.Choice(["all", "sft", "preference"]),
    default="all",
    show_default=True,
    help="Train SFT, the preference phase (DPO/ORPO on the newest SFT adapter), or SFT then preference.",
)
@click.option("--no-cache", is_flag=True, help="Tokenize every row; neither read nor write cache entries.")
@click.option(
    "--no-share",
    is_flag=True,
    help="Tokenize the rows this store misses here, even when another store of the home holds their "
    "tokens (training.cache.share: false does the same).",
)
@click.option(
    "--no-replay",
    is_flag=True,
    help="Train on the document's current rows only: draw nothing from the replay history (the run "
    "is still recorded in it, and retention is still measured).",
)
@click.option("--max-steps", type=click.IntRange(min=1), help="Override training.max_steps.")
@click.option("--epochs", type=click.IntRange(min=1), help="Override training.num_epochs.")
@click.option("--seed", type=SEED, help="Override training.seed.")
@click.option(
    "--dataset",
    "datasets",
    multiple=True,
    type=DatasetText(),
    metavar="DIR[:WEIGHT]",
    help="Also train on this token dataset (`dlm data build`; a folder, or s3://bucket/prefix read through "
    "this node's cache), mixed by WEIGHT (default 1; the document's rows weigh 1). Repeatable; adds to "
    "training.datasets.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the newest interrupted train run from its last checkpoint whose files verify.",
)
@click.option(
    "--fresh",
    is_flag=True,
    help="Start over: train from the first step, and once this run completes remove the checkpoints of "
    "interrupted runs (without it they are kept for --resume).",
)
@click.option(
    "--nproc",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Train data-parallel on this many processes of this machine (gloo on CPU, NCCL on CUDA).",
)
@click.option(
    "--nnodes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Train on this many machines, each running the same `dlm train` with its own --node-rank and "
    "--nproc processes (torchrun's static rendezvous).",
)
@click.option(
    "--node-rank",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="With --nnodes: this machine's place, 0 to N-1. Node 0 runs rank 0, which alone writes the store.",
)
@click.option(
    "--master-addr",
    metavar="HOST",
    help="With --nnodes: the address of node 0, where every rank meets rank 0.",
)
@click.option(
    "--master-port",
    type=click.IntRange(min=1, max=65535),
    help="With --nnodes: the TCP port of node 0 where rank 0 listens (the same on every node).",
)
@click.option(
    "--watch",
    is_flag=True,
    help="After the run, keep watching the document and its training.sources: each save that changes "
    "a row trains a run of at most --watch-max-steps steps. Ctrl-C ends it.",
)
@click.option(
    "--watch-debounce-ms",
    type=click.IntRange(min=0),
    default=400,
    show_default=True,
    help="With --watch: how long no save must come after one before its run starts.",
)
@click.option(
    "--watch-max-steps",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="With --watch: the most steps of each run after the first.",
)
@lock_mode_options
@json_option("dlmstore.train.summary:TrainSummary", help="Print the run summary as JSON.")
@click.pass_context
def train_command(
    ctx: click.Context, path: str, phase: str, no_cache: bool, no_share: bool, no_replay: bool,
    max_steps: int | None,
    epochs: int | None, seed: int | None, datasets: tuple[str, ...], resume: bool, fresh: bool, nproc: int,
    nnodes: int, node_rank: int, master_addr: str | None, master_port: int | None, watch: bool, watch_debounce_ms: int, watch_max_steps: int, lock_mode: str, as_json: bool,
) -> None:  # fmt: skip
    """Train a LoRA adapter on the rows of the document at PATH.

    SFT (transformers' Trainer, batches padded by TRL's collator) trains on
    prose, instruction and source rows; then,
    when the document has ::preference:: sections, the preference phase
    (DPO or ORPO, training.preference.method) trains the same adapter on
    them. Rows come pre-tokenized from the cache. Each phase's adapter is
    written to adapter/versions/vNNNN beside store.db, and the run, its
    per-step metrics and its reproducibility lock (dlm.lock) are recorded
    in the store.

    Token datasets (training.datasets, --dataset) are mixed in by weight.
    A run writes a checkpoint into the store every training.checkpoint_steps
    steps, with the sha256 of each of its files; --resume verifies them and
    continues the newest interrupted run from its last sound checkpoint. An
    interrupted run's checkpoints are kept until it is resumed to the end or
    a run started with --fresh completes. --nproc N trains on N processes,
    each on its own share of every epoch; --nnodes M --node-rank I
    --master-addr A --master-port P, run on each of M machines, trains on
    M*N processes (rank 0 on node 0 alone writes the store). --resume
    continues on another number of processes as well, at the same global
    batch.

    --watch keeps going after the run: each save of the document or of a
    file under its training.sources starts a run of at most
    --watch-max-steps steps through the cache, and a save that changes no
    row is skipped with one line (docs/training.md, "Watch mode").
    """
    if resume and fresh:
        raise click.UsageError("--resume and --fresh cannot be combined; pass one of them")
    _check_watch_options(ctx, watch, nproc * nnodes, as_json)
    nodes = _nodes(nnodes, node_rank, master_addr, master_port)
    from dlmstore.torch_loader import require_torch

    if nproc > 1 or nnodes > 1:
        require_torch("dlm train --nproc starts its ranks with torch's launcher")
        from dlmstore.train.launch import launch

        arguments = (
            _rank_arguments(
                path, phase, no_cache, max_steps, epochs, seed, datasets, resume, fresh, lock_mode, as_json
            )
            + (["--no-share"] if no_share else [])
            + (["--no-replay"] if no_replay else [])
        )
        ctx.exit(launch(arguments, nproc, document=path, nodes=nodes))
    from dlmstore.train.threads import configure

    configure()  # threads and how they wait, before torch is imported (its pool reads them once)
    require_torch("dlm train trains the adapter in torch")
    from dlmstore.train.distributed import current_world
    from dlmstore.train.named.adapter_runs import train

    from .progress import progress_shown

    if watch:
        options = {
            "phase": phase, "no_cache": no_cache, "max_steps": max_steps, "epochs": epochs, "seed": seed,
            "lock_mode": lock_mode, "datasets": datasets, "resume": resume, "fresh": fresh,
            "no_share": no_share, "no_replay": no_replay,
        }  # fmt: skip
        _watch(path, watch_debounce_ms, watch_max_steps, options)
        return
    world = current_world()
    with progress_shown(as_json=as_json or not world.is_main):  # only rank 0 reports
        summary = train(
            path, phase=phase, no_cache=no_cache, max_steps=max_steps, epochs=epochs, seed=seed,
            lock_mode=lock_mode, datasets=datasets, resume=resume, fresh=fresh, no_share=no_share,
            no_replay=no_replay,
        )  # fmt: skip
    if world.is_main:
        _print_summary(summary, as_json)
    if world.distributed:
        from dlmstore.train.distributed import exit_rank

        exit_rank()


def _check_watch_options(ctx: click.Context, watch: bool, nproc: int, as_json: bool) -> None:
    """--watch's usage errors: its options without it, and what it cannot be combined with."""
    from click.core import ParameterSource

    if not watch:
        for name in ("watch_debounce_ms", "watch_max_steps"):
            if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
                flag = "--" + name.replace("_", "-")
                raise click.UsageError(f"{flag} only applies with --watch; add --watch or leave {flag} out")
        return
    if nproc > 1:
        raise click.UsageError("--watch trains in this process; leave out --nproc and --nnodes")
    if as_json:
        raise click.UsageError("--watch prints a line per run, not JSON; leave out --json")


def _nodes(nnodes: int, node_rank: int, master_addr: str | None, master_port: int | None) -> Nodes:
    """--nnodes and its companions, checked: usage errors (exit 2) for what cannot rendezvous."""
    from dlmstore.train.launch import Nodes

    if nnodes == 1:
        for flag, value in (("--node-rank", node_rank or None), ("--master-addr", master_addr),
                            ("--master-port", master_port)):  # fmt: skip
            if value is not None:
                raise click.UsageError(f"{flag} only applies with --nnodes 2 or more; leave it out")
        return Nodes()
    if node_rank >= nnodes:
        raise click.UsageError(f"--node-rank {node_rank} is outside --nnodes {nnodes} (0 to {nnodes - 1})")
    if master_addr is None or not master_addr.strip():
        raise click.UsageError(
            f"--nnodes {nnodes} needs --master-addr, the address of node 0 (the same on every node)"
        )
    if master_port is None:
        raise click.UsageError(
            f"--nnodes {nnodes} needs --master-port, a free TCP port of node 0 (the same on every node)"
        )
    return Nodes(count=nnodes, rank=node_rank, master_addr=master_addr.strip(), master_port=master_port)


def _watch(path: str, debounce_ms: int, max_steps: int, options: dict[str, Any]) -> None:
    """The first run's summary, then a line as each save's run starts and one as it ends; until Ctrl-C."""
    from dlmstore.watch.cycles import watch_document

    from .progress import progress_shown
    from .render import printable

    with progress_shown(as_json=False):
        for cycle in watch_document(path, debounce_ms=debounce_ms, max_steps=max_steps, options=options):
            if cycle.number == 0:
                if cycle.summary is not None:
                    _print_summary(cycle.summary, False)
                    click.echo(f"watching {path} and its sources; Ctrl-C stops", err=True)
                continue
            head = f"cycle {cycle.number}: {_saved(cycle.saved)}"
            if cycle.stage == "skipped":
                click.echo(f"{head}: no row changed ({plural(cycle.rows, 'row')}), skipped")
            elif cycle.stage == "failed":
                click.echo(f"error: {printable(cycle.error or '')}", err=True)
                if cycle.hint:
                    click.echo(f"hint: {printable(cycle.hint)}", err=True)
            elif cycle.stage == "training":
                click.echo(f"{head}: {plural(cycle.added, 'row')} added, {cycle.removed} removed; training",
                           err=True)  # fmt: skip
            elif cycle.summary is not None:
                from dlmstore.train.summary import NamedTrainSummary

                named = isinstance(cycle.summary, NamedTrainSummary)
                runs = (
                    cycle.summary.adapters
                    if isinstance(cycle.summary, NamedTrainSummary)
                    else [cycle.summary]
                )
                for summary in runs:
                    sft = next((part for part in summary.phases if part.phase == "sft"), summary.phases[-1])
                    loss = "n/a" if sft.final_loss is None else f"{sft.final_loss:.4f}"
                    for message in [*summary.warnings, *summary.lock_warnings]:
                        warn(message)
                    rows = f"adapter {summary.adapter}" if named else plural(cycle.rows, "row")
                    click.echo(f"{head}: run {summary.run_id}: {plural(sft.steps_this_run, 'step')} on "
                               f"{rows}, final loss {loss} -> v{summary.adapter_version:04d} "
                               f"in {cycle.seconds:.1f} s")  # fmt: skip


def _saved(paths: tuple[str, ...]) -> str:
    """``doc.dlm saved`` / ``3 files saved``."""
    import os

    if len(paths) == 1:
        return f"{os.path.basename(paths[0])} saved"
    return f"{plural(len(paths), 'file')} saved"


def _print_summary(summary: TrainSummary | NamedTrainSummary, as_json: bool) -> None:
    """What rank 0 prints when the run is done: the summary as JSON, or as lines (a run per named adapter)."""
    from dlmstore.train.summary import NamedTrainSummary

    runs = summary.adapters if isinstance(summary, NamedTrainSummary) else [summary]
    for message in [
        *(summary.warnings if isinstance(summary, NamedTrainSummary) else []),
        *(line for run in runs for line in [*run.warnings, *run.lock_warnings]),
    ]:
        warn(message)
    if as_json:
        emit_json(summary)
        return
    if not isinstance(summary, NamedTrainSummary):
        _print_run(summary)
        return
    for run in summary.adapters:
        click.echo(f"adapter {run.adapter}:")
        _print_run(run)
    gate = summary.gate
    if gate is not None:
        mix = ", ".join(f"{name} {weight:.2f}" for name, weight in gate.mean_weights.items())
        if gate.mode == "uniform":
            click.echo(f"gate:    uniform ({mix}) -> {gate.path}")
        else:
            loss = "n/a" if gate.final_loss is None else f"{gate.final_loss:.4f}"
            click.echo(f"gate:    {plural(gate.steps, 'step')} on {plural(gate.prompts, 'prompt')}, final loss "
                       f"{loss}, mean weights {mix} -> {gate.path}")  # fmt: skip
    if summary.skipped:
        click.echo(
            f"skipped: {', '.join(summary.skipped)} (trained on this document already; nothing to resume)"
        )
    click.echo(
        f"base:    loaded {plural(summary.base_loads, 'time')} for {plural(len(summary.adapters), 'adapter')}"
    )


def _print_run(summary: TrainSummary) -> None:
    """One run's lines: each phase and its evaluation, what it mixed in and replayed, its adapter."""
    event = summary.tokenization
    rate = "n/a" if event.hit_rate is None else f"{event.hit_rate:.1%}"
    for part in summary.phases:
        loss = "n/a" if part.final_loss is None else f"{part.final_loss:.4f}"
        if part.phase == "sft":
            steps = plural(part.steps, "step")
            if part.steps_this_run != part.steps:  # --resume: this run trained those after the checkpoint
                steps = f"{part.steps_this_run} of {steps} (from step {part.steps - part.steps_this_run + 1})"
            click.echo(f"run {summary.run_id} sft: {steps} on {plural(part.rows, 'row')} "
                       f"({plural(summary.tokens, 'token')}), final loss {loss} -> v{part.adapter_version:04d}")  # fmt: skip
        else:
            rewards = _rewards(part.metrics)
            click.echo(f"run {summary.run_id} preference ({part.method}): {plural(part.steps, 'step')} on "
                       f"{plural(part.rows, 'triple')}, final loss {loss}{rewards} -> v{part.adapter_version:04d}")  # fmt: skip
        if part.evaluation is not None:
            _print_evaluation(part.evaluation)
    for use in summary.datasets:
        click.echo(f"dataset: {use.path} ({use.kind}, weight {use.weight:g}): {plural(use.samples, 'item')}, "
                   f"{plural(use.tokens, 'token')}")  # fmt: skip
    replay = summary.replay
    if replay is not None and (replay.sft_candidates or replay.preference_candidates):
        candidates = replay.sft_candidates + replay.preference_candidates
        if replay.skipped is not None:
            click.echo(
                f"replay:  off ({replay.skipped}): {plural(candidates, 'row')} of earlier versions left out"
            )
        else:
            drawn = plural(replay.rows_drawn, "row")
            if replay.triples_drawn:
                drawn += f" and {plural(replay.triples_drawn, 'triple')}"
            click.echo(f"replay:  {drawn} of earlier versions (of {plural(candidates, 'candidate')}), "
                       f"generation {replay.generation}")  # fmt: skip
    if summary.world_size > 1:
        click.echo(f"ranks:   {summary.world_size} processes")
    if summary.resumed_from is not None:
        click.echo(f"resumed: run {summary.resumed_from} from step {summary.resumed_at_step}")
    click.echo(f"adapter: v{summary.adapter_version:04d} {summary.adapter_path}")
    click.echo(f"sha256:  {summary.adapter_sha256}")
    click.echo(f"cache:   {plural(event.cache_hits, 'hit')}, {plural(event.cache_misses, 'miss', 'misses')} ({rate}), "
               f"{human_bytes(event.cache_bytes_after)} cached")  # fmt: skip
    click.echo(f"lock:    {summary.lock_decision}")


def _print_evaluation(evaluation: PhaseEval) -> None:
    """A phase's val loss, base -> adapter, with its best step and early stopping; its probes, base -> adapter."""
    base, adapter, stop = evaluation.base, evaluation.adapter, evaluation.early_stop
    if adapter.val_loss is None:
        click.echo("  val:    no rows held out")
    else:
        line = f"loss {_number(base.val_loss, '.4f')} -> {adapter.val_loss:.4f} ({plural(adapter.val_rows, 'row')})"
        if stop is not None and stop.best_val_loss is not None:
            line += f", best {stop.best_val_loss:.4f} at step {stop.best_step}"
        if stop is not None and stop.stopped_at is not None:
            line += f"; early stopping at step {stop.stopped_at} ({stop.patience} evaluations without improvement)"
        click.echo(f"  val:    {line}")
    if adapter.probes:
        click.echo(f"  probes: {_probes(base)} -> {_probes(adapter)}")
    if adapter.retained:
        click.echo(f"  kept:   {_retained(base)} -> {_retained(adapter)} (probes of earlier versions)")
    if adapter.retention_loss is not None:
        line = f"loss {_number(base.retention_loss, '.4f')} -> {adapter.retention_loss:.4f} ({plural(adapter.retention_rows, 'row')})"
        if adapter.retention_delta is not None:
            line += f", {adapter.retention_delta:+.4f} against the previous adapter"
        click.echo(f"  retain: {line}")


def _retained(model: ModelEval) -> str:
    """``base NLL 7.92, 0/3 exact, F1 0.04`` of the probes of earlier versions."""
    return (f"{model.model if model.model == 'base' else 'adapter'} NLL {_number(model.retained_nll, '.2f')}, "
            f"{model.retained_exact}/{len(model.retained)} exact, F1 {_number(model.retained_f1, '.2f')}")  # fmt: skip


def _probes(model: ModelEval) -> str:
    """``base NLL 7.92, 0/3 exact, F1 0.04``."""
    return (f"{model.model if model.model == 'base' else 'adapter'} NLL {_number(model.probe_nll, '.2f')}, "
            f"{model.probe_exact}/{len(model.probes)} exact, F1 {_number(model.probe_f1, '.2f')}")  # fmt: skip


def _number(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _rewards(metrics: dict[str, float]) -> str:
    """``, reward margin 0.012, accuracy 100%`` from what TRL logged (empty when it logged none)."""
    parts = []
    if "rewards/margins" in metrics:
        parts.append(f"reward margin {metrics['rewards/margins']:.4g}")
    if "rewards/accuracies" in metrics:
        parts.append(f"accuracy {metrics['rewards/accuracies']:.0%}")
    return "".join(f", {part}" for part in parts)


def _rank_arguments(
    path: str, phase: str, no_cache: bool, max_steps: int | None, epochs: int | None, seed: int | None,
    datasets: tuple[str, ...], resume: bool, fresh: bool, lock_mode: str, as_json: bool,
) -> list[str]:  # fmt: skip
    """``dlm train`` arguments for each rank: this command's, without ``--nproc``."""
    from .lock import LOCK_FLAGS
    from .render import is_quiet

    args = ["-q"] if is_quiet() else []
    args += ["train", path, "--phase", phase]
    args += ["--no-cache"] if no_cache else []
    args += ["--max-steps", str(max_steps)] if max_steps is not None else []
    args += ["--epochs", str(epochs)] if epochs is not None else []
    args += ["--seed", str(seed)] if seed is not None else []
    for dataset in datasets:
        args += ["--dataset", dataset]
    args += ["--resume"] if resume else []
    args += ["--fresh"] if fresh else []
    args += [flag for flag, mode in LOCK_FLAGS.items() if mode == lock_mode]
    args += ["--json"] if as_json else []
    return args

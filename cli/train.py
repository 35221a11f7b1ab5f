"""``dlm train PATH``: train a LoRA adapter on the document's rows."""

from __future__ import annotations

import click

from .lock import lock_mode_options
from .params import SEED
from .render import emit_json, human_bytes, plural, warn


@click.command("train")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option(
    "--phase",
    type=click.Choice(["all", "sft", "preference"]),
    default="all",
    show_default=True,
    help="Train SFT, the preference phase (DPO/ORPO on the newest SFT adapter), or SFT then preference.",
)
@click.option("--no-cache", is_flag=True, help="Tokenize every row; neither read nor write cache entries.")
@click.option("--max-steps", type=click.IntRange(min=1), help="Override training.max_steps.")
@click.option("--epochs", type=click.IntRange(min=1), help="Override training.num_epochs.")
@click.option("--seed", type=SEED, help="Override training.seed.")
@lock_mode_options
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON.")
def train_command(
    path: str, phase: str, no_cache: bool, max_steps: int | None, epochs: int | None, seed: int | None,
    lock_mode: str, as_json: bool,
) -> None:  # fmt: skip
    """Train a LoRA adapter on the rows of the document at PATH.

    SFT (TRL SFTTrainer) trains on prose, instruction and source rows; then,
    when the document has ::preference:: sections, the preference phase
    (DPO or ORPO, training.preference.method) trains the same adapter on
    them. Rows come pre-tokenized from the cache. Each phase's adapter is
    written to adapter/versions/vNNNN beside store.db, and the run, its
    per-step metrics and its reproducibility lock (dlm.lock) are recorded
    in the store.
    """
    from dlmstore.train.trainer import train_document

    from .progress import progress_shown

    with progress_shown(as_json=as_json):
        summary = train_document(
            path, phase=phase, no_cache=no_cache, max_steps=max_steps, epochs=epochs, seed=seed,
            lock_mode=lock_mode,
        )  # fmt: skip
    for message in [*summary.warnings, *summary.lock_warnings]:
        warn(message)
    if as_json:
        emit_json(summary)
        return
    event = summary.tokenization
    rate = "n/a" if event.hit_rate is None else f"{event.hit_rate:.1%}"
    for part in summary.phases:
        loss = "n/a" if part.final_loss is None else f"{part.final_loss:.4f}"
        if part.phase == "sft":
            click.echo(f"run {summary.run_id} sft: {plural(part.steps, 'step')} on {plural(part.rows, 'row')} "
                       f"({plural(summary.tokens, 'token')}), final loss {loss} -> v{part.adapter_version:04d}")  # fmt: skip
        else:
            rewards = _rewards(part.metrics)
            click.echo(f"run {summary.run_id} preference ({part.method}): {plural(part.steps, 'step')} on "
                       f"{plural(part.rows, 'triple')}, final loss {loss}{rewards} -> v{part.adapter_version:04d}")  # fmt: skip
    click.echo(f"adapter: v{summary.adapter_version:04d} {summary.adapter_path}")
    click.echo(f"sha256:  {summary.adapter_sha256}")
    click.echo(f"cache:   {plural(event.cache_hits, 'hit')}, {plural(event.cache_misses, 'miss', 'misses')} ({rate}), "
               f"{human_bytes(event.cache_bytes_after)} cached")  # fmt: skip
    click.echo(f"lock:    {summary.lock_decision}")


def _rewards(metrics: dict[str, float]) -> str:
    """``, reward margin 0.012, accuracy 100%`` from what TRL logged (empty when it logged none)."""
    parts = []
    if "rewards/margins" in metrics:
        parts.append(f"reward margin {metrics['rewards/margins']:.4g}")
    if "rewards/accuracies" in metrics:
        parts.append(f"accuracy {metrics['rewards/accuracies']:.0%}")
    return "".join(f", {part}" for part in parts)

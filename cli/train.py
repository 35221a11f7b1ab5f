"""``dlm train PATH``: train a LoRA adapter on the document's rows."""

from __future__ import annotations

import click

from .lock import lock_mode_options
from .params import SEED
from .render import emit_json, human_bytes, warn


@click.command("train")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--no-cache", is_flag=True, help="Tokenize every row; neither read nor write cache entries.")
@click.option("--max-steps", type=click.IntRange(min=1), help="Override training.max_steps.")
@click.option("--epochs", type=click.IntRange(min=1), help="Override training.num_epochs.")
@click.option("--seed", type=SEED, help="Override training.seed.")
@lock_mode_options
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON.")
def train_command(
    path: str, no_cache: bool, max_steps: int | None, epochs: int | None, seed: int | None,
    lock_mode: str, as_json: bool,
) -> None:  # fmt: skip
    """Train a LoRA adapter (TRL SFTTrainer) on the rows of the document at PATH.

    Rows come pre-tokenized from the cache. The adapter is written to
    adapter/versions/vNNNN beside store.db, and the run, its per-step loss
    and its reproducibility lock (dlm.lock) are recorded in the store.
    """
    from dlmstore.train.trainer import train_document

    from .progress import TrainBar

    bar = TrainBar(enabled=not as_json)
    try:
        summary = train_document(
            path, no_cache=no_cache, max_steps=max_steps, epochs=epochs, seed=seed,
            lock_mode=lock_mode, progress=bar,
        )  # fmt: skip
    finally:
        bar.close()
    for message in [*summary.warnings, *summary.lock_warnings]:
        warn(message)
    if summary.preference_rows_skipped:
        click.echo(
            f"note: {summary.preference_rows_skipped} preference rows are not trained (SFT uses text and "
            "instruction rows only)",
            err=True,
        )
    if as_json:
        emit_json(summary)
        return
    event = summary.tokenization
    rate = "n/a" if event.hit_rate is None else f"{event.hit_rate:.1%}"
    loss = "n/a" if summary.final_loss is None else f"{summary.final_loss:.4f}"
    click.echo(f"run {summary.run_id}: {summary.steps} steps on {summary.rows_trained:,} rows "
               f"({summary.tokens:,} tokens), final loss {loss}")  # fmt: skip
    click.echo(f"adapter: v{summary.adapter_version:04d} {summary.adapter_path}")
    click.echo(f"sha256:  {summary.adapter_sha256}")
    click.echo(f"cache:   {event.cache_hits:,} hits, {event.cache_misses:,} misses ({rate}), "
               f"{human_bytes(event.cache_bytes_after)} cached")  # fmt: skip
    click.echo(f"lock:    {summary.lock_decision}")

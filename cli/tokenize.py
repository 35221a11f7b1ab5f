"""``dlm tokenize PATH``: run the tokenize pass through the cache and record it."""

from __future__ import annotations

import click

from .params import LocalPath
from .render import emit_json, human_bytes, json_option, plural, warn


@click.command("tokenize")
@click.argument("path", type=LocalPath(dir_okay=False))
@click.option("--no-cache", is_flag=True, help="Tokenize everything; neither read nor write cache entries.")
@click.option(
    "--no-share",
    is_flag=True,
    help="Tokenize the rows this store misses here, even when another store of the home holds their "
    "tokens (training.cache.share: false does the same).",
)
@json_option("dlmstore.corpus.tokenize:TokenizeSummary", help="Print the run summary as JSON.")
def tokenize_command(path: str, no_cache: bool, no_share: bool, as_json: bool) -> None:
    """Tokenize the rows of the document at PATH, through the tokenized cache.

    Only rows whose content (or tokenizer, or sequence length) changed go
    through the tokenizer; the rest come from the cache, or from another
    store of the home that holds the same tokens (its token file
    hard-linked, else copied). The run and its hit/miss numbers are
    recorded in the store (see `dlm metrics`).
    """
    from dlmstore.corpus.tokenize import tokenize_document

    from .progress import progress_shown

    with progress_shown(as_json=as_json):
        summary, _ = tokenize_document(path, no_cache=no_cache, materialize=False, no_share=no_share)
    for message in summary.warnings:
        warn(message)
    if as_json:
        emit_json(summary)
        return
    event = summary.tokenization
    rate = "n/a" if event.hit_rate is None else f"{event.hit_rate:.1%}"
    click.echo(f"run {summary.run_id}: {plural(event.total_rows, 'row')}, {plural(summary.tokens, 'token')}")
    shared = f" ({event.cache_shared:,} from other stores)" if event.cache_shared else ""
    click.echo(
        f"cache:  {event.cache_mode}, {plural(event.cache_hits, 'hit')}{shared}, "
        f"{plural(event.cache_misses, 'miss', 'misses')} ({rate})"
    )
    click.echo(f"time:   {event.total_tokenize_seconds:.2f} s")
    click.echo(f"size:   {human_bytes(event.cache_bytes_after)} cached")
    dedup = summary.dedup
    if dedup is not None and dedup.clusters:
        what = (
            f"{plural(dedup.dropped_rows, 'row')} left out of training (training.dedup: {dedup.mode})"
            if dedup.mode != "off"
            else "all trained (training.dedup: off)"
        )
        click.echo(
            f"dedup:  {plural(dedup.clusters, 'duplicate cluster')}, "
            f"{plural(dedup.duplicate_rows, 'duplicate row')}, {what}; `dlm show` lists them"
        )
    if summary.preference_rows:
        click.echo(
            f"prefs:  {plural(summary.preference_rows, 'preference row')}, "
            f"{plural(summary.preference_tokens, 'token')} "
            "in their chosen and rejected conversations (for DPO/ORPO, not SFT)"
        )

"""``dlm show PATH``: what a document holds and where its store is."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from .params import LocalPath
from .render import emit_json, human_bytes, json_option, plural, warn

if TYPE_CHECKING:
    from dlmstore.corpus.dedup import DedupReport
    from dlmstore.sources.expand import SourceProvenance
    from dlmstore.store.contamination import Contamination


@click.command("show")
@click.argument("path", type=LocalPath(dir_okay=False))
@json_option("dlmstore.corpus.show:DocumentSummary", help="Print the summary as JSON.")
@click.option(
    "--rows",
    "as_rows",
    is_flag=True,
    help="Print the rows that will be trained, in order, one JSON object per line.",
)
def show_command(path: str, as_json: bool, as_rows: bool) -> None:
    """Summarise the .dlm document at PATH (read-only).

    Lists sections by type, the rows they become, each training.sources
    directive with what it included and skipped, and the store's path.
    With --rows, prints the training rows instead: {"text": ...},
    {"messages": [...]} or {"prompt", "chosen", "rejected"}, each with its
    row_key.
    """
    from .progress import progress_shown

    if as_rows:
        import json

        from dlmstore.corpus.show import document_rows

        with progress_shown():  # the source walk, on stderr: the rows on stdout stay clean
            training_rows = document_rows(path)
        for row in training_rows:
            click.echo(json.dumps({**row.data, "row_key": row.row_key}, ensure_ascii=False))
        return
    from dlmstore.corpus.show import summarize

    with progress_shown(as_json=as_json):
        summary = summarize(path)
    for message in summary.warnings:
        warn(message)
    if as_json:
        emit_json(summary)
        return
    base = summary.base_model
    sections = ", ".join(f"{n} {kind}" for kind, n in summary.sections.items())
    rows = ", ".join(f"{n} {kind}" for kind, n in summary.rows.items())
    click.echo(f"document: {summary.path}")
    click.echo(f"id:       {summary.dlm_id}")
    click.echo(f"base:     {base.name} ({base.kind}{': ' + base.error if base.error else ''})")
    click.echo(f"sections: {sections}; {summary.source_sections} from sources")
    click.echo(f"rows:     {rows}")
    for adapter in summary.adapters:
        routed = ", ".join(f"{n} {kind}" for kind, n in adapter.rows.items())
        click.echo(f"adapter:  {adapter.name}: {routed}")
    for source in summary.sources:
        skipped = {
            key.removeprefix("skipped_"): value
            for key, value in vars(source).items()
            if key.startswith("skipped_") and value
        }
        detail = ", ".join(f"{n} {why}" for why, n in skipped.items())
        left = _left_out(source)
        notes = "; ".join(part for part in (f"skipped {detail}" if detail else "", left) if part)
        click.echo(
            f"source:   {source.directive}: {plural(source.files_included, 'file')}, "
            f"{human_bytes(source.bytes_included)}" + (f" ({notes})" if notes else "")
        )
    for weighed in summary.tag_weights:
        effect = [plural(weighed.added, "copy", "copies") + " added"] if weighed.added else []
        effect += [plural(weighed.dropped, "row") + " dropped"] if weighed.dropped else []
        click.echo(
            f"weight:   {weighed.tag}={weighed.value} x{weighed.weight:g}: {plural(weighed.rows, 'row')}, "
            + (", ".join(effect) or "no change")
        )
    state = "exists" if summary.store.exists else "not created yet"
    click.echo(f"store:    {summary.store.path} ({state})")
    cache = summary.training_cache
    rate = "n/a" if cache.last_run_hit_rate is None else f"{cache.last_run_hit_rate:.1%}"
    click.echo(
        f"cache:    {plural(cache.entry_count, 'entry', 'entries')}, {human_bytes(cache.bytes)}, last-run hit rate {rate}"
    )
    _print_dedup(summary.dedup)
    _print_contamination(summary.contamination)


#: Clusters listed by the text output; --json lists every one.
SHOWN_CLUSTERS = 20


def _left_out(source: SourceProvenance) -> str:
    """What a directive's filters left out, by reason (the files it read and skipped are apart)."""
    reasons = [
        (source.excluded_not_included, "not matching include"),
        (source.excluded - source.excluded_not_included, "by exclude, the default excludes or .dlm/ignore"),
    ]
    parts = [f"{n} {why}" for n, why in reasons if n]
    text = f"left out {source.excluded}: {', '.join(parts)}" if source.excluded else ""
    if source.excluded_dirs:
        folders = f"{plural(source.excluded_dirs, 'folder')} not walked"
        text = f"{text}; {folders}" if text else folders
    return text


def _print_dedup(dedup: DedupReport) -> None:
    if not dedup.clusters:
        return
    if dedup.mode == "off":
        what = "all trained (training.dedup: off)"
    else:
        what = f"training.dedup: {dedup.mode} leaves {plural(dedup.dropped_rows, 'row')} out"
    click.echo(
        f"dedup:    {plural(len(dedup.clusters), 'cluster')} among {plural(dedup.rows, 'text row')}, "
        f"{plural(dedup.duplicate_rows, 'duplicate row')}; {what}"
    )
    width = max(len(m.path) for cluster in dedup.clusters[:SHOWN_CLUSTERS] for m in cluster.members)
    for cluster in dedup.clusters[:SHOWN_CLUSTERS]:
        for index, member in enumerate(cluster.members):
            kind = cluster.kind if index == 0 else ""
            state = "kept" if member.kept else ("dropped" if member.dropped else "trained")
            click.echo(f"          {kind:5}  {member.path:{width}}  {member.similarity:.2f}  {state}")
    if len(dedup.clusters) > SHOWN_CLUSTERS:
        more = len(dedup.clusters) - SHOWN_CLUSTERS
        click.echo(f"          ... and {plural(more, 'more cluster')} (dlm show --json lists every one)")


def _print_contamination(found: Contamination) -> None:
    """The held-out rows that duplicate training rows: each with the training row it is most like."""
    if not found.rows:
        return
    if found.kept_out_rows:
        what = f"kept out of the split, they train (training.dedup: {found.mode})"
    else:
        what = "held out: the val loss reads low on them (training.dedup: exact or near keeps them out)"
    recorded = "" if found.from_run is None else f", as run {found.from_run} recorded"
    click.echo(
        f"val:      {plural(found.contaminated_rows, 'validation row')} (seed {found.seed}{recorded}) "
        f"{'duplicates a training row' if found.contaminated_rows == 1 else 'duplicate training rows'}; {what}"
    )
    shown = found.rows[:SHOWN_CLUSTERS]
    width = max(len(row.path) for row in shown)
    for row in shown:
        click.echo(f"          {row.path:{width}}  {row.kind:5}  {row.similarity:.2f}  {row.train_path}")
    if len(found.rows) > SHOWN_CLUSTERS:
        more = len(found.rows) - SHOWN_CLUSTERS
        click.echo(f"          ... and {plural(more, 'more row')} (dlm show --json lists every one)")

"""The store report as one self-contained HTML page.

:func:`render_page` turns a :class:`~dlmstore.report.contents.StoreReport`
into a single HTML document: styles inline, charts inline SVG
(:mod:`dlmstore.report.svg`), no script, no font, no image and no link to
anything outside the page, so it opens offline, can be mailed or archived,
and shows the same in ten years. A Content-Security-Policy ``<meta>``
forbids every load but inline styles, so a reference that slipped in would
be blocked by the browser, and reported on its console, rather than fetched.

Everything that comes from the store (paths, errors, lock values, adapter
hashes) is escaped with :func:`html.escape`; the page has no other input.
Each chart is a ``<figure class="chart" data-chart="...">``; a section with
nothing to draw says so in words instead of drawing an empty frame.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import UTC, datetime
from html import escape
from pathlib import Path

from dlmstore.errors import ReportError
from dlmstore.plural import plural
from dlmstore.report.contents import LockEntry, PhaseCurve, StoreReport, TrainingRun
from dlmstore.report.evaluation import ProbeCell, ReplayDraw, RetentionFigures
from dlmstore.report.svg import Series, bar_chart, column_chart, line_chart
from dlmstore.report.units import human_bytes
from dlmstore.store.atomic import SameAsInputError, replace_user_file
from dlmstore.store.contamination import Contamination
from dlmstore.store.metrics import PhaseMetrics

#: At most this many source folders get their own bar; the rest are summed in one.
TOP_FOLDERS = 15

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1000px;
       padding: 0 1rem; color: #222; background: #fff; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #ddd; }
h3 { font-size: 1rem; margin: 1.2rem 0 .4rem; }
.meta { color: #555; } .meta code { color: #222; }
.charts { display: flex; flex-wrap: wrap; gap: 1rem; }
figure.chart { margin: 0; } figcaption { font-size: .85rem; color: #444; margin-bottom: .2rem; }
svg { background: #fafafa; border: 1px solid #e4e4e4; }
svg .grid { stroke: #e6e6e6; } svg .axis { stroke: #888; fill: none; }
svg text { font-size: 11px; fill: #444; } svg .label { fill: #222; }
table { border-collapse: collapse; font-size: .85rem; margin-top: .5rem; }
th, td { border-bottom: 1px solid #e4e4e4; padding: .25rem .6rem; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
code { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: .8rem; }
code.sha { word-break: break-all; display: inline-block; min-width: 22ch; max-width: 34ch; }
.empty { color: #777; font-style: italic; } .wide { overflow-x: auto; }
.sev { border-radius: 3px; padding: 0 .3rem; font-size: .75rem; font-weight: 600; }
.sev-ALLOW { background: #e3f3e3; color: #225522; } .sev-WARN { background: #fff1cc; color: #6b4e00; }
.sev-ERROR { background: #fbdcdc; color: #8a1c1c; }
"""


def render_page(report: StoreReport) -> str:
    """The whole page for ``report``, as text (UTF-8 when written)."""
    title = f"dlm report: {report.document_path or report.dlm_id}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        _summary(report),
        _training(report),
        _probes(report),
        _cache(report),
        _sources(report),
        _adapters(report),
        _exports(report),
        _locks(report),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def write_page(report: StoreReport, path: Path, *, inputs: Iterable[str | os.PathLike[str]] = ()) -> int:
    """Write the page for ``report`` to ``path`` atomically; return its size in bytes.

    ``path`` is the user's (:func:`~dlmstore.store.atomic.replace_user_file`):
    a symlink there is followed, a file replaced keeps its mode, and a path
    naming one of ``inputs`` (the document, the store database) is refused.

    Raises:
        ReportError: ``path`` is one of ``inputs``, is not a regular file, or
            cannot be written (a missing folder, no permission, a full disk);
            what was at ``path`` is left as it was.
    """
    data = render_page(report).encode("utf-8")
    try:
        replace_user_file(path, data, inputs=inputs)
    except SameAsInputError as exc:
        raise ReportError(
            f"cannot write the report to {path}: {exc.strerror}",
            hint="pass -o with another path (the default is report.html)",
        ) from None
    except OSError as exc:
        raise ReportError(
            f"cannot write the report to {path}: {exc.strerror or exc}",
            hint="pass -o with a path in a folder that exists and that you can write to",
        ) from None
    return len(data)


def _figure(key: str, caption: str, svg: str) -> str:
    return (
        f'<figure class="chart" data-chart="{escape(key)}"><figcaption>{escape(caption)}</figcaption>'
        f"{svg}</figure>"
    )


def _empty(text: str) -> str:
    return f'<p class="empty">{escape(text)}</p>'


def _table(headers: list[str], rows: list[list[str]], numeric: set[int]) -> str:
    """A table; cells are HTML already escaped by the caller."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _summary(report: StoreReport) -> str:
    items = [
        ("document id", f"<code>{escape(report.dlm_id)}</code>"),
        ("store", f"<code>{escape(report.store_path)}</code>"),
        ("runs", f"{report.run_count:,}"),
        (
            "cache",
            f"{plural(report.cache_entries, 'entry', 'entries')}, {escape(human_bytes(report.cache_bytes))}",
        ),
        ("adapters", f"{len(report.adapters):,}"),
        ("generated", escape(report.generated_at)),
    ]
    return '<p class="meta">' + " · ".join(f"{name}: {value}" for name, value in items) + "</p>"


def _phase_title(run: TrainingRun, phase: str, method: str | None) -> str:
    return f"run {run.run_id} {phase}" + (f" ({method})" if method else "")


def _training(report: StoreReport) -> str:
    parts = ["<h2>Training</h2>"]
    if not report.training:
        return parts[0] + _empty("No train runs yet: run `dlm train` on the document.")
    parts.append(
        '<p class="meta">Loss and learning rate at every logged step, per run and phase '
        f"(the newest {len(report.training)} train runs, newest first).</p>"
    )
    for run in report.training:
        took = "" if run.duration_seconds is None else f" · took {_duration(run.duration_seconds)}"
        parts.append(
            f"<h3>Run {run.run_id} · {escape(run.status)} · started {escape(run.started_at)}{took}</h3>"
        )
        if run.error:
            parts.append(f'<p class="meta">failed: {escape(run.error)}</p>')
        if run.phases:
            parts.append(
                '<p class="meta">' + " · ".join(_phase_line(run, curve) for curve in run.phases) + "</p>"
            )
        if run.replay is not None and (run.replay.candidates or run.replay.drawn):
            parts.append(_replay(run.replay))
        for phase in dict.fromkeys(item.phase for item in run.retention):
            measured = [item for item in run.retention if item.phase == phase]
            parts.append(
                f'<p class="meta" data-retention="{escape(phase)}">retention after {escape(phase)}: '
                + " · ".join(_retention(item, "the previous adapter") for item in measured)
                + "</p>"
            )
        if run.contamination is not None and run.contamination.rows:
            parts.append(_contamination(run.contamination))
        if not run.phases:
            parts.append(_empty("No steps were logged (the run failed before its first step)."))
            continue
        figures = []
        for curve in run.phases:
            name = _phase_title(run, curve.phase, curve.method)
            for key, label, values in (
                ("loss", "loss", [(float(p.step), p.loss) for p in curve.steps]),
                ("lr", "learning rate", [(float(p.step), p.learning_rate) for p in curve.steps]),
            ):
                if not any(value is not None for _, value in values):
                    figures.append(_empty(f"{name}: no {label} was logged."))
                    continue
                series = [Series(curve.phase, values)]
                if key == "loss" and curve.val:  # the val loss beside the train loss
                    series.append(Series("val", [(float(p.step), p.loss) for p in curve.val]))
                svg = line_chart(f"{name}: {label}", series, x_label="step", y_label=label)
                figures.append(_figure(f"{key}-run{run.run_id}-{curve.phase}", f"{name}: {label}", svg))
        parts.append(f'<div class="charts">{"".join(figures)}</div>')
    return "\n".join(parts)


def _replay(draw: ReplayDraw) -> str:
    """What a run drew from the replay history, in a line."""
    if draw.skipped is not None:
        what = f"off ({escape(draw.skipped)}): {plural(draw.candidates, 'candidate')} left out"
    else:
        what = f"{plural(draw.drawn, 'row')} drawn of {plural(draw.candidates, 'candidate')}"
    return f'<p class="meta" data-replay="{draw.drawn}">replay: {what} (generation {draw.generation})</p>'


def _retention(item: RetentionFigures, previous: str) -> str:
    """``v0002 kept 1/2 exact, NLL 0.40; retention slice loss 3.1020 (4 rows), +0.0120 against ...``."""
    parts = []
    if item.retained_probes:
        nll = "" if item.retained_nll is None else f", NLL {item.retained_nll:.2f}"
        parts.append(f"kept {item.retained_exact}/{item.retained_probes} exact{nll}")
    if item.retention_loss is not None:
        line = f"retention slice loss {item.retention_loss:.4f} ({plural(item.retention_rows, 'row')})"
        if item.retention_delta is not None:
            line += f", {item.retention_delta:+.4f} against {escape(previous)}"
        parts.append(line)
    return f"{escape(item.model)} {'; '.join(parts)}"


def _contamination(found: Contamination) -> str:
    """A run's held-out rows that duplicate training rows: a line, and a table of them."""
    count, one = found.contaminated_rows, found.contaminated_rows == 1
    if found.kept_out_rows:
        what = (
            f"{plural(count, 'row')} drawn for it {'duplicated a training row and was' if one else 'duplicated training rows and were'} "
            f"kept out by <code>training.dedup: {escape(found.mode)}</code>: {'it' if one else 'they'} trained"
        )
    else:
        what = (
            f"{count} of them {'duplicates a training row' if one else 'duplicate training rows'}: the val loss "
            "reads low on them (<code>training.dedup: exact</code> or <code>near</code> keeps them out)"
        )
    line = (
        f'<p class="meta" data-contamination="{found.contaminated_rows}">'
        f"{plural(found.val_rows or 0, 'row')} held out for validation (seed {found.seed}); {what}.</p>"
    )
    rows = [
        [
            f"<code>{escape(row.path)}</code>",
            f"<code>{escape(row.train_path)}</code>",
            row.kind,
            f"{row.similarity:.2f}",
            "kept out" if row.kept_out else "held out",
        ]  # fmt: skip
        for row in found.rows
    ]
    return line + _table(["validation row", "training row", "kind", "similarity", ""], rows, {3})


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{seconds:.1f} s" if seconds < 60 else f"{minutes} min {rest:02d} s"


def _phase_line(run: TrainingRun, curve: PhaseCurve) -> str:
    """A phase's steps, final and best loss (the numbers its curve draws)."""
    summary = PhaseMetrics.of(curve.phase, [(point.step, point.loss) for point in curve.steps])
    final = "n/a" if summary.final_loss is None else f"{summary.final_loss:.4f}"
    best = "" if summary.best_loss is None else f", best {summary.best_loss:.4f} at step {summary.best_step}"
    return f"{escape(_phase_title(run, curve.phase, curve.method))}: {plural(summary.steps, 'step')}, final loss {final}{best}"


def _probes(report: StoreReport) -> str:
    """The newest probe table: each question, the document's answer, each model's answer and scores."""
    head = "<h2>Probes</h2>"
    table = report.probes
    if table is None:
        return head + _empty(
            "No probes asked yet: `dlm train` asks them after each phase, `dlm eval` on demand."
        )
    where = f"after its {table.phase} phase" if table.phase != "eval" else "(dlm eval)"
    note = (
        f'<p class="meta">Run {table.run_id} {escape(where)}: each question answered greedily and scored '
        "against the document's answer (exact match and token-F1 once normalised; NLL: the answer's mean "
        "token negative log-likelihood, lower is better).</p>"
    )
    rows = [
        [
            escape(row.question) + ('<br><span class="meta">earlier version</span>' if row.retained else ""),
            escape(row.reference),
            *(_answer(cell) for cell in row.answers),
        ]
        for row in table.rows
    ]
    headers = ["question", "reference", *(f"{model} answer" for model in table.models)]
    kept = ""
    if table.retention:
        compared = (
            table.models[1] if table.phase == "eval" and len(table.models) > 1 else "the previous adapter"
        )
        kept = (
            '<p class="meta" data-retention="probes">Probes marked <em>earlier version</em> were held by an '
            "earlier version of the document and are no longer (the replay history's); retention: "
            + " · ".join(_retention(item, compared) for item in table.retention)
            + "</p>"
        )
    return head + note + _table(headers, rows, set()) + kept


def _answer(cell: ProbeCell) -> str:
    mark = "exact" if cell.exact else f"F1 {cell.f1:.2f}"
    nll = "" if cell.nll is None else f" · NLL {cell.nll:.3f}"
    return f'{escape(cell.answer)}<br><span class="meta">{mark}{nll}</span>'


def _cache(report: StoreReport) -> str:
    head = "<h2>Tokenized cache</h2>"
    passes = report.cache_passes
    if not passes:
        return head + _empty("No tokenization pass yet: run `dlm tokenize` or `dlm train` on the document.")
    if any(p.cache_mode != "on" for p in passes):  # every row a miss on purpose, not an emptied cache
        modes = ", ".join(f"run {p.run_id} {p.cache_mode}" for p in passes if p.cache_mode != "on")
        head += (
            f'<p class="meta">Cache not used ({escape(modes)}: bypassed is <code>--no-cache</code>, off is '
            "<code>training.cache.enabled: false</code>): those runs' misses are every row, by request.</p>"
        )
    labels = [str(p.run_id) for p in passes]
    hits = column_chart(
        "cache hits and misses per run",
        labels,
        [
            ("hits", [float(p.cache_hits) for p in passes]),
            ("misses", [float(p.cache_misses) for p in passes]),
        ],
        x_label="run",
        y_label="rows",
    )
    seconds = column_chart(
        "tokenize seconds per run",
        labels,
        [("seconds", [p.total_tokenize_seconds for p in passes])],
        x_label="run",
        y_label="seconds",
    )
    times = [_epoch(p.created_at) for p in passes]
    size = line_chart(
        "cache size over time",
        [Series("cache", [(t, float(p.cache_bytes_after)) for t, p in zip(times, passes, strict=True)])],
        x_label="time (UTC)",
        y_label="bytes",
        x_format=_clock if times[-1] - times[0] < 86400 else _day,
        y_format=human_bytes,
    )
    figures = [
        _figure("cache-hits", "Rows from the cache (hits) and through the tokenizer (misses), per run", hits),
        _figure("tokenize-seconds", "Wall time of each run's tokenization pass", seconds),
        _figure("cache-size", "Cache size after each pass", size),
    ]
    if any(p.cache_shared or p.duplicate_rows for p in passes):
        shared = column_chart(
            "rows shared and duplicated per run",
            labels,
            [
                ("from other stores", [float(p.cache_shared) for p in passes]),
                ("duplicates", [float(p.duplicate_rows or 0) for p in passes]),
                ("left out", [float(p.dropped_rows or 0) for p in passes]),
            ],
            x_label="run",
            y_label="rows",
        )
        caption = (
            "Rows whose tokens another store of the home had made (taken, not tokenized); text rows "
            "that duplicate another (`dlm show` lists the clusters), and those training.dedup left out"
        )
        figures.append(_figure("shared-and-duplicates", caption, shared))
    return head + f'<div class="charts">{"".join(figures)}</div>'


def _sources(report: StoreReport) -> str:
    head = "<h2>Tokens by source folder</h2>"
    sources = report.sources
    if sources.run_id is None:
        return head + _empty("No pass used the cache yet, so there are no token counts to show.")
    items = [(f.folder, float(f.tokens)) for f in sources.folders[:TOP_FOLDERS]]
    rest = sources.folders[TOP_FOLDERS:]
    if rest:
        items.append((f"({len(rest)} more folders)", float(sum(f.tokens for f in rest))))
    items.append(("(document sections)", float(sources.document_tokens)))
    note = (
        f'<p class="meta">Tokens of run {sources.run_id}\'s pass, by the folder of each source file; '
        "the document's own sections (and preference rows) are one bar."
        + (
            f" {sources.uncounted_files:,} source files had no cache entry from that pass and are not counted."
            if sources.uncounted_files
            else ""
        )
        + "</p>"
    )
    svg = bar_chart("tokens by source folder", items)
    rows = [[f"<code>{escape(f.folder)}</code>", f"{f.files:,}", f"{f.tokens:,}"] for f in sources.folders]
    table = _table(["folder", "files", "tokens"], rows, {1, 2}) if rows else ""
    return head + note + _figure("source-tokens", "Tokens by source folder", svg) + table


def _adapters(report: StoreReport) -> str:
    head = "<h2>Adapters</h2>"
    if not report.adapters:
        return head + _empty("No adapter yet: `dlm train` registers one per run and phase.")
    rows = [
        [
            f"v{a.version:04d}" + (f" {escape(a.name)}" if a.name else ""), str(a.run_id), escape(a.phase),
            escape(a.method or ""),
            "" if a.parent_version is None else f"v{a.parent_version:04d}", f"{a.steps:,}",
            "" if a.final_loss is None else f"{a.final_loss:.4f}", escape(human_bytes(a.bytes)),
            f'<code class="sha">{escape(a.sha256)}</code>', escape(a.created_at),
        ]
        for a in report.adapters
    ]  # fmt: skip
    headers = [
        "version",
        "run",
        "phase",
        "method",
        "parent",
        "steps",
        "final loss",
        "size",
        "sha256",
        "created",
    ]
    return head + _table(headers, rows, {1, 5, 6, 7})


def _exports(report: StoreReport) -> str:
    head = "<h2>Exports</h2>"
    if not report.exports:
        return head + _empty(
            "No export yet: `dlm export` writes GGUF files, a Modelfile or a merged HF folder."
        )
    rows = [
        [
            str(e.export_id), f"v{e.adapter_version:04d}", escape(e.target), escape(e.quant or ""),
            f"{e.files:,}", escape(human_bytes(e.bytes)), f"{e.seconds:.1f}", f"<code>{escape(e.path)}</code>",
            escape(e.created_at),
        ]
        for e in report.exports
    ]  # fmt: skip
    headers = ["export", "adapter", "target", "quant", "files", "size", "seconds", "folder", "created"]
    return head + _table(headers, rows, {0, 4, 5, 6})


def _locks(report: StoreReport) -> str:
    head = "<h2>Lock history</h2>"
    if not report.lock_history:
        return head + _empty("No lock recorded yet: every `dlm train` run records one.")
    rows = [
        [
            str(e.record_id), "" if e.run_id is None else str(e.run_id), escape(e.created_at), escape(e.decision),
            "" if e.compared_with is None else f"record {e.compared_with}", _severity(e.severity), _changes(e),
        ]
        for e in report.lock_history
    ]  # fmt: skip
    note = (
        '<p class="meta">Each record compared with the lock <code>dlm.lock</code> held before it, by the '
        "severity table of docs/reproducibility.md (ALLOW, WARN, ERROR).</p>"
    )
    headers = ["record", "run", "created", "decision", "compared with", "severity", "changes"]
    return head + note + _table(headers, rows, {0, 1})


def _severity(severity: str | None) -> str:
    return "" if severity is None else f'<span class="sev sev-{escape(severity)}">{escape(severity)}</span>'


def _changes(entry: LockEntry) -> str:
    if entry.problem is not None:
        return f'<span class="sev sev-ERROR">unreadable</span> {escape(entry.problem)}'
    if entry.compared_with is None:
        return '<span class="empty">first lock</span>'
    if not entry.changes:
        return '<span class="empty">no changes</span>'
    return "<br>".join(
        f"{_severity(c.severity)} <code>{escape(c.field)}</code>: "
        f"<code>{escape(_value(c.old))}</code> → <code>{escape(_value(c.new))}</code>"
        for c in entry.changes
    )


def _value(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _epoch(stamp: str) -> float:
    """Seconds since the epoch of one of the store's timestamps (``2026-11-21T08:15:03.123Z``)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _clock(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%H:%M:%S")


def _day(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d")

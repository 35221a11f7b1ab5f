"""Small charts as inline SVG: lines, stacked columns and horizontal bars.

The report page must open anywhere, offline, with nothing but a browser, so
its charts are SVG markup written here rather than a plotting library or a
script: no dependency, no network, no JavaScript. Each function returns one
``<svg>`` element as text. Every data mark (a line, a column, a bar, a
point marker) is a ``<path class="mark">``, which is what the browser test
looks for to know a chart drew; axes and gridlines are ``class="axis"``
and ``class="grid"``. Every piece of text (titles, labels, series names) is
escaped here, so callers pass plain strings.

Scales are linear with "nice" ticks (1, 2 or 5 times a power of ten),
labelled with as many digits as keep them apart (:func:`tick_labels`). A
series longer than :data:`MAX_POINTS` is thinned to every n-th point (the
last one kept), which keeps a 100,000-step run's page small; the shape of a
loss curve survives that at this width.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

#: Colours of successive series, chosen to stay apart for common colour blindness.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")

#: Most points drawn per line.
MAX_POINTS = 600

WIDTH = 460
HEIGHT = 240
_LEFT, _RIGHT, _TOP, _BOTTOM = 80, 16, 16, 44

Formatter = Callable[[float], str]


@dataclass(frozen=True)
class Series:
    """A named line: ``(x, y)`` points in x order; a ``None`` y breaks the line."""

    name: str
    points: Sequence[tuple[float, float | None]]


def number(value: float, digits: int = 3) -> str:
    """A label: ``digits`` significant digits, no trailing zeros (``0.0002``, ``1.5k``, ``2e-06``)."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.{digits}g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.{digits}g}k"
    return f"{value:.{digits}g}"


def tick_labels(ticks: Sequence[float], formatter: Formatter | None = None) -> list[str]:
    """Labels for ``ticks``: ``formatter``'s, or :func:`number` with as few digits as keep them apart.

    A loss that moves from 10.7990 to 10.7987 gets ticks 0.0001 apart, which
    three significant digits would all print as ``10.8``.
    """
    if formatter is not None:
        return [formatter(tick) for tick in ticks]
    for digits in range(3, 13):
        labels = [number(tick, digits) for tick in ticks]
        if len(set(labels)) == len(labels):
            return labels
    return labels


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round values spanning ``low``..``high`` (a flat range is widened)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"ticks need a finite range, not {low}..{high}")
    if high < low:
        low, high = high, low
    if high == low:
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    raw = (high - low) / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value < high + step * 0.5:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 12))
    return ticks


class _Frame:
    """The plot area and its two linear scales."""

    def __init__(self, xs: list[float], ys: list[float], width: int, height: int, *, zero_y: bool) -> None:
        self.width, self.height = width, height
        x_low, x_high = (min(xs), max(xs)) if xs else (0.0, 1.0)
        if x_low == x_high:
            x_low, x_high = x_low - 1, x_high + 1
        y_low, y_high = (min(ys), max(ys)) if ys else (0.0, 1.0)
        if zero_y:
            y_low = min(0.0, y_low)
        self.x_low, self.x_high = x_low, x_high
        self.y_ticks = nice_ticks(y_low, y_high)
        self.y_low, self.y_high = self.y_ticks[0], self.y_ticks[-1]

    def x(self, value: float) -> float:
        span = self.width - _LEFT - _RIGHT
        return _LEFT + (value - self.x_low) / (self.x_high - self.x_low) * span

    def y(self, value: float) -> float:
        span = self.height - _TOP - _BOTTOM
        return self.height - _BOTTOM - (value - self.y_low) / (self.y_high - self.y_low) * span

    def axes(self, y_format: Formatter | None, y_label: str, x_label: str) -> list[str]:
        parts = []
        for tick, text in zip(self.y_ticks, tick_labels(self.y_ticks, y_format), strict=True):
            y = self.y(tick)
            parts.append(f'<path class="grid" d="M{_LEFT} {y:.1f}H{self.width - _RIGHT}"/>')
            parts.append(
                f'<text class="tick" x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(text)}</text>'
            )
        bottom = self.height - _BOTTOM
        parts.append(f'<path class="axis" d="M{_LEFT} {_TOP}V{bottom}H{self.width - _RIGHT}"/>')
        parts.append(
            f'<text class="label" x="{(_LEFT + self.width - _RIGHT) / 2:.0f}" y="{self.height - 6}" '
            f'text-anchor="middle">{escape(x_label)}</text>'
        )
        parts.append(
            f'<text class="label" transform="translate(12 {(_TOP + bottom) / 2:.0f}) rotate(-90)" '
            f'text-anchor="middle">{escape(y_label)}</text>'
        )
        return parts


def _svg(title: str, width: int, height: int, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
        + "".join(body)
        + "</svg>"
    )


def _thin(points: Sequence[tuple[float, float | None]]) -> list[tuple[float, float | None]]:
    if len(points) <= MAX_POINTS:
        return list(points)
    stride = math.ceil(len(points) / MAX_POINTS)
    kept = list(points[::stride])
    if kept[-1] != points[-1]:
        kept.append(points[-1])
    return kept


def _x_ticks(frame: _Frame, x_format: Formatter | None, count: int = 5) -> list[str]:
    parts = []
    bottom = frame.height - _BOTTOM
    ticks = [t for t in nice_ticks(frame.x_low, frame.x_high, count) if frame.x_low <= t <= frame.x_high]
    for tick, text in zip(ticks, tick_labels(ticks, x_format), strict=True):
        x = frame.x(tick)
        parts.append(f'<path class="axis" d="M{x:.1f} {bottom}v4"/>')
        parts.append(
            f'<text class="tick" x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">{escape(text)}</text>'
        )
    return parts


def _legend(names: Sequence[str], width: int) -> list[str]:
    parts = []
    x = width - _RIGHT
    for index in reversed(range(len(names))):
        name = names[index]
        x -= 14 + 7 * len(name)
        color = PALETTE[index % len(PALETTE)]
        parts.append(f'<path class="legend" d="M{x} {_TOP - 6}h10v8h-10z" fill="{color}"/>')
        parts.append(f'<text class="tick" x="{x + 13}" y="{_TOP + 1}">{escape(name)}</text>')
    return parts


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    x_format: Formatter | None = None,
    y_format: Formatter | None = None,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """Lines over a shared x axis; each point is also marked when a line has few of them.

    Raises:
        ValueError: no series has a finite point (the caller shows "no data" instead).
    """
    drawn = [(s.name, _thin([(x, y) for x, y in s.points if y is None or math.isfinite(y)])) for s in series]
    xs = [x for _, points in drawn for x, y in points if y is not None]
    ys = [y for _, points in drawn for _, y in points if y is not None]
    if not ys:
        raise ValueError(f"{title}: nothing to draw")
    frame = _Frame(xs, ys, width, height, zero_y=False)
    body = frame.axes(y_format, y_label, x_label) + _x_ticks(frame, x_format)
    for index, (name, points) in enumerate(drawn):
        color = PALETTE[index % len(PALETTE)]
        segments: list[str] = []
        pen_up = True
        for x, y in points:
            if y is None:
                pen_up = True
                continue
            segments.append(f"{'M' if pen_up else 'L'}{frame.x(x):.1f} {frame.y(y):.1f}")
            pen_up = False
        if not segments:
            continue
        label = escape(name)
        body.append(
            f'<path class="mark line" data-series="{label}" d="{"".join(segments)}" fill="none" '
            f'stroke="{color}" stroke-width="2"/>'
        )
        known = [(x, y) for x, y in points if y is not None]
        if len(known) <= 40:
            marks = "".join(f"M{frame.x(x) - 3:.1f} {frame.y(y):.1f}h6" for x, y in known)
            body.append(
                f'<path class="mark point" data-series="{label}" d="{marks}" stroke="{color}" '
                'stroke-width="6" stroke-linecap="round"/>'
            )
    if len(series) > 1:
        body += _legend([s.name for s in series], width)
    return _svg(title, width, height, body)


def column_chart(
    title: str,
    labels: Sequence[str],
    stacks: Sequence[tuple[str, Sequence[float]]],
    *,
    x_label: str,
    y_label: str,
    y_format: Formatter | None = None,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """One column per label, each the stack of the named values at its position.

    Raises:
        ValueError: there are no labels, or a stack's length is not the labels'.
    """
    if not labels:
        raise ValueError(f"{title}: nothing to draw")
    for name, values in stacks:
        if len(values) != len(labels):
            raise ValueError(f"{title}: {name} has {len(values)} values for {len(labels)} columns")
    totals = [sum(values[i] for _, values in stacks) for i in range(len(labels))]
    frame = _Frame([0.0, float(len(labels))], [0.0, max(totals)], width, height, zero_y=True)
    body = frame.axes(y_format, y_label, x_label)
    slot = (width - _LEFT - _RIGHT) / len(labels)
    bar = max(1.0, slot * 0.7)
    bottom = frame.height - _BOTTOM
    every = math.ceil(len(labels) / 12)  # at most about 12 labels under the axis
    for i, label in enumerate(labels):
        left = _LEFT + i * slot + (slot - bar) / 2
        if i % every == 0:
            body.append(
                f'<text class="tick" x="{left + bar / 2:.1f}" y="{bottom + 16}" text-anchor="middle">{escape(label)}</text>'
            )
    for index, (name, values) in enumerate(stacks):
        color = PALETTE[index % len(PALETTE)]
        shapes = []
        for i, value in enumerate(values):
            if value <= 0:
                continue
            below = sum(v[i] for _, v in stacks[:index])
            top, base = frame.y(below + value), frame.y(below)
            left = _LEFT + i * slot + (slot - bar) / 2
            shapes.append(f"M{left:.1f} {base:.1f}V{top:.1f}h{bar:.1f}V{base:.1f}z")
        if shapes:
            body.append(
                f'<path class="mark bar" data-series="{escape(name)}" d="{"".join(shapes)}" fill="{color}"/>'
            )
    if len(stacks) > 1:
        body += _legend([name for name, _ in stacks], width)
    return _svg(title, width, height, body)


def bar_chart(
    title: str,
    items: Sequence[tuple[str, float]],
    *,
    value_format: Formatter = lambda value: f"{value:,.0f}",
    width: int = WIDTH,
) -> str:
    """Horizontal bars, one per ``(label, value)``, in the order given, the value written beside each.

    Raises:
        ValueError: there are no items.
    """
    if not items:
        raise ValueError(f"{title}: nothing to draw")
    row, label_width, value_width = 22, 170, 60
    height = _TOP + row * len(items) + 8
    high = max(value for _, value in items) or 1.0
    span = width - label_width - value_width - _RIGHT
    body = [f'<path class="axis" d="M{label_width} {_TOP - 4}V{height - 4}"/>']
    shapes = []
    for i, (label, value) in enumerate(items):
        y = _TOP + i * row
        length = max(1.0, value / high * span) if value > 0 else 0.0
        if length:
            shapes.append(f"M{label_width} {y:.1f}h{length:.1f}v{row - 6}h{-length:.1f}z")
        shown = label if len(label) <= 26 else "…" + label[-25:]
        body.append(
            f'<text class="tick" x="{label_width - 6}" y="{y + 12:.1f}" text-anchor="end">'
            f"<title>{escape(label)}</title>{escape(shown)}</text>"
        )
        body.append(
            f'<text class="tick" x="{label_width + length + 4:.1f}" y="{y + 12:.1f}">{escape(value_format(value))}</text>'
        )
    body.append(f'<path class="mark bar" d="{"".join(shapes)}" fill="{PALETTE[0]}"/>')
    return _svg(title, width, height, body)

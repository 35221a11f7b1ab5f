"""A small progress bar on stderr, silent without a terminal or under --json."""

from __future__ import annotations

import sys
import time

import click


class ProgressBar:
    """Callable ``(done, total, tokens)`` that redraws one stderr line, at most 10 times a second."""

    def __init__(self, label: str, *, enabled: bool) -> None:
        self.label = label
        self.enabled = enabled and sys.stderr.isatty()
        self.start = time.perf_counter()
        self.last = 0.0
        self.drawn = False

    def __call__(self, done: int, total: int, tokens: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.last < 0.1 and done < total:
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        width = 30
        filled = int(width * done / total) if total else width
        bar = "#" * filled + "-" * (width - filled)
        click.echo(
            f"\r{self.label} [{bar}] {done}/{total} rows  {tokens / elapsed:,.0f} tokens/s",
            err=True,
            nl=False,
        )
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            click.echo("", err=True)


class TrainBar:
    """Callable ``(step, total, loss, tokens_per_second, phase)`` drawing one stderr line per phase."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.drawn = False
        self.phase: str | None = None

    def __call__(
        self, step: int, total: int, loss: float | None, rate: float | None, phase: str = "sft"
    ) -> None:
        if not self.enabled:
            return
        if self.drawn and phase != self.phase:
            click.echo("", err=True)  # keep the finished phase's line
        self.phase = phase
        width = 30
        filled = int(width * step / total) if total > 0 else 0
        bar = "#" * filled + "-" * (width - filled)
        loss_text = "" if loss is None else f"  loss {loss:.4f}"
        rate_text = "" if rate is None else f"  {rate:,.0f} tokens/s"
        click.echo(f"\r{phase:<10} [{bar}] step {step}/{total}{loss_text}{rate_text}", err=True, nl=False)
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            click.echo("", err=True)

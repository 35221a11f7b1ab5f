"""Rendering helpers shared by commands: JSON for data, sizes for people."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click


def emit_json(value: Any) -> None:
    """Print a dataclass (or plain data) as indented JSON on stdout."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def warn(message: str) -> None:
    """A warning line on stderr."""
    click.echo(f"warning: {message}", err=True)


def human_bytes(n: int) -> str:
    """``1234567`` -> ``1.2 MB`` (decimal units, as the cache docs use)."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")

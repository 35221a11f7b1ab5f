"""Parameter types shared by commands: durations (``30d``) and sizes (``128MiB``).

Each converts on the command line and leaves an already-converted default
alone. Nothing heavy is imported here, so ``dlm --help`` stays fast.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import click

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)


class Duration(click.ParamType[timedelta, Any]):
    """A click type for 30d / 12h / 45m / 10s."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        from dlmstore.errors import DurationError
        from dlmstore.store.metrics import parse_duration

        try:
            return parse_duration(value)
        except DurationError as exc:
            self.fail(exc.message, param, ctx)


class Size(click.ParamType[int, Any]):
    """A count with an optional suffix: ``200M`` tokens, ``128MiB`` bytes (K/M/G/T, Ki/Mi/...)."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = _SIZE.match(str(value))
        if not match:
            self.fail(f"{value!r} is not a size such as 5000000, 5M or 128MiB", param, ctx)
        number, unit, binary, _ = match.groups()
        power = "kmgt".index(unit.lower()) + 1 if unit else 0
        return int(float(number) * ((1024 if binary else 1000) ** power))


DURATION = Duration()
SIZE = Size()

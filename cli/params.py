"""Parameter types shared by commands: durations (``30d``), sizes (``128MiB``), run ids.

Each converts on the command line and leaves an already-converted default
alone. Nothing heavy is imported here, so ``dlm --help`` stays fast.
Values that could only overflow later (a date before year 1, an integer
SQLite cannot store) are usage errors here instead.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import click

#: The longest duration accepted: 100 years, so ``now - duration`` is a date.
MAX_DURATION = timedelta(days=36_500)

#: SQLite stores integers in 64 bits.
SQLITE_MAX_INT = 2**63 - 1

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
            duration = parse_duration(value)
        except DurationError as exc:
            self.fail(exc.message, param, ctx)
        except (OverflowError, ValueError):  # a number too large for timedelta (or for int())
            duration = None
        if duration is None or duration > MAX_DURATION:
            self.fail(
                f"{str(value)[:40]!r} is too long: at most {MAX_DURATION.days}d (100 years)", param, ctx
            )
        return duration


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

#: A run id: ``runs.id``, a positive 64-bit integer.
RUN_ID = click.IntRange(1, SQLITE_MAX_INT)

#: A random seed, within training.seed's bounds (``dlmstore.document.frontmatter.MAX_SEED``,
#: not imported: that would load pydantic for ``dlm --help``).
SEED = click.IntRange(0, 2**32 - 1)

#: ``scheme://...``: s3://, gs://, az://, http(s)://, hf://, file:// and any other.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _url_refusal(value: str) -> str:
    return f"{value!r} is a URL; object storage is not supported yet, so give a local path"


class LocalPath(click.Path):
    """A ``click.Path`` that refuses a URL by name instead of taking it as a relative path.

    Until object storage exists, ``s3://bucket/prefix`` given where a path goes
    would otherwise become a folder named ``s3:`` in the working directory.
    Every path-taking option and argument of ``dlm`` is of this type
    (``tests/test_cli_urls.py`` walks the command tree).
    """

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and _URL.match(value):
            self.fail(_url_refusal(value), param, ctx)
        return super().convert(value, param, ctx)


class PathOrObject(LocalPath):
    """A local path, or a prefix of object storage (``s3://bucket/prefix``, returned as text).

    For the options that read or write token datasets in a bucket (``dlm
    data build --out``). Any other URL scheme is refused by name, and a
    malformed ``s3://`` URL (no bucket, a bucket name S3 refuses) is a
    usage error naming what is wrong.
    """

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.startswith("s3://"):
            from dlmstore.errors import ObjectStoreError
            from dlmstore.objstore.uri import ObjectURI

            try:
                return str(ObjectURI.parse(value))
            except ObjectStoreError as exc:
                self.fail(exc.message, param, ctx)
        if isinstance(value, str) and _URL.match(value):
            self.fail(_object_refusal(value), param, ctx)
        return super().convert(value, param, ctx)


def _object_refusal(value: str) -> str:
    return (
        f"{value!r} is a URL; of object storage only s3:// is supported (any S3-compatible server), "
        "so give s3://bucket/prefix or a local path"
    )


class LocalPathText(click.ParamType[str, Any]):
    """Text that holds a local path (``DIR[:WEIGHT]``, ``NAME=PATH``): refused when it or what follows
    its first ``=`` is a URL."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        for path in (text, text.partition("=")[2]):
            if _URL.match(path):
                self.fail(_url_refusal(path), param, ctx)
        return text


class DatasetText(LocalPathText):
    """``--dataset DIR[:WEIGHT]``: a local folder, or a dataset in a bucket (``s3://bucket/prefix[:WEIGHT]``).

    An ``s3://`` URL whose bucket or prefix S3 would refuse is a usage error
    naming what is wrong; every other URL scheme is refused by name.
    """

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if text.startswith("s3://"):
            from dlmstore.errors import ObjectStoreError
            from dlmstore.objstore.uri import ObjectURI

            head, sep, tail = text.rpartition(":")
            url = head if sep and head.startswith("s3://") and _number(tail) else text
            try:
                ObjectURI.parse(url)
            except ObjectStoreError as exc:
                self.fail(exc.message, param, ctx)
            return text
        if _URL.match(text):
            self.fail(_object_refusal(text), param, ctx)
        return super().convert(value, param, ctx)


def _number(text: str) -> bool:
    """Whether ``text`` reads as a number (a ``:WEIGHT`` suffix; its value is checked where it is used)."""
    try:
        float(text)
    except ValueError:
        return False
    return True

"""Timestamps as store.db keeps them: ISO-8601 UTC text with a ``Z``.

``2026-11-21T08:15:03.123Z`` sorts as text in time order and reads as a
date in ``sqlite3``, so every timestamp column uses this one format.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


def utc_now() -> str:
    """The current time in the stored format."""
    return _format(datetime.now(UTC))


def iso_before(delta: timedelta) -> str:
    """The stored-format timestamp ``delta`` ago (for ``>=`` / ``<`` comparisons)."""
    return _format(datetime.now(UTC) - delta)


def utc_text(moment: datetime) -> str:
    """``moment`` in the stored format; a naive one is taken as UTC (as DocumentLanguageModel writes them)."""
    return _format(moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC))


def _format(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")

"""Numbers as people read them: byte sizes in decimal units, as the cache docs use."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """``1234567`` -> ``1.2 MB``; whole bytes below 1 KB (``999 B``)."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")

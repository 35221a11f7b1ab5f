"""Counts in messages, said grammatically: ``1 preference row``, ``2 rows``, ``1,024 entries``.

Every message that states a count goes through :func:`plural`, in the
library (errors, warnings) and the CLI alike, so none says "1 rows".
"""

from __future__ import annotations


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    """``count`` (with thousands separators) and the noun in the form that count takes.

    Args:
        count: how many.
        singular: the noun for one (``row``, ``preference row``).
        plural_form: the noun for any other count; ``singular + "s"`` when
            omitted (pass ``entries`` for ``entry``).
    """
    noun = singular if count == 1 else (plural_form if plural_form is not None else f"{singular}s")
    return f"{count:,} {noun}"

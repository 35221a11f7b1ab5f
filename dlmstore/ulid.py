"""ULIDs: 26-character, time-sortable ids in Crockford base32.

48 bits of Unix milliseconds followed by 80 random bits, encoded as 26
characters of ``0123456789ABCDEFGHJKMNPQRSTVWXYZ`` (no I, L, O, U). The first
character is at most ``7`` because 26 x 5 bits is 130 bits for a 128-bit
value.
"""

from __future__ import annotations

import os
import time

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_VALID = frozenset(ALPHABET)


def new_ulid(now: float | None = None) -> str:
    """Mint a new ULID for the time ``now`` (seconds since the epoch; default: now)."""
    # Floor to the millisecond, after rounding away float noise: 16667.993 s
    # times 1000 is 16667992.999999998, which must be 16667993 ms, not ...992.
    millis = int(round((time.time() if now is None else now) * 1000, 6))
    if not 0 <= millis < 2**48:
        raise ValueError(f"timestamp out of ULID range: {millis} ms")
    value = (millis << 80) | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def is_valid_ulid(text: object) -> bool:
    """True when ``text`` is a canonical (upper-case) 26-character ULID."""
    return isinstance(text, str) and len(text) == 26 and text[0] <= "7" and all(c in _VALID for c in text)


def ulid_timestamp(text: str) -> float:
    """Seconds since the epoch encoded in the first 10 characters of a ULID."""
    millis = 0
    for c in text[:10]:
        millis = millis * 32 + ALPHABET.index(c)
    return millis / 1000.0

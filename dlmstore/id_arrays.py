"""Ids packed as little-endian 64-bit integers: one ``BLOB`` for a list of ids.

A pass's cache uses (``cache_uses.entry_ids``), a pass snapshot's entry ids
and its proof's stat stamps (``pass_snapshots``) are long lists of integers
that are only ever written and read whole. One packed blob is one insert
and one C-level read (``array.frombytes``), where a row per id would be
100,000 inserts for a warm pass over 100,000 rows. Little-endian on every
host, so a store.db moved between machines reads the same ids.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable


def pack_ids(ids: Iterable[int]) -> bytes:
    """``ids`` as little-endian 64-bit integers."""
    packed = array("q", ids)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack_ids(blob: bytes) -> array[int]:
    """The ids of a blob written by :func:`pack_ids`."""
    ids = array("q")
    ids.frombytes(blob)
    if sys.byteorder == "big":
        ids.byteswap()
    return ids

"""The validation split: which rows are held out of training, as DLM holds them out.

DLM assigns each row to validation when the first 8 bytes (big-endian) of
``sha256(f"{seed}\\0{section_id}\\0{sub_index}")`` are below
``val_frac * 2**64``, with ``val_frac`` 0.1 and the seed the training seed.
dlmstore keys the same hash on the row key instead of ``(section_id,
sub_index)``::

    val  <=>  int.from_bytes(sha256(f"{seed}\\0{row_key}")[:8], "big") < int(0.1 * 2**64)

A row key (``dlmstore.document.rows``) names the row's section by its full
digest, the row's index inside it and the section's occurrence, so it is
DLM's ``(section_id, sub_index)`` made content-addressed: a row's fate is a
pure function of its key and the seed. Adding, removing or reordering other
rows moves no row between train and val, a warm run splits exactly as the
cold one did, and a row's text changing re-draws only that row.

The split applies to the rows the SFT phase trains on (prose, source files,
Q/A pairs), never to the ``### Q !probe`` pairs (DLM trains on them: they
are the questions the document means the adapter to answer) nor to the
preference triples (DLM's preference phase has no validation). Token
datasets bring their own ``val`` split (``dlm data build`` writes one).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass

#: DLM's ``val_frac`` (``dlm.data.dataset_builder.build_dataset``); its v15 frontmatter has no key for it.
VAL_FRACTION = 0.1

_BUCKETS = 1 << 64


def is_val(row_key: str, seed: int, val_fraction: float = VAL_FRACTION) -> bool:
    """Whether the row keyed ``row_key`` is held out for validation under ``seed``."""
    digest = hashlib.sha256(f"{seed}\x00{row_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < int(val_fraction * _BUCKETS)


@dataclass(frozen=True)
class Split:
    """Positions of the rows that train and of the rows held out, each in the input order."""

    train: tuple[int, ...]
    val: tuple[int, ...]


def split_rows(
    row_keys: Sequence[str],
    seed: int,
    *,
    always_train: Collection[str] = (),
    val_fraction: float = VAL_FRACTION,
) -> Split:
    """Split rows by their keys: :func:`is_val` for each, except the keys in ``always_train``.

    Args:
        row_keys: the keys of the rows, in the order they train.
        seed: the run's seed (``training.seed`` or ``--seed``).
        always_train: keys never held out (the document's ``!probe`` pairs).
        val_fraction: the share of rows held out, in expectation.
    """
    train: list[int] = []
    val: list[int] = []
    keep = set(always_train)
    for position, key in enumerate(row_keys):
        (val if key not in keep and is_val(key, seed, val_fraction) else train).append(position)
    return Split(train=tuple(train), val=tuple(val))

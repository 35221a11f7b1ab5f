"""Signatures of text rows: a content hash for exact duplicates, a MinHash for near ones.

Each text row (a prose section of the body, or a ``training.sources``
file) gets, once per row key:

* ``content_sha256``: the sha256 of its text, a source file's without its
  ``# source: <relpath>`` header, so a vendored copy of a file at another
  path has the same hash as the original. Equal hashes are exact duplicates.
* a **MinHash** of its word shingles: the text is split at ASCII whitespace
  into words, every run of :data:`SHINGLE_WORDS` consecutive words is one
  shingle (a text of fewer words is one shingle), each shingle is hashed to
  32 bits, and the signature keeps, for each of :data:`NUM_PERM` random
  permutations, the smallest permuted hash. Two signatures agree in a
  position with probability equal to the Jaccard similarity of the two
  shingle sets, so the share of equal positions estimates it (within about
  ±0.035 at 128 permutations, one standard deviation near 0.8).

The MinHash is `datasketch <https://github.com/ekzhu/datasketch>`_'s,
scheme ``affine32`` (``MinHash(num_perm=128, seed=1)``: each shingle hash
mixed by the MurmurHash3 finalizer, then ``a * h + b mod 2**32`` with the
seed's odd ``a``): ``tests/test_dedup.py`` checks that these signatures
equal datasketch's ``update_batch`` of the same shingle hashes (and
``dlmstore.corpus.dedup``'s candidates its ``MinHashLSH``'s). Only the
feeding is done here, on whole arrays: datasketch's ``update_batch`` calls
a Python hash function per shingle (about 13M shingles on the Python
stdlib), while this hashes every word of a text with a few numpy passes
over its bytes and applies the permutations in blocks. Importing
datasketch costs half a second to two (SciPy), so dlm does not import it:
the tests hold these functions to it.

Why 5-word shingles: vendored and generated copies of source files differ
in a few lines (a version header, a renamed import); a change of one line
moves about 5 shingles of several hundred, while unrelated files of one
project share boilerplate lines but few runs of five words. Shorter
shingles made unrelated small modules look alike, longer ones made a
small edit move more of the set.

Signatures are kept per row key in ``row_signatures`` (the row key names
the text, so a signature never goes stale); one of another scheme is made
again. A store takes the signatures of rows another store of the home
already signed (``dlmstore.cache.share``), as it takes their tokens.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from dlmstore.cache.share import sibling_reads
from dlmstore.clock import utc_now
from dlmstore.store.database import Store

if TYPE_CHECKING:
    import numpy as np

    from dlmstore.document.rows import Row

_log = logging.getLogger(__name__)

SHINGLE_WORDS = 5
NUM_PERM = 128
SEED = 1
#: Bump when what a signature is made from changes (the words, the shingle hash).
SCHEME_VERSION = 1
SCHEME = f"minhash-v{SCHEME_VERSION}:w{SHINGLE_WORDS}:p{NUM_PERM}:s{SEED}"

#: Shingles permuted at once: a block is NUM_PERM x BLOCK uint32 (2 MiB).
BLOCK = 4096

#: A word's bytes are weighted by powers of this odd 64-bit constant (mod 2**64).
_WORD_BASE = 0x9E3779B97F4A7C15
#: A shingle combines its words' hashes by powers of this one.
_SHINGLE_BASE = 0x100000001B3
#: Word bytes hashed from one run of prefix sums (a text is cut between words into runs of this).
PREFIX_BLOCK = 1 << 20


@dataclass(frozen=True)
class Signature:
    """One text row's signature, as ``row_signatures`` keeps it."""

    content_sha256: str
    shingles: int
    minhash: bytes  # NUM_PERM little-endian uint32


def row_text(text: str, source: str | None) -> str:
    """What a row's signature is made from: its text, a source file's without its header."""
    if source is not None:
        header = f"# source: {source}"
        if text.startswith(header):
            return text[len(header) :].strip()
    return text


def sign(text: str) -> Signature:
    """The signature of one row's text (see :func:`row_text`)."""
    data = text.encode("utf-8", "surrogatepass")
    hashes = shingle_hashes(data)
    values = minhash(hashes)  # all 0xFFFFFFFF for a text of no word: like no other
    return Signature(
        "sha256:" + hashlib.sha256(data).hexdigest(), len(hashes), values.astype("<u4").tobytes()
    )


def shingle_hashes(data: bytes) -> np.ndarray:
    """The distinct 32-bit hashes of the word shingles of ``data`` (UTF-8), sorted.

    Words are runs of bytes other than ASCII whitespace. A word's hash is
    the polynomial ``sum((byte_j + 1) * B**j) mod 2**64`` over its bytes,
    taken from prefix sums of the word bytes (a few whole-array passes, no
    loop over words); a shingle's is the same kind of polynomial over its
    words' hashes, folded to 32 bits.
    """
    import numpy as np

    space, powers, inverses = _tables()
    buf = np.frombuffer(data, dtype=np.uint8)
    if not len(buf):
        return np.empty(0, dtype=np.uint32)
    inside = ~space[buf]
    edges = np.diff(inside.view(np.int8), prepend=np.int8(0), append=np.int8(0))
    starts = np.flatnonzero(edges == 1)
    if not len(starts):
        return np.empty(0, dtype=np.uint32)
    lengths = np.flatnonzero(edges == -1) - starts
    packed = buf[inside]  # the words' bytes, back to back
    begins = np.zeros(len(starts), dtype=np.int64)  # where each word starts in them
    np.cumsum(lengths[:-1], out=begins[1:])
    finishes = begins + lengths
    words = np.empty(len(starts), dtype=np.uint64)
    with np.errstate(over="ignore"):
        # In blocks of at most PREFIX_BLOCK bytes, cut between words (a longer
        # word alone, hashed on its first PREFIX_BLOCK bytes).
        first = 0
        while first < len(begins):
            origin = int(begins[first])
            last = max(int(np.searchsorted(finishes, origin + PREFIX_BLOCK, side="right")), first + 1)
            stop = min(int(finishes[last - 1]), origin + PREFIX_BLOCK)
            block = packed[origin:stop].astype(np.uint64)
            block += np.uint64(1)
            block *= powers[: len(block)]
            sums = np.zeros(len(block) + 1, dtype=np.uint64)
            np.cumsum(block, out=sums[1:])
            local = begins[first:last] - origin
            ends = np.minimum(local + lengths[first:last], len(block))
            words[first:last] = (sums[ends] - sums[local]) * inverses[local]
            first = last
        count = len(words) - SHINGLE_WORDS + 1
        if count < 1:  # fewer words than a shingle: the text is one shingle
            shingles = np.zeros(1, dtype=np.uint64)
            for word in words:
                shingles = shingles * np.uint64(_SHINGLE_BASE) + word
        else:
            shingles = words[:count].copy()
            for offset in range(1, SHINGLE_WORDS):
                shingles *= np.uint64(_SHINGLE_BASE)
                shingles += words[offset : offset + count]
    folded = (shingles >> np.uint64(32)).astype(np.uint32) ^ shingles.astype(np.uint32)
    folded.sort()  # distinct values by sorting: numpy's hash-based unique is several times slower
    distinct = np.empty(len(folded), dtype=bool)
    distinct[0] = True
    np.not_equal(folded[1:], folded[:-1], out=distinct[1:])
    return folded[distinct]


def minhash(hashes: np.ndarray) -> np.ndarray:
    """datasketch's affine32 MinHash values of 32-bit ``hashes`` (``NUM_PERM`` uint32)."""
    import numpy as np

    a, b = permutations()
    a, b = a.reshape(-1, 1), b.reshape(-1, 1)
    values = np.full(NUM_PERM, 0xFFFFFFFF, dtype=np.uint32)
    with np.errstate(over="ignore"):
        mixed = _fmix32(hashes.astype(np.uint32))
        for begin in range(0, len(mixed), BLOCK):
            # A permutation per row: its minimum is a contiguous reduction (1.6x the
            # speed of a shingle per row, reduced across rows).
            block = a * mixed[begin : begin + BLOCK]
            block += b
            np.minimum(values, block.min(axis=1), out=values)
    return values


def permutations() -> tuple[np.ndarray, np.ndarray]:
    """The ``a`` and ``b`` of datasketch's ``MinHash(num_perm=NUM_PERM, seed=SEED, scheme="affine32")``."""
    global _PERMUTATIONS
    if _PERMUTATIONS is None:
        import numpy as np

        generator = np.random.RandomState(SEED)  # datasketch's draw, in its order; no global state
        a = generator.randint(0, 1 << 31, NUM_PERM, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
        b = generator.randint(0, 1 << 32, NUM_PERM, dtype=np.uint32)
        _PERMUTATIONS = (a, b)
    return _PERMUTATIONS


def _fmix32(hv: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer (datasketch's pre-mix of each input hash)."""
    import numpy as np

    hv = hv ^ (hv >> np.uint32(16))
    hv = hv * np.uint32(0x85EBCA6B)
    hv = hv ^ (hv >> np.uint32(13))
    hv = hv * np.uint32(0xC2B2AE35)
    mixed: np.ndarray = hv ^ (hv >> np.uint32(16))
    return mixed


_PERMUTATIONS: tuple[np.ndarray, np.ndarray] | None = None


@cache
def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which bytes are ASCII whitespace, and the powers of the word base and of its inverse mod
    2**64 for :data:`PREFIX_BLOCK` bytes (16 MiB together; built on first use, so a pass that
    signs nothing imports no numpy)."""
    import numpy as np

    space = np.zeros(256, dtype=bool)
    space[[9, 10, 11, 12, 13, 32]] = True
    with np.errstate(over="ignore"):
        powers = np.full(PREFIX_BLOCK, _WORD_BASE, dtype=np.uint64)
        powers[0] = 1
        np.cumprod(powers, out=powers)
        inverses = np.full(PREFIX_BLOCK, pow(_WORD_BASE, -1, 1 << 64), dtype=np.uint64)
        inverses[0] = 1
        np.cumprod(inverses, out=inverses)
    return space, powers, inverses


def cached(conn: sqlite3.Connection, keys: Iterable[str]) -> dict[str, Signature]:
    """The signatures of ``keys`` that store.db holds under :data:`SCHEME` (any connection)."""
    import json

    rows = conn.execute(
        "SELECT s.row_key, s.content_sha256, s.shingles, s.minhash FROM json_each(?) AS k "
        "JOIN row_signatures AS s ON s.row_key = k.value WHERE s.scheme = ?",
        (json.dumps(list(keys)), SCHEME),
    ).fetchall()
    return {row[0]: Signature(row[1], row[2], bytes(row[3])) for row in rows if len(row[3]) == 4 * NUM_PERM}


class Signing:
    """Signatures made while the tokenize pass encodes its rows, on its encoding threads.

    Signing the rows after the pass would be a second pass over their
    text on one core while the other idles (about a third of a second
    for 1,000 files of 13 MB): the pass instead hands each chunk it has
    just encoded to :meth:`sign_rows`, on the thread that encoded it, so
    signing shares both cores with encoding. Before encoding, the pass
    names the rows it will encode (:meth:`expect`, on its own thread):
    the text rows among them whose signature store.db does not keep are
    the ones signed. :func:`dlmstore.corpus.dedup.analyse` takes
    :attr:`made` and signs only what is still missing.

    Args:
        store: the document's store (its kept signatures are not made again).
        sources: gives every text row's key, with the ``training.sources``
            relpath of its file (``None`` for prose; see :func:`row_text`);
            called only when some row is to be encoded (a pass of all hits
            never needs it).
    """

    def __init__(self, store: Store, sources: Callable[[], Mapping[str, str | None]]) -> None:
        self._store = store
        self._sources = sources
        self._wanted: dict[str, str | None] = {}
        self.made: dict[str, Signature] = {}

    def expect(self, rows: Sequence[Row]) -> None:
        """``rows`` are about to be encoded: sign those of them that are text rows without a kept signature."""
        if not rows:
            return
        sources = self._sources()
        keys = [row.row_key for row in rows if row.row_key in sources]
        if not keys:
            return
        with self._store.read() as conn:
            there = cached(conn, keys)
        self._wanted = {key: sources[key] for key in keys if key not in there}
        if self._wanted:  # built here, once, rather than by two encoding threads at the same time
            _tables()
            permutations()

    def sign_rows(self, rows: Sequence[Row]) -> None:
        """Sign the wanted ones of ``rows`` (any thread; each row is signed by the thread that has it)."""
        for row in rows:
            if row.row_key in self._wanted and row.row_key not in self.made:
                self.made[row.row_key] = sign(row_text(row.data["text"], self._wanted[row.row_key]))


def from_other_stores(folder: Path, keys: Iterable[str]) -> dict[str, Signature]:
    """The signatures of ``keys`` that the other stores beside the store ``folder`` hold
    (read-only; a store that cannot be read is skipped, as for sharing tokens)."""
    wanted = set(keys)
    found: dict[str, Signature] = {}
    with sibling_reads(folder) as others:
        for dlm_id, conn in others:
            if not wanted:
                break
            try:
                got = cached(conn, wanted)
            except (sqlite3.Error, UnicodeDecodeError) as exc:
                _log.debug("signatures: skipping %s: %s", dlm_id, exc)
                continue
            found.update(got)
            wanted -= got.keys()
    return found


def save(store: Store, signatures: Mapping[str, Signature]) -> None:
    """Keep ``signatures`` in store.db (replacing one of another scheme)."""
    if not signatures:
        return
    now = utc_now()
    with store.write() as conn:
        conn.executemany(
            "INSERT INTO row_signatures (row_key, scheme, content_sha256, shingles, minhash, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (row_key) DO UPDATE SET scheme = excluded.scheme, "
            "content_sha256 = excluded.content_sha256, shingles = excluded.shingles, "
            "minhash = excluded.minhash, created_at = excluded.created_at",
            [
                (key, SCHEME, sig.content_sha256, sig.shingles, sig.minhash, now)
                for key, sig in signatures.items()
            ],
        )

"""DLM's replay corpus, read from its pack and recorded as dlmstore's replay history.

DLM keeps every section a training run saw in ``replay/corpus.zst``: one
independently decodable zstd frame per section snapshot, each the
canonical CBOR of ``{section_id, section_type, content, auto_mined,
first_seen_at, last_seen_at, training_runs_seen}``; ``replay/index.json``
points at each frame (``section_id``, ``byte_offset``, ``length``,
``added_at``, ``weight``), sorted by section id. A section appended twice
has two frames.

dlmstore's history is kept by row, not by section (``dlmstore.replay.history``):
each snapshot's content is split into rows as dlmstore splits a section of
the document (so a section the document still holds gets the same row keys
and is never replayed, and one it dropped is), and the rows are recorded as
one generation under a run. The snapshots' timestamps and DLM's sampler
weights have no counterpart: recency here comes from generations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlmstore.errors import PackError

#: The section types a snapshot may have (DLM's ``SectionSnapshot.section_type``).
SECTION_TYPES = ("prose", "instruction", "preference")
#: The largest frame, and the largest section snapshot it decompresses to, read back.
_MAX_FRAME = 64 * 1024**2


def read_sections(corpus: Path, index: Path) -> tuple[tuple[str, str], ...]:
    """Every section snapshot of the corpus as (type, content), in index order, one frame in memory at a time.

    Raises:
        PackError: the index is not DLM's, a frame lies outside the corpus, or
            does not decompress to a snapshot of a text section.
    """
    import cbor2
    import zstandard

    size = corpus.stat().st_size
    sections: list[tuple[str, str]] = []
    try:
        entries = json.loads(index.read_bytes())
        if not isinstance(entries, list):
            raise ValueError("index.json is not a list")
        decompressor = zstandard.ZstdDecompressor()
        with corpus.open("rb") as frames:
            for entry in entries:
                start, length = int(entry["byte_offset"]), int(entry["length"])
                if start < 0 or length <= 0 or length > _MAX_FRAME or start + length > size:
                    raise ValueError(f"entry {entry.get('section_id')} lies outside corpus.zst")
                frames.seek(start)
                snapshot = cbor2.loads(
                    decompressor.decompress(frames.read(length), max_output_size=_MAX_FRAME)
                )
                kind, content = snapshot["section_type"], snapshot["content"]
                if kind not in SECTION_TYPES or not isinstance(content, str):
                    raise ValueError(f"section {snapshot.get('section_id')} has type {kind!r}")
                sections.append((kind, content))
    except (ValueError, KeyError, TypeError, zstandard.ZstdError, cbor2.CBORDecodeError) as exc:
        raise PackError(f"the pack's replay corpus cannot be read ({exc}): the pack is damaged") from None
    return tuple(sections)


def record_history(store: Any, sections: tuple[tuple[str, str], ...], run_id: int, settings: Any) -> int:
    """Record the rows of ``sections`` as one generation of history under run ``run_id``; how many rows.

    ``settings`` is the document's ``training.replay`` (its retention
    fraction and size cap apply as they do to a run's rows). A ``### Q
    !probe`` pair is recorded as a probe, as a run records it.
    """
    from dlmstore.document.rows import section_rows
    from dlmstore.document.sections import Section
    from dlmstore.eval.probes import marked_keys
    from dlmstore.replay.history import BODY, TrainedRow, pending, record_run, supersede_key

    parsed = [Section(kind, content) for kind, content in sections]
    probes = marked_keys(parsed)
    described: list[TrainedRow] = []
    seen: set[str] = set()
    for section in parsed:
        for row in section_rows(section):
            if row.row_key not in seen:
                seen.add(row.row_key)
                described.append(TrainedRow(row, supersede_key(row, BODY), BODY, row.row_key in probes))
    prepared = pending(store, [item.row_key for item in described], lambda: described, settings)
    with store.write() as conn:
        record_run(conn, run_id, prepared)
    return len(described)

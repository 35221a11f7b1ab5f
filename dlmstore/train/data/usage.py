"""What a train run trained on: each rank's positions and counts, each dataset's share.

During the SFT phase every rank's collator counts the items and tokens it
trains per input (:class:`~dlmstore.train.data.examples.Collator`). At the end
every rank's positions and counts are gathered to rank 0, which writes
each rank's positions to a file, ``runs/<run>/sft-rank<r>.samples.npy``,
and registers the counts in one transaction: ``run_ranks`` (one row per rank)
and ``run_datasets`` (one row per token dataset, with the items and
tokens of it the run used).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Folder of the store where runs keep their per-rank files.
SAMPLES_DIR = "runs"


@dataclass(frozen=True)
class DatasetUse:
    """A token dataset the run trained on, and how much of it (``run_datasets``).

    Attributes:
        path: The dataset folder.
        kind: ``pretrain`` (packed windows) or ``sft`` (masked conversations).
        name: The dataset's name from its meta.json.
        split: The split trained on: ``train`` or ``val``.
        weight: Its mixture weight (the document's rows weigh 1).
        meta_sha256: sha256 of its meta.json, the dataset's identity.
        samples: Items of it the run trained on, all ranks.
        tokens: Tokens of those items.
    """

    path: str
    kind: str
    name: str
    split: str
    weight: float
    meta_sha256: str
    samples: int
    tokens: int


def samples_path(run_id: int, rank: int) -> str:
    """Where rank ``rank`` of run ``run_id`` keeps its trained positions, relative to the store."""
    return f"{SAMPLES_DIR}/{run_id}/sft-rank{rank}.samples.npy"


def gather_accounting(world: Any, accounting: dict[str, Any] | None) -> list[dict[str, Any] | None]:
    """Every rank's SFT accounting (positions trained, per-source counts, ``count``), on rank 0.

    The other ranks get an empty list: they send theirs, and rank 0 alone
    writes (the store may be on another machine).
    """
    from dlmstore.train.distributed import gather_to_main

    mine = None if accounting is None else {**accounting, "count": len(accounting["samples"])}
    return gather_to_main(world, mine) or []


def write_rank_samples(store_path: Path, run_id: int, per_rank: Sequence[dict[str, Any] | None]) -> None:
    """Each rank's trained positions, as ``runs/<run>/sft-rank<r>.samples.npy`` (rank 0 writes them all)."""
    import numpy as np

    from dlmstore.datasets.build.writers import npy_bytes
    from dlmstore.store.atomic import write_bytes_atomic

    for rank, accounting in enumerate(per_rank):
        if accounting is None:
            continue
        path = store_path / samples_path(run_id, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, npy_bytes(np.asarray(accounting["samples"], dtype=np.int64)))


def record_usage(
    store: Any, run_id: int, inputs: Sequence[Any], per_rank: list[dict[str, Any] | None]
) -> list[DatasetUse]:
    """Register what each rank trained (``run_ranks``) and each dataset's share (``run_datasets``)."""
    ranks = [(rank, counts) for rank, counts in enumerate(per_rank) if counts is not None]
    if not ranks:
        return []
    offset = len(ranks[0][1]["source_samples"]) - len(inputs)  # the document's rows are source 0 when present
    uses = []
    for position, item in enumerate(inputs):
        source = position + offset
        uses.append(
            DatasetUse(
                path=item.path,
                kind=item.kind,
                name=item.name,
                split=item.split,
                weight=item.weight,
                meta_sha256=item.meta_sha256,
                samples=sum(c["source_samples"][source] for _, c in ranks),
                tokens=sum(c["source_tokens"][source] for _, c in ranks),
            )  # fmt: skip
        )
    with store.write() as conn:
        conn.executemany(
            "INSERT OR REPLACE INTO run_ranks (run_id, phase, rank, samples, tokens, samples_path) "
            "VALUES (?, 'sft', ?, ?, ?, ?)",
            [
                (run_id, rank, c["count"], sum(c["source_tokens"]), samples_path(run_id, rank))
                for rank, c in ranks
            ],
        )  # fmt: skip
        conn.executemany(
            "INSERT OR REPLACE INTO run_datasets (run_id, position, path, kind, name, split, weight, meta_sha256, "
            "tokenizer_sha256, tokens_available, samples_used, tokens_used) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (run_id, position, item.path, item.kind, item.name, item.split, item.weight, item.meta_sha256,
                 item.tokenizer_sha256, item.tokens, use.samples, use.tokens)
                for position, (item, use) in enumerate(zip(inputs, uses, strict=True))
            ],
        )  # fmt: skip
    return uses

"""What a train run trained on: each rank's positions and counts, each dataset's share.

During the SFT phase every rank's collator counts the items and tokens it
trains per input (:class:`~dlmstore.train.data.examples.Collator`). At the end
each rank writes the positions it trained on to a file of its own,
``runs/<run>/sft-rank<r>.samples.npy``; the counts are gathered to rank 0,
which registers them in one transaction: ``run_ranks`` (one row per rank)
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
    """Every rank's SFT accounting (positions trained, per-source counts), on every rank."""
    from dlmstore.train.distributed import gather

    summary = None if accounting is None else {k: v for k, v in accounting.items() if k != "samples"}
    if summary is not None and accounting is not None:
        summary["count"] = len(accounting["samples"])
    return gather(world, summary)


def write_rank_samples(store_path: Path, run_id: int, world: Any, accounting: dict[str, Any] | None) -> None:
    """This rank's trained positions, as ``runs/<run>/sft-rank<r>.samples.npy`` (each rank its own file)."""
    if accounting is None:
        return
    import numpy as np

    from dlmstore.datasets.build.writers import npy_bytes
    from dlmstore.store.atomic import write_bytes_atomic

    path = store_path / samples_path(run_id, world.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(
        path,
        npy_bytes(np.asarray(accounting["samples"], dtype=np.int64)),
    )


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

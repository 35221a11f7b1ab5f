"""``ResumableLoader``: batches over a map-style dataset that resume exactly mid-epoch, on any world size.

The loader owns the position: ``(epoch, batches_done)``. Iterating it
yields the rest of the current epoch's batches (a ``torch`` ``DataLoader``
over this rank's share from :class:`~.sampler.RankPartitionSampler`, so
``num_workers`` works as usual), counting a batch as done when it is
handed to the caller; the next iteration starts the next epoch.

``state_dict()`` records the position *and* everything that decides which
samples a position means: batch size, world size, rank, seed, shuffle,
drop_last, the dataset size and ``pad_to`` (the world size the epochs'
order is padded for). Since rank ``r`` takes every ``world``-th item of
the epoch's order, ``k`` batches of ``b`` on each of ``w`` ranks are the
first ``k * b * w`` items of the order, whatever ``w`` is: a state loads
into a loader of another world size (any rank) that keeps the global batch
``b * w`` (elastic resume, as litdata's and MosaicML streaming's loaders
do), which then keeps the state's ``pad_to``. ``load_state_dict`` refuses
a state whose global batch, seed, shuffle, drop_last or dataset size
differs, because "batch 120 of epoch 3" would then name other samples,
and silently resuming there would repeat or skip data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from dlmstore.datasets.read.sampler import RankPartitionSampler
from dlmstore.errors import DatasetError, ResumeError

STATE_VERSION = 1
#: Settings a checkpoint must share with the loader it is loaded into (the global batch is checked too).
_MUST_MATCH = {
    "seed": "seed",
    "shuffle": "shuffle",
    "drop_last": "drop_last",
    "num_samples": "dataset size",
}


class ResumableLoader:
    """Batches of ``dataset`` for one rank, resumable mid-epoch (see the module docstring).

    Args:
        dataset: a map-style dataset (``__len__`` and ``__getitem__``).
        batch_size: samples per batch on this rank.
        num_replicas, rank, seed, shuffle: as for the sampler.
        drop_last: drop the last partial batch (and make ranks equal by
            cutting instead of padding).
        num_workers, collate_fn, pin_memory: passed to ``DataLoader``.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        batch_size: int,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
    ) -> None:
        if batch_size < 1:
            raise DatasetError(f"batch_size must be at least 1, not {batch_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.sampler = RankPartitionSampler(
            len(dataset),  # type: ignore[arg-type]
            num_replicas=num_replicas,
            rank=rank,
            seed=seed,
            shuffle=shuffle,
            drop_last=drop_last,
        )
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.collate_fn = collate_fn
        self.pin_memory = pin_memory
        self.epoch = 0
        self.batches_done = 0

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        per_rank = self.sampler.per_rank
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        self.sampler.set_epoch(self.epoch)
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.epoch)
        indices = self.sampler.indices().tolist()
        batches = [indices[i : i + self.batch_size] for i in range(0, len(indices), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        remaining = batches[self.batches_done :]
        loader = DataLoader(
            self.dataset,
            batch_sampler=remaining,
            num_workers=self.num_workers,
            collate_fn=self.collate_fn,
            pin_memory=self.pin_memory,
        )
        for batch in loader:
            self.batches_done += 1
            yield batch
        self.epoch += 1
        self.batches_done = 0

    def state_dict(self) -> dict[str, Any]:
        """Position and settings; save it with the model checkpoint."""
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "batches_done": self.batches_done,
            "batch_size": self.batch_size,
            "num_replicas": self.sampler.num_replicas,
            "rank": self.sampler.rank,
            "seed": self.sampler.seed,
            "shuffle": self.sampler.shuffle,
            "drop_last": self.drop_last,
            "num_samples": self.sampler.total,
            "pad_to": self.sampler.pad_to,
        }
        if hasattr(self.dataset, "state_dict"):
            state["dataset"] = self.dataset.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; refuse it when the settings differ.

        Raises:
            ResumeError: a setting differs (the message names it and both values).
        """
        if state.get("version") != STATE_VERSION:
            raise ResumeError(f"cannot resume from a loader state of version {state.get('version')!r}")
        mine = self.state_dict()
        try:
            theirs = int(state["batch_size"]) * int(state["num_replicas"])
        except (KeyError, TypeError, ValueError):
            raise ResumeError(
                "cannot resume from a loader state without its batch size and world size"
            ) from None
        if theirs != self.batch_size * self.sampler.num_replicas:
            raise ResumeError(
                f"cannot resume: the checkpoint was taken with a global batch of {theirs} (batch size "
                f"{state['batch_size']} x world size {state['num_replicas']}), this loader has "
                f"{self.batch_size * self.sampler.num_replicas} ({self.batch_size} x {self.sampler.num_replicas})",
                hint=f"resume with a batch size times world size of {theirs}, or start a new epoch with a fresh loader",
            )
        for key, label in _MUST_MATCH.items():
            if state.get(key) != mine[key]:
                raise ResumeError(
                    f"cannot resume: the checkpoint was taken with {label} {state.get(key)}, "
                    f"this loader has {mine[key]}",
                    hint=f"resume with {label} {state.get(key)}, or start a new epoch with a fresh loader",
                )
        pad_to = int(state.get("pad_to", state["num_replicas"]))  # a state written before pad_to was recorded
        if pad_to != self.sampler.pad_to:
            try:
                self.sampler = RankPartitionSampler(
                    self.sampler.total, num_replicas=self.sampler.num_replicas, rank=self.sampler.rank,
                    seed=self.sampler.seed, shuffle=self.sampler.shuffle, drop_last=self.drop_last, pad_to=pad_to,
                )  # fmt: skip
            except DatasetError as exc:
                raise ResumeError(
                    f"cannot resume: {exc.message}",
                    hint=f"resume on a world size that divides the epoch (the checkpoint's was {pad_to})",
                ) from None
        if "dataset" in state and hasattr(self.dataset, "load_state_dict"):
            self.dataset.load_state_dict(state["dataset"])
        self.epoch = int(state["epoch"])
        self.batches_done = int(state["batches_done"])


def collate_stack(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack a list of equal-shape tensor dicts (what ``MemoryMappedDataset`` returns)."""
    return {key: torch.stack([item[key] for item in items]) for key in items[0]}

"""``RankPartitionSampler``: each rank its own disjoint share of every epoch.

The permutation of an epoch is ``torch.randperm`` with a generator seeded
from ``(seed, epoch)`` only, so every rank computes the same permutation
without talking to the others and takes every ``num_replicas``-th index
starting at its ``rank``. To give every rank the same number of samples,
the permutation is either padded with its own first indices
(``drop_last=False``, some samples seen twice per epoch) or cut to a
multiple of ``num_replicas`` (``drop_last=True``, a few unseen).

``start`` skips the first indices of this rank's share: how a resumed
loader continues mid-epoch without replaying batches.

**Elastic.** ``pad_to`` (default: ``num_replicas``) is the multiple the
epoch's order is padded (or cut) to. Rank ``r`` taking every
``num_replicas``-th index from ``r`` means that ``k`` batches of ``b`` on
every rank are the first ``k * b * num_replicas`` indices of the order,
whatever ``num_replicas`` is: a run that keeps ``pad_to`` (its first world
size) and its global batch continues on another number of ranks exactly
where it stopped (``dlmstore.train.checkpoints.Layout``), as long as the
padded order divides evenly among them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch
from torch.utils.data import Sampler

from dlmstore.errors import DatasetError

#: Mixed into the seed so epoch e of seed s and epoch 0 of seed s + e differ.
_EPOCH_STRIDE = 1_000_003


class RankPartitionSampler(Sampler[int]):
    """Indices of ``data`` for one rank, reshuffled per epoch (see the module docstring).

    Args:
        data: the dataset (or its length).
        num_replicas: world size.
        rank: this process's rank, ``0 <= rank < num_replicas``.
        seed: shared by all ranks.
        shuffle: permute per epoch (else ``0..n-1``).
        drop_last: cut to a multiple of ``pad_to`` instead of padding.
        pad_to: the multiple the order is padded or cut to (default ``num_replicas``);
            the padded length must divide by ``num_replicas``.
    """

    def __init__(
        self,
        data: Sized | int,
        *,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        pad_to: int | None = None,
    ) -> None:
        self.total = data if isinstance(data, int) else len(data)
        if num_replicas < 1:
            raise DatasetError(f"num_replicas must be at least 1, not {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise DatasetError(
                f"rank {rank} is outside the world size {num_replicas} (0..{num_replicas - 1})"
            )
        if self.total == 0:
            raise DatasetError("cannot sample from an empty dataset")
        self.pad_to = num_replicas if pad_to is None else pad_to
        if self.pad_to < 1:
            raise DatasetError(f"pad_to must be at least 1, not {self.pad_to}")
        self.num_replicas = num_replicas
        self.drop_last = drop_last
        if self._length() % num_replicas:
            raise DatasetError(
                f"an epoch of {self.total} samples, {'cut' if drop_last else 'padded'} to {self._length()} "
                f"(a multiple of {self.pad_to}), cannot be split evenly over {num_replicas} ranks"
            )
        self.rank = rank
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.start = 0

    def _length(self) -> int:
        """The epoch's order, padded (or cut) to a multiple of ``pad_to``."""
        if self.drop_last:
            return self.total // self.pad_to * self.pad_to
        return -(-self.total // self.pad_to) * self.pad_to

    @property
    def per_rank(self) -> int:
        """Samples this rank yields per epoch."""
        return self._length() // self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s permutation from now on (and start at its beginning)."""
        self.epoch = epoch
        self.start = 0

    def indices(self) -> torch.Tensor:
        """This rank's whole share of the current epoch, in order."""
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed * _EPOCH_STRIDE + self.epoch)
            order = torch.randperm(self.total, generator=generator)
        else:
            order = torch.arange(self.total)
        wanted = self.per_rank * self.num_replicas
        if wanted > self.total:
            repeats = -(-wanted // self.total)
            order = order.repeat(repeats)
        order = order[:wanted]
        return order[self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices()[self.start :].tolist())

    def __len__(self) -> int:
        return self.per_rank - self.start

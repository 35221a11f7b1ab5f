"""``MixtureDataset``: several datasets sampled by weight, with a temperature.

Source ``i`` is drawn with probability ``p_i ∝ w_i ** (1 / temperature)``:
temperature 1 follows the weights, a higher temperature flattens them
towards uniform (up-sampling small sources), a lower one sharpens them.
Weights default to the sources' sizes, so temperature 1 then means
"proportional to size".

The mixture is a map-style dataset of ``num_samples`` items (default: the
sources' total size). For an epoch, a seeded ``torch.multinomial`` assigns
a source to every position and each source is walked through its own
seeded permutation, cycling when a source is drawn more often than it has
items. Item ``k`` is therefore a pure function of ``(seed, epoch, k)``:
the resumable loader and the rank sampler work on it unchanged, and a
resumed run sees exactly the items it would have seen. The schedule costs
16 bytes per position plus 8 per source item, made once per epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from dlmstore.errors import DatasetError, ResumeError


class MixtureDataset(Dataset[Any]):
    """Items of ``datasets`` mixed by weight and temperature (see the module docstring).

    Args:
        datasets: map-style datasets.
        weights: one non-negative weight per dataset (default: their sizes).
        temperature: > 0; 1 follows the weights, larger flattens them.
        num_samples: items per epoch (default: the total size).
        seed: seeds the schedule (with the epoch).
    """

    def __init__(
        self,
        datasets: Sequence[Dataset[Any]],
        *,
        weights: Sequence[float] | None = None,
        temperature: float = 1.0,
        num_samples: int | None = None,
        seed: int = 0,
    ) -> None:
        if not datasets:
            raise DatasetError("a mixture needs at least one dataset")
        self.datasets = list(datasets)
        self.sizes = [len(d) for d in self.datasets]  # type: ignore[arg-type]
        if any(size == 0 for size in self.sizes):
            raise DatasetError(f"mixture source {self.sizes.index(0)} is empty")
        if weights is None:
            weights = [float(size) for size in self.sizes]
        if len(weights) != len(self.datasets):
            raise DatasetError(f"{len(weights)} weights for {len(self.datasets)} datasets")
        if any(w < 0 for w in weights) or not any(w > 0 for w in weights):
            raise DatasetError(f"weights must be non-negative and not all zero, not {list(weights)}")
        if temperature <= 0:
            raise DatasetError(f"temperature must be positive, not {temperature}")
        self.weights = [float(w) for w in weights]
        self.temperature = float(temperature)
        scaled = torch.tensor(self.weights, dtype=torch.float64) ** (1.0 / self.temperature)
        self.probabilities = (scaled / scaled.sum()).tolist()
        self.num_samples = num_samples if num_samples is not None else sum(self.sizes)
        if self.num_samples < 1:
            raise DatasetError(f"num_samples must be at least 1, not {self.num_samples}")
        self.seed = seed
        self.epoch = 0
        self._schedule: tuple[torch.Tensor, torch.Tensor] | None = None

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch = epoch
            self._schedule = None

    def _build(self) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        probabilities = torch.tensor(self.probabilities, dtype=torch.float64)
        sources = torch.multinomial(probabilities, self.num_samples, replacement=True, generator=generator)
        items = torch.empty(self.num_samples, dtype=torch.int64)
        for source, size in enumerate(self.sizes):
            where = torch.nonzero(sources == source).flatten()
            if len(where) == 0:
                continue
            order = torch.randperm(size, generator=generator)
            items[where] = order[torch.arange(len(where)) % size]
        return sources, items

    def source_of(self, index: int) -> tuple[int, int]:
        """``(dataset, item)`` that position ``index`` of this epoch reads."""
        if self._schedule is None:
            self._schedule = self._build()
        if not 0 <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for {self.num_samples} samples")
        sources, items = self._schedule
        return int(sources[index]), int(items[index])

    def __getitem__(self, index: int) -> Any:
        source, item = self.source_of(index)
        return self.datasets[source][item]

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "weights": self.weights,
            "temperature": self.temperature,
            "num_samples": self.num_samples,
            "seed": self.seed,
            "sizes": self.sizes,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the epoch; refuse a mixture with other weights, sizes or seed."""
        for key in ("weights", "temperature", "num_samples", "seed", "sizes"):
            if state.get(key) != getattr(self, key):
                raise ResumeError(
                    f"cannot resume: the checkpoint's mixture had {key} {state.get(key)}, "
                    f"this one has {getattr(self, key)}",
                    hint="resume with the same sources, weights, temperature and seed",
                )
        self.set_epoch(int(state["epoch"]))

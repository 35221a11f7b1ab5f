"""Rank partitioning, exact mid-epoch resume (and refusing a changed setup), mixtures."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

from dlmstore.datasets.build.pretrain import build_pretrain_cache
from dlmstore.datasets.read.loader import ResumableLoader, collate_stack
from dlmstore.datasets.read.mixture import MixtureDataset
from dlmstore.datasets.read.mmap_dataset import MemoryMappedDataset
from dlmstore.datasets.read.sampler import RankPartitionSampler
from dlmstore.errors import DatasetError, ResumeError

from .helpers import WORD_SHA, WordTokenizer, words


class Numbers(Dataset[int]):
    def __init__(self, n: int, base: int = 0) -> None:
        self.n, self.base = n, base

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.n:
            raise IndexError(index)
        return self.base + index


def test_ranks_get_disjoint_shares_that_cover_the_epoch() -> None:
    shares = [list(RankPartitionSampler(10, num_replicas=3, rank=r, seed=1)) for r in range(3)]
    assert [len(s) for s in shares] == [4, 4, 4]  # padded to 12 with the epoch's first indices
    assert set(sum(shares, [])) == set(range(10))
    cut = [list(RankPartitionSampler(10, num_replicas=3, rank=r, seed=1, drop_last=True)) for r in range(3)]
    flat = sum(cut, [])
    assert [len(s) for s in cut] == [3, 3, 3] and len(set(flat)) == 9


def test_each_epoch_is_a_new_permutation_shared_by_all_ranks() -> None:
    sampler = RankPartitionSampler(50, seed=3)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert sorted(first) == sorted(second) == list(range(50)) and first != second
    again = RankPartitionSampler(50, seed=3)
    assert list(again) == first
    again.start = 45  # a resumed epoch skips what was already served
    assert list(again) == first[45:] and len(again) == 5


def test_a_rank_outside_the_world_is_refused() -> None:
    with pytest.raises(DatasetError) as info:
        RankPartitionSampler(10, num_replicas=2, rank=2)
    assert info.value.message == "rank 2 is outside the world size 2 (0..1)"


def test_resuming_mid_epoch_continues_exactly_where_the_loader_stopped() -> None:
    full = ResumableLoader(Numbers(37), batch_size=4, seed=5, num_replicas=2, rank=1)
    epoch0 = [b.tolist() for b in full]
    epoch1 = [b.tolist() for b in full]

    loader = ResumableLoader(Numbers(37), batch_size=4, seed=5, num_replicas=2, rank=1)
    seen = []
    for batch in loader:
        seen.append(batch.tolist())
        if len(seen) == 3:
            break
    state = loader.state_dict()
    assert (state["epoch"], state["batches_done"]) == (0, 3)

    resumed = ResumableLoader(Numbers(37), batch_size=4, seed=5, num_replicas=2, rank=1)
    resumed.load_state_dict(state)
    seen.extend(b.tolist() for b in resumed)
    assert seen == epoch0
    assert [b.tolist() for b in resumed] == epoch1  # and the next epoch is the same too


def test_resuming_with_another_global_batch_is_refused() -> None:
    loader = ResumableLoader(Numbers(20), batch_size=4, num_replicas=2, rank=0)
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(ResumeError) as info:
        ResumableLoader(Numbers(20), batch_size=8, num_replicas=2, rank=0).load_state_dict(state)
    assert info.value.message == (
        "cannot resume: the checkpoint was taken with a global batch of 8 (batch size 4 x world size 2), "
        "this loader has 16 (8 x 2)"
    )
    with pytest.raises(ResumeError) as info:
        ResumableLoader(Numbers(20), batch_size=4, num_replicas=4, rank=0).load_state_dict(state)
    assert info.value.message == (
        "cannot resume: the checkpoint was taken with a global batch of 8 (batch size 4 x world size 2), "
        "this loader has 16 (4 x 4)"
    )


def test_a_loader_stopped_on_two_ranks_resumes_on_one_or_four_with_the_samples_left() -> None:
    def run(
        size: int, world: int, *, stop: int | None = None, state: dict[str, Any] | None = None
    ) -> list[Any]:
        """Each step's items (all ranks together, 8 a step) of one epoch of ``size``; with ``stop``, the
        steps to there and, last, rank 0's state."""
        loaders = [ResumableLoader(Numbers(size), batch_size=8 // world, seed=5, num_replicas=world, rank=r)
                   for r in range(world)]  # fmt: skip
        for loader in loaders:
            if state is not None:
                loader.load_state_dict(state)  # any rank's state: the position is the same on every rank
        steps: list[Any] = []
        for batches in zip(*loaders, strict=True):
            steps.append(sorted(item for batch in batches for item in batch.tolist()))
            if len(steps) == stop:
                return [*steps, loaders[0].state_dict()]
        return steps

    for size, world in ((37, 1), (36, 4)):
        *first, state = run(size, 2, stop=2)
        assert first + run(size, world, state=state) == run(size, 2)
    *_, state = run(37, 2, stop=2)
    with pytest.raises(ResumeError) as info:  # 37 items padded to 38 for 2 ranks: not for 4
        ResumableLoader(Numbers(37), batch_size=2, seed=5, num_replicas=4, rank=0).load_state_dict(state)
    assert info.value.message == (
        "cannot resume: an epoch of 37 samples, padded to 38 (a multiple of 2), cannot be split evenly over 4 ranks"
    )


def test_the_loader_serves_memory_mapped_windows_and_saves_the_datasets_state(tmp_path: Path) -> None:
    texts = [words(*range(10 * i + 1, 10 * i + 9)) for i in range(20)]
    build_pretrain_cache(
        texts, tmp_path / "ds", tokenizer=WordTokenizer(), tokenizer_sha256=WORD_SHA, val_frac=0.0, seed=0
    )
    dataset = MemoryMappedDataset(tmp_path / "ds" / "train", 9, "shard_*.bin", pack_sequences=True)
    loader = ResumableLoader(dataset, batch_size=4, collate_fn=collate_stack, drop_last=True)
    batch = next(iter(loader))
    assert batch["input_ids"].shape == batch["labels"].shape == batch["doc_ids"].shape == (4, 8)
    assert loader.state_dict()["dataset"] == {"epoch": 0, "total_samples": len(dataset)}


def test_mixture_probabilities_follow_weights_sharpened_or_flattened_by_temperature() -> None:
    sources = [Numbers(10), Numbers(10, base=100)]
    assert MixtureDataset(sources, weights=[3, 1]).probabilities == pytest.approx([0.75, 0.25])
    assert MixtureDataset(sources, weights=[9, 1], temperature=2).probabilities == pytest.approx([0.75, 0.25])
    sized = MixtureDataset([Numbers(30), Numbers(10, base=100)])
    assert sized.probabilities == pytest.approx([0.75, 0.25])
    mix = MixtureDataset(sources, weights=[3, 1], num_samples=4000, seed=1)
    drawn = Counter(mix[i] >= 100 for i in range(len(mix)))
    assert drawn[False] / 4000 == pytest.approx(0.75, abs=0.03)


def test_a_mixture_is_a_pure_function_of_seed_epoch_and_position() -> None:
    def items(epoch: int) -> list[Any]:
        mix = MixtureDataset([Numbers(5), Numbers(7, base=100)], weights=[1, 1], num_samples=40, seed=2)
        mix.set_epoch(epoch)
        return [mix[i] for i in range(40)]

    assert items(0) == items(0) and items(0) != items(1)
    small = [i for i in items(0) if i < 100]
    assert set(small) == set(range(5))  # the small source cycles through all of its items


def test_a_mixture_checkpoint_with_other_weights_is_refused() -> None:
    mix = MixtureDataset([Numbers(5), Numbers(5)], weights=[1, 2], seed=0)
    state = mix.state_dict()
    other = MixtureDataset([Numbers(5), Numbers(5)], weights=[2, 1], seed=0)
    with pytest.raises(ResumeError) as info:
        other.load_state_dict(state)
    assert info.value.message == (
        "cannot resume: the checkpoint's mixture had weights [1.0, 2.0], this one has [2.0, 1.0]"
    )


def test_a_mixture_resumes_mid_epoch_through_the_loader() -> None:
    def mixture() -> MixtureDataset:
        return MixtureDataset([Numbers(6), Numbers(9, base=100)], temperature=2.0, num_samples=30, seed=4)

    reference = [b.tolist() for b in ResumableLoader(mixture(), batch_size=4, seed=1)]
    loader = ResumableLoader(mixture(), batch_size=4, seed=1)
    iterator = iter(loader)
    head = [next(iterator).tolist() for _ in range(2)]
    resumed = ResumableLoader(mixture(), batch_size=4, seed=1)
    resumed.load_state_dict(loader.state_dict())
    assert head + [b.tolist() for b in resumed] == reference
    assert torch.is_tensor(next(iter(resumed)))

"""The split draw and the budget rule: pure functions of position and seed, whatever the grouping."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmstore.datasets.build.output import UniformDraws
from dlmstore.datasets.build.routing import (
    DRAW_CHUNK,
    PretrainRouter,
    chunk_seed,
    draw_splits,
    position_draws,
    seeded_permutation,
)


def test_a_positions_draw_does_not_depend_on_where_the_run_starts() -> None:
    whole = position_draws(7, 0, 3 * DRAW_CHUNK)
    assert np.array_equal(position_draws(7, 4000, 300), whole[4000:4300])  # across a chunk boundary
    assert np.array_equal(position_draws(7, 2 * DRAW_CHUNK + 5, 1), whole[2 * DRAW_CHUNK + 5 :][:1])
    assert not np.array_equal(position_draws(8, 0, 100), whole[:100])  # the seed moves it
    assert 0.0 <= whole.min() and whole.max() < 1.0 and abs(whole.mean() - 0.5) < 0.02


def reference(docs: list[tuple[int, str, bool]], budgets: dict[str, int | None]) -> tuple[Any, ...]:
    """The rule read one document at a time, as docs/datasets.md states it."""
    held = {"train": 0, "val": 0}
    taken, empty, over, read = [], 0, 0, 0

    def full(split: str) -> bool:
        budget = budgets[split]
        return budget is not None and held[split] >= budget

    for index, (length, split, fixed) in enumerate(docs):
        if all(full(s) for s in budgets):
            break  # every split is full: reading stops
        if fixed and full(split):
            continue  # the source's own split has ended: not read
        read += 1
        if length == 0:
            empty += 1
        elif full(split):
            over += 1
        else:
            taken.append(index)
            held[split] += length + 1
    return taken, empty, over, read, held


budget = st.one_of(st.none(), st.integers(0, 120))


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12), max_size=60),
    vals=st.lists(st.booleans(), min_size=60, max_size=60),
    cuts=st.lists(st.integers(1, 9), min_size=60, max_size=60),
    train=budget,
    val=budget,
    own_splits=st.booleans(),
)
def test_routing_runs_of_any_size_agrees_with_reading_one_document_at_a_time(
    lengths: list[int],
    vals: list[bool],
    cuts: list[int],
    train: int | None,
    val: int | None,
    own_splits: bool,
) -> None:
    budgets = {"train": train, "val": val}
    if own_splits:  # a source's own train documents, then its validation documents
        middle = len(lengths) // 2
        splits = ["train"] * middle + ["val"] * (len(lengths) - middle)
    else:
        splits = ["val" if v else "train" for v in vals[: len(lengths)]]
    docs = [(n, s, own_splits) for n, s in zip(lengths, splits, strict=True)]
    router = PretrainRouter(budgets)
    taken: list[int] = []
    start = 0
    for size in cuts:
        if start >= len(docs) or router.stopped:
            break
        end = min(len(docs), start + size)
        if own_splits and splits[start] != splits[end - 1]:
            end = splits.index("val")  # runs never mix a source's splits
        run = np.asarray(lengths[start:end])
        if own_splits:
            chosen = router.route_fixed(run, splits[start])
        else:
            chosen = router.route(run, np.asarray([s == "val" for s in splits[start:end]]))
        taken.extend(int(i) + start for i in chosen)
        start = end
    expected_taken, empty, over, read, held = reference(docs, budgets)
    assert taken == expected_taken
    assert (router.skipped_empty_docs, router.over_budget_docs, router.read, router.held) == (
        empty,
        over,
        read,
        held,
    )


def test_draw_splits_sends_about_val_frac_to_val() -> None:
    to_val = draw_splits(1, 0, 20_000, 0.1)
    assert 0.09 < to_val.mean() < 0.11


@settings(max_examples=25)
@given(seed=st.integers(0, 2**32 - 1), chunk=st.integers(0, 2**20))
def test_the_draws_are_torch_rand_of_the_chunks_generator_bit_for_bit(seed: int, chunk: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(chunk_seed(seed, chunk))
    expected = torch.rand(DRAW_CHUNK, generator=generator, dtype=torch.float64).numpy()
    assert np.array_equal(position_draws(seed, chunk * DRAW_CHUNK, DRAW_CHUNK), expected)


@settings(max_examples=25)
@given(n=st.integers(0, 3000), seed=st.integers(-(2**63), 2**63 - 1))
def test_the_seeded_permutation_is_torch_randperm_of_the_seed(n: int, seed: int) -> None:
    import torch

    expected = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    assert seeded_permutation(n, seed) == expected


def test_the_shuffle_draws_are_one_torch_generator_drawn_in_chunks() -> None:
    import torch

    generator = torch.Generator().manual_seed(11)
    expected = torch.cat([torch.rand(DRAW_CHUNK, generator=generator, dtype=torch.float64) for _ in range(2)])
    draws = UniformDraws(11)
    assert [draws.next() for _ in range(2 * DRAW_CHUNK)] == expected.tolist()

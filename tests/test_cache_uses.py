"""The cache use log: lookups log the entries they used; the LRU marks catch up when read."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from dlmstore.cache.admin import prune
from dlmstore.cache.entries import TokenCache, evict
from dlmstore.cache.uses import FOLD_AFTER, entries_used_by, fold, pack_ids, unpack_ids
from dlmstore.store.database import Store, open_store
from dlmstore.store.runs import start_run

from .helpers import VALID_ID

OLD = "2000-01-01T00:00:00.000Z"


@pytest.fixture
def store() -> Store:
    with open_store(VALID_ID) as opened:
        yield opened


def _run(store: Store) -> int:
    return start_run(store, command="tokenize", dlm_path=Path("/d.dlm"), dlm_sha256="x")


def _cache(store: Store) -> TokenCache:
    return TokenCache(store, tokenizer_sha256="sha256:t", sequence_len=64)


def _filled(store: Store, keys: list[str]) -> int:
    """A run that wrote ``keys`` (10 tokens each), its marks then set far in the past."""
    run = _run(store)
    _cache(store).store_many([(k, np.arange(10)) for k in keys], run_id=run, dtype=np.dtype("<u2"))
    with store.write() as conn:
        conn.execute("UPDATE cache_entries SET last_access_at = ?", (OLD,))
    return run


def _marks(store: Store) -> dict[str, tuple[str, int]]:
    conn = sqlite3.connect(store.db_path)
    return {
        key: (at, run)
        for key, at, run in conn.execute("SELECT row_key, last_access_at, last_run_id FROM cache_entries")
    }


def _log(store: Store) -> list[tuple[int, int]]:
    return (
        sqlite3.connect(store.db_path)
        .execute("SELECT run_id, entries FROM cache_uses ORDER BY id")
        .fetchall()
    )


def test_ids_pack_as_little_endian_64_bit_integers_and_back() -> None:
    assert pack_ids([1, 2**40]) == (1).to_bytes(8, "little") + (2**40).to_bytes(8, "little")
    assert list(unpack_ids(pack_ids([5, 3, 2**62]))) == [5, 3, 2**62]


@pytest.mark.parametrize("verify", [True, False])
def test_a_lookup_logs_the_entries_it_found_and_leaves_their_marks_alone(store: Store, verify: bool) -> None:
    writer = _filled(store, ["a", "b", "c"])
    reader = _run(store)
    found = _cache(store).lookup(["a", "c", "missing"], run_id=reader, verify=verify)
    assert set(found.counts) == {"a", "c"}
    assert _marks(store) == dict.fromkeys("abc", (OLD, writer))  # no entry row was rewritten
    assert _log(store) == [(reader, 2)]
    with store.read() as conn:
        ids = {row["row_key"]: row["id"] for row in conn.execute("SELECT id, row_key FROM cache_entries")}
        assert sorted(entries_used_by(conn, reader)) == sorted([ids["a"], ids["c"]])


def test_a_pass_that_uses_the_same_entries_again_replaces_the_older_log_row(store: Store) -> None:
    _filled(store, ["a", "b", "c"])
    first, second, third = _run(store), _run(store), _run(store)
    _cache(store).lookup(["a", "b"], run_id=first, verify=False)
    _cache(store).lookup(["a"], run_id=second, verify=False)  # covers only part of the first: both stay
    assert _log(store) == [(first, 2), (second, 1)]
    _cache(store).lookup(["a", "b", "c"], run_id=third, verify=False)  # covers both
    assert _log(store) == [(third, 3)]


def test_folding_gives_each_entry_its_newest_use_moves_marks_only_forward_and_empties_the_log(
    store: Store,
) -> None:
    writer = _filled(store, ["a", "b", "c"])
    first, second = _run(store), _run(store)
    _cache(store).lookup(["a", "b"], run_id=first, verify=False)
    _cache(store).lookup(["a"], run_id=second, verify=False)
    with store.write() as conn:
        conn.execute(
            "UPDATE cache_entries SET last_access_at = '2999-01-01T00:00:00.000Z' WHERE row_key = 'b'"
        )
        used_at = dict(conn.execute("SELECT run_id, used_at FROM cache_uses").fetchall())
        assert fold(conn) == 2
    assert _marks(store) == {
        "a": (used_at[second], second),
        "b": ("2999-01-01T00:00:00.000Z", writer),  # newer than its logged use: kept
        "c": (OLD, writer),  # never used since it was written
    }
    assert _log(store) == []
    with store.write() as conn:
        assert fold(conn) == 0  # nothing left to fold


def test_the_log_is_folded_once_it_holds_more_than_its_limit(store: Store) -> None:
    keys = [f"k{i}" for i in range(FOLD_AFTER + 1)]
    _filled(store, keys)
    runs = []
    for key in keys:  # one entry per pass: no row covers another
        runs.append(_run(store))
        _cache(store).lookup([key], run_id=runs[-1], verify=False)
    assert _log(store) == []
    assert {key: run for key, (_, run) in _marks(store).items()} == dict(zip(keys, runs, strict=True))


def test_eviction_and_prune_see_uses_that_are_still_only_in_the_log(store: Store) -> None:
    _filled(store, ["a", "b", "c", "d"])
    reader = _run(store)
    _cache(store).lookup(["a", "c"], run_id=reader, verify=False)
    assert prune(store, older_than=timedelta(days=30)).entries_removed == 2  # b and d: unused since 2000
    assert sorted(_marks(store)) == ["a", "c"]
    _cache(store).lookup(["c"], run_id=_run(store), verify=False)  # c is now newer than a
    assert evict(store, max_bytes=20, protect_run_id=None).entries == 1
    assert sorted(_marks(store)) == ["c"]

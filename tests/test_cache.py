"""The tokenized cache: eviction, prune, clear, verify, the use log, concurrency and faults."""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from dlmstore.cache.admin import cache_summary, clear, prune, verify
from dlmstore.cache.entries import TokenCache, cache_bytes, evict
from dlmstore.cache.segments import as_array
from dlmstore.cache.uses import FOLD_AFTER, entries_used_by, fold
from dlmstore.corpus.tokenize import tokenize_document
from dlmstore.errors import StoreError
from dlmstore.home import store_dir
from dlmstore.id_arrays import pack_ids, unpack_ids
from dlmstore.store.database import Store, open_store
from dlmstore.store.runs import start_run

from .helpers import VALID_ID, write_doc

U16 = np.dtype("<u2")


@pytest.fixture
def store() -> Store:
    with open_store(VALID_ID) as opened:
        yield opened


def _run(store: Store) -> int:
    return start_run(store, command="tokenize", dlm_path=Path("/d.dlm"), dlm_sha256="x")


def _cache(store: Store) -> TokenCache:
    return TokenCache(store, tokenizer_sha256="sha256:t", sequence_len=64)


def _fill(store: Store, run_id: int, keys: list[str], size: int = 10) -> None:
    _cache(store).store_many([(k, np.arange(size) + i) for i, k in enumerate(keys)], run_id=run_id, dtype=U16)


def test_entries_round_trip_with_their_dtype_and_count(store: Store) -> None:
    run = _run(store)
    _cache(store).store_many([("a", np.array([1, 2, 65535])), ("b", np.array([7]))], run_id=run, dtype=U16)
    found = _cache(store).lookup(["a", "b", "missing"], run_id=run)
    assert {k: as_array(*v).tolist() for k, v in found.tokens.items()} == {"a": [1, 2, 65535], "b": [7]}
    rows = (
        sqlite3.connect(store.db_path)
        .execute("SELECT row_key, dtype, token_count, bytes FROM cache_entries ORDER BY row_key")
        .fetchall()
    )
    assert rows == [("a", "uint16", 3, 6), ("b", "uint16", 1, 2)]


def test_the_cache_size_is_a_running_total_kept_by_triggers(store: Store) -> None:
    run = _run(store)
    _fill(store, run, ["a", "b", "c"])
    assert cache_bytes(store) == 60
    sqlite3.connect(store.db_path).execute(
        "DELETE FROM cache_entries WHERE row_key = 'a'"
    ).connection.commit()
    assert cache_bytes(store) == 40


def test_eviction_drops_least_recently_used_entries_first(store: Store) -> None:
    old = _run(store)
    _fill(store, old, ["a", "b", "c", "d"])
    reader = _run(store)
    _cache(store).lookup(["a", "c"], run_id=reader)  # a and c are now the most recent
    result = evict(store, max_bytes=40, protect_run_id=None)
    kept = [
        r[0]
        for r in sqlite3.connect(store.db_path).execute("SELECT row_key FROM cache_entries ORDER BY row_key")
    ]
    assert result.entries == 2 and kept == ["a", "c"]


def test_eviction_never_drops_entries_of_the_current_run(store: Store) -> None:
    run = _run(store)
    _fill(store, run, ["a", "b", "c"])
    result = evict(store, max_bytes=5, protect_run_id=run)
    assert result.entries == 0 and cache_bytes(store) == 60  # a cold cache does not starve itself


def test_eviction_reads_only_the_entries_it_evicts(store: Store) -> None:
    old = _run(store)
    _fill(store, old, [f"k{i}" for i in range(2000)], size=1)
    new = _run(store)
    _fill(store, new, ["fresh"], size=1)
    with store.read() as conn:
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT id, bytes FROM cache_entries WHERE last_run_id IS NOT ? "
            "ORDER BY last_access_at, last_run_id LIMIT ?",
            (new, 512),
        ).fetchall()
    assert any("cache_entries_lru" in row["detail"] for row in plan)
    assert not any("TEMP B-TREE" in row["detail"] for row in plan)  # no sort of the whole table
    assert evict(store, max_bytes=3998, protect_run_id=new).entries == 2


def test_segments_left_without_entries_are_deleted(store: Store) -> None:
    run = _run(store)
    _fill(store, run, ["a", "b"])
    (segment,) = (store.path / "tokens").glob("segment-*.bin")
    evict(store, max_bytes=0, protect_run_id=None)
    assert not segment.exists()
    assert sqlite3.connect(store.db_path).execute("SELECT COUNT(*) FROM token_segments").fetchone() == (0,)


def test_prune_drops_entries_unused_since_the_cutoff_and_compacts_their_segment(store: Store) -> None:
    run = _run(store)
    _fill(store, run, ["a", "b", "c", "d"])
    conn = sqlite3.connect(store.db_path)
    conn.execute("UPDATE cache_entries SET last_access_at = '2000-01-01T00:00:00.000Z' WHERE row_key != 'a'")
    conn.commit()
    result = prune(store, older_than=timedelta(days=30))
    assert (result.entries_removed, result.bytes_removed, result.segments_compacted) == (3, 60, 1)
    assert as_array(*_cache(store).lookup(["a"], run_id=run).tokens["a"]).tolist() == list(range(10))
    (segment,) = (store.path / "tokens").glob("segment-*.bin")
    assert segment.stat().st_size == 20  # only a's bytes are left on disk


def _debris(store: Store) -> tuple[Path, Path, Path]:
    """An old unregistered segment, an old temp file and a new unregistered segment in tokens/."""
    tokens = store.path / "tokens"
    tokens.mkdir()
    orphan, temp, fresh = (
        tokens / "segment-OLD.bin",
        tokens / ".segment-x.bin.tmp",
        tokens / "segment-NEW.bin",
    )
    for path in (orphan, temp, fresh):
        path.write_bytes(b"\0" * 8)
    old = time.time() - 7200
    os.utime(orphan, (old, old))
    os.utime(temp, (old, old))
    return orphan, temp, fresh


def test_prune_with_the_store_to_itself_removes_every_orphan_and_temp_file_whatever_its_age(
    store: Store,
) -> None:
    orphan, temp, fresh = _debris(store)
    result = prune(store, older_than=timedelta(days=1))
    assert (result.orphan_files_removed, result.temp_files_removed, result.store_in_use) == (2, 1, False)
    assert not orphan.exists() and not temp.exists() and not fresh.exists()


def test_prune_leaves_young_files_alone_while_another_opener_holds_the_store(store: Store) -> None:
    orphan, temp, fresh = _debris(store)
    with open_store(VALID_ID):  # another holder of the store lock, as a second process would be
        result = prune(store, older_than=timedelta(days=1))
    assert (result.orphan_files_removed, result.temp_files_removed, result.store_in_use) == (1, 1, True)
    assert not orphan.exists() and not temp.exists() and fresh.exists()


def test_clear_removes_every_entry_and_file(store: Store) -> None:
    run = _run(store)
    _fill(store, run, ["a", "b"])
    assert clear(store).entries_removed == 2
    assert cache_bytes(store) == 0 and list((store.path / "tokens").iterdir()) == []


def test_verify_reports_a_damaged_entry_and_repair_drops_it(store: Store) -> None:
    run = _run(store)
    _fill(store, run, ["a", "b"])
    (segment,) = (store.path / "tokens").glob("segment-*.bin")
    data = bytearray(segment.read_bytes())
    data[0] ^= 1
    segment.write_bytes(bytes(data))
    result = verify(store)
    assert [(p.kind, p.repaired) for p in result.problems] == [("bad_entry", False)]
    repaired = verify(store, repair=True)
    assert [p.repaired for p in repaired.problems] == [True]
    assert verify(store).problems == []
    assert list(_cache(store).lookup(["a", "b"], run_id=run).tokens) == ["b"]


def test_a_lookup_that_only_counts_reads_no_entry_but_the_one_that_serves_tokens_checks_every_crc(
    store: Store,
) -> None:
    run = _run(store)
    _fill(store, run, ["a", "b"])
    (segment,) = (store.path / "tokens").glob("segment-*.bin")
    data = bytearray(segment.read_bytes())
    data[0] ^= 1  # inside "a"
    segment.write_bytes(bytes(data))
    counted = _cache(store).lookup(["a", "b"], run_id=run, verify=False)
    assert (counted.tokens, counted.counts, counted.damaged) == ({}, {"a": 10, "b": 10}, ())
    served = _cache(store).lookup(["a", "b"], run_id=run)
    assert list(served.tokens) == ["b"] and served.damaged == ("a",)
    assert as_array(*served.tokens["b"]).tolist() == list(range(1, 11))
    assert _cache(store).lookup(["a"], run_id=run, verify=False).counts == {}  # dropped: re-tokenized next


def test_a_lookup_that_only_counts_still_misses_entries_of_a_missing_or_truncated_segment(
    store: Store,
) -> None:
    run = _run(store)
    _fill(store, run, ["a", "b"])
    (segment,) = (store.path / "tokens").glob("segment-*.bin")
    segment.write_bytes(segment.read_bytes()[:-1])  # the last entry, "b", is cut short
    counted = _cache(store).lookup(["a", "b"], run_id=run, verify=False)
    assert (counted.counts, counted.damaged) == ({"a": 10}, ("b",))
    segment.unlink()
    assert _cache(store).lookup(["a"], run_id=run, verify=False).damaged == ("a",)


def test_a_damaged_entry_is_never_trained_on_even_after_a_pass_that_only_counted(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm", body="Some prose to tokenize.\n")
    _, expected = tokenize_document(str(doc))
    (segment,) = (store_dir(VALID_ID) / "tokens").glob("segment-*.bin")
    data = bytearray(segment.read_bytes())
    data[0] ^= 0xFF
    segment.write_bytes(bytes(data))
    counted, _ = tokenize_document(str(doc), materialize=False)  # `dlm tokenize`: reads no entry
    assert (counted.tokenization.cache_hits, counted.damaged_entries) == (1, 0)
    trained, rows = tokenize_document(str(doc))  # what `dlm train` runs: every entry checked
    assert (trained.tokenization.cache_misses, trained.damaged_entries) == (1, 1)
    assert rows is not None and expected is not None
    assert rows.values.tolist() == expected.values.tolist()


def test_verify_reports_a_missing_segment_and_wrong_totals(store: Store) -> None:
    run = _run(store)
    _fill(store, run, ["a"])
    for segment in (store.path / "tokens").glob("segment-*.bin"):
        segment.unlink()
    conn = sqlite3.connect(store.db_path)
    conn.execute("UPDATE cache_totals SET bytes = 999")
    conn.commit()
    kinds = sorted(p.kind for p in verify(store).problems)
    assert kinds == ["bad_entry", "missing_segment", "wrong_totals"]
    verify(store, repair=True)
    assert verify(store).problems == [] and cache_bytes(store) == 0


def test_the_cache_summary_of_a_document_never_tokenized_creates_nothing(dlm_home: Path) -> None:
    summary = cache_summary(VALID_ID)
    assert (summary.exists, summary.entry_count, summary.last_run_hit_rate) == (False, 0, None)
    assert not (dlm_home / "store").exists()


def test_a_cache_over_its_limit_evicts_old_entries_after_a_run(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(6):
        (notes / f"{i}.md").write_text(f"note number {i} " * 30)
    doc = write_doc(tmp_path / "doc.dlm", frontmatter="training:\n  sources:\n    - path: notes\n")
    tokenize_document(str(doc))
    for i in range(6):
        (notes / f"{i}.md").write_text(f"edited note {i} " * 30)
    text = doc.read_text().replace("training:\n", "training:\n  cache:\n    max_bytes: 1000\n")
    doc.write_text(text)
    summary, _ = tokenize_document(str(doc))
    assert summary.evicted_entries > 0
    assert summary.tokenization.cache_misses == 6
    # everything of the current run survived, even over the limit
    conn = sqlite3.connect(store_dir(VALID_ID) / "store.db")
    assert conn.execute(
        "SELECT COUNT(*) FROM cache_entries WHERE last_run_id = ?", (summary.run_id,)
    ).fetchone() == (7,)


def test_a_read_only_store_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3 as sqlite3_module

    doc = write_doc(tmp_path / "doc.dlm")
    tokenize_document(str(doc))
    db = store_dir(VALID_ID) / "store.db"
    # Root ignores permission bits, so have SQLite itself open the database read-only.
    real_connect = sqlite3_module.connect

    def read_only(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path) == str(db):
            return real_connect(f"file:{path}?mode=ro", *args, uri=True, **kwargs)
        return real_connect(path, *args, **kwargs)

    monkeypatch.setattr(sqlite3_module, "connect", read_only)
    with pytest.raises(StoreError) as err:
        tokenize_document(str(doc))
    assert str(err.value) == f"cannot write {db}: attempt to write a readonly database"


def _tokenize_in_process(home: str, doc: str, out: str) -> None:
    os.environ["DLM_HOME"] = home
    summary, rows = tokenize_document(doc)
    Path(out).write_text(json.dumps({"values": rows.values.tolist(), "offsets": rows.offsets.tolist()}))


@pytest.mark.slow  # spawns tokenize processes to race or kill them
def test_two_tokenize_processes_on_one_store_both_finish_correctly(tmp_path: Path, dlm_home: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(40):
        (notes / f"{i:02d}.md").write_text(f"file {i}: " + "lorem ipsum dolor " * (i + 1))
    doc = write_doc(tmp_path / "doc.dlm", frontmatter="training:\n  sources:\n    - path: notes\n")
    expected = tokenize_document(str(doc), no_cache=True)[1]
    ctx = multiprocessing.get_context("spawn")
    outs = [tmp_path / f"out{i}.json" for i in range(2)]
    procs = [ctx.Process(target=_tokenize_in_process, args=(str(dlm_home), str(doc), str(o))) for o in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    for out in outs:
        data = json.loads(out.read_text())
        assert data["values"] == expected.values.tolist() and data["offsets"] == expected.offsets.tolist()
    conn = sqlite3.connect(store_dir(VALID_ID) / "store.db")
    assert conn.execute("SELECT COUNT(*) FROM cache_entries").fetchone() == (41,)
    assert verify(open_store(VALID_ID)).problems == []


def test_an_unwritable_token_directory_is_a_clear_error(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    tokenize_document(str(doc), no_cache=True)  # creates the store
    tokens = store_dir(VALID_ID) / "tokens"
    tokens.write_text("not a directory")
    with pytest.raises(StoreError) as err:
        tokenize_document(str(doc))
    assert str(err.value).startswith(f"cannot write token file in {tokens}: ")
    assert err.value.hint == "make the store writable and free some disk space, or run with --no-cache"
    with open_store(VALID_ID) as store:
        assert cache_bytes(store) == 0  # no row was registered


@pytest.mark.slow  # spawns tokenize processes to race or kill them
def test_killing_a_tokenize_process_at_any_moment_leaves_no_row_pointing_at_a_partial_file(
    tmp_path: Path, dlm_home: Path
) -> None:
    import random
    import signal
    import subprocess
    import sys

    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(300):
        (notes / f"{i:03d}.md").write_text(f"document {i} " + "words and more words " * (50 + i))
    doc = write_doc(tmp_path / "doc.dlm", frontmatter="training:\n  sources:\n    - path: notes\n")
    dlm = str(Path(sys.executable).with_name("dlm"))
    env = {**os.environ, "DLM_HOME": str(dlm_home)}
    for delay in (random.uniform(1.0, 3.0), random.uniform(3.0, 5.0)):
        proc = subprocess.Popen(
            [dlm, "tokenize", str(doc)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if (store_dir(VALID_ID) / "store.db").is_file():
            with open_store(VALID_ID) as store:
                kinds = {p.kind for p in verify(store, grace_s=0).problems}
            assert kinds <= {"orphan_file", "temp_file"}, kinds
    expected = tokenize_document(str(doc), no_cache=True)[1]
    _, rows = tokenize_document(str(doc))
    assert np.array_equal(rows.values, expected.values) and np.array_equal(rows.offsets, expected.offsets)


# The use log: lookups log the entries they used; the LRU marks catch up when read.

OLD = "2000-01-01T00:00:00.000Z"


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

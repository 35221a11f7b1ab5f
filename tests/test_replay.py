"""The replay history (issue 38, step 1): recorded by dlm train, shown, drawn from, pruned, verified."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmstore.cli.main import cli

from .helpers import VALID_ID, write_doc

FRONT = "training:\n  sequence_len: 64\n  max_steps: 1\n  micro_batch_size: 2\n  seed: 7\n" + (
    "  preference:\n    enabled: false\n"
)
PROSE = "".join(
    f"::prose::\nParagraph {i} about the local-first store and its tables.\n\n" for i in range(12)
)
REMOVED = "::prose::\nA paragraph that the second version removes.\n\n"
PAIRS = """::instruction::
### Q
What colour is the sky?
### A
{answer}

### Q
Where is the data kept?
### A
In store.db.
"""
V1 = "Prose that stays.\n\n" + REMOVED + PROSE + PAIRS.format(answer="Green.")
V2 = "Prose that stays.\n\n" + PROSE + PAIRS.format(answer="Blue.")


def _doc(folder: Path, body: str, front: str = FRONT) -> Path:
    return write_doc(folder / "doc.dlm", body=body, frontmatter=front)


def _described(doc: Path) -> list[Any]:
    from dlmstore.corpus.assemble import load_corpus
    from dlmstore.document.parser import parse_document
    from dlmstore.eval.probes import marked_keys
    from dlmstore.replay.history import describe

    document = parse_document(doc)
    return describe(load_corpus(document), marked_keys(document.sections))


def _trained(doc: Path) -> list[str]:
    """The row keys a run of ``doc`` trains: its rows less the val split under its seed."""
    from dlmstore.document.parser import parse_document
    from dlmstore.eval.split import split_rows

    rows = _described(doc)
    sft = [r.row_key for r in rows if r.row.kind != "preference"]
    split = split_rows(sft, parse_document(doc).frontmatter.training.seed)
    val = {sft[i] for i in split.val} if split.val and split.train else set()
    return [r.row_key for r in rows if r.row_key not in val]


def _record(doc: Path, *, keep: int | None = None, as_trained: bool = False) -> int:
    """Record a finished train run of ``doc``'s rows (the first ``keep``; with ``as_trained``, those a
    run trains: the val split left out) in history, without training."""
    from dlmstore.document.parser import parse_document
    from dlmstore.replay.history import pending, record_run
    from dlmstore.store.database import open_store
    from dlmstore.store.runs import recorded_run

    document = parse_document(doc)
    rows = _described(doc)
    keys = _trained(doc) if as_trained else [r.row_key for r in rows[:keep]]
    with open_store(VALID_ID) as store:
        with recorded_run(store, command="train", dlm_path=doc, dlm_sha256=document.sha256) as run_id:
            found = pending(store, keys, lambda: rows, document.frontmatter.training.replay)
            with store.write() as conn:
                record_run(conn, run_id, found)
    return run_id


def _db(home: Path) -> sqlite3.Connection:
    return sqlite3.connect(home / "store" / VALID_ID / "store.db")


def _show(doc: Path) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["replay", "show", str(doc), "--json"])
    assert result.exit_code == 0, result.output
    loaded: dict[str, Any] = json.loads(result.stdout)
    return loaded


# --- the draw --------------------------------------------------------------------------------


def _settings(**changes: Any) -> Any:
    from dlmstore.document.frontmatter import ReplaySettings

    return ReplaySettings(**changes)


def test_the_draw_size_is_dlms_rule_and_all_candidates_when_fewer() -> None:
    from dlmstore.replay.draw import size

    replay = _settings()
    assert size(0, 1000, replay) == 32
    assert size(40, 1000, replay) == 80
    assert size(40, 50, replay) == 50
    assert size(0, 1000, replay, preference=True) == 8
    assert size(10, 1000, replay, preference=True) == 20
    assert size(3, 0, replay) == 0


def test_a_candidate_weighs_one_over_one_plus_its_age_in_generations_with_the_floor() -> None:
    from dlmstore.replay.draw import weight

    assert weight(4, 5, 0.01) == 0.5
    assert weight(2, 5, 0.01) == 0.25
    assert weight(5, 5, 0.01) == 1.0
    assert weight(1, 500, 0.01) == 0.01


def _pool(n: int) -> list[tuple[str, int]]:
    rng = random.Random(n)
    return [(f"sha256:{rng.getrandbits(256):064x}", rng.randint(1, 6)) for _ in range(n)]


def test_the_draw_takes_the_same_rows_for_the_same_inputs_and_others_for_another_seed() -> None:
    from dlmstore.replay.draw import draw

    pool = _pool(500)
    first = draw(pool, 32, generation=7, seed=42, floor=0.01)
    assert first == draw(pool, 32, generation=7, seed=42, floor=0.01)
    assert len(first.row_keys) == 32 and list(first.row_keys) == sorted(first.row_keys)
    assert draw(pool, 32, generation=7, seed=43, floor=0.01).row_keys != first.row_keys
    assert draw(pool, 32, generation=8, seed=42, floor=0.01).row_keys != first.row_keys


def test_the_draw_takes_every_candidate_when_there_are_fewer_than_k() -> None:
    from dlmstore.replay.draw import draw

    pool = _pool(10)
    assert draw(pool, 32, generation=7, seed=42, floor=0.01).row_keys == tuple(sorted(k for k, _ in pool))
    assert draw(pool, 0, generation=7, seed=42, floor=0.01).row_keys == ()


def test_the_draw_favours_recent_generations() -> None:
    from dlmstore.replay.draw import draw

    pool = [(f"sha256:{i:064x}", 9 if i % 2 else 1) for i in range(2000)]
    taken = draw(pool, 200, generation=10, seed=1, floor=0.01).row_keys
    recent = sum(int(key[7:], 16) % 2 for key in taken)
    assert recent > 150  # weights 0.5 against 0.1: about 5 in 6 of the draw


def _reference_draw(
    pool: list[tuple[str, int]], k: int, generation: int, seed: int, floor: float
) -> tuple[str, ...]:
    """The draw by its definition: every candidate's exact score ``math.log(u) / w``, the ``k`` largest
    (ties to the smaller key), in plain Python."""
    import math

    from dlmstore.replay.draw import Pool, uniforms, weight

    u = uniforms(Pool.of(pool).keys, generation=generation, seed=seed).tolist()
    scored = sorted(
        (
            (-math.log(value * 2.0**-53) / weight(last, generation, floor), key)
            for value, (key, last) in zip(u, pool, strict=True)
        )
    )
    return tuple(sorted(key for _, key in scored[:k]))


@pytest.mark.parametrize(
    ("n", "k", "generation"), [(3000, 32, 7), (3000, 700, 12), (400, 399, 3), (2000, 1, 500)]
)
def test_the_draw_takes_exactly_the_k_largest_exact_scores(n: int, k: int, generation: int) -> None:
    from dlmstore.replay.draw import draw

    pool = [(key, min(last, generation)) for key, last in _pool(n)]
    for seed in (0, 42, 2**31 - 1):
        assert draw(pool, k, generation=generation, seed=seed, floor=0.01).row_keys == _reference_draw(
            pool, k, generation, seed, 0.01
        )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2**64), st.integers(1, 5)), min_size=1, max_size=60, unique_by=lambda x: x[0]
    ),
    st.integers(0, 40),
    st.integers(0, 2**31),
    st.randoms(use_true_random=False),
)
def test_the_draw_depends_only_on_the_candidates_the_generation_and_the_seed_not_their_order(
    items: list[tuple[int, int]], k: int, seed: int, shuffler: random.Random
) -> None:
    from dlmstore.replay.draw import draw

    pool = [(f"sha256:{value:064x}", last) for value, last in items]
    shuffled = list(pool)
    shuffler.shuffle(shuffled)
    assert draw(pool, k, generation=6, seed=seed, floor=0.01) == draw(
        shuffled, k, generation=6, seed=seed, floor=0.01
    )


# --- the settings ----------------------------------------------------------------------------


def test_training_replay_has_its_defaults_and_refuses_out_of_range_values(tmp_path: Path) -> None:
    from dlmstore.document.parser import parse_document

    replay = parse_document(_doc(tmp_path, "x\n")).frontmatter.training.replay
    assert (replay.enabled, replay.min_rows, replay.factor, replay.preference_min) == (True, 32, 2, 8)
    assert (replay.weight_floor, replay.retention_fraction, replay.max_bytes) == (0.01, 0.05, 2**30)
    bad = _doc(tmp_path, "x\n", "training:\n  replay:\n    weight_floor: 0\n")
    result = CliRunner().invoke(cli, ["show", str(bad)])
    assert result.exit_code == 1
    assert "training.replay.weight_floor" in result.stderr


# --- recording, candidates, show -------------------------------------------------------------


def test_an_unchanged_document_recorded_twice_is_one_generation_with_no_candidates(
    tmp_path: Path, dlm_home: Path
) -> None:
    doc = _doc(tmp_path, V1)
    first = _record(doc, as_trained=True)
    second = _record(doc, as_trained=True)
    with _db(dlm_home) as conn:
        assert conn.execute("SELECT generation, first_run_id FROM history_generations").fetchall() == [
            (1, first)
        ]
        assert conn.execute("SELECT run_id, generation FROM history_runs").fetchall() == [
            (first, 1),
            (second, 1),
        ]
        assert conn.execute("SELECT DISTINCT first_run_id, last_run_id FROM history").fetchall() == [
            (first, second)
        ]
        assert conn.execute("SELECT count(*) FROM history_rows").fetchone()[0] == len(_trained(doc))
        assert conn.execute("SELECT sum(retention) FROM history_rows").fetchone()[0] >= 1
    report = _show(doc)
    # The rows it would train are generation 1's: the next run joins it, with nothing to replay.
    assert (report["next_generation"], report["new_rows"], report["candidates"]) == (1, 0, [])


def test_an_edit_opens_a_generation_its_removed_rows_are_candidates_and_its_edited_answer_is_superseded(
    tmp_path: Path, dlm_home: Path
) -> None:
    doc = _doc(tmp_path, V1)
    old = {r.row.data.get("text", ""): r.row_key for r in _described(doc)}
    old_pairs = [r.row_key for r in _described(doc) if r.row.kind == "messages"]
    _record(doc)
    doc = _doc(tmp_path, V2)
    report = _show(doc)
    assert report["next_generation"] == 2
    # Both pairs: an edit of one changes its section's digest, so the other's key moves too.
    assert report["new_rows"] == 2
    removed = old[REMOVED.split("\n", 1)[1].strip()]
    with _db(dlm_home) as conn:
        retained = conn.execute("SELECT retention FROM history WHERE row_key = ?", (removed,)).fetchone()[0]
    assert retained == 0  # the slice holds other rows of this document
    assert [c["row_key"] for c in report["candidates"]] == [removed]
    assert report["candidates"][0]["drawn"] and report["candidates"][0]["weight"] == 0.5
    new_pairs = [r.row_key for r in _described(doc) if r.row.kind == "messages"]
    # The edited answer, and its unchanged neighbour under its new key: neither is replayed.
    assert sorted((s["row_key"], s["by_row_key"], s["kind"]) for s in report["superseded"]) == sorted(
        (old, new, "messages") for old, new in zip(old_pairs, new_pairs, strict=True)
    )
    _record(doc)
    report = _show(doc)
    assert [g["generation"] for g in report["generations"]] == [1, 2]
    assert (report["generations"][1]["rows_new"], report["generations"][1]["rows_removed"]) == (2, 3)
    assert [c["row_key"] for c in report["candidates"]] == [removed]


def test_a_source_file_whose_content_changed_is_superseded_and_a_removed_one_is_a_candidate(
    tmp_path: Path, dlm_home: Path
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("print('a')\n")
    (tmp_path / "src" / "b.py").write_text("print('b')\n")
    front = FRONT + "  sources:\n    - path: src\n"
    doc = _doc(tmp_path, "Body prose.\n", front)
    rows = {r.origin: r for r in _described(doc)}
    assert rows["src/a.py"].supersede_key is not None and rows["body"].supersede_key is None
    _record(doc)
    (tmp_path / "src" / "a.py").write_text("print('a, edited')\n")
    (tmp_path / "src" / "b.py").unlink()
    report = _show(doc)
    assert [(c["row_key"], c["origin"]) for c in report["candidates"]] == [
        (rows["src/b.py"].row_key, "src/b.py")
    ]
    assert [(s["row_key"], s["origin"]) for s in report["superseded"]] == [
        (rows["src/a.py"].row_key, "src/a.py")
    ]


def test_history_content_round_trips_to_the_exact_row_data(tmp_path: Path, dlm_home: Path) -> None:
    from dlmstore.replay.history import read_rows
    from dlmstore.store.database import open_store

    doc = _doc(
        tmp_path, V1 + "\n::preference::\n### Prompt\nSay hi — ünïcode\n### Chosen\nhi\n### Rejected\nno\n"
    )
    _record(doc)
    expected = {r.row_key: (r.row.kind, r.row.data) for r in _described(doc)}
    with open_store(VALID_ID) as store, store.read() as conn:
        found = {r.row_key: (r.kind, r.data) for r in read_rows(conn)}
    assert found == expected
    assert {kind for kind, _ in found.values()} == {"text", "messages", "preference"}


def test_the_byte_cap_evicts_rows_the_document_no_longer_holds_oldest_first(
    tmp_path: Path, dlm_home: Path
) -> None:
    doc = _doc(tmp_path, V1, FRONT + "  replay:\n    max_bytes: 1000\n")
    rows = _described(doc)
    _record(doc)  # over the cap, but every row is still in the document: none goes
    with _db(dlm_home) as conn:
        total = conn.execute("SELECT sum(bytes) FROM history_rows").fetchone()[0]
    assert total > 1000
    doc = _doc(tmp_path, "Only this now.\n", FRONT + "  replay:\n    max_bytes: 1000\n")
    _record(doc)
    with _db(dlm_home) as conn:
        kept = conn.execute("SELECT row_key, bytes FROM history").fetchall()
        contents = conn.execute("SELECT count(*) FROM history_content").fetchone()[0]
    assert sum(size for _, size in kept) <= 1000 and contents == len(kept)
    gone = {r.row_key for r in rows} - {key for key, _ in kept}
    assert gone and [r.row_key for r in rows if r.row_key in gone] == [r.row_key for r in rows][: len(gone)]


def test_replay_show_prints_the_generations_the_size_and_the_candidates(tmp_path: Path) -> None:
    doc = _doc(tmp_path, V1)
    result = CliRunner().invoke(cli, ["replay", "show", str(doc)])
    assert result.exit_code == 0 and result.stdout.startswith("no replay history yet")
    _record(doc)
    doc = _doc(tmp_path, V2)
    lines = CliRunner().invoke(cli, ["replay", "show", str(doc)]).stdout.splitlines()
    assert lines[0].startswith("generation 1: 1 run (1) -> -; 16 rows trained, 16 new, 0 dropped")
    assert lines[1].startswith("history: 16 rows, ")
    assert lines[2].startswith("next run: generation 2, 2 new rows and 0 new triples; draw 1 rows")
    assert lines[3].lstrip().startswith("drawn sha256:")
    assert lines[4] == "superseded: 2 rows (never replayed)"


# --- prune -----------------------------------------------------------------------------------


def test_replay_prune_needs_exactly_one_selector(tmp_path: Path) -> None:
    doc = _doc(tmp_path, V1)
    for args in ([], ["--all", "--superseded"]):
        result = CliRunner().invoke(cli, ["replay", "prune", str(doc), *args])
        assert result.exit_code == 2
        assert "give exactly one of --row, --older-than, --superseded, --all" in result.stderr


def test_replay_prune_of_a_row_that_is_not_there_is_one_error_line(tmp_path: Path) -> None:
    doc = _doc(tmp_path, V1)
    _record(doc)
    result = CliRunner().invoke(cli, ["replay", "prune", str(doc), "--row", "sha256:nope"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: no row sha256:nope in the replay history of {doc}",
        f"hint: `dlm replay show {doc}` lists the candidates and superseded rows",
    ]


def test_replay_prune_removes_what_each_selector_chooses_and_dry_run_removes_nothing(
    tmp_path: Path, dlm_home: Path
) -> None:
    doc = _doc(tmp_path, V1)
    old_pairs = sorted(r.row_key for r in _described(doc) if r.row.kind == "messages")
    _record(doc)
    doc = _doc(tmp_path, V2)

    def prune(*args: str) -> dict[str, Any]:
        result = CliRunner().invoke(cli, ["replay", "prune", str(doc), *args, "--json"])
        assert result.exit_code == 0, result.output
        loaded: dict[str, Any] = json.loads(result.stdout)
        return loaded

    def count() -> int:
        with _db(dlm_home) as conn:
            return int(conn.execute("SELECT count(*) FROM history_rows").fetchone()[0])

    dry = prune("--superseded", "--dry-run")
    assert (dry["dry_run"], dry["rows_removed"], [r["row_key"] for r in dry["rows"]]) == (True, 2, old_pairs)
    assert count() == 16
    assert prune("--superseded")["rows_removed"] == 2 and count() == 14
    assert prune("--older-than", "1d")["rows_removed"] == 0
    first = _show(doc)["candidates"][0]["row_key"]
    assert prune("--row", first)["rows"][0]["row_key"] == first and count() == 13
    with _db(dlm_home) as conn:
        assert conn.execute("SELECT count(*) FROM history_content").fetchone()[0] == 13
        conn.execute("UPDATE runs SET finished_at = '2020-01-01T00:00:00.000Z'")
    assert prune("--older-than", "30d")["rows_removed"] == 13 and count() == 0
    _record(doc)
    assert prune("--all")["rows_removed"] == 15 and count() == 0
    text = CliRunner().invoke(cli, ["replay", "prune", str(doc), "--all", "--dry-run"])
    assert text.stdout.splitlines() == ["would remove 0 rows (0 B); nothing was removed (--dry-run)"]


def test_replay_prune_refuses_while_another_process_has_the_store_open(
    tmp_path: Path, dlm_home: Path
) -> None:
    from dlmstore.store.database import open_store

    doc = _doc(tmp_path, V1)
    _record(doc)
    with open_store(VALID_ID):  # a second open file description: a train in another process, to flock
        result = CliRunner().invoke(cli, ["replay", "prune", str(doc), "--all"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "error: another dlm process has this store open (a dlm train records history as it finishes); "
        "nothing was pruned",
        "hint: run dlm replay prune again when it is done",
    ]
    with _db(dlm_home) as conn:
        assert conn.execute("SELECT count(*) FROM history_rows").fetchone()[0] == 16


# --- verify ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE history_content SET content = X'00112233' WHERE id = 1",
        "UPDATE history_rows SET checksum = checksum + 1 WHERE content_id = 1",
        # Content that decodes, but is another row's: the checksum covers the key too.
        "UPDATE history_content SET content = (SELECT content FROM history_content WHERE id = 2) WHERE id = 1",
    ],
)
def test_cache_verify_finds_a_damaged_history_row_and_repair_removes_it(
    tmp_path: Path, dlm_home: Path, damage: str
) -> None:
    doc = _doc(tmp_path, V1)
    _record(doc)
    with _db(dlm_home) as conn:
        key = conn.execute("SELECT row_key FROM history WHERE content_id = 1").fetchone()[0]
        conn.execute(damage)
    result = CliRunner().invoke(cli, ["cache", "verify", str(doc), "--json"])
    assert result.exit_code == 1
    (problem,) = json.loads(result.stdout)["problems"]
    assert (problem["kind"], problem["path"], problem["repaired"]) == (
        "damaged_history_row",
        "history_content",
        False,
    )
    assert problem["detail"].startswith(f"history row {key}: ")
    repaired = CliRunner().invoke(cli, ["cache", "verify", str(doc), "--repair"])
    assert repaired.exit_code == 0
    assert repaired.stdout.splitlines()[0].startswith(
        f"repaired: damaged_history_row: history_content: history row {key}"
    )
    with _db(dlm_home) as conn:
        assert conn.execute("SELECT count(*) FROM history WHERE row_key = ?", (key,)).fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM history_rows").fetchone()[0] == 15
    assert CliRunner().invoke(cli, ["cache", "verify", str(doc)]).exit_code == 0


# --- dlm train -------------------------------------------------------------------------------


@pytest.mark.slow
def test_dlm_train_records_the_rows_it_trained_and_an_edit_opens_a_generation(
    tmp_path: Path, dlm_home: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    from dlmstore.eval.split import split_rows
    from dlmstore.train.trainer import train_document

    front = f"base_model: {tiny_base}\n" + FRONT
    doc = _doc(tmp_path, V1, front)
    rows = _described(doc)
    split = split_rows([r.row_key for r in rows], 7)
    val = {rows[i].row_key for i in split.val}
    assert val  # the document holds rows the split holds out
    first = train_document(str(doc))
    second = train_document(str(doc))
    with _db(dlm_home) as conn:
        recorded = {key for (key,) in conn.execute("SELECT row_key FROM history")}
        assert conn.execute("SELECT run_id, generation FROM history_runs").fetchall() == [(1, 1), (2, 1)]
        assert conn.execute("SELECT DISTINCT last_run_id, last_generation FROM history").fetchall() == [
            (2, 1)
        ]
    assert recorded == {r.row_key for r in rows} - val
    assert first.adapter_sha256 == second.adapter_sha256
    old_pairs = sorted(r.row_key for r in rows if r.row.kind == "messages")
    doc = _doc(tmp_path, V2, front)
    train_document(str(doc))
    report = _show(doc)
    assert [(g["generation"], g["runs"]) for g in report["generations"]] == [(1, [1, 2]), (2, [3])]
    assert [s["row_key"] for s in report["superseded"]] == old_pairs
    removed = next(r.row_key for r in rows if r.row.data.get("text", "").startswith("A paragraph that"))
    assert removed in [c["row_key"] for c in report["candidates"]]
    assert not set(old_pairs) & {c["row_key"] for c in report["candidates"]}


@pytest.mark.slow
def test_a_run_that_fails_in_its_publish_transaction_records_no_history(
    tmp_path: Path, dlm_home: Path, tiny_base: Path, one_torch_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dlmstore.eval.results
    from dlmstore.train.trainer import train_document

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(dlmstore.eval.results, "record_evaluation", fail)
    doc = _doc(tmp_path, V1, f"base_model: {tiny_base}\n" + FRONT)
    with pytest.raises(OSError, match="disk gone"):
        train_document(str(doc))
    with _db(dlm_home) as conn:
        assert conn.execute("SELECT status FROM runs").fetchall() == [("failed",)]
        for table in ("history_rows", "history_content", "history_generations", "history_runs"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table

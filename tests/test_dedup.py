"""Duplicate text rows: found on every run, listed by dlm show, dropped by training.dedup.

Small generated trees: a module, its vendored copy at another path (an
exact duplicate), a lightly edited copy (a near duplicate), and unrelated
modules. The signatures are checked against datasketch's own MinHash, the
LSH path against comparing every pair, and training with ``exact`` and
``near`` against the rows it trains.
"""

from __future__ import annotations

import json
import random
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.corpus import dedup, signatures
from dlmstore.corpus.dedup import TextRow, find_clusters, kept_rows
from dlmstore.corpus.show import summarize
from dlmstore.corpus.tokenize import tokenize_document
from dlmstore.document.rows import Row
from dlmstore.home import store_dir

from .helpers import VALID_ID, write_doc

#: A module long enough that a one-line edit keeps most of its 5-word shingles.
MODULE = "\n".join(
    f"def handler_{n}(request, response):\n    value = request.get('field_{n}', {n})\n"
    f"    response.write('handled {n} with ' + str(value))\n    return response"
    for n in range(30)
)


def _tree(root: Path) -> Path:
    src = root / "src"
    (src / "vendor").mkdir(parents=True)
    (src / "app.py").write_text(MODULE, encoding="utf-8")
    (src / "vendor" / "app.py").write_text(MODULE, encoding="utf-8")  # vendored: the same text
    edited = MODULE.replace("handler_7(", "handler_seven(")
    (src / "zz_old_app.py").write_text(edited, encoding="utf-8")  # a near copy
    (src / "other.py").write_text("import os\n\nprint(os.getcwd())\n", encoding="utf-8")
    (src / "more.py").write_text("class Thing:\n    size = 3\n    colour = 'red'\n", encoding="utf-8")
    return src


def _doc(root: Path, extra: str = "", body: str = "Notes about the tree.\n") -> Path:
    _tree(root)
    frontmatter = f"training:\n  sources:\n    - path: src\n{extra}"
    return write_doc(root / "doc.dlm", body=body, frontmatter=frontmatter)


def _tokenize(doc: Path) -> Any:
    return tokenize_document(str(doc), materialize=False)[0]


def test_signatures_equal_datasketch_s_minhash_of_the_same_shingles() -> None:
    from datasketch import MinHash

    hashes = signatures.shingle_hashes(MODULE.encode())
    reference = MinHash(num_perm=signatures.NUM_PERM, seed=signatures.SEED, hashfunc=int)
    reference.update_batch(hashes)
    assert reference.scheme == "affine32"
    assert np.array_equal(signatures.minhash(hashes), reference.hashvalues)
    a, b = signatures.permutations()
    assert np.array_equal(a, reference.permutations[0]) and np.array_equal(b, reference.permutations[1])


def test_a_shingle_is_five_words_whatever_the_whitespace_between_them() -> None:
    assert np.array_equal(
        signatures.shingle_hashes(b"one two three four five six"),
        signatures.shingle_hashes(b"one\ttwo\n\nthree  four five\r\nsix\n"),
    )
    assert len(signatures.shingle_hashes(b"one two three four five six")) == 2
    assert len(signatures.shingle_hashes(b"three words only")) == 1  # fewer than five: one shingle
    assert len(signatures.shingle_hashes(b" \n\t ")) == 0


def test_a_source_file_s_signature_leaves_out_its_path_header() -> None:
    assert signatures.row_text("# source: a/b.py\n\nprint(1)", "a/b.py") == "print(1)"
    assert signatures.row_text("# source: x.py\n\nprint(1)", None) == "# source: x.py\n\nprint(1)"


def test_a_vendored_copy_is_an_exact_duplicate_and_an_edited_one_a_near_duplicate(tmp_path: Path) -> None:
    report = summarize(_doc(tmp_path)).dedup
    assert report.rows == 6 and report.from_run is None  # never tokenized: found now, in memory
    ((cluster),) = report.clusters
    assert cluster.kind == "near"
    paths = [(m.path, m.kept, m.dropped) for m in cluster.members]
    assert paths == [
        ("src/app.py", True, False),
        ("src/vendor/app.py", False, False),
        ("src/zz_old_app.py", False, False),
    ]
    similarity = {m.path: m.similarity for m in cluster.members}
    assert similarity["src/vendor/app.py"] == 1.0
    assert (
        signatures.NUM_PERM * 0.8
        <= similarity["src/zz_old_app.py"] * signatures.NUM_PERM
        < signatures.NUM_PERM
    )
    assert (report.duplicate_rows, report.exact_duplicate_rows, report.dropped_rows) == (2, 1, 0)
    assert not (store_dir(VALID_ID)).exists()  # dlm show wrote nothing


def test_dlm_show_lists_the_clusters_and_what_training_keeps(tmp_path: Path) -> None:
    doc = _doc(tmp_path, extra="  dedup: exact\n")
    result = CliRunner().invoke(cli, ["show", str(doc)])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("dedup:"))
    assert lines[start:] == [
        "dedup:    1 cluster among 6 text rows, 2 duplicate rows; training.dedup: exact leaves 1 row out",
        "          near   src/app.py         1.00  kept",
        "                 src/vendor/app.py  1.00  dropped",
        f"                 src/zz_old_app.py  {lines[start + 3].split()[1]}  trained",
    ]
    data = json.loads(CliRunner().invoke(cli, ["show", str(doc), "--json"]).stdout)["dedup"]
    assert data["mode"] == "exact" and data["dropped_rows"] == 1
    assert [m["dropped"] for m in data["clusters"][0]["members"]] == [False, True, False]


def test_near_mode_drops_every_member_but_the_kept_one(tmp_path: Path) -> None:
    report = summarize(_doc(tmp_path, extra="  dedup: near\n")).dedup
    assert report.dropped_rows == 2
    assert report.dropped() == {m.row_key for m in report.clusters[0].members if not m.kept}


def test_repeated_instruction_pairs_and_prose_copies_in_the_body(tmp_path: Path) -> None:
    pair = "::instruction::\n### Q\nWhat is it?\n### A\nA thing.\n\n"
    prose = "::prose::\nThe same paragraph of prose, written out twice in the body of the document.\n\n"
    doc = write_doc(tmp_path / "doc.dlm", body=pair + pair + prose + prose)
    report = summarize(doc).dedup
    assert report.rows == 2  # the pairs are never compared: repeating one is deliberate
    ((cluster),) = report.clusters
    assert cluster.kind == "exact"
    assert [m.path for m in cluster.members] == [f"doc.dlm:{line}" for line in (16, 19)]


def test_every_run_records_its_clusters_and_a_warm_run_reuses_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _doc(tmp_path)
    cold = _tokenize(doc)
    assert cold.dedup is not None and (cold.dedup.clusters, cold.dedup.duplicate_rows) == (1, 2)
    assert cold.dedup.signatures_computed == 6

    def refuse(*_: object) -> None:
        raise AssertionError("a warm pass signed a row")

    monkeypatch.setattr(signatures, "sign", refuse)
    warm = _tokenize(doc)  # answered from the pass snapshot
    walked_db = store_dir(VALID_ID) / "store.db"
    conn = sqlite3.connect(walked_db)
    with conn:
        conn.execute("DELETE FROM pass_snapshots")
    conn.close()
    walked = _tokenize(doc)  # walks the tree: the same rows, the recorded clusters
    shown = summarize(doc).dedup
    assert warm.dedup is not None and walked.dedup is not None
    assert replace(warm.dedup, seconds=0) == replace(walked.dedup, seconds=0)
    assert warm.dedup is not None and (warm.dedup.clusters, warm.dedup.signatures_computed) == (1, 0)
    assert shown.from_run is not None and shown.signatures_computed == 0 and len(shown.clusters) == 1
    conn = sqlite3.connect(walked_db)
    runs = conn.execute("SELECT run_id, members_run_id, clusters FROM dedup_runs ORDER BY run_id").fetchall()
    members = conn.execute("SELECT run_id, COUNT(*) FROM dedup_members GROUP BY run_id").fetchall()
    conn.close()
    assert runs == [(1, 1, 1), (2, 1, 1), (3, 1, 1)] and members == [(1, 3)]


def test_an_edited_file_is_signed_again_and_the_rest_are_not(tmp_path: Path) -> None:
    doc = _doc(tmp_path)
    _tokenize(doc)
    (tmp_path / "src" / "other.py").write_text("import sys\n\nprint(sys.argv)\n", encoding="utf-8")
    again = _tokenize(doc)
    assert again.dedup is not None and again.dedup.signatures_computed == 1


def _signing_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread of every signature made from now on."""
    import threading

    made: list[str] = []
    sign = signatures.sign

    def counted(text: str) -> signatures.Signature:
        made.append(threading.current_thread().name)
        return sign(text)

    monkeypatch.setattr(signatures, "sign", counted)
    return made


def test_a_cold_pass_signs_its_text_rows_on_the_threads_that_encode_them_as_the_search_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _doc(tmp_path)
    threads = _signing_threads(monkeypatch)
    summary = _tokenize(doc)
    # The body's prose and the five files, each signed once, none after the pass.
    assert summary.dedup is not None and summary.dedup.signatures_computed == 6
    assert len(threads) == 6 and all(name.startswith("dlm-encode") for name in threads)
    corpus_rows = {item.path: item for item in dedup.text_rows(_corpus(doc))}
    conn = sqlite3.connect(store_dir(VALID_ID) / "store.db")
    kept = dict(conn.execute("SELECT row_key, minhash FROM row_signatures").fetchall())
    conn.close()
    for item in corpus_rows.values():
        expected = signatures.sign(signatures.row_text(item.row.data["text"], item.source))
        assert kept[item.row.row_key] == expected.minhash, item.path
    assert summary.dedup.clusters == 1 and summary.dedup.duplicate_rows == 2  # app.py, its copies


def test_rows_tokenized_again_are_not_signed_again_when_their_signatures_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _doc(tmp_path)
    _tokenize(doc)
    threads = _signing_threads(monkeypatch)
    summary = tokenize_document(str(doc), materialize=False, no_cache=True)[0]  # every row encoded
    assert summary.tokenization.cache_misses == 6
    assert threads == [] and summary.dedup is not None and summary.dedup.signatures_computed == 0


def _corpus(doc: Path) -> Any:
    from dlmstore.corpus.assemble import load_corpus
    from dlmstore.document.parser import parse_document

    return load_corpus(parse_document(doc))


def test_prune_drops_the_signatures_of_rows_no_cache_entry_holds(tmp_path: Path) -> None:
    from datetime import timedelta

    from dlmstore.cache.admin import prune
    from dlmstore.store.database import open_store

    doc = _doc(tmp_path)
    _tokenize(doc)
    db = store_dir(VALID_ID) / "store.db"
    conn = sqlite3.connect(db)
    with conn:  # as eviction would: one row's entry gone
        (key,) = conn.execute("SELECT row_key FROM row_signatures ORDER BY row_key LIMIT 1").fetchone()
        conn.execute("DELETE FROM cache_entries WHERE row_key = ?", (key,))
    conn.close()
    with open_store(VALID_ID) as store:
        result = prune(store, older_than=timedelta(days=36500))
    assert result.signatures_removed == 1
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT COUNT(*) FROM row_signatures WHERE row_key = ?", (key,)).fetchone() == (0,)
    conn.close()


def test_a_second_store_takes_the_signatures_of_the_first(tmp_path: Path) -> None:
    doc = _doc(tmp_path)
    _tokenize(doc)
    second = tmp_path / "second.dlm"
    second.write_text(doc.read_text().replace(VALID_ID, "01KPQ1FFEDGPPSMWRAS18SAZSV"), encoding="utf-8")
    summary = _tokenize(second)
    assert (
        summary.dedup is not None and summary.dedup.signatures_computed == 0 and summary.dedup.clusters == 1
    )


def test_dlm_tokenize_and_dlm_metrics_say_what_was_found(tmp_path: Path) -> None:
    doc = _doc(tmp_path)
    result = CliRunner().invoke(cli, ["tokenize", str(doc)])
    assert result.exit_code == 0
    assert (
        "dedup:  1 duplicate cluster, 2 duplicate rows, all trained (training.dedup: off); `dlm show` lists them"
        in result.stdout
    )
    metrics = CliRunner().invoke(cli, ["metrics", str(doc)])
    assert "run 1: 1 duplicate cluster, 2 duplicate rows (training.dedup: off)" in metrics.stdout
    runs = json.loads(CliRunner().invoke(cli, ["metrics", str(doc), "--json"]).stdout)["runs"]
    assert runs[0]["dedup"] == runs[0]["dedup"] | {
        "mode": "off",
        "rows": 6,
        "clusters": 1,
        "duplicate_rows": 2,
    }


def test_dedup_off_written_bare_is_off_though_yaml_reads_it_as_false(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm", frontmatter="training:\n  dedup: off\n")
    assert summarize(doc).dedup.mode == "off"


def test_a_bad_dedup_mode_is_an_error_naming_the_key(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm", frontmatter="training:\n  dedup: sometimes\n")
    result = CliRunner().invoke(cli, ["show", str(doc)])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == (
        f"error: {doc}:4: training.dedup: must be 'off', 'exact' or 'near'"
    )


def _rows(texts: list[str]) -> list[TextRow]:
    return [
        TextRow(
            Row(f"sha256:{index:064x}", f"{index:016x}", 0, "text", {"text": text}), None, f"f{index:04d}"
        )
        for index, text in enumerate(texts)
    ]


def test_above_the_all_pairs_limit_lsh_finds_the_pairs_comparing_every_pair_finds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(5)
    vocabulary = [f"w{n}" for n in range(5000)]
    texts = [" ".join(rng.choice(vocabulary) for _ in range(200)) for _ in range(dedup.ALL_PAIRS + 40)]
    for index in range(0, 40, 2):  # twenty near copies: one word in two hundred changed
        words = texts[index].split()
        words[100] = "changed"
        texts[index + 1] = " ".join(words)
    items = _rows(texts)
    signed = {item.row.row_key: signatures.sign(item.row.data["text"]) for item in items}
    with_lsh = find_clusters(items, signed)
    monkeypatch.setattr(dedup, "ALL_PAIRS", len(texts))
    every_pair = find_clusters(items, signed)
    assert with_lsh == every_pair
    assert sorted({m.cluster for m in with_lsh}) == list(range(1, 21))


def test_the_lsh_candidates_are_the_pairs_datasketch_s_minhashlsh_finds() -> None:
    from datasketch import MinHash, MinHashLSH

    rng = random.Random(11)
    vocabulary = [f"w{n}" for n in range(300)]
    texts = [" ".join(rng.choice(vocabulary) for _ in range(60)) for _ in range(400)]
    for index in range(0, 200, 2):  # copies with a few words changed: candidates in several bands
        words = texts[index].split()
        for position in rng.sample(range(60), rng.randint(1, 12)):
            words[position] = "edit"
        texts[index + 1] = " ".join(words)
    values = np.stack([np.frombuffer(signatures.sign(text).minhash, dtype="<u4") for text in texts])
    left, right = dedup.lsh_candidates(values)
    index = MinHashLSH(num_perm=signatures.NUM_PERM, params=dedup.BANDS)
    a, b = signatures.permutations()
    sketches = [MinHash(hashvalues=row, permutations=(a, b), scheme="affine32") for row in values]
    for number, sketch in enumerate(sketches):
        index.insert(number, sketch)
    expected = {(n, m) for n, sketch in enumerate(sketches) for m in index.query(sketch) if m > n}
    assert set(zip(left.tolist(), right.tolist(), strict=True)) == expected
    assert len(expected) >= 20


def test_the_kept_row_does_not_depend_on_the_order_rows_come_in() -> None:
    items = _rows([MODULE, MODULE, MODULE.replace("handler_3(", "h3("), "unrelated words here and there"])
    signed = {item.row.row_key: signatures.sign(item.row.data["text"]) for item in items}
    forward = find_clusters(items, signed)
    backward = find_clusters(list(reversed(items)), signed)
    assert sorted(forward, key=lambda m: m.row_key) == sorted(backward, key=lambda m: m.row_key)
    assert [m.path for m in forward if not m.drop_near] == ["f0000"]


def test_with_nothing_dropped_training_gets_the_pass_s_own_rows(tmp_path: Path) -> None:
    _, rows = tokenize_document(str(_doc(tmp_path)))
    assert rows is not None
    assert kept_rows(rows, set()) is rows
    fewer = kept_rows(rows, {rows.row_keys[1]})
    assert fewer.row_keys == rows.row_keys[:1] + rows.row_keys[2:]
    assert (
        fewer.values.tolist()
        == rows.values[: rows.offsets[1]].tolist() + rows.values[rows.offsets[2] :].tolist()
    )


@pytest.mark.parametrize(("mode", "trained"), [("off", 6), ("exact", 5), ("near", 4)])
def test_training_dedup_decides_the_rows_trained(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None, mode: str, trained: int
) -> None:
    from dlmstore.train.trainer import train_document

    extra = f"  sequence_len: 64\n  max_steps: 1\n  micro_batch_size: 2\n  dedup: {mode}\n"
    doc = _doc(tmp_path, extra=extra)
    doc.write_text(doc.read_text().replace("training:\n", f"base_model: {tiny_base}\ntraining:\n", 1))
    summary = train_document(str(doc))
    assert summary.rows_trained == trained
    runs = json.loads(CliRunner().invoke(cli, ["metrics", str(doc), "--json"]).stdout)["runs"]
    assert runs[0]["dedup"]["dropped_rows"] == 6 - trained


def test_validation_rows_that_duplicate_training_rows_are_reported_and_dedup_keeps_them_out(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    from dlmstore.eval.split import is_val
    from dlmstore.train.trainer import train_document

    copies = tmp_path / "src"
    copies.mkdir()
    for number in range(30):  # one module vendored thirty times: some copies fall in the val split
        (copies / f"copy{number:02d}.py").write_text(MODULE, encoding="utf-8")
    extra = "  sequence_len: 64\n  max_steps: 1\n  micro_batch_size: 2\n"
    doc = write_doc(
        tmp_path / "doc.dlm",
        body="Notes about the tree.\n",
        frontmatter=f"base_model: {tiny_base}\ntraining:\n  sources:\n    - path: src\n{extra}",
    )
    rows = tokenize_document(str(doc))[1]
    assert rows is not None
    held = [key for key in rows.row_keys[1:] if is_val(key, 42)]
    assert 0 < len(held) < 30  # fixed by the keys and the seed: copies on both sides of the split
    (warning,) = [w for w in train_document(str(doc)).warnings if "validation" in w]
    assert warning.startswith(f"{len(held)} validation rows duplicate training rows (src/copy")
    assert warning.endswith("training.dedup: exact or near keeps a duplicate out of the validation split")
    doc.write_text(doc.read_text().replace(extra, extra + "  dedup: exact\n"), encoding="utf-8")
    assert not [w for w in train_document(str(doc)).warnings if "validation" in w]

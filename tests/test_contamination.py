"""Validation rows that duplicate training rows: found, kept out by training.dedup, recorded, shown.

Trees of copies of one module: thirty identical copies (exact
contamination), thirty copies each with one function renamed (near), at
paths whose row keys put some copies in the validation split under seed 42
and the rest in training. Which ones is fixed by the keys and the seed, so
each test computes it with ``dlmstore.eval.split.is_val`` rather than
hard-coding it.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner

from dlmstore.cli.contract import json_schema, resolve
from dlmstore.cli.main import cli
from dlmstore.corpus import signatures
from dlmstore.corpus.show import summarize
from dlmstore.eval.split import is_val
from dlmstore.home import store_dir

from .helpers import VALID_ID, write_doc

#: A module long enough that renaming one function keeps most of its 5-word shingles.
MODULE = "\n".join(
    f"def handler_{n}(request, response):\n    value = request.get('field_{n}', {n})\n"
    f"    response.write('handled {n} with ' + str(value))\n    return response"
    for n in range(30)
)

TRAINING = "  sequence_len: 64\n  max_steps: 1\n  micro_batch_size: 2\n"


def _doc(root: Path, *, near: bool, dedup: str = "off", base: Path | None = None) -> Path:
    """Thirty copies of MODULE under src/: the same text, or (``near``) each with one function renamed."""
    src = root / "src"
    src.mkdir()
    for number in range(30):
        text = MODULE.replace(f"handler_{number}(", f"renamed_{number}(") if near else MODULE
        (src / f"copy{number:02d}.py").write_text(text, encoding="utf-8")
    model = f"base_model: {base}\n" if base is not None else ""
    frontmatter = f"{model}training:\n  sources:\n    - path: src\n  dedup: {dedup}\n{TRAINING}"
    return write_doc(root / "doc.dlm", body="Notes about the tree.\n", frontmatter=frontmatter)


def _sides(doc: Path) -> tuple[set[str], set[str]]:
    """The copies' paths held out under seed 42, and those that train."""
    members = [m for cluster in summarize(doc).dedup.clusters for m in cluster.members if not m.dropped]
    held = {m.path for m in members if is_val(m.row_key, 42)}
    return held, {m.path for m in members} - held


def _db(query: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(store_dir(VALID_ID) / "store.db")
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


def test_a_held_out_copy_of_a_training_row_is_exact_contamination(tmp_path: Path) -> None:
    doc = _doc(tmp_path, near=False)
    held, train = _sides(doc)
    assert 0 < len(held) < 30  # fixed by the keys and the seed: copies on both sides of the split
    found = summarize(doc).contamination
    assert (found.mode, found.seed, found.from_run, found.val_rows) == ("off", 42, None, None)
    assert [row.path for row in found.rows] == sorted(held)
    assert found.contaminated_rows == len(held) and found.kept_out_rows == 0
    assert {(row.kind, row.similarity, row.kept_out) for row in found.rows} == {("exact", 1.0, False)}
    assert {row.train_path for row in found.rows} == {min(train)}  # the cluster's kept row trains
    assert not store_dir(VALID_ID).exists()  # dlm show wrote nothing


def test_a_held_out_near_copy_is_near_contamination_with_its_similarity(tmp_path: Path) -> None:
    doc = _doc(tmp_path, near=True)
    held, train = _sides(doc)
    assert 0 < len(held) < 30
    found = summarize(doc).contamination
    assert [row.path for row in found.rows] == sorted(held)
    for row in found.rows:
        assert row.kind == "near" and row.train_path in train and not row.kept_out
        own, other = (
            signatures.sign((tmp_path / path).read_text()).minhash for path in (row.path, row.train_path)
        )
        agree = np.count_nonzero(np.frombuffer(own, dtype="<u4") == np.frombuffer(other, dtype="<u4"))
        assert row.similarity == round(agree / signatures.NUM_PERM, 4) and 0.8 <= row.similarity < 1.0


def test_dlm_show_lists_the_held_out_duplicates_with_the_training_row_each_is_most_like(
    tmp_path: Path,
) -> None:
    doc = _doc(tmp_path, near=False)
    held, train = _sides(doc)
    result = CliRunner().invoke(cli, ["show", str(doc)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("val:"))
    assert lines[start] == (
        f"val:      {len(held)} validation rows (seed 42) duplicate training rows; held out: the val loss "
        "reads low on them (training.dedup: exact or near keeps them out)"
    )
    assert lines[start + 1 :] == [f"          {path}  exact  1.00  {min(train)}" for path in sorted(held)]
    payload = json.loads(CliRunner().invoke(cli, ["show", str(doc), "--json"]).stdout)
    jsonschema.validate(payload, json_schema(resolve("dlmstore.corpus.show:DocumentSummary")))
    data = payload["contamination"]
    assert data["contaminated_rows"] == len(held) and data["rows"][0]["train_path"] == min(train)


def test_with_dedup_near_no_row_is_left_to_contaminate_the_split(tmp_path: Path) -> None:
    found = summarize(_doc(tmp_path, near=True, dedup="near")).contamination
    assert (found.mode, found.contaminated_rows, found.rows) == ("near", 0, [])


def test_with_dedup_exact_held_out_near_copies_are_kept_out_of_the_split(tmp_path: Path) -> None:
    doc = _doc(tmp_path, near=True, dedup="exact")
    held, _ = _sides(doc)
    found = summarize(doc).contamination
    assert found.kept_out_rows == found.contaminated_rows == len(held) > 0
    assert all(row.kept_out and row.kind == "near" for row in found.rows)
    result = CliRunner().invoke(cli, ["show", str(doc)])
    line = next(line for line in result.stdout.splitlines() if line.startswith("val:"))
    assert line.endswith("duplicate training rows; kept out of the split, they train (training.dedup: exact)")


def _train(doc: Path) -> Any:
    from dlmstore.train.trainer import train_document

    return train_document(str(doc))


def test_a_train_run_with_dedup_off_holds_them_out_records_them_and_warns(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    doc = _doc(tmp_path, near=True, base=tiny_base)
    held, _ = _sides(doc)
    summary = _train(doc)
    (warning,) = [w for w in summary.warnings if "validation" in w]
    assert warning.startswith(f"{len(held)} validation rows duplicate training rows (src/copy")
    assert _db("SELECT mode, seed, contaminated_rows, kept_out_rows, from_run_id FROM val_splits") == [
        ("off", 42, len(held), 0, None)
    ]
    rows = _db("SELECT path, kind, kept_out FROM val_contamination ORDER BY path")
    assert rows == [(path, "near", 0) for path in sorted(held)]
    (val_rows,) = _db("SELECT val_rows FROM val_splits")[0]
    evaluated = _db("SELECT val_rows FROM evaluations WHERE model = 'base'")
    assert evaluated == [(val_rows,)] == [(summary.val_rows,)]  # the contaminated rows were measured
    assert val_rows >= len(held)

    metrics = CliRunner().invoke(cli, ["metrics", str(doc)]).stdout.splitlines()
    assert (
        f"run 1: {len(held)} validation rows of seed 42 duplicate training rows ({len(held)} near); held out: its val loss reads low on them"
        in metrics
    )
    listed = CliRunner().invoke(cli, ["metrics", str(doc), "--run-id", "1"]).stdout.splitlines()
    first = sorted(held)[0]
    assert any(line.startswith(f"  {first}  near   0.") and line.endswith("  held out") for line in listed)
    payload = json.loads(CliRunner().invoke(cli, ["metrics", str(doc), "--json"]).stdout)
    jsonschema.validate(payload, json_schema(resolve("dlmstore.store.metrics:MetricsReport")))
    data = payload["runs"][0]
    assert data["contamination"]["contaminated_rows"] == len(held)
    assert data["contamination"]["from_run"] == 1 and data["contamination"]["rows"][0]["path"] == first
    (row,) = csv.DictReader(io.StringIO(CliRunner().invoke(cli, ["metrics", str(doc), "--csv"]).stdout))
    assert (row["val_rows"], row["contaminated_rows"], row["kept_out_rows"]) == (
        str(val_rows),
        str(len(held)),
        "0",
    )

    report = json.loads(CliRunner().invoke(cli, ["report", str(doc), "--json"]).stdout)
    jsonschema.validate(report, json_schema(resolve("dlmstore.report.contents:StoreReport")))
    assert [r["path"] for r in report["training"][0]["contamination"]["rows"]] == sorted(held)
    page = tmp_path / "report.html"
    assert CliRunner().invoke(cli, ["report", str(doc), "-o", str(page)]).exit_code == 0
    html = page.read_text(encoding="utf-8")
    assert f'data-contamination="{len(held)}"' in html and f"<code>{first}</code>" in html


def test_a_train_run_with_dedup_exact_trains_the_near_copies_it_keeps_out_of_the_split(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    doc = _doc(tmp_path, near=True, dedup="exact", base=tiny_base)
    held, _ = _sides(doc)
    summary = _train(doc)
    assert not [w for w in summary.warnings if "validation" in w]
    body_held = int(is_val(_body_key(doc), 42))
    assert _db("SELECT val_rows, contaminated_rows, kept_out_rows FROM val_splits") == [
        (body_held, len(held), len(held))
    ]
    assert summary.rows_trained == 31 - body_held  # every copy trains: exact drops no near copy
    assert _db("SELECT count(*) FROM val_contamination WHERE kept_out = 1") == [(len(held),)]
    metrics = CliRunner().invoke(cli, ["metrics", str(doc)]).stdout
    assert "duplicate training rows" in metrics
    assert "kept out of the split, they trained (training.dedup: exact)" in metrics
    evaluated = json.loads(CliRunner().invoke(cli, ["eval", str(doc), "--json"]).stdout)
    assert evaluated["val_rows"] == body_held  # dlm eval holds out what the run held out


def _body_key(doc: Path) -> str:
    from dlmstore.corpus.show import document_rows

    return document_rows(doc)[0].row_key


def test_a_warm_run_reads_the_contamination_back_and_signs_nothing(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _doc(tmp_path, near=True, base=tiny_base)
    held, _ = _sides(doc)
    _train(doc)

    def refuse(*_: object) -> None:
        raise AssertionError("a warm run signed a row")

    monkeypatch.setattr(signatures, "sign", refuse)
    second = _train(doc)
    assert [w for w in second.warnings if "validation" in w]
    assert _db("SELECT run_id, contaminated_rows, from_run_id FROM val_splits ORDER BY run_id") == [
        (1, len(held), None),
        (2, len(held), 1),
    ]
    first, again = (
        _db(
            f"SELECT path, train_path, kind, similarity, kept_out FROM val_contamination WHERE run_id = {run}"
        )
        for run in (1, 2)
    )
    assert first == again and len(first) == len(held)
    shown = summarize(doc).contamination  # dlm show reads the newest record back
    assert shown.from_run == 2 and [row.path for row in shown.rows] == sorted(held)

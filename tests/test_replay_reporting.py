"""Retention shown (issue 38): `dlm eval`, `dlm metrics` and `dlm report` show the probes of earlier
versions and the retention slice's loss, and a document with no history shows nothing new."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli

from .helpers import VALID_ID, write_doc

FRONT = (
    "training:\n  sequence_len: 64\n  max_steps: 2\n  micro_batch_size: 2\n  seed: 7\n"
    "  preference:\n    enabled: false\n  replay:\n    retention_fraction: 0.5\n"
)
PROSE = "".join(f"::prose::\nNote {i} on what the store keeps and why it keeps it.\n\n" for i in range(8))
V1 = (
    PROSE
    + "".join(f"::prose::\nDropped note {i}: the second version removes it.\n\n" for i in range(4))
    + "::instruction::\n### Q !probe\nWhat is the harbour of Tellin called?\n### A\nGrey Quay.\n\n"
    + "### Q !probe\nWho mapped the Orrin shoals?\n### A\nAda Morrow.\n"
)
V2 = PROSE + "::instruction::\n### Q !probe\nWhat does the Pell river carry?\n### A\nSalt barges.\n"
OLD_QUESTIONS = {"What is the harbour of Tellin called?", "Who mapped the Orrin shoals?"}


def _doc(folder: Path, body: str, base: Path) -> Path:
    return write_doc(folder / "doc.dlm", body=body, frontmatter=f"base_model: {base}\n{FRONT}")


def _run(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def _json(*args: str) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(_run(*args, "--json").stdout)
    return payload


def _trained(folder: Path, base: Path) -> Path:
    """The document trained as v1 (two probes), then edited to v2 (the two replaced) and trained."""
    _run("train", str(_doc(folder, V1, base)))
    doc = _doc(folder, V2, base)
    _run("train", str(doc))
    return doc


@pytest.mark.slow
def test_dlm_eval_asks_the_probes_of_earlier_versions_and_measures_the_retention_slice_for_each_model(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    doc = _trained(tmp_path, tiny_base)
    payload = _json("eval", str(doc), "--adapter", "v2", "--against", "v1")
    newer, older = payload["models"]
    assert (newer["model"], older["model"]) == ("v0002", "v0001")
    for model in (newer, older):
        assert {p["question"] for p in model["retained"]} == OLD_QUESTIONS
        assert all(p["retained"] for p in model["retained"])
        assert not any(p["retained"] for p in model["probes"])
        assert model["retention_rows"] > 0 and model["retention_loss"] is not None
    assert newer["retention_previous_loss"] == older["retention_loss"]
    assert newer["retention_delta"] == pytest.approx(newer["retention_loss"] - older["retention_loss"])
    assert older["retention_delta"] is None
    with sqlite3.connect(tmp_path / "dlm-home" / "store" / VALID_ID / "store.db") as conn:
        recorded = conn.execute(
            "SELECT model, retained_probes, retention_rows, retention_loss, retention_delta FROM evaluations "
            "WHERE run_id = ? ORDER BY id",
            (payload["run_id"],),
        ).fetchall()
        kept = conn.execute(
            "SELECT count(*) FROM probe_results AS p JOIN evaluations AS e ON e.id = p.evaluation_id "
            "WHERE e.run_id = ? AND p.retained = 1",
            (payload["run_id"],),
        ).fetchone()
    assert recorded == [
        ("v0002", 2, newer["retention_rows"], newer["retention_loss"], newer["retention_delta"]),
        ("v0001", 2, older["retention_rows"], older["retention_loss"], None),
    ]
    assert kept == (4,)

    lines = _run("eval", str(doc)).stdout.splitlines()  # the newest adapter against the base
    number = r"[\d.]+, \d/2 exact, F1 [\d.]+"
    at = lines.index("kept:   2 probes of earlier versions")
    assert re.fullmatch(rf"  v0002  NLL {number}", lines[at + 1])
    assert re.fullmatch(rf"  base   NLL {number}", lines[at + 2])
    assert re.fullmatch(r"retain: \d+ rows? of the retention slice", lines[at + 3])
    assert re.fullmatch(r"  v0002  loss [\d.]+", lines[at + 4])  # no delta against the base
    assert re.fullmatch(r"  base   loss [\d.]+", lines[at + 5])
    asked = [line.split(": ", 1)[1] for line in lines if line.startswith("kept probe ")]
    assert set(asked) == OLD_QUESTIONS
    against = _run("eval", str(doc), "--adapter", "v2", "--against", "v1").stdout.splitlines()
    assert any(re.fullmatch(r"  v0002  loss [\d.]+, [+-][\d.]+ against v0001", line) for line in against)


@pytest.mark.slow
def test_dlm_eval_of_a_document_with_nothing_removed_shows_no_retention(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    doc = _doc(tmp_path, V1, tiny_base)
    _run("train", str(doc))
    adapter, base = _json("eval", str(doc))["models"]
    for model in (adapter, base):
        assert model["retained"] == [] and model["retention_loss"] is None and model["retention_rows"] == 0
    lines = _run("eval", str(doc)).stdout.splitlines()
    assert lines[0] == "run 3 eval: 1 val row, 2 probes"
    assert not [line for line in lines if line.startswith(("kept", "retain"))]
    assert "" not in lines
    assert len(lines) == 3 + 2 * 4  # the header, two models, two probes of four lines each


@pytest.mark.slow
def test_dlm_metrics_shows_the_retention_figures_of_each_evaluation_and_none_for_a_run_without_history(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    doc = _trained(tmp_path, tiny_base)
    _run("eval", str(doc), "--adapter", "v2", "--against", "v1")
    lines = _run("metrics", str(doc)).stdout.splitlines()
    number, exact = r"[\d.]+", r"\d/2 exact, NLL [\d.]+"
    kept = (
        rf"run 2 sft: kept: base {exact} -> v0002 {exact}; "
        rf"retain: loss {number} -> {number} \(\d+ rows?\), [+-]{number} against the previous adapter"
    )
    assert sum(bool(re.fullmatch(kept, line)) for line in lines) == 1, lines
    scores = rf"\d/1 exact, NLL {number}, kept {exact}, retain loss {number}"  # the split holds no row out
    evaluated = rf"run 3 eval: v0002 {scores}, delta [+-]{number}; v0001 {scores}"
    assert sum(bool(re.fullmatch(evaluated, line)) for line in lines) == 1, lines
    assert not [line for line in lines if line.startswith("run 1 ") and ("kept" in line or "retain" in line)]
    assert "" not in lines

    runs = {run["run_id"]: run for run in _json("metrics", str(doc))["runs"]}
    first_base, first_adapter = runs[1]["evaluations"]
    assert first_adapter["retained_probes"] == 0 and first_adapter["retention_loss"] is None
    assert first_base["retention_rows"] == 0 and first_adapter["retention_delta"] is None
    base, adapter = runs[2]["evaluations"]
    assert (base["retained_probes"], adapter["retained_probes"]) == (2, 2)
    assert adapter["retention_rows"] > 0 and adapter["retention_loss"] is not None
    assert adapter["retention_delta"] == pytest.approx(
        adapter["retention_loss"] - adapter["retention_previous_loss"]
    )
    newer, older = runs[3]["evaluations"]
    assert newer["retention_previous_loss"] == older["retention_loss"] and older["retention_delta"] is None


@pytest.mark.slow
def test_the_report_shows_each_runs_replay_draw_and_retention_and_marks_the_probes_of_earlier_versions(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    doc = _trained(tmp_path, tiny_base)
    data = _json("report", str(doc))
    second, first = data["training"]
    assert first["replay"] == {"generation": 1, "candidates": 0, "drawn": 0, "skipped": None}
    assert first["retention"] == []  # the document held everything its history did
    draw = second["replay"]
    assert (draw["generation"], draw["skipped"]) == (2, None) and 0 < draw["drawn"] == draw["candidates"]
    assert [(item["phase"], item["model"]) for item in second["retention"]] == [
        ("sft", "base"),
        ("sft", "v0002"),
    ]
    base, adapter = second["retention"]
    assert base["retained_probes"] == adapter["retained_probes"] == 2 and adapter["retention_rows"] > 0
    assert base["retention_delta"] is None and adapter["retention_delta"] is not None
    table = data["probes"]
    assert (table["run_id"], table["models"]) == (2, ["base", "v0002"])
    assert [row["retained"] for row in table["rows"]] == [False, True, True]
    assert {row["question"] for row in table["rows"] if row["retained"]} == OLD_QUESTIONS
    assert table["retention"] == second["retention"]

    page = _run("report", str(doc), "-o", "-").stdout
    drawn = draw["drawn"]
    replay = rf'<p class="meta" data-replay="{drawn}">replay: {drawn} rows? drawn of {drawn} candidates? \(generation 2\)</p>'
    assert re.search(replay, page)
    assert page.count("data-replay=") == 1  # the first run had nothing to draw: no line
    line = re.search(r'<p class="meta" data-retention="sft">retention after sft: (.*?)</p>', page)
    assert line is not None, page
    number = r"[\d.]+"
    kept = rf"kept \d/2 exact, NLL {number}; retention slice loss {number} \(\d+ rows?\)"
    assert re.fullmatch(
        rf"base {kept} · v0002 {kept}, [+-]{number} against the previous adapter", line.group(1)
    ), line.group(1)
    assert page.count('<span class="meta">earlier version</span>') == 2
    assert 'data-retention="probes"' in page

    _run("eval", str(doc), "--adapter", "v2", "--against", "v1")
    table = _json("report", str(doc))["probes"]
    assert (table["run_id"], table["phase"], table["models"]) == (3, "eval", ["v0002", "v0001"])
    assert table["retention"][0]["retention_delta"] is not None
    assert re.search(
        r"v0002 kept [^<]*, [+-][\d.]+ against v0001", _run("report", str(doc), "-o", "-").stdout
    )


@pytest.mark.slow
def test_the_report_of_a_document_with_nothing_removed_shows_no_replay_or_retention(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    doc = _doc(tmp_path, V1, tiny_base)
    _run("train", str(doc))
    _run("train", str(doc))  # unchanged: nothing to draw
    data = _json("report", str(doc))
    assert all(run["retention"] == [] and run["replay"]["candidates"] == 0 for run in data["training"])
    assert data["probes"]["retention"] == [] and not any(row["retained"] for row in data["probes"]["rows"])
    page = _run("report", str(doc), "-o", "-").stdout
    assert "data-replay=" not in page and "data-retention=" not in page and "earlier version" not in page

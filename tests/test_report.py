"""`dlm report`: the store on one self-contained HTML page, its data from store.db, drawn by a real browser."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.corpus.show import document_rows
from dlmstore.document.rows import row_key, text_row_key
from dlmstore.document.sections import Section
from dlmstore.home import store_dir
from dlmstore.lock import write_lock
from dlmstore.report.contents import SourceFolder, build_report
from dlmstore.report.page import render_page
from dlmstore.report.svg import Series, column_chart, line_chart, nice_ticks, tick_labels
from dlmstore.store.database import open_store

from .chromium import INSTALL_HINT, find_chromium, open_page, page_url
from .helpers import REPO, VALID_ID, make_lock, write_doc

#: Where the browser test leaves the page it opened and its screenshot (ignored by git).
ARTIFACTS = REPO / "tests" / "artifacts"

SOURCES = {
    "notes/a.md": "Notes on caching tokens. " * 6,
    "notes/b.md": "More notes about packs and entries.",
    "notes/deep/c.md": "A deeper note on the stat cache. " * 3,
    "src/main.py": "def main():\n    return 42\n",
}


def _source_doc(folder: Path, base: Path, body: str = "Prose about dlmstore.\n", extra: str = "") -> Path:
    for relpath, text in SOURCES.items():
        (folder / relpath).parent.mkdir(parents=True, exist_ok=True)
        (folder / relpath).write_text(text, encoding="utf-8")
    return write_doc(
        folder / "doc.dlm",
        body=body,
        frontmatter=f"base_model: {base}\ntraining:\n  sequence_len: 64\n{extra}"
        "  sources:\n    - path: notes\n    - path: src\n",
    )


def _tokenize(doc: Path) -> None:
    result = CliRunner().invoke(cli, ["tokenize", str(doc)])
    assert result.exit_code == 0, result.output


def test_a_source_files_row_key_follows_from_its_recorded_digest_alone() -> None:
    section = Section("prose", "# source: a.md\n\ntext", None, "a.md")
    assert text_row_key(section.digest) == row_key(section, "text", 0, 0, {})
    assert text_row_key(section.digest, 1) == row_key(section, "text", 0, 1, {})


def test_the_report_counts_the_tokens_of_the_last_cached_pass_by_source_folder(
    tmp_path: Path, tiny_base: Path
) -> None:
    doc = _source_doc(tmp_path, tiny_base)
    _tokenize(doc)
    _tokenize(doc)  # the second pass hits the cache for every row: it is the one counted
    db = sqlite3.connect(store_dir(VALID_ID) / "store.db")
    counts = dict(db.execute("SELECT row_key, token_count FROM cache_entries").fetchall())
    expected: dict[str, list[int]] = {}
    body_tokens = 0
    for row in document_rows(doc):
        header = re.match(r"# source: (\S+)", row.data.get("text", ""))
        if header is None:
            body_tokens += counts[row.row_key]
            continue
        relpath = next(path for path in SOURCES if path.endswith(header.group(1)))
        entry = expected.setdefault(str(Path(relpath).parent), [0, 0])
        entry[0] += 1
        entry[1] += counts[row.row_key]
    with open_store(VALID_ID) as store:
        sources = build_report(store).sources
    assert sources.run_id == 2 and sources.uncounted_files == 0
    assert sorted(sources.folders, key=lambda f: f.folder) == [
        SourceFolder(folder, files, tokens) for folder, (files, tokens) in sorted(expected.items())
    ]
    assert [f.tokens for f in sources.folders] == sorted((f.tokens for f in sources.folders), reverse=True)
    assert sources.document_tokens == body_tokens > 0


def test_a_source_folder_beside_the_documents_is_named_relative_to_it(
    tmp_path: Path, tiny_base: Path
) -> None:
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "a.md").write_text("Shared notes.", encoding="utf-8")
    (tmp_path / "doc").mkdir()
    doc = write_doc(
        tmp_path / "doc" / "doc.dlm",
        frontmatter=f"base_model: {tiny_base}\ntraining:\n  sources:\n    - path: ../shared\n",
    )
    _tokenize(doc)
    with open_store(VALID_ID) as store:
        (folder,) = build_report(store).sources.folders
    assert (folder.folder, folder.files) == ("../shared", 1)


def test_the_report_reads_runs_cache_passes_and_adapters_from_the_store(
    tmp_path: Path, tiny_base: Path
) -> None:
    doc = _source_doc(tmp_path, tiny_base)
    _tokenize(doc)
    with open_store(VALID_ID) as store:
        report = build_report(store)
    assert (report.dlm_id, report.run_count, report.document_path) == (VALID_ID, 1, str(doc.resolve()))
    assert report.training == [] and report.adapters == [] and report.lock_history == []
    (only,) = report.cache_passes
    assert (only.run_id, only.command, only.cache_hits, only.cache_mode) == (1, "tokenize", 0, "on")
    assert only.cache_misses == report.cache_entries == len(document_rows(doc))
    assert only.cache_bytes_after == report.cache_bytes > 0


def test_lock_history_compares_each_record_with_the_lock_on_disk_before_it() -> None:
    with open_store(VALID_ID) as store:
        write_lock(store, make_lock(), decision="written")
        write_lock(store, make_lock(pinned_versions={"torch": "3.0.0"}), decision="ignored")
        write_lock(
            store,
            make_lock(pinned_versions={"transformers": "5.24.0"}, dlm_sha256="c" * 64),
            decision="updated",
        )
        write_lock(
            store,
            make_lock(pinned_versions={"transformers": "5.24.0"}, dlm_sha256="c" * 64),
            decision="written",
        )
        history = build_report(store).lock_history
    assert [(e.record_id, e.decision, e.compared_with, e.severity) for e in history] == [
        (1, "written", None, None),
        (2, "ignored", 1, "ERROR"),  # a new torch major version
        (3, "updated", 1, "WARN"),  # compared with what dlm.lock held: record 1, not the ignored one
        (4, "written", 3, None),
    ]
    assert [(c.field, c.old, c.new, c.severity) for c in history[2].changes] == [
        ("dlm_sha256", "a" * 64, "c" * 64, "ALLOW"),
        ("pinned_versions.transformers", "5.23.0", "5.24.0", "WARN"),
    ]


def test_a_lock_record_that_cannot_be_read_is_shown_as_unreadable_not_fatal() -> None:
    with open_store(VALID_ID) as store:
        write_lock(store, make_lock(), decision="written")
        with store.write() as conn:
            conn.execute("UPDATE lock_records SET lock_json = '{' WHERE id = 1")
        report = build_report(store)
    (entry,) = report.lock_history
    assert entry.problem is not None and entry.problem.startswith("lock record 1")
    assert "unreadable" in render_page(report)


def test_everything_from_the_store_is_escaped_in_the_page(tmp_path: Path, tiny_base: Path) -> None:
    hostile = tmp_path / "<img src=x onerror=alert(1)>&amp"
    hostile.mkdir()
    doc = _source_doc(hostile, tiny_base)
    _tokenize(doc)
    with open_store(VALID_ID) as store:
        write_lock(store, make_lock(), decision="written")
        write_lock(
            store, make_lock(base_model_revision="</code><script>alert(2)</script>"), decision="written"
        )
        page = render_page(build_report(store))
    assert "<img" not in page and "<script" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;&amp;amp" in page
    assert "&lt;/code&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in page


def test_an_empty_store_gets_a_page_that_says_what_to_run_instead_of_empty_charts() -> None:
    with open_store(VALID_ID) as store:
        page = render_page(build_report(store))
    assert "<figure" not in page
    for words in ("No train runs yet", "No tokenization pass yet", "No adapter yet", "No lock recorded yet"):
        assert words in page


def test_dlm_report_writes_the_page_and_json_prints_its_data(tmp_path: Path, tiny_base: Path) -> None:
    doc = _source_doc(tmp_path, tiny_base)
    _tokenize(doc)
    out = tmp_path / "report.html"
    result = CliRunner().invoke(cli, ["report", str(doc), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert re.fullmatch(rf"wrote {re.escape(str(out))} \(\d+\.\d KB\)\n", result.stderr)
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and 'data-chart="cache-hits"' in page
    quiet = CliRunner().invoke(cli, ["-q", "report", str(doc), "-o", str(out)])
    assert (quiet.exit_code, quiet.stdout, quiet.stderr) == (0, "", "")
    data = json.loads(CliRunner().invoke(cli, ["report", str(doc), "--json"]).stdout)
    assert list(data) == [
        "dlm_id", "store_path", "document_path", "generated_at", "run_count", "cache_entries", "cache_bytes",
        "training", "cache_passes", "sources", "adapters", "lock_history", "exports", "probes",
    ]  # fmt: skip
    assert data["cache_passes"][0]["run_id"] == 1
    stdout = CliRunner().invoke(cli, ["report", str(doc), "-o", "-"]).stdout
    assert stdout.startswith("<!DOCTYPE html>") and stdout.rstrip().endswith("</html>")


def test_a_report_that_cannot_be_written_is_one_error_naming_the_path(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    open_store(VALID_ID).close()
    out = tmp_path / "missing" / "report.html"
    result = CliRunner().invoke(cli, ["report", str(doc), "-o", str(out)])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"error: cannot write the report to {out}: No such file or directory",
        "hint: pass -o with a path in a folder that exists and that you can write to",
    ]


def test_dlm_report_imports_neither_torch_nor_transformers(tmp_path: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm")
    open_store(VALID_ID).close()
    code = (
        "import sys; from dlmstore.cli.main import cli\n"
        f"try:\n    cli(['report', {str(doc)!r}, '-o', {str(tmp_path / 'r.html')!r}])\nexcept SystemExit:\n    pass\n"
        "print([m for m in ('torch', 'transformers') if m in sys.modules], file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip().splitlines()[-1] == "[]"


def test_nice_ticks_are_round_and_cover_the_range() -> None:
    assert nice_ticks(0.0, 10.0) == [0.0, 5.0, 10.0]
    assert nice_ticks(0.31, 0.74) == [0.2, 0.4, 0.6, 0.8]
    assert nice_ticks(3.0, 3.0) == [2.6, 2.8, 3.0, 3.2, 3.4]
    with pytest.raises(ValueError, match="finite range"):
        nice_ticks(0.0, float("nan"))


def test_tick_labels_take_as_many_digits_as_keep_them_apart() -> None:
    assert tick_labels([10.7987, 10.7988, 10.7989]) == ["10.7987", "10.7988", "10.7989"]
    assert tick_labels([0.0, 5e-05, 0.0001]) == ["0", "5e-05", "0.0001"]
    assert tick_labels([0.0, 20000.0]) == ["0", "20k"]
    assert tick_labels([1.0, 2.0], lambda value: f"{value:.0f} B") == ["1 B", "2 B"]


def test_a_missing_value_breaks_a_line_and_an_empty_chart_is_refused() -> None:
    svg = line_chart("t", [Series("s", [(1, 1.0), (2, None), (3, 2.0), (4, 3.0)])], x_label="x", y_label="y")
    (line,) = re.findall(r'class="mark line"[^>]* d="([^"]+)"', svg)
    assert re.fullmatch(r"M[\d. ]+M[\d. ]+L[\d. ]+", line)
    with pytest.raises(ValueError, match="nothing to draw"):
        line_chart("t", [Series("s", [(1, None)])], x_label="x", y_label="y")
    with pytest.raises(ValueError, match="misses has 1 values for 2 columns"):
        column_chart("t", ["1", "2"], [("misses", [1.0])], x_label="x", y_label="y")


#: Evaluated in the page by the test: for each chart, how many marks the browser laid out with a size.
_DRAWN = """
[...document.querySelectorAll('figure.chart')].map(figure => {
  const marks = [...figure.querySelectorAll('svg path.mark')];
  const drawn = marks.filter(p => { const b = p.getBBox(); return b.width > 0 || b.height > 0; });
  return [figure.dataset.chart, marks.length, drawn.length];
})
"""


@pytest.mark.slow
def test_the_report_of_a_trained_store_draws_every_chart_in_chromium(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    binary = find_chromium()
    if binary is None:
        pytest.fail(INSTALL_HINT)
    body = (
        "Prose about dlmstore, the local-first store.\n\n::instruction::\n### Q\nWhere is the metadata?\n"
        "### A\nIn store.db.\n\n::preference::\n### Prompt\nwhere\n### Chosen\nstore.db\n### Rejected\nnowhere\n"
    )
    extra = "  max_steps: 2\n  micro_batch_size: 2\n  seed: 7\n"
    doc = _source_doc(tmp_path, tiny_base, body=body, extra=extra)
    runner = CliRunner()
    for _ in range(2):  # two runs: the second one's lock differs by the document's hash (ALLOW)
        result = runner.invoke(cli, ["train", str(doc)])
        assert result.exit_code == 0, result.output
        doc.write_text(doc.read_text(encoding="utf-8") + "\nOne more line.\n", encoding="utf-8")
    ARTIFACTS.mkdir(exist_ok=True)
    page = ARTIFACTS / "report.html"
    result = runner.invoke(cli, ["report", str(doc), "-o", str(page)])
    assert result.exit_code == 0, result.output

    run = open_page(binary, page_url(page), _DRAWN)
    (ARTIFACTS / "report.png").write_bytes(run.screenshot)
    print(f"report page and screenshot: {page}, {ARTIFACTS / 'report.png'}")

    charts = {key: (marks, drawn) for key, marks, drawn in run.value}
    assert sorted(charts) == sorted(
        [
            f"{kind}-run{r}-{phase}"
            for kind in ("loss", "lr")
            for r in (1, 2)
            for phase in ("sft", "preference")
        ]
        + ["cache-hits", "tokenize-seconds", "cache-size", "source-tokens"]
    )
    assert {key: drawn > 0 for key, (_, drawn) in charts.items()} == dict.fromkeys(charts, True)
    assert run.console == []
    assert run.screenshot.startswith(b"\x89PNG\r\n\x1a\n") and len(run.screenshot) > 20_000
    text = page.read_text(encoding="utf-8")
    assert 'class="sev sev-ALLOW">ALLOW' in text and "dlm_sha256" in text
    adapters = store_dir(VALID_ID) / "adapter" / "versions"
    registered = sqlite3.connect(store_dir(VALID_ID) / "store.db").execute("SELECT sha256 FROM adapters")
    shas = [sha for (sha,) in registered]
    assert len(shas) == len(list(adapters.iterdir())) == 4  # two runs, sft and preference each
    assert all(f'<code class="sha">{sha}</code>' in text for sha in shas)


@pytest.mark.slow
def test_a_page_that_fetches_anything_is_caught_by_the_browser_check(tmp_path: Path) -> None:
    """The console check of the browser test is live: a blocked fetch shows up in it."""
    binary = find_chromium()
    if binary is None:
        pytest.fail(INSTALL_HINT)
    with open_store(VALID_ID) as store:
        page = render_page(build_report(store))
    leaky = tmp_path / "leaky.html"
    leaky.write_text(
        page.replace("</body>", '<img src="http://example.invalid/x.png"></body>'), encoding="utf-8"
    )
    run = open_page(binary, page_url(leaky), "document.images.length")
    assert run.value == 1
    assert [entry["level"] for entry in run.console] == ["error"]
    assert "Content Security Policy" in run.console[0]["text"]

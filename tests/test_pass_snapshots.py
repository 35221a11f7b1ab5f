"""Pass snapshots: a warm count answered by a stat per folder and file, and never a stale answer."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

import dlmstore.corpus.assemble
import dlmstore.corpus.show
from dlmstore.corpus.show import summarize
from dlmstore.corpus.tokenize import TokenizeSummary, tokenize_document
from dlmstore.home import store_dir
from dlmstore.sources.defaults import DEFAULT_MAX_BYTES_PER_FILE
from dlmstore.store.connection import DB_NAME

from .helpers import VALID_ID, write_doc

PAST = time.time() - 3600


def _age(root: Path) -> None:
    """Move every mtime below ``root`` an hour back, so no stamp is racily clean."""
    for path in sorted(root.rglob("*"), reverse=True):
        if not path.is_symlink():
            os.utime(path, (PAST, PAST))
    os.utime(root, (PAST, PAST))


def _tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0\1")
    (src / "a.py").write_text("alpha = 1\n")
    (src / "pkg" / "b.py").write_text("beta = 2\n")
    (src / "pkg" / "c.py").write_text("gamma = 3\n")
    (src / "notes.bin").write_bytes(b"x\0y")
    _age(src)
    return write_doc(
        tmp_path / "doc.dlm",
        frontmatter="training:\n  sources:\n    - path: src\n      include: ['**/*.py', '*.bin']\n",
    )


def _walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count full expansions (``load_corpus`` calls) from here on."""
    calls: list[int] = []
    real = dlmstore.corpus.assemble.load_corpus

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(
        dlmstore.corpus.assemble, "load_corpus", counted
    )  # tokenize and show import it when used
    return calls


def _same_answer(summary: TokenizeSummary) -> dict[str, Any]:
    """The summary without what differs from run to run."""
    out = asdict(summary)
    del out["run_id"]
    del out["tokenization"]["total_tokenize_seconds"]
    for varies in ("seconds", "signatures_computed"):  # the first run signs the rows, the next reuse them
        del out["dedup"][varies]
    return out


def _tokenize(doc: Path) -> TokenizeSummary:
    summary, _ = tokenize_document(str(doc), materialize=False)
    return summary


def _snapshots() -> int:
    with sqlite3.connect(store_dir(VALID_ID) / DB_NAME) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM pass_snapshots").fetchone()[0])


def test_a_warm_count_is_answered_from_the_snapshot_with_the_full_pass_s_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _tree(tmp_path)
    cold = _tokenize(doc)  # misses: tokenizes, and takes the snapshot
    assert cold.tokenization.cache_misses == 4 and _snapshots() == 1
    walks = _walks(monkeypatch)
    warm = _tokenize(doc)
    again = _tokenize(doc)
    assert walks == []  # neither warm run walked the tree
    expected = _same_answer(cold)
    expected["tokenization"].update(cache_hits=4, cache_misses=0, hit_rate=1.0)
    assert _same_answer(warm) == _same_answer(again) == expected
    assert warm.run_id != again.run_id
    with sqlite3.connect(store_dir(VALID_ID) / DB_NAME) as conn:
        events = conn.execute(
            "SELECT run_id, cache_hits, cache_misses FROM tokenization_events ORDER BY run_id"
        ).fetchall()
        used = conn.execute("SELECT run_id, entries FROM cache_uses").fetchall()
    assert events[-2:] == [(warm.run_id, 4, 0), (again.run_id, 4, 0)]
    assert used == [(again.run_id, 4)]  # the use log supersedes the earlier row, as a full pass does


def test_a_counting_pass_without_a_snapshot_takes_the_full_walk_and_then_takes_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _tree(tmp_path)
    _tokenize(doc)
    with sqlite3.connect(store_dir(VALID_ID) / DB_NAME) as conn:
        conn.execute("DELETE FROM pass_snapshots")
    walks = _walks(monkeypatch)
    first = _tokenize(doc)  # all hits, walked: takes a new snapshot
    second = _tokenize(doc)
    assert walks == [1] and _snapshots() == 1
    assert _same_answer(first) == _same_answer(second)


def _rewrite_same_size_same_mtime(src: Path) -> None:
    path = src / "pkg" / "b.py"
    path.write_text("BETA = 2\n")
    os.utime(path, (PAST, PAST))  # only ctime moves


def _add_file(src: Path) -> None:
    (src / "pkg" / "d.py").write_text("delta = 4\n")
    _age(src)


def _remove_file(src: Path) -> None:
    (src / "pkg" / "c.py").unlink()
    _age(src)


def _rename_file(src: Path) -> None:
    (src / "pkg" / "c.py").rename(src / "pkg" / "e.py")
    _age(src)


def _add_folder(src: Path) -> None:
    (src / "new").mkdir()
    (src / "new" / "f.py").write_text("phi = 6\n")
    _age(src)


def _dlm_folder_below_a_skipped_folder(src: Path) -> None:
    # __pycache__ is skipped unwalked only while nothing below it could change
    # the answer; a .dlm/ folder there re-includes its .py files.
    dot = src / "pkg" / "__pycache__" / ".dlm"
    dot.mkdir()
    (dot / "training.yaml").write_text("dlm_training_version: 1\nexclude_defaults: false\n")
    (src / "pkg" / "__pycache__" / "g.py").write_text("g = 7\n")
    _age(src)


def _binary_becomes_text(src: Path) -> None:
    path = src / "notes.bin"
    path.write_bytes(b"xyz")
    os.utime(path, (PAST, PAST))


@pytest.mark.parametrize(
    "change",
    [
        _rewrite_same_size_same_mtime,
        _add_file,
        _remove_file,
        _rename_file,
        _add_folder,
        _dlm_folder_below_a_skipped_folder,
        _binary_becomes_text,
    ],
)
def test_any_change_to_the_tree_is_seen_and_counted_as_a_full_pass_counts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: Callable[[Path], None]
) -> None:
    doc = _tree(tmp_path)
    _tokenize(doc)
    _tokenize(doc)
    change(tmp_path / "src")
    walks = _walks(monkeypatch)
    seen = _tokenize(doc)
    assert walks == [1]
    # Without a snapshot or a stat record, reading every file, the pass counts the same.
    with sqlite3.connect(store_dir(VALID_ID) / DB_NAME) as conn:
        conn.execute("DELETE FROM pass_snapshots")
        conn.execute("DELETE FROM source_stats")
    full = _tokenize(doc)
    assert walks == [1, 1]
    assert (seen.tokens, seen.tokenization.total_rows, seen.tokenization.total_sections) == (
        full.tokens, full.tokenization.total_rows, full.tokenization.total_sections,
    )  # fmt: skip


def test_an_edited_document_is_never_answered_from_the_old_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _tree(tmp_path)
    _tokenize(doc)
    doc.write_text(doc.read_text() + "More prose.\n")
    walks = _walks(monkeypatch)
    summary = _tokenize(doc)
    assert walks == [1] and summary.tokenization.cache_misses == 1


@pytest.mark.parametrize("how", ["clear", "truncate"])
def test_a_snapshot_whose_entries_went_away_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    doc = _tree(tmp_path)
    _tokenize(doc)
    db = store_dir(VALID_ID) / DB_NAME
    with sqlite3.connect(db) as conn:
        if how == "clear":
            conn.execute("DELETE FROM cache_entries WHERE row_key = (SELECT MIN(row_key) FROM cache_entries)")
        else:
            (segment,) = conn.execute("SELECT path FROM token_segments").fetchone()
            with open(store_dir(VALID_ID) / segment, "r+b") as handle:
                handle.truncate(4)
    walks = _walks(monkeypatch)
    summary = _tokenize(doc)
    assert walks == [1]
    assert summary.tokenization.cache_misses >= 1


def test_a_tree_just_written_is_racily_clean_and_gets_no_snapshot(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("alpha = 1\n")  # mtime: now
    doc = write_doc(tmp_path / "doc.dlm", frontmatter="training:\n  sources:\n    - path: src\n")
    _tokenize(doc)
    _tokenize(doc)
    assert _snapshots() == 0
    _age(src)
    _tokenize(doc)  # the record is refreshed once the mtime is in the past, and the snapshot taken
    assert _snapshots() == 1


@pytest.mark.parametrize("what", ["symlink", "dlm folder", "warning"])
def test_what_a_folder_stamp_cannot_vouch_for_gets_no_snapshot(tmp_path: Path, what: str) -> None:
    doc = _tree(tmp_path)
    src = tmp_path / "src"
    if what == "symlink":
        (tmp_path / "elsewhere.py").write_text("x = 1\n")
        (src / "link.py").symlink_to(tmp_path / "elsewhere.py")
    elif what == "dlm folder":
        (src / ".dlm").mkdir()
        (src / ".dlm" / "ignore").write_text("pkg/c.py\n")
    else:  # a file over the default size cap is skipped with a warning, which every run must print
        (src / "big.py").write_bytes(b"#" * (DEFAULT_MAX_BYTES_PER_FILE + 1))
    _age(src)
    _tokenize(doc)
    _tokenize(doc)
    assert _snapshots() == 0


def test_show_answers_from_the_snapshot_exactly_as_from_the_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _tree(tmp_path)
    walked = summarize(doc)  # no store yet: the full expansion
    _tokenize(doc)
    walks = _walks(monkeypatch)
    answered = summarize(doc)
    assert walks == []
    # Where the clusters came from and what finding them cost differ: the walk signed the rows,
    # the answer reads what the tokenize run recorded.
    found = {"from_run": 1, "signatures_computed": 0, "seconds": answered.dedup.seconds}
    assert json.dumps(asdict(answered), sort_keys=True) == json.dumps(
        asdict(walked)
        | {"training_cache": asdict(answered.training_cache), "store": asdict(answered.store)}
        | {"dedup": asdict(walked.dedup) | found}
        | {"contamination": asdict(walked.contamination) | {"seconds": answered.contamination.seconds}},
        sort_keys=True,
    )
    _add_file(tmp_path / "src")
    changed = summarize(doc)
    assert walks == [1] and changed.source_sections == walked.source_sections + 1


def test_a_copy_of_the_tree_elsewhere_is_not_answered_from_the_original_s_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _tree(tmp_path)
    _tokenize(doc)
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "src", copy / "src")
    shutil.copy(doc, copy / "doc.dlm")
    _age(copy)
    walks = _walks(monkeypatch)
    _tokenize(copy / "doc.dlm")
    assert walks == [1]


#: What a warm pass answered from its snapshot must not import (each costs tens of milliseconds).
HEAVY = ("pydantic", "yaml", "numpy", "sqlalchemy", "alembic", "transformers", "torch", "importlib.metadata")

_IMPORTED = """
import sys
from dlmstore.cli.main import cli
cli([sys.argv[2], sys.argv[1]], standalone_mode=False)
heavy = {heavy!r}
print(" ".join(name for name in heavy if name in sys.modules) or "none")
print(" ".join(sorted(m for m in sys.modules if m.startswith("dlmstore.sources.walk"))) or "none")
"""


@pytest.mark.parametrize(("command", "answered"), [("tokenize", "4 hits"), ("show", "from sources")])
def test_a_warm_pass_or_show_from_the_snapshot_imports_no_pydantic_yaml_numpy_sqlalchemy_or_transformers(
    tmp_path: Path, command: str, answered: str
) -> None:
    import subprocess
    import sys

    doc = _tree(tmp_path)
    _tokenize(doc)
    child = subprocess.run(
        [sys.executable, "-c", _IMPORTED.format(heavy=HEAVY), str(doc), command],
        capture_output=True, text=True, check=True, env={**os.environ, "DLM_DEBUG": "1"},
    )  # fmt: skip
    assert answered in child.stdout
    assert child.stdout.splitlines()[-2:] == ["none", "none"], child.stdout


def test_a_file_edited_after_the_snapshot_is_tokenized_again_by_the_pass_from_the_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _tree(tmp_path)
    _tokenize(doc)
    path = tmp_path / "src" / "a.py"
    path.write_text("alpha = 11\n")  # a new size, mtime and ctime; the folder's stamp does not move
    walks = _walks(monkeypatch)
    summary = _tokenize(doc)
    assert walks == [1]
    assert (summary.tokenization.cache_hits, summary.tokenization.cache_misses) == (3, 1)


@pytest.mark.parametrize(
    "id_line",
    [
        pytest.param(f'"dlm_id": {VALID_ID}', id="quoted key"),
        pytest.param(f"dlm_id: >-\n  {VALID_ID}", id="folded scalar"),
    ],
)
def test_a_document_whose_id_line_is_not_plain_is_parsed_and_still_answered_from_its_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, id_line: str
) -> None:
    doc = _tree(tmp_path)
    doc.write_text(doc.read_text().replace(f"dlm_id: {VALID_ID}", id_line))
    cold = _tokenize(doc)
    walks = _walks(monkeypatch)
    warm = _tokenize(doc)
    assert walks == []  # the parsed document's snapshot holds
    expected = _same_answer(cold)
    expected["tokenization"].update(cache_hits=4, cache_misses=0, hit_rate=1.0)
    assert _same_answer(warm) == expected


def test_a_snapshot_kept_before_snapshots_held_the_frontmatter_is_taken_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _tree(tmp_path)
    _tokenize(doc)
    with sqlite3.connect(store_dir(VALID_ID) / DB_NAME) as conn:  # as dlmstore wrote it before
        (where,) = conn.execute("SELECT context FROM pass_snapshots").fetchone()
        context = json.loads(where)
        del context["frontmatter"]
        conn.execute("UPDATE pass_snapshots SET context = ?", (json.dumps(context, sort_keys=True),))
    walks = _walks(monkeypatch)
    _tokenize(doc)  # walks, and takes the snapshot again
    _tokenize(doc)
    assert walks == [1]


def test_a_snapshot_is_not_used_once_the_tokenizer_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dlmstore.fingerprint

    doc = _tree(tmp_path)
    _tokenize(doc)
    monkeypatch.setattr(dlmstore.fingerprint, "SCHEME", "tok-test")  # every fingerprint moves
    walks = _walks(monkeypatch)
    summary = _tokenize(doc)
    assert walks == [1] and summary.tokenization.cache_misses == 4


@pytest.mark.parametrize(
    ("text", "found"),
    [
        pytest.param(f"---\ndlm_id: {VALID_ID}\n---\nx", VALID_ID, id="plain"),
        pytest.param(f"\ufeff---\r\ndlm_id: '{VALID_ID}'  # id\r\n---\r\n", VALID_ID, id="BOM, CRLF, quoted"),
        pytest.param(f"---\ndlm_id: {VALID_ID}\ndlm_id: {VALID_ID}\n---\n", None, id="twice"),
        pytest.param(f"---\ntraining:\n  dlm_id: {VALID_ID}\n---\n", None, id="indented"),
        pytest.param(f"---\nx: 1\n---\ndlm_id: {VALID_ID}\n", None, id="in the body"),
        pytest.param(f"---\ndlm_id: {VALID_ID}\n", None, id="not closed"),
        pytest.param(f'---\ndlm_id: {VALID_ID}"\n---\n', None, id="unbalanced quote"),
    ],
)
def test_the_declared_id_is_read_only_from_a_plain_frontmatter_line(text: str, found: str | None) -> None:
    from dlmstore.document.parser import declared_id

    assert declared_id(text.encode()) == found


def test_show_from_the_document_s_bytes_keeps_its_warnings_unused_keys_and_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _tree(tmp_path)
    frontmatter = doc.read_text().split("---\n")[1]
    doc.write_text(
        f"---\n{frontmatter}system_prompt: Be brief.\n".replace(
            "training:\n", "training:\n  seed: 7\n  cpt:\n    schedule: dapt\n"
        )
        + "---\nProse.\n\n::preference::\n### Prompt\nWhich?\n### Chosen\nSame.\n### Rejected\nSame.\n"
    )
    walked = summarize(doc)  # no store yet: parsed and walked
    _tokenize(doc)
    walks = _walks(monkeypatch)
    answered = summarize(doc)
    assert walks == []
    assert answered.warnings == walked.warnings and len(walked.warnings) == 2  # the unused key, the triple
    assert answered.not_used == walked.not_used == ["training.cpt.schedule"]
    same = ("sections", "rows", "source_sections", "system_prompt", "seed", "dlm_version", "sequence_len")
    assert {key: getattr(answered, key) for key in same} == {key: getattr(walked, key) for key in same}
    assert (answered.system_prompt, answered.seed) == ("Be brief.", 7)

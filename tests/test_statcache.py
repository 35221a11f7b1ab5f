"""The source stat cache: unchanged files are not read again, racy ones are."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from dlmstore.corpus.assemble import load_corpus
from dlmstore.corpus.tokenize import tokenize_document
from dlmstore.document.parser import parse_document
from dlmstore.document.sections import section_digest
from dlmstore.errors import SourceError
from dlmstore.sources.read import _load_checked
from dlmstore.sources.statcache import RACY_NS, FileStamp, StatCache, proves_unchanged
from dlmstore.store.database import open_store

from .helpers import VALID_ID, write_doc

PAST = time.time() - 3600


def _corpus(tmp_path: Path) -> Path:
    notes = tmp_path / "notes"
    notes.mkdir()
    for name, text in (("a.md", "alpha\n"), ("b.md", "beta\r\nwith CRLF\r\n"), ("c.bin", "x\0y")):
        (notes / name).write_text(text, newline="")
        os.utime(notes / name, (PAST, PAST))
    return write_doc(tmp_path / "doc.dlm", frontmatter="training:\n  sources:\n    - path: notes\n")


def _loaded(doc: Path) -> tuple[list[bool], list[str]]:
    with open_store(VALID_ID) as store:
        corpus = load_corpus(parse_document(doc), stat_cache=StatCache.load(store))
    sources = corpus.source_sections
    return [s._content is not None for s in sources], [s.section_id for s in sources]


def test_files_proven_unchanged_are_not_read_on_the_next_run(tmp_path: Path) -> None:
    doc = _corpus(tmp_path)
    first, _ = tokenize_document(str(doc))
    read, ids = _loaded(doc)
    assert read == [False, False]  # both text files come from their records
    plain = load_corpus(parse_document(doc))
    assert ids == [s.section_id for s in plain.source_sections]
    assert [s.content for s in plain.source_sections] == [
        s.content for s in load_corpus(parse_document(doc), stat_cache=StatCache()).source_sections
    ]
    second, _ = tokenize_document(str(doc))
    assert second.tokenization.cache_hits == second.tokenization.total_rows
    assert load_corpus(parse_document(doc)).expansion.provenance[0].skipped_binary == 1


def test_a_recorded_binary_file_is_still_counted_as_skipped(tmp_path: Path) -> None:
    doc = _corpus(tmp_path)
    tokenize_document(str(doc))
    with open_store(VALID_ID) as store:
        corpus = load_corpus(parse_document(doc), stat_cache=StatCache.load(store))
    assert corpus.expansion.provenance[0].skipped_binary == 1


def test_an_edit_that_restores_the_old_mtime_is_still_seen(tmp_path: Path) -> None:
    doc = _corpus(tmp_path)
    tokenize_document(str(doc))
    note = tmp_path / "notes" / "a.md"
    note.write_text("ALPHA\n")  # same size
    os.utime(note, (PAST, PAST))  # same mtime; ctime moves, and that is enough
    read, _ = _loaded(doc)
    assert read == [True, False]
    summary, _ = tokenize_document(str(doc))
    assert summary.tokenization.cache_misses == 1


def test_a_file_read_in_the_same_moment_it_was_written_is_racily_clean_and_read_again() -> None:
    st = os.stat(__file__)
    racy = FileStamp("/f", "f", st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, "ok", "d",
                     st.st_mtime_ns + RACY_NS - 1)  # fmt: skip
    assert not proves_unchanged(racy, st)
    safe = racy._replace(checked_ns=st.st_mtime_ns + RACY_NS)
    assert proves_unchanged(safe, st)


def test_a_freshly_written_file_is_read_again_until_its_mtime_is_safely_old(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "new.md").write_text("just written\n")
    doc = write_doc(tmp_path / "doc.dlm", frontmatter="training:\n  sources:\n    - path: notes\n")
    tokenize_document(str(doc))
    read, _ = _loaded(doc)
    assert read == [True]


def test_a_file_changed_after_its_stat_check_is_refused_not_mis_tokenized(tmp_path: Path) -> None:
    path = tmp_path / "a.md"
    path.write_text("new text\n")
    stale = section_digest("prose", "# source: a.md\n\nold text\n")
    with pytest.raises(SourceError) as err:
        _load_checked("training.sources 'notes'", str(path), "a.md", stale)
    assert str(err.value) == "training.sources 'notes': a.md changed while dlm was running"
    fresh = section_digest("prose", "# source: a.md\n\nnew text\n")
    assert _load_checked("x", str(path), "a.md", fresh) == "# source: a.md\n\nnew text\n"


def test_records_of_files_that_are_gone_are_dropped(tmp_path: Path) -> None:
    doc = _corpus(tmp_path)
    tokenize_document(str(doc))
    (tmp_path / "notes" / "a.md").unlink()
    tokenize_document(str(doc))
    with open_store(VALID_ID) as store:
        assert sorted(rel for _, rel in StatCache.load(store).stamps) == ["b.md", "c.bin"]


def test_a_warm_pass_with_every_row_cached_reads_no_source_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dlmstore.sources.read as sources

    doc = _corpus(tmp_path)
    tokenize_document(str(doc))

    def refuse(*args: object) -> str:
        raise AssertionError(f"read {args[2]}")

    monkeypatch.setattr(sources, "_load_checked", refuse)
    summary, _ = tokenize_document(str(doc), materialize=False)
    assert summary.tokenization.cache_hits == summary.tokenization.total_rows


def _opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The source files ``dlmstore.sources.read`` opens from now on, by name."""
    import dlmstore.sources.read as sources

    opened: list[str] = []
    real = sources.open_regular

    def spy(path: str, **kwargs: bool) -> tuple[int, os.stat_result]:
        opened.append(os.path.basename(path))
        return real(path, **kwargs)

    monkeypatch.setattr(sources, "open_regular", spy)
    return opened


def test_show_reads_only_the_files_the_last_tokenize_did_not_prove_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlmstore.corpus.show import summarize

    doc = _corpus(tmp_path)
    before = summarize(doc)  # no store yet: every file is read
    tokenize_document(str(doc))
    note = tmp_path / "notes" / "a.md"
    note.write_text("ALPHA\n")  # same size, mtime restored: only ctime tells
    os.utime(note, (PAST, PAST))
    opened = _opened(monkeypatch)
    after = summarize(doc)
    assert opened == ["a.md"]
    assert (after.rows, after.sources) == (before.rows, before.sources)


def test_show_reads_a_racily_clean_file_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dlmstore.corpus.show import summarize

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "new.md").write_text("just written\n")  # recorded within RACY_NS of its mtime
    doc = write_doc(tmp_path / "doc.dlm", frontmatter="training:\n  sources:\n    - path: notes\n")
    tokenize_document(str(doc))
    opened = _opened(monkeypatch)
    assert summarize(doc).sources[0].files_included == 1
    assert opened == ["new.md"]


def test_records_keep_their_rows_keys_and_a_row_whose_entry_is_gone_misses_again(tmp_path: Path) -> None:
    from dlmstore.document.rows import text_row_key

    doc = _corpus(tmp_path)
    tokenize_document(str(doc))
    with open_store(VALID_ID) as store:
        stamps = [stamp for stamp in StatCache.load(store).stamps.values() if stamp[6] == "ok"]
        keys = [stamp[9] for stamp in stamps]
        assert len(keys) == 2 and keys == [text_row_key(stamp[7]) for stamp in stamps]
        with store.write() as conn:  # one file's entry goes: its row is a miss again, the other a hit
            conn.execute("DELETE FROM cache_entries WHERE row_key = ?", (keys[0],))
    second, _ = tokenize_document(str(doc))
    assert (second.tokenization.cache_misses, second.tokenization.cache_hits) == (1, 2)


def test_a_record_from_before_row_keys_were_kept_gets_its_key_on_the_next_run(tmp_path: Path) -> None:
    doc = _corpus(tmp_path)
    tokenize_document(str(doc))
    with open_store(VALID_ID) as store, store.write() as conn:
        conn.execute("UPDATE source_stats SET row_key = NULL")
    second, _ = tokenize_document(str(doc))
    assert second.tokenization.cache_misses == 0
    with open_store(VALID_ID) as store:
        assert all(stamp[9] for stamp in StatCache.load(store).stamps.values() if stamp[6] == "ok")

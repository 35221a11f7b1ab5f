"""Tokens shared across the stores of a home: a second document over one tree tokenizes nothing.

Each test writes a small tree and two documents over it with different
ids (two stores of one home). The first tokenizes; the second takes its
entries (``dlmstore.cache.share``): its segment hard-linked, or its ranges
copied, and registered in its own manifest. Every fault the module names
is provoked: another filesystem, a damaged entry, a damaged or other-revision
store.db, a segment that goes between the lookup and the link, a symlinked
segment, two passes taking the same keys, and each store cleared or deleted
under the other. Then what the other commands do to a store another one
shares tokens with (prune, clear and ``stores gc`` of either), a store on
a real second filesystem and a home whose filesystem makes no hard links
(in a child process), ``--no-share``, and four processes at once.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlmstore.cache import share
from dlmstore.cli.main import cli
from dlmstore.corpus.tokenize import TokenizeSummary, tokenize_document
from dlmstore.home import store_dir

from .helpers import as_written_before_0018

FIRST = "01KPQ1FFEDGPPSMWRAS18SAZST"
SECOND = "01KPQ1FFEDGPPSMWRAS18SAZSV"
FILES = 12


def _tree(root: Path) -> Path:
    tree = root / "tree"
    tree.mkdir(parents=True, exist_ok=True)
    for number in range(FILES):
        (tree / f"mod{number:02d}.py").write_text(
            f"def function_{number}(value):\n    return value * {number} + {number * 7}\n", encoding="utf-8"
        )
    return tree


def _doc(path: Path, dlm_id: str, extra: str = "", include: str = "") -> Path:
    globs = f"      include: [{include!r}]\n" if include else ""
    path.write_text(
        f"---\ndlm_id: {dlm_id}\ntraining:\n  sources:\n    - path: tree\n{globs}{extra}---\nNotes.\n",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def docs(tmp_path: Path) -> tuple[Path, Path]:
    _tree(tmp_path)
    return _doc(tmp_path / "one.dlm", FIRST), _doc(tmp_path / "two.dlm", SECOND)


def _tokenize(doc: Path, **options: Any) -> TokenizeSummary:
    summary, _ = tokenize_document(str(doc), materialize=False, **options)
    return summary


def _rows(dlm_id: str, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(store_dir(dlm_id) / "store.db")
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _segments(dlm_id: str) -> list[Path]:
    return sorted((store_dir(dlm_id) / "tokens").glob("segment-*.bin"))


def _no_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any load of a tokenizer fails the test: the pass must tokenize nothing."""

    def refuse(*_: object) -> None:
        raise AssertionError("the tokenizer was loaded")

    monkeypatch.setattr("dlmstore.corpus.tokenize._loaded_and_kept", refuse)
    monkeypatch.setattr("dlmstore.cache.rust_tokenizer.load_snapshot", refuse)


def _verify(doc: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["cache", "verify", str(doc)])
    return result.exit_code, result.stdout


def test_a_second_document_over_the_same_tree_tokenizes_nothing_and_links_the_first_store_s_segment(
    docs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = docs
    first = _tokenize(one)
    assert first.tokenization.cache_misses == FILES + 1
    _no_tokenizer(monkeypatch)
    second = _tokenize(two)
    event = second.tokenization
    assert (event.cache_hits, event.cache_misses, event.cache_shared) == (FILES + 1, 0, FILES + 1)
    assert second.tokens == first.tokens
    ((theirs,), (mine,)) = _segments(FIRST), _segments(SECOND)
    assert theirs.name != mine.name and os.path.samefile(theirs, mine)  # one inode: no new disk
    assert _rows(SECOND, "SELECT from_store, how, COUNT(*) FROM entry_origins GROUP BY 1, 2") == [
        (FIRST, "link", FILES + 1)
    ]
    assert _verify(two) == (0, "checked 13 entries in 1 token file: 0 problems, 0 remaining\n")
    again = _tokenize(two)  # its own entries now
    assert (again.tokenization.cache_hits, again.tokenization.cache_shared) == (FILES + 1, 0)


def test_a_segment_the_first_store_wrote_before_the_rename_as_a_pack_is_linked_like_any_other(
    docs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = docs
    _tokenize(one)
    (legacy,) = as_written_before_0018(store_dir(FIRST))
    _no_tokenizer(monkeypatch)
    event = _tokenize(two).tokenization
    assert (event.cache_hits, event.cache_misses, event.cache_shared) == (FILES + 1, 0, FILES + 1)
    (mine,) = _segments(SECOND)  # its own link takes today's name
    assert os.path.samefile(store_dir(FIRST) / legacy, mine)
    checked = (0, "checked 13 entries in 1 token file: 0 problems, 0 remaining\n")
    assert _verify(one) == _verify(two) == checked


def test_a_second_document_reads_no_file_the_first_store_s_stat_records_prove_unchanged(
    docs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from dlmstore.sources import read

    one, two = docs
    time.sleep(2.1)  # the tree's mtimes past the racy-clean window: the records taken are trusted
    _tokenize(one)
    opened: list[str] = []
    real = read.open_regular

    def counting(path: Any, **kwargs: Any) -> Any:
        opened.append(str(path))
        return real(path, **kwargs)

    monkeypatch.setattr(read, "open_regular", counting)
    assert _tokenize(two).tokenization.cache_shared == FILES + 1
    assert opened == []  # every file proven unchanged by the borrowed records: none read
    assert _rows(SECOND, "SELECT COUNT(*) FROM source_stats") == [(FILES,)]  # adopted as its own
    (tmp := one.parent / "tree" / "mod00.py").write_text("changed = True\n", encoding="utf-8")
    assert _tokenize(two).tokenization.cache_misses == 1 and tmp.exists()


def test_the_shared_tokens_are_the_tokens_the_tokenizer_makes(docs: tuple[Path, Path]) -> None:
    one, two = docs
    _, made = tokenize_document(str(one))
    _, taken = tokenize_document(str(two))
    assert made is not None and taken is not None
    assert taken.row_keys == made.row_keys
    assert taken.values.tolist() == made.values.tolist() and taken.offsets.tolist() == made.offsets.tolist()


def test_dlm_cache_show_counts_the_entries_taken_from_other_stores(docs: tuple[Path, Path]) -> None:
    one, two = docs
    _tokenize(one)
    _tokenize(two)
    result = CliRunner().invoke(cli, ["cache", "show", str(two)])
    assert result.exit_code == 0
    assert "shared: 13 entries (" in result.stdout and "taken from other stores of the home" in result.stdout
    assert "shared:" not in CliRunner().invoke(cli, ["cache", "show", str(one)]).stdout


def test_no_share_and_training_cache_share_false_tokenize_here(
    docs: tuple[Path, Path], tmp_path: Path
) -> None:
    one, two = docs
    _tokenize(one)
    result = CliRunner().invoke(cli, ["tokenize", str(two), "--no-share"])
    assert result.exit_code == 0 and "0 hits, 13 misses" in result.stdout
    assert not _rows(SECOND, "SELECT * FROM entry_origins")
    third = _doc(tmp_path / "three.dlm", "01KPQ1FFEDGPPSMWRAS18SAZSW", extra="  cache:\n    share: false\n")
    assert _tokenize(third).tokenization.cache_misses == FILES + 1


def test_a_segment_on_another_filesystem_is_copied(
    docs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = docs
    _tokenize(one)

    link = os.link

    def cross_device(source: Any, target: Any, **options: Any) -> None:
        if Path(target).parent.name == "tokens":  # a segment linked from another store: "another filesystem"
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        link(source, target, **options)

    monkeypatch.setattr(os, "link", cross_device)
    event = _tokenize(two).tokenization
    assert (event.cache_misses, event.cache_shared) == (0, FILES + 1)
    ((theirs,), (mine,)) = _segments(FIRST), _segments(SECOND)
    assert not os.path.samefile(theirs, mine)
    assert _rows(SECOND, "SELECT DISTINCT how FROM entry_origins") == [("copy",)]
    assert _verify(two)[0] == 0


def test_a_few_rows_of_a_large_segment_are_copied_not_linked(tmp_path: Path) -> None:
    _tree(tmp_path)
    _tokenize(_doc(tmp_path / "one.dlm", FIRST))
    one_file = _doc(tmp_path / "two.dlm", SECOND, include="mod03.py")
    event = _tokenize(one_file).tokenization
    assert (event.cache_hits, event.cache_misses, event.cache_shared) == (2, 0, 2)  # the file and the body
    (mine,) = _segments(SECOND)
    (theirs,) = _segments(FIRST)
    assert not os.path.samefile(theirs, mine) and mine.stat().st_size < theirs.stat().st_size
    assert _rows(SECOND, "SELECT how, COUNT(*) FROM entry_origins GROUP BY 1") == [("copy", 2)]


def test_a_damaged_entry_in_the_other_store_is_not_taken(docs: tuple[Path, Path]) -> None:
    one, two = docs
    _tokenize(one)
    ((offset, nbytes),) = _rows(
        FIRST, "SELECT byte_offset, bytes FROM cache_entries ORDER BY byte_offset LIMIT 1"
    )
    (segment,) = _segments(FIRST)
    with open(segment, "r+b") as f:  # a flipped byte inside the first entry (bit rot)
        f.seek(offset + nbytes // 2)
        byte = f.read(1)
        f.seek(offset + nbytes // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    event = _tokenize(two).tokenization
    assert (event.cache_misses, event.cache_shared) == (1, FILES)  # that row went through the tokenizer
    assert _verify(two)[0] == 0  # the damaged range is dead space of the linked segment, registered nowhere
    _, rows = tokenize_document(str(two))
    _, fresh = tokenize_document(str(two), no_cache=True)
    assert rows is not None and fresh is not None and rows.values.tolist() == fresh.values.tolist()


def test_another_store_at_another_schema_revision_is_skipped(docs: tuple[Path, Path]) -> None:
    one, two = docs
    _tokenize(one)
    conn = sqlite3.connect(store_dir(FIRST) / "store.db")
    with conn:
        conn.execute("UPDATE alembic_version SET version_num = '0012'")
    conn.close()
    event = _tokenize(two).tokenization
    assert (event.cache_misses, event.cache_shared) == (FILES + 1, 0)


def test_a_damaged_store_db_of_another_store_is_skipped(docs: tuple[Path, Path]) -> None:
    one, two = docs
    _tokenize(one)
    (store_dir(FIRST) / "store.db").write_bytes(b"this is not a database" * 100)
    result = CliRunner().invoke(cli, ["tokenize", str(two)])
    assert result.exit_code == 0 and "0 hits, 13 misses" in result.stdout


def test_a_store_cleared_between_the_lookup_and_the_link_leaves_its_rows_to_the_tokenizer(
    docs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = docs
    _tokenize(one)
    looked_up = share._entries_of

    def then_cleared(*args: Any) -> Any:
        found = looked_up(*args)
        assert CliRunner().invoke(cli, ["cache", "clear", str(one), "--force"]).exit_code == 0
        return found

    monkeypatch.setattr(share, "_entries_of", then_cleared)
    event = _tokenize(two).tokenization
    assert (event.cache_misses, event.cache_shared) == (FILES + 1, 0)
    assert _verify(two)[0] == 0


def test_a_segment_that_is_a_symlink_in_the_other_store_is_not_followed(
    docs: tuple[Path, Path], tmp_path: Path
) -> None:
    one, two = docs
    _tokenize(one)
    (segment,) = _segments(FIRST)
    elsewhere = tmp_path / "elsewhere.bin"
    shutil.move(segment, elsewhere)
    segment.symlink_to(elsewhere)
    event = _tokenize(two).tokenization
    assert (event.cache_misses, event.cache_shared) == (FILES + 1, 0)


def test_a_key_another_pass_registered_first_is_taken_once_and_the_extra_segment_removed(
    docs: tuple[Path, Path],
) -> None:
    from dlmstore.bases import resolve_base
    from dlmstore.fingerprint import tokenizer_sha256
    from dlmstore.store.database import open_store

    one, two = docs
    _tokenize(one)
    _tokenize(two)
    keys = [key for (key,) in _rows(SECOND, "SELECT row_key FROM cache_entries")]
    (sequence_len,) = {length for (length,) in _rows(SECOND, "SELECT sequence_len FROM cache_entries")}
    with open_store(SECOND) as store:  # as a second pass that looked up before the first registered
        taken = share.take_shared(
            store, keys, tokenizer_sha256=tokenizer_sha256(resolve_base("smollm2-135m")),
            sequence_len=sequence_len, run_id=1,
        )  # fmt: skip
    assert len(taken.tokens) == len(keys) and taken.ids == []  # the tokens serve; nothing registered twice
    assert len(_segments(SECOND)) == 1  # the segment that registered nothing was removed again
    assert _verify(two)[0] == 0


def test_two_passes_taking_the_same_keys_at_once_both_succeed(docs: tuple[Path, Path]) -> None:
    one, two = docs
    _tokenize(one)
    dlm = str(Path(sys.executable).with_name("dlm"))
    runs = [
        subprocess.Popen([dlm, "tokenize", str(two)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    for run in runs:
        _, stderr = run.communicate(timeout=120)
        assert run.returncode == 0, stderr
    assert _rows(SECOND, "SELECT COUNT(*), COUNT(DISTINCT row_key) FROM cache_entries") == [(13, 13)]
    assert _verify(two)[0] == 0


def test_clearing_or_deleting_the_first_store_leaves_the_second_whole(docs: tuple[Path, Path]) -> None:
    one, two = docs
    _tokenize(one)
    _tokenize(two)
    assert CliRunner().invoke(cli, ["cache", "clear", str(one), "--force"]).exit_code == 0
    assert _verify(two)[0] == 0
    shutil.rmtree(store_dir(FIRST))
    summary, rows = tokenize_document(str(two))  # reads and checks every entry's bytes
    assert summary.tokenization.cache_misses == 0 and summary.damaged_entries == 0 and rows is not None
    assert _verify(two)[0] == 0


def test_clearing_the_second_store_leaves_the_first_whole(docs: tuple[Path, Path]) -> None:
    one, two = docs
    _tokenize(one)
    _tokenize(two)
    assert CliRunner().invoke(cli, ["cache", "clear", str(two), "--force"]).exit_code == 0
    assert _segments(SECOND) == [] and len(_segments(FIRST)) == 1
    assert _verify(one)[0] == 0
    assert _tokenize(one).tokenization.cache_misses == 0


def test_training_a_second_document_over_one_tree_tokenizes_nothing(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    from dlmstore.train.trainer import train_document

    _tree(tmp_path)
    extra = "  sequence_len: 64\n  max_steps: 1\n  micro_batch_size: 2\n"
    base = f"base_model: {tiny_base}\n"
    one = _doc(tmp_path / "one.dlm", FIRST, extra=extra)
    two = _doc(tmp_path / "two.dlm", SECOND, extra=extra)
    for doc in (one, two):
        doc.write_text(doc.read_text().replace("training:\n", base + "training:\n", 1), encoding="utf-8")
    first = train_document(str(one))
    second = train_document(str(two))
    assert first.tokenization.cache_misses == FILES + 1
    assert (second.tokenization.cache_misses, second.tokenization.cache_shared) == (0, FILES + 1)
    assert second.tokens == first.tokens and second.rows_trained == first.rows_trained


# --- one store's maintenance while another store holds links to its token files -----------------


def _materialized(doc: Path) -> tuple[TokenizeSummary, list[str], list[int], list[int]]:
    """A pass that reads and checks every entry's bytes: its summary, row keys, tokens and offsets."""
    summary, rows = tokenize_document(str(doc))
    assert rows is not None
    return summary, list(rows.row_keys), rows.values.tolist(), rows.offsets.tolist()


def _gone_and_collected(doc: Path) -> list[str]:
    """``dlm stores gc`` once ``doc`` is deleted: its store goes."""
    doc.unlink()
    return ["stores", "gc", "--force"]


#: Each command that removes token files of one store, as the CLI is given it for ``doc``.
_MAINTENANCE = {
    "cache prune": lambda doc: ["cache", "prune", str(doc), "--older-than", "0s"],
    "cache clear": lambda doc: ["cache", "clear", str(doc), "--force"],
    "stores gc": _gone_and_collected,
}


@pytest.mark.parametrize("acting", ["first", "second"])
@pytest.mark.parametrize("command", sorted(_MAINTENANCE))
def test_prune_clear_or_gc_of_one_store_leaves_the_other_store_that_shares_its_tokens_whole(
    docs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, command: str, acting: str
) -> None:
    one, two = docs
    _tokenize(one)
    assert _tokenize(two).tokenization.cache_shared == FILES + 1  # the first store's segment, linked
    (doc, dlm_id), (other, other_id) = ((one, FIRST), (two, SECOND))[:: 1 if acting == "first" else -1]
    _, keys, tokens, offsets = _materialized(other)
    result = CliRunner().invoke(cli, _MAINTENANCE[command](doc))
    assert result.exit_code == 0, result.output
    assert _segments(dlm_id) == []  # every token file of the acting store is gone (the store too, for gc)
    assert store_dir(dlm_id).exists() == (command != "stores gc")
    assert _verify(other) == (0, "checked 13 entries in 1 token file: 0 problems, 0 remaining\n")
    _no_tokenizer(monkeypatch)
    summary, *again = _materialized(other)
    event = summary.tokenization
    assert (event.cache_hits, event.cache_misses, event.cache_shared) == (FILES + 1, 0, 0)
    assert summary.damaged_entries == 0
    assert again == [keys, tokens, offsets]
    assert len(_segments(other_id)) == 1


def test_a_prune_that_rewrites_a_shared_segment_leaves_the_other_store_s_link_whole(
    docs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = docs
    _tokenize(one)
    _tokenize(two)
    (linked,) = _segments(SECOND)
    _, keys, tokens, offsets = _materialized(two)
    # The first store's entries were last used long ago; then a pass over one of the files uses
    # two of them (the file and the body) again.
    conn = sqlite3.connect(store_dir(FIRST) / "store.db")
    with conn:
        conn.execute("UPDATE cache_entries SET last_access_at = '2000-01-01T00:00:00.000Z'")
        conn.execute("UPDATE cache_uses SET used_at = '2000-01-01T00:00:00.000Z'")
    conn.close()
    _doc(one, FIRST, include="mod03.py")
    assert _tokenize(one).tokenization.cache_hits == 2
    (theirs,) = _segments(FIRST)
    result = CliRunner().invoke(cli, ["cache", "prune", str(one), "--older-than", "1d", "--json"])
    assert result.exit_code == 0, result.output
    pruned = json.loads(result.output)
    assert (pruned["entries_removed"], pruned["segments_compacted"]) == (11, 1)  # 2 of 13 live: rewritten
    (rewritten,) = _segments(FIRST)
    assert rewritten != theirs and not theirs.exists() and _segments(SECOND) == [linked]
    assert _verify(one)[0] == 0
    assert _verify(two) == (0, "checked 13 entries in 1 token file: 0 problems, 0 remaining\n")
    _no_tokenizer(monkeypatch)
    summary, *again = _materialized(two)
    assert (summary.tokenization.cache_misses, summary.damaged_entries) == (0, 0)
    assert again == [keys, tokens, offsets]


# --- --no-share ---------------------------------------------------------------------------------


def _files(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file under ``folder``: (inode, mtime in ns, bytes), by relative path."""
    return {
        str(path.relative_to(folder)): (path.stat().st_ino, path.stat().st_mtime_ns, path.read_bytes())
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_a_no_share_pass_takes_nothing_from_another_store_and_writes_nothing_there(
    docs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlmstore.sources import read

    one, two = docs
    _, keys, tokens, offsets = _materialized(one)
    before = _files(store_dir(FIRST))
    opened: list[str] = []
    real = read.open_regular

    def counting(path: Any, **kwargs: Any) -> Any:
        opened.append(os.path.basename(path))
        return real(path, **kwargs)

    monkeypatch.setattr(read, "open_regular", counting)
    summary, rows = tokenize_document(str(two), no_share=True)
    assert rows is not None
    event = summary.tokenization
    assert (event.cache_hits, event.cache_misses, event.cache_shared) == (0, FILES + 1, 0)
    assert sorted(opened) == [f"mod{number:02d}.py" for number in range(FILES)]  # no stat record borrowed
    assert summary.dedup is not None and summary.dedup.signatures_computed == FILES + 1  # none borrowed
    assert _rows(SECOND, "SELECT COUNT(*) FROM entry_origins") == [(0,)]
    ((theirs,), (mine,)) = _segments(FIRST), _segments(SECOND)
    assert not os.path.samefile(theirs, mine) and mine.stat().st_nlink == theirs.stat().st_nlink == 1
    assert [list(rows.row_keys), rows.values.tolist(), rows.offsets.tolist()] == [keys, tokens, offsets]
    assert _files(store_dir(FIRST)) == before  # the other store: not a byte, name or time changed
    assert _verify(two)[0] == 0 and _verify(one)[0] == 0


# --- a home where hard links fail -----------------------------------------------------------------

#: Run in a child process: ``MODE STORE DOC...``. ``mount`` mounts a tmpfs on the folder STORE first
#: (the child runs in its own user and mount namespace): STORE is then another filesystem than its
#: siblings, and a link across it fails with EXDEV as on any two mounts. ``exdev`` makes ``os.link``
#: fail with EXDEV for a link across STORE's boundary instead (where no namespace can be made), and
#: ``nolinks`` every link with EPERM, as on a filesystem that has none (FAT, some network shares).
#: Each DOC is then ``dlm init``-ed when it does not exist, tokenized twice (the second pass reads and
#: checks every entry), verified, and what happened is printed as JSON.
_CHILD = r"""
import errno, json, os, sqlite3, subprocess, sys
from pathlib import Path

mode, store, *docs = sys.argv[1:]
if mode == "mount":
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", store], check=True)
else:
    real_link = os.link

    def link(source, target, **options):
        inside = [Path(os.path.abspath(p)).is_relative_to(store) for p in (source, target)]
        if mode == "nolinks" or inside[0] != inside[1]:
            raise OSError(errno.EXDEV if mode == "exdev" else errno.EPERM, "no hard link here")
        return real_link(source, target, **options)

    os.link = link

from click.testing import CliRunner
from dlmstore.cli.main import cli
from dlmstore.corpus.tokenize import tokenize_document
from dlmstore.home import store_dir

out = {"devices": len({os.stat(store).st_dev, os.stat(Path(store).parent).st_dev})}
for doc in docs:
    if not os.path.exists(doc):
        init = CliRunner().invoke(cli, ["init", doc])
        again = CliRunner().invoke(cli, ["init", doc])
        out[doc] = {"init": [init.exit_code, again.exit_code, again.output]}
        continue
    first, _ = tokenize_document(doc, materialize=False)
    second, rows = tokenize_document(doc)
    verify = CliRunner().invoke(cli, ["cache", "verify", doc])
    conn = sqlite3.connect(store_dir(first.dlm_id) / "store.db")
    how = sorted({how for (how,) in conn.execute("SELECT how FROM entry_origins")})
    conn.close()
    out[doc] = {
        "first": [first.tokenization.cache_misses, first.tokenization.cache_shared],
        "second": [second.tokenization.cache_hits, second.tokenization.cache_misses, second.damaged_entries],
        "how": how,
        "verify": [verify.exit_code, verify.output],
        "tokens": [list(rows.row_keys), rows.values.tolist(), rows.offsets.tolist()],
    }
print(json.dumps(out))
"""


def _can_mount(folder: Path) -> bool:
    """Whether this machine lets a process mount a tmpfs in a namespace of its own."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = [unshare, "--user", "--map-root-user", "--mount", "mount", "-t", "tmpfs", "tmpfs", str(folder)]
    return subprocess.run(probe, capture_output=True, timeout=60).returncode == 0


def _child(mode: str, store: Path, *docs: Path) -> dict[str, Any]:
    command = [sys.executable, "-c", _CHILD, mode, str(store), *map(str, docs)]
    if mode == "mount":
        command = ["unshare", "--user", "--map-root-user", "--mount", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.slow
def test_a_store_on_another_filesystem_than_its_sibling_takes_a_copy_and_verifies(
    docs: tuple[Path, Path],
) -> None:
    one, two = docs
    _, *tokens = _materialized(one)
    mine = store_dir(SECOND)
    mine.mkdir(parents=True)
    mode = "mount" if _can_mount(mine) else "exdev"
    done = _child(mode, mine, two)
    assert done["devices"] == (2 if mode == "mount" else 1)  # a real second filesystem where one can be had
    took = done[str(two)]
    assert took["first"] == [0, FILES + 1] and took["how"] == ["copy"]  # every row taken, by copy
    assert took["second"] == [FILES + 1, 0, 0]
    assert took["verify"] == [0, "checked 13 entries in 1 token file: 0 problems, 0 remaining\n"]
    assert took["tokens"] == tokens
    assert _verify(one)[0] == 0


@pytest.mark.slow
def test_a_home_on_a_filesystem_without_hard_links_creates_stores_shares_by_copy_and_verifies(
    docs: tuple[Path, Path], tmp_path: Path
) -> None:
    from dlmstore.home import dlm_home

    one, two = docs
    third = tmp_path / "three.dlm"
    done = _child("nolinks", dlm_home(), one, two, third)  # every store created without a link
    made, took = done[str(one)], done[str(two)]
    assert made["first"] == [FILES + 1, 0] and took["first"] == [0, FILES + 1] and took["how"] == ["copy"]
    for each in (made, took):
        assert each["second"] == [FILES + 1, 0, 0]
        assert each["verify"] == [0, "checked 13 entries in 1 token file: 0 problems, 0 remaining\n"]
    assert took["tokens"] == made["tokens"]
    init, again, said = done[str(third)]["init"]
    assert (init, again) == (0, 1) and "already exists; dlm init never overwrites a document" in said
    event = _materialized(third)[0].tokenization  # the document dlm init wrote reads and tokenizes
    assert event.cache_misses == event.total_rows > 0


# --- passes at once -------------------------------------------------------------------------------


@pytest.mark.slow
def test_four_tokenize_processes_of_documents_sharing_their_sources_at_once_agree_with_the_tokenizer(
    tmp_path: Path,
) -> None:
    _tree(tmp_path)
    ids = [FIRST, SECOND, "01KPQ1FFEDGPPSMWRAS18SAZSW", "01KPQ1FFEDGPPSMWRAS18SAZSX"]
    documents = [_doc(tmp_path / f"doc{number}.dlm", dlm_id) for number, dlm_id in enumerate(ids)]
    for number, doc in enumerate(documents):  # each has a body of its own beside the shared tree
        doc.write_text(
            doc.read_text().replace("Notes.\n", f"Notes of document {number}.\n"), encoding="utf-8"
        )
    dlm = str(Path(sys.executable).with_name("dlm"))
    runs = [
        subprocess.Popen([dlm, "tokenize", str(doc)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for doc in documents
    ]
    for run in runs:
        _, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr
    for doc, dlm_id in zip(documents, ids, strict=True):
        code, said = _verify(doc)
        assert (
            code == 0
            and said.startswith("checked 13 entries in ")
            and said.endswith(": 0 problems, 0 remaining\n")
        )
        summary, *tokens = _materialized(doc)
        assert (summary.tokenization.cache_misses, summary.damaged_entries) == (0, 0)
        _, fresh = tokenize_document(str(doc), no_cache=True)  # what the tokenizer makes of it, alone
        assert fresh is not None
        assert tokens == [list(fresh.row_keys), fresh.values.tolist(), fresh.offsets.tolist()]
        assert _rows(dlm_id, "SELECT COUNT(*), COUNT(DISTINCT row_key) FROM cache_entries") == [(13, 13)]

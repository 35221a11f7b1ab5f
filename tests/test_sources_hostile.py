"""training.sources against hostile trees: swaps between the walk and the read, huge and
sparse files, FIFOs, and directives over the whole machine.

Each fault is provoked deterministically: a swap is made by wrapping
``os.open`` so that it happens after the walk chose the file and just
before the read opens it; huge files are sparse (``truncate``), so they
cost no disk. Where a hang would be the failure, the command runs in a
subprocess with a timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.document.frontmatter import SourceDirective
from dlmstore.errors import SourceError
from dlmstore.sources import read
from dlmstore.sources.defaults import DEFAULT_MAX_BYTES_PER_FILE
from dlmstore.sources.expand import SourceExpansion, expand_sources

from .helpers import write_doc

GIB = 1 << 30


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def expand(doc_dir: Path, path: str = "src", policy: str = "permissive", **kw: Any) -> SourceExpansion:
    return expand_sources([SourceDirective(path=path, **kw)], doc_dir=doc_dir, policy=policy)


def texts(expansion: SourceExpansion) -> list[str]:
    return [section.content for section in expansion.sections]


def swap_on_open(monkeypatch: pytest.MonkeyPatch, victim: Path, swap: Callable[[], None]) -> None:
    """Run ``swap`` once, right before the first ``os.open`` of ``victim``: after the walk chose it."""
    real_open = os.open
    done: list[bool] = []

    def opening(path: Any, *args: Any, **kw: Any) -> int:
        if not done and os.fspath(path) == str(victim):
            done.append(True)
            swap()
        return real_open(path, *args, **kw)

    monkeypatch.setattr(os, "open", opening)


def replace_with_symlink(path: Path, target: Path) -> None:
    link = path.with_name(path.name + ".swap")
    link.symlink_to(target)
    os.replace(link, path)  # atomic, as an attacker racing the walk would do it


# -- the check-then-open race (item 5 of issue 16) ---------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """A document folder with src/sub/a.txt and src/b.txt, and an outside folder with a secret."""
    doc_dir = tmp_path / "doc"
    make_tree(doc_dir / "src", {"sub/a.txt": "inside a\n", "b.txt": "inside b\n"})
    outside = make_tree(tmp_path / "outside", {"a.txt": "SECRET\n", "sub/a.txt": "SECRET\n"})
    return doc_dir.resolve(), outside.resolve()


def test_a_file_swapped_for_an_outside_symlink_after_the_walk_is_an_error_under_strict(
    tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    doc_dir, outside = tree
    victim = doc_dir / "src" / "sub" / "a.txt"
    swap_on_open(monkeypatch, victim, lambda: replace_with_symlink(victim, outside / "a.txt"))
    with pytest.raises(SourceError) as caught:
        expand(doc_dir, policy="strict")
    assert str(caught.value) == (
        "training.sources 'src': sub/a.txt was replaced while dlm was reading it (now a symlink); "
        "under sources_policy: strict it is not read"
    )


def test_a_file_swapped_for_an_outside_symlink_after_the_walk_is_skipped_under_permissive(
    tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    doc_dir, outside = tree
    victim = doc_dir / "src" / "sub" / "a.txt"
    swap_on_open(monkeypatch, victim, lambda: replace_with_symlink(victim, outside / "a.txt"))
    got = expand(doc_dir)
    assert texts(got) == ["# source: b.txt\n\ninside b\n"]
    assert got.warnings == (
        "training.sources 'src': skipping sub/a.txt: replaced while dlm was reading it (now a symlink)",
    )


@pytest.mark.parametrize("policy", ["strict", "permissive"])
def test_a_folder_above_a_chosen_file_swapped_for_an_outside_symlink_is_never_read(
    tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    # O_NOFOLLOW guards only the last component: the descriptor's own path
    # must be the path the walk chose.
    doc_dir, outside = tree
    sub = doc_dir / "src" / "sub"

    def swap() -> None:
        sub.rename(sub.with_name("moved"))
        sub.symlink_to(outside / "sub", target_is_directory=True)

    swap_on_open(monkeypatch, sub / "a.txt", swap)
    if policy == "strict":
        with pytest.raises(SourceError) as caught:
            expand(doc_dir, policy=policy)
        assert f"(now {outside}/sub/a.txt)" in str(caught.value)
    else:
        got = expand(doc_dir, policy=policy)
        assert texts(got) == ["# source: b.txt\n\ninside b\n"]
        assert got.warnings == (
            f"training.sources 'src': skipping sub/a.txt: replaced while dlm was reading it "
            f"(now {outside}/sub/a.txt)",
        )


def test_a_file_replaced_by_an_ordinary_rename_is_read_as_it_is_now(
    tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An editor's atomic save (write a temp file, rename it over) is no swap:
    # the path still names a regular file in its place.
    doc_dir, _ = tree
    victim = doc_dir / "src" / "b.txt"

    def save() -> None:
        victim.with_name("b.tmp").write_text("saved b\n")
        os.replace(victim.with_name("b.tmp"), victim)

    swap_on_open(monkeypatch, victim, save)
    assert texts(expand(doc_dir, policy="strict"))[0] == "# source: b.txt\n\nsaved b\n"


def test_a_file_the_stat_cache_trusts_is_refused_when_it_became_a_symlink(tree: tuple[Path, Path]) -> None:
    doc_dir, outside = tree
    victim = doc_dir / "src" / "b.txt"
    digest = expand(doc_dir).sections[1].digest
    replace_with_symlink(victim, outside / "a.txt")
    with pytest.raises(SourceError) as caught:
        read._load_checked("training.sources 'src'", str(victim), "b.txt", digest)
    assert str(caught.value) == (
        "training.sources 'src': b.txt changed while dlm was running "
        "(replaced while dlm was reading it (now a symlink))"
    )


# -- FIFOs: a hang is the failure, so these run in a subprocess --------------------------------


def run_python(code: str, *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_a_file_swapped_for_a_fifo_after_the_walk_is_skipped_without_hanging(tmp_path: Path) -> None:
    doc_dir = tmp_path / "doc"
    make_tree(doc_dir / "src", {"a.txt": "a\n", "b.txt": "b\n"})
    victim = (doc_dir / "src" / "a.txt").resolve()
    code = f"""
import os
from dlmstore.document.frontmatter import SourceDirective
from dlmstore.sources.expand import expand_sources
real_open = os.open
def opening(path, *args, **kw):
    if os.fspath(path) == {str(victim)!r} and not os.path.exists(path + ".was"):
        os.rename(path, path + ".was")
        os.mkfifo(path)
    return real_open(path, *args, **kw)
os.open = opening
got = expand_sources([SourceDirective(path="src")], doc_dir={str(doc_dir)!r}, policy="strict")
print([s.source for s in got.sections])
print(list(got.warnings))
"""
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "['b.txt']",
        "[\"training.sources 'src': skipping a.txt: a FIFO, not a regular file\"]",
    ]


def test_a_fifo_in_the_tree_is_never_a_source_and_never_blocks_the_read(tmp_path: Path) -> None:
    doc_dir = tmp_path / "doc"
    make_tree(doc_dir / "src", {"a.txt": "a\n"})
    os.mkfifo(doc_dir / "src" / "pipe.txt")
    code = f"""
from dlmstore.document.frontmatter import SourceDirective
from dlmstore.sources.expand import expand_sources
got = expand_sources([SourceDirective(path="src")], doc_dir={str(doc_dir)!r})
print([s.source for s in got.sections], list(got.warnings))
"""
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "['a.txt'] []\n"


# -- size: the binary check reads the first KiB, the default cap skips what it must -----------


def sparse_file(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(size)
    return path


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The byte counts every ``os.readv`` of the source reader returns, in order."""
    counts: list[int] = []
    real_readv = os.readv

    def readv(fd: int, buffers: Any) -> int:
        count = real_readv(fd, buffers)
        counts.append(count)
        return count

    monkeypatch.setattr(os, "readv", readv)
    return counts


def test_the_binary_check_of_a_huge_file_reads_only_its_first_kib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 3 GiB sparse file (zeros: binary) under a raised cap: before, it was
    # read whole (3 GB of memory) to look at 1 KiB of it.
    make_tree(tmp_path / "src", {"a.txt": "text\n"})
    sparse_file(tmp_path / "src" / "huge.log", 3 * GIB)
    counts = count_reads(monkeypatch)
    got = expand(tmp_path, max_bytes_per_file=4 * GIB)
    assert texts(got) == ["# source: a.txt\n\ntext\n"]
    assert got.provenance[0].skipped_binary == 1
    assert counts == [5, read.BINARY_SNIFF_BYTES]  # a.txt whole; huge.log's first KiB only


@pytest.mark.parametrize(
    "size", [read.SNIFF_FIRST_ABOVE, read.SNIFF_FIRST_ABOVE + 1, read.SNIFF_FIRST_ABOVE + 5000]
)
def test_a_large_text_file_read_in_two_steps_is_read_exactly(tmp_path: Path, size: int) -> None:
    body = ("0123456789abcdef" * (size // 16 + 1))[: size - 1] + "\n"
    make_tree(tmp_path / "src", {"big.txt": body})
    assert texts(expand(tmp_path)) == [f"# source: big.txt\n\n{body}"]


def test_a_nul_after_the_first_kib_of_a_large_file_is_text_as_for_a_small_one(tmp_path: Path) -> None:
    body = "x" * 2000 + "\0" + "y" * read.SNIFF_FIRST_ABOVE
    make_tree(tmp_path / "src", {"late-nul.txt": body, "small.txt": "x" * 2000 + "\0"})
    got = expand(tmp_path)
    assert [s.source for s in got.sections] == ["late-nul.txt", "small.txt"]


def test_files_over_the_default_cap_are_skipped_unread_counted_and_explained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tree(tmp_path / "src", {"a.txt": "text\n"})
    sparse_file(tmp_path / "src" / "dump.sql", 3 * GIB)
    sparse_file(tmp_path / "src" / "edge.txt", DEFAULT_MAX_BYTES_PER_FILE + 1)
    counts = count_reads(monkeypatch)
    got = expand(tmp_path)
    assert [s.source for s in got.sections] == ["a.txt"]
    assert got.provenance[0].skipped_too_large == 2
    assert counts == [5]  # neither large file was read at all
    assert got.warnings == (
        "training.sources 'src': skipped 2 files over 4 MiB, the default max_bytes_per_file; set "
        "max_bytes_per_file on the directive to read larger files (tokenizing takes about 200 bytes "
        "of memory per byte of the largest file)",
    )


def test_a_file_of_exactly_the_default_cap_is_read(tmp_path: Path) -> None:
    sparse_file(tmp_path / "src" / "edge.txt", DEFAULT_MAX_BYTES_PER_FILE)
    got = expand(tmp_path)
    assert got.provenance[0].skipped_too_large == 0
    assert got.provenance[0].skipped_binary == 1  # read (and found binary), not skipped for size


def test_a_cap_the_directive_sets_counts_its_skips_without_the_default_caps_warning(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", {"a.txt": "text\n", "b.txt": "x" * 100})
    got = expand(tmp_path, max_bytes_per_file=50)
    assert got.provenance[0].skipped_too_large == 1
    assert got.warnings == ()


def test_show_and_tokenize_print_the_default_cap_count_with_the_way_to_raise_it(
    tmp_path: Path, tiny_base: Path
) -> None:
    make_tree(tmp_path / "src", {"a.txt": "text\n"})
    sparse_file(tmp_path / "src" / "dump.sql", GIB)
    doc = write_doc(
        tmp_path / "doc.dlm", frontmatter=f"base_model: {tiny_base}\ntraining:\n  sources:\n    - path: src\n"
    )
    warning = (
        "warning: training.sources 'src': skipped 1 file over 4 MiB, the default max_bytes_per_file; "
        "set max_bytes_per_file on the directive to read larger files"
    )
    show = CliRunner().invoke(cli, ["-q", "show", str(doc)])  # -q: warnings only
    assert show.exit_code == 0, show.output
    assert show.stderr.startswith(warning)
    assert "source:   src: 1 file, 5 B (skipped 1 too_large)" in show.stdout
    tokenize = CliRunner().invoke(cli, ["-q", "tokenize", str(doc)])  # -q: warnings only
    assert tokenize.exit_code == 0, tokenize.output
    assert tokenize.stderr.startswith(warning)


# -- directives over the whole machine ---------------------------------------------------------


@pytest.mark.parametrize("policy", ["strict", "permissive"])
def test_a_directive_at_the_filesystem_root_is_refused(tmp_path: Path, policy: str) -> None:
    with pytest.raises(SourceError) as caught:
        expand(tmp_path, "/", policy=policy)
    assert str(caught.value) == (
        "training.sources '/': the path resolves to /, the filesystem root; a directive reads every "
        "file below it into memory, so it must name a folder of training text"
    )


def test_a_directive_at_the_home_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = make_tree(tmp_path / "home" / "me", {"notes/a.txt": "a\n"})
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(SourceError) as caught:
        expand(tmp_path, "~")
    assert f"the path resolves to {home.resolve()}, your home folder;" in str(caught.value)
    with pytest.raises(SourceError) as caught:
        expand(tmp_path, str(tmp_path / "home"))
    assert f"a folder above your home folder {home.resolve()};" in str(caught.value)
    assert [s.source for s in expand(tmp_path, "~/notes").sections] == ["a.txt"]


def test_a_document_in_the_home_folder_reading_its_own_folder_is_refused_under_strict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = make_tree(tmp_path / "home", {"a.txt": "a\n"})
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(SourceError) as caught:
        expand(home, ".", policy="strict")
    assert "your home folder" in str(caught.value)
    assert caught.value.hint is not None and "needs a folder of its own" in caught.value.hint


@pytest.mark.slow  # trains the tiny base for one step
def test_train_prints_the_default_cap_count_with_the_way_to_raise_it(tmp_path: Path, tiny_base: Path) -> None:
    make_tree(tmp_path / "src", {"a.txt": "Notes on caching tokens. " * 10})
    sparse_file(tmp_path / "src" / "dump.sql", GIB)
    doc = write_doc(
        tmp_path / "doc.dlm",
        frontmatter=f"base_model: {tiny_base}\ntraining:\n  sequence_len: 64\n  max_steps: 1\n"
        "  micro_batch_size: 1\n  sources:\n    - path: src\n",
    )
    result = CliRunner().invoke(cli, ["train", str(doc)])
    assert result.exit_code == 0, result.output
    assert (
        "warning: training.sources 'src': skipped 1 file over 4 MiB, the default max_bytes_per_file; "
        "set max_bytes_per_file on the directive to read larger files"
    ) in result.stderr

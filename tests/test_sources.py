"""Expanding training.sources directives into prose sections (dlmstore.sources.expand, .walk, .read)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from dlmstore.document.frontmatter import SourceDirective
from dlmstore.document.sections import Section, section_digest
from dlmstore.errors import SourceError
from dlmstore.sources.defaults import DEFAULT_EXCLUDES
from dlmstore.sources.expand import SourceExpansion, expand_sources


@pytest.fixture
def doc_dir(tmp_path: Path) -> Path:
    """The .dlm file's directory (tmp_path itself also holds DLM_HOME)."""
    path = tmp_path / "doc"
    path.mkdir()
    return path


def make_tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_bytes(data.encode("utf-8"))
    return root


def expand(doc_dir: Path, path: str = "src", policy: str = "permissive", **kw: Any) -> SourceExpansion:
    return expand_sources([SourceDirective(path=path, **kw)], doc_dir=doc_dir, policy=policy)


def rels(expansion: SourceExpansion) -> list[str]:
    return [s.source for s in expansion.sections if s.source is not None]


# -- output shape ------------------------------------------------------------------


def test_sections_come_out_in_dlms_path_order_folder_by_folder(doc_dir: Path) -> None:
    names = ["b.txt", "a/x.txt", "a.txt", "a-b/y.txt", "A.txt", "a/b/z.txt", "é.txt", "a0"]
    make_tree(doc_dir / "src", {name: name for name in reversed(names)})
    assert rels(expand(doc_dir)) == sorted(names, key=lambda name: name.split("/"))
    # DLM sorts Path objects, which compare folder by folder: folder "a" sorts
    # before "a-b" and "a.txt", so everything in it comes first
    assert rels(expand(doc_dir)) == [
        "A.txt",
        "a/b/z.txt",
        "a/x.txt",
        "a-b/y.txt",
        "a.txt",
        "a0",
        "b.txt",
        "é.txt",
    ]


def test_section_content_and_id_equal_a_plainly_built_section(doc_dir: Path) -> None:
    make_tree(doc_dir / "src", {"pkg/mod.py": "def f():\n    return 'ünïcode'\n"})
    (section,) = expand(doc_dir).sections
    content = "# source: pkg/mod.py\n\ndef f():\n    return 'ünïcode'\n"
    plain = Section(type="prose", content=content, source="pkg/mod.py")
    assert section == plain
    assert section.line is None
    assert section.digest == plain.digest == section_digest("prose", plain.content)
    assert section.section_id == plain.section_id


def test_crlf_and_cr_files_get_the_same_section_id_as_their_lf_twin(doc_dir: Path) -> None:
    make_tree(doc_dir / "lf", {"note.txt": "one\ntwo\n"})
    make_tree(doc_dir / "crlf", {"note.txt": b"one\r\ntwo\r\n"})
    make_tree(doc_dir / "cr", {"note.txt": b"one\rtwo\r"})
    sections = [expand(doc_dir, path).sections[0] for path in ("lf", "crlf", "cr")]
    assert {s.content for s in sections} == {"# source: note.txt\n\none\ntwo\n"}
    assert len({s.digest for s in sections}) == 1
    assert sections[0].digest == section_digest("prose", sections[0].content)


def test_empty_file_gives_a_section_with_only_the_header(doc_dir: Path) -> None:
    make_tree(doc_dir / "src", {"empty.txt": ""})
    (section,) = expand(doc_dir).sections
    assert section.content == "# source: empty.txt\n\n"
    assert section.digest == section_digest("prose", section.content)


def test_provenance_counts_what_was_included_and_why_the_rest_was_not(doc_dir: Path) -> None:
    make_tree(
        doc_dir / "src",
        {
            "a.md": "hello",
            "b.md": "héllo",
            "c.txt": "x",
            "bin.md": b"\x00\x01",
            "latin.md": b"\xe9t\xe9",
        },
    )
    expansion = expand(doc_dir, include=["**/*.md"])
    (prov,) = expansion.provenance
    assert prov.directive == "src"
    assert prov.root == os.path.realpath(doc_dir / "src")
    assert (prov.files_included, prov.bytes_included) == (2, len(b"hello") + len("héllo".encode()))
    assert (prov.skipped_binary, prov.skipped_encoding, prov.excluded) == (1, 1, 1)
    assert expansion.warnings == ()


def test_several_directives_come_out_in_directive_order(doc_dir: Path) -> None:
    make_tree(doc_dir, {"z/a.txt": "z", "a/a.txt": "a"})
    expansion = expand_sources([SourceDirective(path="z"), SourceDirective(path="a")], doc_dir=doc_dir)
    assert [s.content[-1] for s in expansion.sections] == ["z", "a"]
    assert [p.directive for p in expansion.provenance] == ["z", "a"]


# -- globs ---------------------------------------------------------------------------


def test_double_star_include_matches_top_level_and_nested_files(doc_dir: Path) -> None:
    make_tree(doc_dir / "src", {"a.py": "", "pkg/b.py": "", "pkg/deep/c.py": "", "c.txt": ""})
    assert rels(expand(doc_dir, include=["**/*.py"])) == ["a.py", "pkg/b.py", "pkg/deep/c.py"]


def test_single_star_include_matches_top_level_only(doc_dir: Path) -> None:
    make_tree(doc_dir / "src", {"a.py": "", "pkg/b.py": ""})
    assert rels(expand(doc_dir, include=["*.py"])) == ["a.py"]


def test_a_file_is_kept_when_some_include_matches_and_no_exclude_does(doc_dir: Path) -> None:
    make_tree(
        doc_dir / "src",
        {"a.py": "", "a.md": "", "test_a.py": "", "pkg/test_b.py": "", "pkg/b.py": "", "x.txt": ""},
    )
    got = expand(doc_dir, include=["**/*.py", "*.md"], exclude=["**/test_*.py"])
    assert rels(got) == ["a.md", "a.py", "pkg/b.py"]
    assert got.provenance[0].excluded == 3


def test_exclude_double_star_prunes_the_directory(doc_dir: Path) -> None:
    make_tree(
        doc_dir / "src",
        {"gen/a.txt": "", "gen/deep/b.txt": "", "keep.txt": "", "generic.txt": ""},
    )
    got = expand(doc_dir, exclude=["gen/**"])
    assert rels(got) == ["generic.txt", "keep.txt"]
    assert got.provenance[0].excluded_dirs == 1
    assert got.provenance[0].excluded == 0  # pruned, never listed


def test_include_globs_skip_folders_that_cannot_hold_a_match_without_counting_their_files(
    doc_dir: Path,
) -> None:
    make_tree(doc_dir / "src", {"docs/a.md": "", "lib/x/b.py": "", "lib/c.py": "", "lib/d.md": ""})
    got = expand(doc_dir, include=["lib/**/*.py"])
    assert rels(got) == ["lib/c.py", "lib/x/b.py"]
    assert (got.provenance[0].excluded_dirs, got.provenance[0].excluded) == (1, 1)  # docs/; lib/d.md


def test_every_filter_counts_the_files_it_drops_and_the_folders_it_skips(doc_dir: Path) -> None:
    make_tree(
        doc_dir / "src",
        {
            ".dlm/training.yaml": "exclude: ['*.bak']\n",
            ".dlm/ignore": "*.tmp\nprivate/\n",
            "a.txt": "",
            "b.md": "",  # include
            "c.log": "",  # directive exclude
            "d.pyc": "",  # default exclude
            "e.bak": "",  # training.yaml exclude
            "f.tmp": "",  # ignore rule
            "gen/x.txt": "",  # a folder the directive exclude covers
            "build/y.txt": "",  # a folder the defaults cover
            "private/z.txt": "",  # a folder an ignore rule covers
        },
    )
    (doc_dir / "src" / "link.log").symlink_to(doc_dir / "src" / "a.txt")
    got = expand(
        doc_dir,
        include=["**/*.txt", "**/*.log", "**/*.pyc", "**/*.bak", "**/*.tmp"],
        exclude=["*.log", "gen/**"],
    )
    assert rels(got) == ["a.txt"]
    prov = got.provenance[0]
    assert (prov.excluded, prov.excluded_dirs) == (
        6,
        4,
    )  # b.md c.log d.pyc e.bak f.tmp link.log; .dlm gen build private


# -- default excludes and ignore files ----------------------------------------------------

NOISE = {
    ".git/config": "[core]",
    ".git/objects/ab": "blob",
    "node_modules/pkg/index.js": "js",
    ".venv/lib/site.py": "py",
    "venv/bin/activate": "sh",
    "__pycache__/m.txt": "x",
    "build/out.txt": "o",
    "dist/pkg.txt": "d",
    "generated/api.py": "g",
    "poetry.lock": "l",
    "package-lock.json": "{}",
    "backup.zip": "not really a zip",
    "server.pem": "key",
    "id_rsa": "key",
    "id_ed25519": "key",
    ".env": "SECRET=1",
    ".env.local": "SECRET=2",
    "secrets.yaml": "token: x",
    "lib.so": "elf",
    "app.min.js": "js",
}


def test_default_excludes_skip_vcs_venvs_build_output_locks_archives_and_secrets(
    doc_dir: Path,
) -> None:
    kept = {
        "keep.txt": "",
        "pkg/build.py": "",
        "pkg.egg-info/PKG-INFO": "",
        ".DS_Store": "",
        "id_ed25519.pub": "",
    }
    make_tree(doc_dir / "src", {**NOISE, **kept})
    got = expand(doc_dir)
    # DLM's list: no .DS_Store, *.egg-info or public keys in it
    assert rels(got) == [".DS_Store", "id_ed25519.pub", "keep.txt", "pkg/build.py", "pkg.egg-info/PKG-INFO"]
    prov = got.provenance[0]
    assert prov.excluded_dirs == 8  # .git node_modules .venv venv __pycache__ build dist generated
    assert prov.excluded == 11  # the top-level locks, archive, keys, secrets and binaries


def test_default_excludes_can_be_switched_off(doc_dir: Path) -> None:
    make_tree(doc_dir / "src", {**NOISE, "keep.txt": "kept"})
    got = expand(doc_dir, default_excludes=False)
    assert rels(got) == sorted([*NOISE, "keep.txt"], key=lambda name: name.split("/"))


def test_default_excludes_are_exposed_as_a_constant() -> None:
    for pattern in (".git/**", "node_modules/**", "**/*.pem", ".env", "**/secrets.*", "**/.dlm/**"):
        assert pattern in DEFAULT_EXCLUDES


def test_dlm_ignore_supports_negation_dir_only_and_anchored_rules(doc_dir: Path) -> None:
    make_tree(
        doc_dir / "src",
        {
            ".dlm/ignore": "# drafts and logs\n*.log\n!keep.log\ncache/\n/top.txt\ndocs/*.tmp\n",
            "a.log": "",
            "keep.log": "",
            "sub/b.log": "",
            "sub/keep.log": "",
            "cache/c.txt": "",
            "sub/cache": "a file, not a directory",
            "top.txt": "",
            "sub/top.txt": "",
            "docs/x.tmp": "",
            "sub/docs/x.tmp": "",
        },
    )
    # As in DLM, "docs/*.tmp" is not anchored by its inner "/": it matches at any depth.
    assert rels(expand(doc_dir)) == ["keep.log", "sub/cache", "sub/keep.log", "sub/top.txt"]


def test_nested_ignore_files_override_shallower_ones_below_their_directory(doc_dir: Path) -> None:
    make_tree(
        doc_dir / "src",
        {
            ".dlm/ignore": "*.txt\n",
            "pkg/.dlm/ignore": "!*.txt\n*.md\n",
            "a.txt": "",
            "a.md": "",
            "pkg/b.txt": "",
            "pkg/b.md": "",
            "pkg/deep/c.txt": "",
            "other/d.txt": "",
        },
    )
    assert rels(expand(doc_dir)) == ["a.md", "pkg/b.txt", "pkg/deep/c.txt"]


def test_an_ignore_file_can_re_include_a_default_exclude(doc_dir: Path) -> None:
    make_tree(doc_dir / "src", {".dlm/ignore": "!.env.example\n", ".env.example": "X=", ".env": "X=1"})
    assert rels(expand(doc_dir)) == [".env.example"]


def test_a_negation_re_includes_a_file_inside_an_ignored_directory_as_in_dlm(doc_dir: Path) -> None:
    make_tree(doc_dir / "src", {".dlm/ignore": "out/\n!out/keep.txt\n", "out/keep.txt": "", "out/x.txt": ""})
    assert rels(expand(doc_dir)) == ["out/keep.txt"]


def test_dlm_folders_are_left_out_by_the_default_excludes_only(doc_dir: Path) -> None:
    make_tree(doc_dir / "src", {".dlm/notes.txt": "config", "sub/.dlm/x.txt": "", "a.txt": ""})
    assert rels(expand(doc_dir)) == ["a.txt"]
    assert rels(expand(doc_dir, default_excludes=False)) == [".dlm/notes.txt", "a.txt", "sub/.dlm/x.txt"]


def record_scandir(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    listed: list[str] = []
    real = os.scandir

    def scandir(path: Any = ".") -> Any:
        listed.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    return listed


def test_skipped_directories_are_listed_only_to_look_for_dlm_folders(
    doc_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tree(
        doc_dir / "src",
        {
            ".dlm/ignore": "private/\n",
            "node_modules/a/b.js": "",
            "private/secret.txt": "",
            "gen/x.txt": "",
            "ok/a.txt": "",
        },
    )
    listed = record_scandir(monkeypatch)
    got = expand(doc_dir, exclude=["gen/**"])
    assert rels(got) == ["ok/a.txt"]
    # .dlm node_modules private gen: skipped, their files never classified or counted
    assert (got.provenance[0].excluded_dirs, got.provenance[0].excluded) == (4, 0)
    names = sorted(os.path.relpath(path, doc_dir / "src") for path in listed)
    assert names == [".", ".dlm", "gen", "node_modules", "node_modules/a", "ok", "private"]


# -- size, count and content limits ------------------------------------------------------


def test_files_over_max_bytes_per_file_are_skipped_and_counted(doc_dir: Path) -> None:
    make_tree(doc_dir / "src", {"small.txt": "x" * 10, "exact.txt": "x" * 11, "big.txt": "x" * 12})
    got = expand(doc_dir, max_bytes_per_file=11)
    assert rels(got) == ["exact.txt", "small.txt"]
    assert got.provenance[0].skipped_too_large == 1


def test_max_files_keeps_the_first_files_in_path_order_and_counts_the_rest(doc_dir: Path) -> None:
    make_tree(doc_dir / "src", {"a.txt": "", "b.bin": b"\x00", "c/d.txt": "", "e.txt": "", "f.txt": ""})
    got = expand(doc_dir, max_files=2)
    assert rels(got) == ["a.txt", "c/d.txt"]
    prov = got.provenance[0]
    assert (prov.files_included, prov.skipped_binary, prov.skipped_max_files) == (2, 1, 2)


def test_binary_and_non_utf8_files_are_skipped_and_counted_not_errors(doc_dir: Path) -> None:
    make_tree(
        doc_dir / "src",
        {
            "nul-early.txt": b"abc\x00def",
            "nul-late.txt": b"a" * 2000 + b"\x00",  # beyond the first KiB: text, but valid
            "latin1.txt": "café".encode("latin-1"),
            "ok.txt": "fine",
        },
    )
    got = expand(doc_dir)
    assert rels(got) == ["nul-late.txt", "ok.txt"]
    prov = got.provenance[0]
    assert (prov.skipped_binary, prov.skipped_encoding) == (1, 1)


def test_a_file_that_grows_while_being_read_is_read_to_the_end(
    doc_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "0123456789" * 10_000
    make_tree(doc_dir / "src", {"log.txt": text})
    real = os.fstat

    class Shrunk:
        def __init__(self, st: os.stat_result) -> None:
            self.st_mode, self.st_size = st.st_mode, st.st_size - 5_000

    monkeypatch.setattr(os, "fstat", lambda fd: Shrunk(real(fd)))
    (section,) = expand(doc_dir).sections
    assert section.content == f"# source: log.txt\n\n{text}"
    assert section.digest == section_digest("prose", section.content)


def test_a_folder_with_no_subfolder_to_walk_gives_its_files_and_followed_links_in_name_order(
    doc_dir: Path,
) -> None:
    # Its only subfolder is skipped unlisted (__pycache__), so the folder's
    # sorted items go out in one piece, a followed link where its name sorts.
    make_tree(doc_dir / "src", {"c.txt": "c", "a.txt": "a", "__pycache__/m.pyc": "x", "B.txt": "b"})
    (doc_dir / "src" / "b-link.txt").symlink_to(doc_dir / "src" / "c.txt")
    expansion = expand(doc_dir)
    assert rels(expansion) == ["B.txt", "a.txt", "b-link.txt", "c.txt"]
    (provenance,) = expansion.provenance
    assert (provenance.excluded, provenance.excluded_dirs) == (0, 1)


# -- paths, symlinks and policies ----------------------------------------------------------


def test_missing_path_is_an_error_naming_the_directive_and_the_resolved_path(
    doc_dir: Path,
) -> None:
    with pytest.raises(SourceError) as caught:
        expand(doc_dir, "no/such/dir")
    assert str(caught.value) == (
        f"training.sources 'no/such/dir': no such file or directory (resolved to {doc_dir / 'no/such/dir'})"
    )
    assert caught.value.hint == (
        "relative source paths start at the .dlm file's directory; fix the path or remove the entry"
    )


def test_single_file_directive_yields_one_section_named_after_the_file(doc_dir: Path) -> None:
    make_tree(doc_dir / "notes", {"today.md": "# Today\n", "other.md": ""})
    got = expand(doc_dir, "notes/today.md")
    assert [s.content for s in got.sections] == ["# source: today.md\n\n# Today\n"]
    assert got.provenance[0].root == os.path.realpath(doc_dir / "notes/today.md")


def test_tilde_expands_to_the_home_directory(
    doc_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    make_tree(home / "notes", {"a.txt": "from home"})
    monkeypatch.setenv("HOME", str(home))
    got = expand(doc_dir, "~/notes")
    assert rels(got) == ["a.txt"]
    assert got.provenance[0].root == os.path.realpath(home / "notes")


def test_strict_policy_refuses_a_directive_path_outside_the_document_directory(
    doc_dir: Path, tmp_path: Path
) -> None:
    make_tree(tmp_path / "elsewhere", {"a.txt": ""})
    with pytest.raises(SourceError) as caught:
        expand(doc_dir, "../elsewhere", policy="strict")
    outside, doc = os.path.realpath(tmp_path / "elsewhere"), os.path.realpath(doc_dir)
    assert str(caught.value) == (
        f"training.sources '../elsewhere': the path resolves to {outside}, outside the "
        f"document's directory {doc}; move it inside, or set training.sources_policy: permissive"
    )


def test_permissive_policy_reads_a_directive_path_outside_the_document_directory(
    doc_dir: Path, tmp_path: Path
) -> None:
    make_tree(tmp_path / "elsewhere", {"a.txt": "outside"})
    got = expand(doc_dir, "../elsewhere")
    assert rels(got) == ["a.txt"]
    assert got.warnings == ()


def outside_symlink(doc_dir: Path, tmp_path: Path) -> Path:
    secret = tmp_path / "secret.txt"
    secret.write_text("do not train on me")
    make_tree(doc_dir / "src", {"a.txt": "fine"})
    (doc_dir / "src" / "link.txt").symlink_to(secret)
    return secret


def test_strict_policy_refuses_a_symlinked_file_outside_the_document_directory(
    doc_dir: Path, tmp_path: Path
) -> None:
    secret = outside_symlink(doc_dir, tmp_path)
    with pytest.raises(SourceError) as caught:
        expand(doc_dir, policy="strict")
    assert str(caught.value) == (
        f"training.sources 'src': symlink link.txt resolves to {os.path.realpath(secret)}, "
        f"outside the document's directory {os.path.realpath(doc_dir)}; move it inside, "
        "or set training.sources_policy: permissive"
    )


def test_permissive_policy_skips_an_outside_symlinked_file_with_a_warning(
    doc_dir: Path, tmp_path: Path
) -> None:
    secret = outside_symlink(doc_dir, tmp_path)
    got = expand(doc_dir)
    assert rels(got) == ["a.txt"]
    assert got.provenance[0].skipped_outside == 1
    assert got.warnings == (
        f"training.sources 'src': skipping link.txt: symlink to {os.path.realpath(secret)}, "
        "outside the document's directory",
    )


def test_a_symlinked_file_inside_the_document_directory_is_followed(doc_dir: Path) -> None:
    make_tree(doc_dir, {"shared/glossary.md": "terms", "src/a.txt": ""})
    (doc_dir / "src" / "glossary.md").symlink_to(doc_dir / "shared/glossary.md")
    got = expand(doc_dir, policy="strict")
    assert rels(got) == ["a.txt", "glossary.md"]
    assert got.sections[1].content == "# source: glossary.md\n\nterms"


def test_symlinked_directories_are_not_followed_so_cycles_cannot_loop(doc_dir: Path) -> None:
    make_tree(doc_dir / "src", {"a/b.txt": ""})
    (doc_dir / "src" / "a" / "loop").symlink_to(doc_dir / "src", target_is_directory=True)
    got = expand(doc_dir)
    assert rels(got) == ["a/b.txt"]
    assert got.warnings == ("training.sources 'src': not following symlinked directory a/loop",)


def test_a_symlinked_directory_that_would_be_excluded_anyway_is_skipped_silently(
    doc_dir: Path, tmp_path: Path
) -> None:
    make_tree(tmp_path / "shared-modules", {"x.js": ""})
    make_tree(doc_dir / "src", {"a.txt": ""})
    (doc_dir / "src" / "node_modules").symlink_to(tmp_path / "shared-modules")
    got = expand(doc_dir)
    assert rels(got) == ["a.txt"]
    assert got.warnings == ()
    assert got.provenance[0].excluded_dirs == 1


def test_a_broken_symlink_is_skipped_with_a_warning(doc_dir: Path) -> None:
    make_tree(doc_dir / "src", {"a.txt": ""})
    (doc_dir / "src" / "gone.txt").symlink_to(doc_dir / "nowhere.txt")
    got = expand(doc_dir)
    assert rels(got) == ["a.txt"]
    assert got.warnings == ("training.sources 'src': skipping gone.txt: broken symlink",)


def test_unreadable_files_and_directories_are_skipped_with_a_warning(
    doc_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tree(doc_dir / "src", {"locked.txt": "", "ok.txt": "", "closed/x.txt": ""})
    real_open, real_scandir = os.open, os.scandir

    def deny_open(path: Any, *args: Any, **kw: Any) -> int:
        if str(path).endswith("locked.txt"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kw)

    def deny_scandir(path: Any = ".") -> Any:
        if str(path).endswith("closed"):
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(os, "open", deny_open)
    monkeypatch.setattr(os, "scandir", deny_scandir)
    got = expand(doc_dir)
    assert rels(got) == ["ok.txt"]
    assert got.warnings == (
        "training.sources 'src': cannot list closed: Permission denied",
        "training.sources 'src': skipping locked.txt: Permission denied",
    )


def test_an_unknown_policy_is_a_programming_error(doc_dir: Path) -> None:
    with pytest.raises(ValueError, match="policy must be one of"):
        expand_sources([], doc_dir=doc_dir, policy="lenient")


def test_a_directive_that_reaches_the_document_itself_skips_it(tmp_path: Path) -> None:
    doc = tmp_path / "doc.dlm"
    doc.write_text("---\n---\n")
    (tmp_path / "notes.md").write_text("notes\n")
    directive = SourceDirective(path=".")
    result = expand_sources([directive], doc_dir=tmp_path, document=doc)
    assert [s.source for s in result.sections] == ["notes.md"]
    assert result.provenance[0].excluded == 1
    alone = expand_sources([SourceDirective(path="doc.dlm")], doc_dir=tmp_path, document=doc)
    assert alone.sections == ()

"""training.sources picks DocumentLanguageModel's files in DLM's order; .dlm/ folders (dlmstore.sources)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmstore.document.frontmatter import SourceDirective
from dlmstore.errors import SourceError
from dlmstore.sources.config import load_folder
from dlmstore.sources.expand import SourceExpansion, expand_sources
from dlmstore.sources.rules import Scope

from .helpers import REPO

FIXTURES = REPO / "tests/fixtures/dlm"
TREE = json.loads((FIXTURES / "sources-tree.json").read_text(encoding="utf-8"))
EXPECTED = json.loads((FIXTURES / "sources-expected.json").read_text(encoding="utf-8"))


def build_tree(root: Path, files: dict[str, Any]) -> None:
    """Write ``files`` (relpath: text, or ``{"hex": bytes}``) below ``root``, as the reference script does."""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes.fromhex(data["hex"]) if isinstance(data, dict) else data.encode("utf-8"))


@pytest.fixture(scope="module")
def dlm_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dlm-tree")
    build_tree(root, TREE["files"])
    return root


def test_the_recorded_cases_are_the_cases_of_the_tree_description() -> None:
    assert list(EXPECTED["cases"]) == [case["name"] for case in TREE["cases"]]


@pytest.mark.parametrize("case", TREE["cases"], ids=[case["name"] for case in TREE["cases"]])
def test_the_files_read_and_their_order_are_dlms(dlm_tree: Path, case: dict[str, Any]) -> None:
    document = dlm_tree / case["document"]
    got = expand_sources([SourceDirective(**case["directive"])], doc_dir=document.parent, document=document)
    assert [section.source for section in got.sections] == EXPECTED["cases"][case["name"]]


# -- small trees ---------------------------------------------------------------------------


def make_tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return root


def expand(doc_dir: Path, path: str = "src", policy: str = "permissive", **kw: Any) -> SourceExpansion:
    return expand_sources([SourceDirective(path=path, **kw)], doc_dir=doc_dir, policy=policy)


def rels(expansion: SourceExpansion) -> list[str]:
    return [s.source for s in expansion.sections if s.source is not None]


def test_files_come_out_in_path_order_a_folder_where_its_name_sorts(tmp_path: Path) -> None:
    names = ["a.py", "a/b.py", "a-b.py", "A.py", "a/b/c.py", "a.b/c.py", "a0"]
    make_tree(tmp_path / "src", {name: name for name in reversed(names)})
    assert rels(expand(tmp_path)) == ["A.py", "a/b/c.py", "a/b.py", "a-b.py", "a.b/c.py", "a.py", "a0"]


def test_a_training_yaml_include_replaces_the_directives_below_its_folder(tmp_path: Path) -> None:
    make_tree(
        tmp_path / "src",
        {
            "a.md": "",
            "a.py": "",
            "lib/.dlm/training.yaml": "include: ['**/*.py']\n",
            "lib/b.md": "",
            "lib/b.py": "",
        },
    )
    assert rels(expand(tmp_path, include=["**/*.md"])) == ["a.md", "lib/b.py"]


def test_training_yaml_include_globs_are_relative_to_the_directive_root_as_in_dlm(tmp_path: Path) -> None:
    make_tree(
        tmp_path / "src",
        {"lib/.dlm/training.yaml": "include: ['*.py', 'lib/*.md']\n", "lib/b.md": "", "lib/b.py": ""},
    )
    assert rels(expand(tmp_path)) == ["lib/b.md"]


def test_training_yaml_excludes_are_relative_to_their_folder(tmp_path: Path) -> None:
    make_tree(
        tmp_path / "src",
        {
            "docs/.dlm/training.yaml": "exclude: ['*.bak']\n",
            "docs/a.bak": "",
            "docs/sub/b.bak": "",
            "c.bak": "",
        },
    )
    assert rels(expand(tmp_path)) == ["c.bak", "docs/sub/b.bak"]


def test_the_nearest_training_yaml_decides_whether_the_defaults_apply(tmp_path: Path) -> None:
    make_tree(
        tmp_path / "src",
        {
            "v/.dlm/training.yaml": "exclude_defaults: false\n",
            "v/a.pyc": "",
            "v/inner/.dlm/training.yaml": "metadata: {kind: vendored}\n",
            "v/inner/b.pyc": "",
            "c.pyc": "",
        },
    )
    assert rels(expand(tmp_path)) == ["v/.dlm/training.yaml", "v/a.pyc"]


def test_a_directives_default_excludes_false_holds_below_every_training_yaml(tmp_path: Path) -> None:
    make_tree(
        tmp_path / "src", {"v/.dlm/training.yaml": "exclude_defaults: true\n", "v/a.pyc": "", "b.pyc": ""}
    )
    assert rels(expand(tmp_path, default_excludes=False)) == ["b.pyc", "v/.dlm/training.yaml", "v/a.pyc"]


def test_an_ignore_negation_re_includes_what_a_default_an_exclude_or_a_training_yaml_dropped(
    tmp_path: Path,
) -> None:
    make_tree(
        tmp_path / "src",
        {
            ".dlm/training.yaml": "exclude: ['*.log']\n",
            ".dlm/ignore": "!.env.example\n!keep.log\n!x.tmp\n",
            ".env.example": "",
            ".env": "",
            "keep.log": "",
            "other.log": "",
            "x.tmp": "",
        },
    )
    assert rels(expand(tmp_path, exclude=["*.tmp"])) == [".env.example", "keep.log", "x.tmp"]


def test_ignore_rules_follow_dlm_anchoring_and_folder_rules(tmp_path: Path) -> None:
    make_tree(
        tmp_path / "src",
        {
            ".dlm/ignore": "/top.txt\ndocs/*.md\nout/\n/gen/\nlogs\n",
            "top.txt": "",
            "sub/top.txt": "",
            "docs/a.md": "",
            "x/docs/b.md": "",  # unanchored: any part after a "/" may match
            "x/out/c.txt": "",  # a folder named out at any depth
            "gen/d.txt": "",  # "/gen/" matches nothing in DLM
            "logs/e.txt": "",  # "logs" names files, not a folder's contents
            "f/logs": "",
        },
    )
    assert rels(expand(tmp_path)) == ["gen/d.txt", "logs/e.txt", "sub/top.txt"]


def test_within_an_ignore_file_the_last_matching_rule_wins(tmp_path: Path) -> None:
    make_tree(tmp_path / "a", {".dlm/ignore": "*.log\n!keep.log\n", "keep.log": "", "x.log": ""})
    make_tree(tmp_path / "b", {".dlm/ignore": "!keep.log\n*.log\n", "keep.log": "", "x.log": ""})
    assert rels(expand(tmp_path, "a")) == ["keep.log"]
    assert rels(expand(tmp_path, "b")) == []


def test_rules_of_a_nested_ignore_file_are_relative_to_its_folder(tmp_path: Path) -> None:
    make_tree(
        tmp_path / "src",
        {
            "pkg/sub/.dlm/ignore": "/gen.txt\nout/\n",
            "pkg/sub/gen.txt": "",
            "pkg/sub/x/gen.txt": "",
            "pkg/sub/x/out/f.txt": "",
            "gen.txt": "",
            "out/g.txt": "",
        },
    )
    assert rels(expand(tmp_path)) == ["gen.txt", "out/g.txt", "pkg/sub/x/gen.txt"]


def test_a_dlm_folder_below_a_default_excluded_folder_still_applies(tmp_path: Path) -> None:
    make_tree(
        tmp_path / "src",
        {
            "node_modules/.dlm/ignore": "!*.js\n",
            "node_modules/a.js": "",
            "node_modules/b.css": "",
            "dist/c.js": "",
        },
    )
    got = expand(tmp_path)
    assert rels(got) == ["node_modules/a.js"]
    assert got.provenance[0].excluded_dirs == 1  # dist/, skipped unread


def test_folders_nothing_below_which_can_be_read_are_skipped_and_counted_once(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", {".git/objects/ab": "", ".git/config": "", "build/x.txt": "", "keep.txt": ""})
    got = expand(tmp_path)
    assert rels(got) == ["keep.txt"]
    assert (got.provenance[0].excluded_dirs, got.provenance[0].excluded) == (2, 0)


def test_a_single_file_directive_matches_its_name_against_the_globs_and_defaults(tmp_path: Path) -> None:
    make_tree(tmp_path, {"notes/today.md": "# Today\n", "notes/secrets.txt": "x"})
    assert rels(expand(tmp_path, "notes/today.md")) == ["today.md"]
    assert rels(expand(tmp_path, "notes/today.md", include=["*.txt"])) == []
    skipped = expand(tmp_path, "notes/secrets.txt")
    assert (rels(skipped), skipped.provenance[0].excluded) == ([], 1)
    assert rels(expand(tmp_path, "notes/secrets.txt", default_excludes=False)) == ["secrets.txt"]


def test_a_symlinked_single_file_is_named_after_its_target_as_in_dlm(tmp_path: Path) -> None:
    make_tree(tmp_path, {"notes/2024.md": "x"})
    (tmp_path / "latest.md").symlink_to(tmp_path / "notes/2024.md")
    assert rels(expand(tmp_path, "latest.md")) == ["2024.md"]


def test_a_document_in_a_dlm_folder_anchors_relative_paths_at_the_folders_parent(tmp_path: Path) -> None:
    make_tree(tmp_path / "corpus", {"ch1.md": "one", ".dlm/corpus.dlm": "---\n---\n", "sub/ch2.md": "two"})
    document = tmp_path / "corpus/.dlm/corpus.dlm"
    got = expand_sources(
        [SourceDirective(path=".")], doc_dir=document.parent, document=document, policy="strict"
    )
    assert rels(got) == ["ch1.md", "sub/ch2.md"]
    assert got.provenance[0].root == os.path.realpath(tmp_path / "corpus")
    nested = expand_sources([SourceDirective(path="sub")], doc_dir=document.parent, policy="strict")
    assert rels(nested) == ["ch2.md"]


def test_strict_policy_confines_a_dlm_folder_document_to_the_folders_parent(tmp_path: Path) -> None:
    make_tree(tmp_path, {"corpus/.dlm/corpus.dlm": "", "elsewhere/a.md": ""})
    with pytest.raises(
        SourceError, match="outside the document's directory " + str(os.path.realpath(tmp_path / "corpus"))
    ):
        expand_sources(
            [SourceDirective(path="../elsewhere")], doc_dir=tmp_path / "corpus/.dlm", policy="strict"
        )


def test_names_holding_a_newline_get_dlms_answer(tmp_path: Path) -> None:
    # DLM's "**" is ".*", which stops at a newline: "**/*.pyc" misses the first
    # file, "**/*" (the default include) misses the folder with a newline.
    make_tree(
        tmp_path / "src", {"__pycache__/odd\nname.txt": "", "a.pyc": "", "new\ndir/x.py": "", "ok.py": ""}
    )
    assert rels(expand(tmp_path)) == ["__pycache__/odd\nname.txt", "ok.py"]
    assert rels(expand(tmp_path, include=["new*/*.py"])) == ["new\ndir/x.py"]


# -- training.yaml and ignore: warnings and errors -------------------------------------------


def test_metadata_and_weights_do_not_change_the_files_and_warn_nothing(tmp_path: Path) -> None:
    make_tree(
        tmp_path / "src",
        {
            ".dlm/training.yaml": "metadata: {lang: py}\nweights:\n  lang: {py: 2.5}\n",
            "a.py": "",
            "sub/.dlm/training.yaml": "metadata: {lang: md}\n",
            "sub/b.md": "",
        },
    )
    got = expand(tmp_path)
    assert rels(got) == ["a.py", "sub/b.md"]
    assert got.warnings == ()


def test_ignore_lines_dlm_drops_are_dropped_with_a_warning(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", {".dlm/ignore": "!\n/\n*.tmp\n", "a.tmp": "", "b.txt": ""})
    got = expand(tmp_path)
    assert rels(got) == ["b.txt"]
    where = f"training.sources 'src': {os.path.realpath(tmp_path / 'src')}/.dlm/ignore: ignoring"
    assert got.warnings == (f"{where} line 1: '!' with no pattern", f"{where} line 2: '/' with no pattern")


def yaml_error(tmp_path: Path, text: str | bytes) -> SourceError:
    make_tree(tmp_path / "src", {"pkg/.dlm/training.yaml": text, "a.txt": ""})
    with pytest.raises(SourceError) as caught:
        expand(tmp_path)
    return caught.value


def where(tmp_path: Path, line: int) -> str:
    return f"training.sources 'src': {os.path.realpath(tmp_path / 'src')}/pkg/.dlm/training.yaml:{line}"


KEYS = "keys: dlm_training_version, include, exclude, exclude_defaults, metadata, weights"


@pytest.mark.parametrize(
    ("text", "line", "message", "hint"),
    [
        (
            "include: [a\n",
            2,
            "invalid YAML: expected ',' or ']', but got '<stream end>'",
            "fix the file, or remove it",
        ),
        ("- a\n- b\n", 1, "must be a mapping of keys to values, not list", KEYS),
        ("exclude: []\nexlcude_defaults: false\n", 2, "unknown key 'exlcude_defaults'", KEYS),
        (
            "include: '*.py'\n",
            1,
            "include: input should be a valid tuple (got '*.py')",
            "fix the file, or remove it",
        ),
        (
            "exclude:\n  - a\n  - 3\n",
            3,
            "exclude.1: input should be a valid string (got 3)",
            "fix the file, or remove it",
        ),
        (
            "exclude_defaults: maybe\n",
            1,
            "exclude_defaults: input should be a valid boolean, unable to interpret input (got 'maybe')",
            "fix the file, or remove it",
        ),
        (
            "dlm_training_version: 2\n",
            1,
            "dlm_training_version: input should be 1 (got 2)",
            "fix the file, or remove it",
        ),
        (
            "weights:\n  lang:\n    py: -1\n",
            3,
            "weights.lang.py: must be 0 or more, not -1.0",
            "fix the file, or remove it",
        ),
        (
            "include: []\ninclude: ['*.md']\n",
            2,
            "duplicate key 'include' (first at line 1)",
            "fix the file, or remove it",
        ),
    ],
)
def test_a_malformed_training_yaml_is_an_error_naming_file_line_and_problem(
    tmp_path: Path, text: str, line: int, message: str, hint: str
) -> None:
    error = yaml_error(tmp_path, text)
    assert str(error) == f"{where(tmp_path, line)}: {message}"
    assert error.hint == hint


def test_an_empty_training_yaml_is_valid_and_turns_the_defaults_back_on(tmp_path: Path) -> None:
    make_tree(
        tmp_path / "src",
        {
            ".dlm/training.yaml": "exclude_defaults: false\n",
            "v/.dlm/training.yaml": "",
            "v/a.pyc": "",
            "b.pyc": "",
        },
    )
    assert rels(expand(tmp_path)) == [".dlm/training.yaml", "b.pyc"]


@pytest.mark.parametrize("name", ["training.yaml", "ignore"])
def test_a_dlm_file_that_is_not_utf8_is_an_error(tmp_path: Path, name: str) -> None:
    make_tree(tmp_path / "src", {f".dlm/{name}": b"exclude: ['caf\xe9']\n", "a.txt": ""})
    with pytest.raises(SourceError) as caught:
        expand(tmp_path)
    path = f"{os.path.realpath(tmp_path / 'src')}/.dlm/{name}"
    assert str(caught.value) == f"training.sources 'src': {path}: not valid UTF-8 (byte 14)"
    assert caught.value.hint == "save it as UTF-8"


@pytest.mark.parametrize("policy", ["strict", "permissive"])
@pytest.mark.parametrize("name", ["training.yaml", "ignore"])
def test_an_unreadable_dlm_file_is_an_error_under_either_policy(
    tmp_path: Path, name: str, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tests run as root, where chmod 000 does not deny a read: deny the open itself.
    make_tree(tmp_path / "src", {f".dlm/{name}": "secret.txt\n", "a.txt": "", "secret.txt": ""})
    real_open = os.open

    def deny(path: Any, *args: Any, **kw: Any) -> int:
        if str(path).endswith(f".dlm/{name}"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kw)

    monkeypatch.setattr(os, "open", deny)
    with pytest.raises(SourceError) as caught:
        expand(tmp_path, policy=policy)
    path = f"{os.path.realpath(tmp_path / 'src')}/.dlm/{name}"
    assert str(caught.value) == f"training.sources 'src': cannot read {path}: Permission denied"


@pytest.mark.parametrize("policy", ["strict", "permissive"])
@pytest.mark.parametrize("name", ["training.yaml", "ignore"])
@pytest.mark.parametrize(
    ("make", "what"),
    [
        (os.mkfifo, "is a FIFO, not a regular file"),
        (lambda path: os.symlink(path + ".gone", path), "is a symlink to a missing file"),
    ],
    ids=["fifo", "dangling-symlink"],
)
def test_a_dlm_file_that_cannot_be_read_as_a_file_fails_closed_without_hanging(
    tmp_path: Path, name: str, policy: str, make: Any, what: str
) -> None:
    # DLM reads the tree without the rules of such a file; its exclusions
    # would silently vanish. A FIFO is read non-blocking, so this never hangs.
    make_tree(tmp_path / "src", {"a.txt": "", "secret.txt": ""})
    path = f"{os.path.realpath(tmp_path / 'src')}/.dlm/{name}"
    os.mkdir(os.path.dirname(path))
    make(path)
    with pytest.raises(SourceError) as caught:
        expand(tmp_path, policy=policy)
    assert str(caught.value).startswith(f"training.sources 'src': {path} {what}, so its rules cannot be")


def test_a_folder_named_like_a_dlm_file_is_no_file_as_in_dlm(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", {".dlm/training.yaml/x": "", ".dlm/ignore/y": "", "a.pyc": "", "b.txt": ""})
    assert rels(expand(tmp_path)) == ["b.txt"]


# -- property: the walk's name tests and folder skipping agree with DLM's rule-by-rule decision --

NAMES = [
    "a",
    "b.py",
    "a.py",
    "x.txt",
    ".env",
    "prod.env",
    "build",
    "node_modules",
    "__pycache__",
    "m.pyc",
    "gen",
]
GLOBS = ["**/*", "**/*.py", "*.py", "a/**", "**/*.txt", "**/b*", "**", "**/gen/**", "a/*.py"]
IGNORE_LINES = ["*.py", "!a.py", "/x.txt", "build/", "!build/", "a/", "!*.env", "!m.pyc", "gen", "!gen/**"]

trees = st.recursive(
    st.dictionaries(st.sampled_from(NAMES), st.just(""), max_size=4),
    lambda children: st.dictionaries(st.sampled_from(NAMES), children, min_size=1, max_size=3),
    max_leaves=12,
)
folders = st.fixed_dictionaries(
    {},
    optional={
        "include": st.lists(st.sampled_from(GLOBS), min_size=1, max_size=2),
        "exclude": st.lists(st.sampled_from(GLOBS), max_size=2),
        "exclude_defaults": st.booleans(),
        "ignore": st.lists(st.sampled_from(IGNORE_LINES), min_size=1, max_size=3),
    },
)


def write_tree(root: Path, tree: dict[str, Any], config: dict[str, Any] | None) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, child in tree.items():
        if isinstance(child, dict):
            write_tree(root / name, child, None)
        else:
            (root / name).write_text(name)
    if config:
        (root / ".dlm").mkdir(exist_ok=True)
        settings = {key: value for key, value in config.items() if key != "ignore"}
        (root / ".dlm/training.yaml").write_text(json.dumps(settings))
        if "ignore" in config:
            (root / ".dlm/ignore").write_text("\n".join(config["ignore"]) + "\n")


def decided_file_by_file(root: Path, directive: SourceDirective) -> list[str]:
    """DLM's way: every file, in Path order, through the rules of every .dlm/ folder above it."""
    chosen = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        scope = Scope.root(directive)
        parts = rel.split("/")[:-1]
        for depth in range(len(parts) + 1):
            anchor = "/".join(parts[:depth])
            if (root / anchor / ".dlm").is_dir():
                scope = scope.enter(load_folder(str(root / anchor), anchor, label="t"))
        if scope.included_exactly(rel):
            chosen.append(rel)
    return chosen


@settings(max_examples=60)
@given(
    tree=trees,
    top=st.one_of(st.none(), folders),
    deeper=folders,
    include=st.lists(st.sampled_from(GLOBS), min_size=1, max_size=2),
    exclude=st.lists(st.sampled_from(GLOBS), max_size=2),
)
def test_the_walk_agrees_with_deciding_every_file_by_dlms_rules(
    tree: dict[str, Any],
    top: dict[str, Any] | None,
    deeper: dict[str, Any],
    include: list[str],
    exclude: list[str],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "src"
        write_tree(root, tree, top)
        subfolders = sorted(p for p in root.rglob("*") if p.is_dir() and ".dlm" not in p.parts)
        if subfolders and deeper:
            write_tree(subfolders[len(subfolders) // 2], {}, deeper)
        directive = SourceDirective(path="src", include=include, exclude=exclude)
        got = expand_sources([directive], doc_dir=Path(tmp))
        assert [s.source for s in got.sections] == decided_file_by_file(root, directive)

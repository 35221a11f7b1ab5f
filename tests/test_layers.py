"""The layers of dlmstore/ run one way (docs/architecture.md, pyproject.toml's import-linter contract).

Every import counts: top-level, inside a function, under ``TYPE_CHECKING``.
The graph is grimp's (import-linter's own reader), so these tests and
``lint-imports`` in ``make lint`` see the same edges.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dlmstore"
MAX_MODULES_PER_FOLDER = 15


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("dlmstore", cache_dir=None)


def _layers() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["id"] == "layers"]
    return [[name.strip() for name in layer.split("|")] for layer in contract["layers"]]


def _unit(module: str) -> str:
    """The layer unit a module belongs to: its sub-package, or itself for a top-level module."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _module_edges() -> dict[str, set[str]]:
    graph = _graph()
    return {module: graph.find_modules_directly_imported_by(module) - {module} for module in graph.modules}


def test_every_import_in_dlmstore_keeps_the_layer_contract() -> None:
    # In a child process: lint_imports configures logging with dictConfig, which disables every
    # logger that exists at the time (dlmstore's own included) for the rest of the test session.
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_module_imports_a_module_that_imports_it_back() -> None:
    assert _cycles(_module_edges()) == []


def test_no_two_packages_import_each_other() -> None:
    imports: dict[str, set[str]] = defaultdict(set)
    for module, targets in _module_edges().items():
        for target in targets:
            if _unit(module) != _unit(target) and _unit(target) != "dlmstore.__init__":
                imports[_unit(module)].add(_unit(target))
    pairs = sorted(
        (a, b) for a, targets in imports.items() for b in targets if a < b and a in imports.get(b, set())
    )
    assert pairs == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_contract_places_every_sub_package_and_top_level_module_once() -> None:
    placed = [name for layer in _layers() for name in layer]
    units = {
        f"dlmstore.{path.stem if path.is_file() else path.name}"
        for path in PACKAGE.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()
    }
    assert sorted(placed) == sorted(units)


def test_architecture_md_draws_the_layers_in_the_contract_order() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    diagram = text.split("## Layers", 1)[1].split("```")[1]
    drawn = [
        match.group(1).replace("/", ".").removesuffix(".py").rstrip(".")
        for match in re.finditer(r"^ (dlmstore/[a-z_]+(?:/|\.py))", diagram, re.M)
    ]
    in_contract = [name for layer in _layers() for name in layer]
    assert drawn == in_contract


@pytest.mark.parametrize(
    "folder", sorted({p.parent for p in PACKAGE.rglob("__init__.py")}), ids=lambda p: str(p.relative_to(ROOT))
)
def test_no_folder_holds_more_than_fifteen_modules(folder: Path) -> None:
    modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
    assert len(modules) <= MAX_MODULES_PER_FOLDER


def _imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_migrations_import_only_the_store() -> None:
    imported = {
        name
        for path in (ROOT / "migrations").rglob("*.py")
        for name in _imported_names(path)
        if name.startswith("dlmstore.")
    }
    assert imported and all(name.startswith("dlmstore.store.") for name in imported)


def test_setuptools_installs_every_package_of_the_tree() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(path.parent.relative_to(ROOT).parts) for path in PACKAGE.rglob("__init__.py")} | {
        "dlmstore.cli",
        "dlmstore.migrations",
        "dlmstore.migrations.versions",
    }
    assert sorted(config["packages"]) == sorted(on_disk)

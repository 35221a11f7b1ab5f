"""The tree is the architecture: layers as sub-packages, one meaning per module name."""

from __future__ import annotations

import ast
from collections import defaultdict

from .helpers import REPO

LIBRARY = REPO / "dlmstore"

#: Basenames that may repeat because they mean the same thing in each
#: sub-package: the package marker, and the module backing the `show` verb
#: of a command group (`dlm show`, `dlm data show`).
SHARED_MEANING = {"__init__.py", "show.py"}


def _library_modules() -> list[str]:
    return sorted(
        str(path.relative_to(REPO))
        for path in LIBRARY.rglob("*.py")
        if not {"cli", "migrations"} & set(path.relative_to(LIBRARY).parts)
    )


def test_no_two_library_modules_share_a_name_that_means_different_things() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for module in _library_modules():
        by_name[module.rsplit("/", 1)[-1]].append(module)
    repeated = {
        name: paths for name, paths in by_name.items() if len(paths) > 1 and name not in SHARED_MEANING
    }
    assert repeated == {}


def test_the_library_never_imports_the_cli_or_the_migrations() -> None:
    """cli/ and migrations/ install as dlmstore.cli and dlmstore.migrations from folders beside dlmstore/."""
    offenders = []
    for module in _library_modules():
        tree = ast.parse((REPO / module).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            if any(
                name in ("dlmstore.cli", "dlmstore.migrations")
                or name.startswith(("dlmstore.cli.", "dlmstore.migrations."))
                for name in names
            ):
                offenders.append(f"{module}:{node.lineno}")
    assert offenders == []


def test_every_layer_the_architecture_document_names_is_a_sub_package() -> None:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    packages = sorted(p.name for p in LIBRARY.iterdir() if (p / "__init__.py").is_file())
    for name in packages:
        if name in {"cli", "migrations"}:
            continue
        assert f"dlmstore/{name}/" in text, f"docs/architecture.md does not place dlmstore/{name}/"


def test_the_only_flat_library_modules_are_plumbing_and_the_base_model_resolver() -> None:
    # base_registry.py is the resolver's data (DLM's named bases), kept out of
    # bases.py so the table reads on its own; two modules do not make a layer.
    # plural.py and progress.py are plumbing every layer uses (counted words,
    # progress tasks), like clock.py and errors.py; so is collector.py (the
    # garbage collector paused while a corpus is built), determinism.py (the
    # seeds and flags training sets and the lock records), id_arrays.py (ids
    # packed as one blob, for the cache's use log and the sources' proofs) and
    # fingerprint.py (a tokenizer's identity, which the cache, the prefix
    # cache, the datasets and training all key on): helpers two layers share
    # sink below both (docs/architecture.md). torch_loader.py is the one way
    # torch is imported (the base's conversion and every command that runs a
    # model), below bases.py, which needs it.
    flat = sorted(p.name for p in LIBRARY.glob("*.py"))
    assert flat == [
        "__init__.py",
        "base_registry.py",
        "bases.py",
        "clock.py",
        "collector.py",
        "determinism.py",
        "errors.py",
        "fingerprint.py",
        "home.py",
        "id_arrays.py",
        "plural.py",
        "progress.py",
        "torch_loader.py",
        "ulid.py",
    ]

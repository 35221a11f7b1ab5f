"""A non-editable install works from anywhere: `dlm --help` and migrating a new store."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .helpers import REPO, VALID_ID


def test_a_non_editable_install_runs_dlm_and_migrates_a_new_store(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("dlmstore", "cli", "migrations"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    # --target, not --prefix: pip would uninstall the editable dlmstore of
    # the running environment before installing into a prefix.
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    assert (site / "dlmstore" / "cli" / "main.py").is_file()
    assert (site / "dlmstore" / "migrations" / "versions" / "0001_store_info.py").is_file()
    assert not (site / "cli").exists() and not (site / "migrations").exists()
    assert Path(sys.executable).with_name("dlm").is_file()  # the editable install is untouched

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "DLM_HOME": str(tmp_path / "home")}
    help_run = subprocess.run(
        [str(site / "bin" / "dlm"), "--help"], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert help_run.returncode == 0, help_run.stderr
    assert "Usage: dlm" in help_run.stdout

    code = (
        "import dlmstore, dlmstore.migrations; from dlmstore.store.database import open_store; "
        f"s = open_store({VALID_ID!r}); print(dlmstore.__file__); print(dlmstore.migrations.__file__)"
    )
    migrate_run = subprocess.run(
        [sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert migrate_run.returncode == 0, migrate_run.stderr
    assert all(line.startswith(str(site)) for line in migrate_run.stdout.splitlines())
    assert (tmp_path / "home" / "store" / VALID_ID / "store.db").is_file()


def test_every_package_in_the_tree_is_listed_for_installation() -> None:
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {"dlmstore"}
    for init in (REPO / "dlmstore").rglob("__init__.py"):
        found.add(".".join(("dlmstore", *init.parent.relative_to(REPO / "dlmstore").parts)).rstrip("."))
    found |= {"dlmstore.cli", "dlmstore.migrations", "dlmstore.migrations.versions"}
    assert found == listed


def test_every_package_dlmstore_imports_is_a_declared_dependency() -> None:
    """A package that only arrives with another (tqdm with transformers) is declared all the same."""
    import ast
    import importlib.metadata
    import re
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = [
        *project["dependencies"],
        *(d for extra in project["optional-dependencies"].values() for d in extra),
    ]
    declared = {re.split(r"[<>=!~\[; ]", spec)[0].lower().replace("_", "-") for spec in wanted}
    imported: set[str] = set()
    for path in [*(REPO / "dlmstore").rglob("*.py"), *(REPO / "cli").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
            elif (  # importlib.import_module("transformers.utils.logging")
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                imported.add(node.args[0].value.split(".")[0])
    third_party = sorted(imported - set(sys.stdlib_module_names) - {"dlmstore", "__future__"})
    providers = importlib.metadata.packages_distributions()
    undeclared = [
        module
        for module in third_party
        if not any(dist.lower().replace("_", "-") in declared for dist in providers.get(module, [module]))
    ]
    assert "tqdm" in third_party and undeclared == []

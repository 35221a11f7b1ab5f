"""Record which files DocumentLanguageModel's training.sources expansion picks.

    PYTHONPATH=/path/to/dlm/src python scripts/dlm-reference-sources.py /path/to/dlm/src

Builds the tree described in ``tests/fixtures/dlm/sources-tree.json`` in a
temporary directory, runs DLM's own ``dlm.directives.expand_sources`` on
each case there (a document whose frontmatter holds the case's directive)
and writes ``tests/fixtures/dlm/sources-expected.json``: per case, the
relpaths of the files DLM read, in its order. ``tests/test_sources_dlm.py``
builds the same tree and checks that dlmstore picks the same files in the
same order.

DLM's ``dlm.directives`` imports ``dlm.store.blobs.BlobStore`` for image and
audio files, and a bare source checkout may lack ``dlm.store``; only that
missing import is stubbed (with an empty class; the tree holds no images or
audio, and no blob store is passed). Nothing else of DLM is replaced. Run it
again, and commit the JSON, when the tree description changes or to check a
newer DLM.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import logging
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "tests/fixtures/dlm/sources-tree.json"
EXPECTED = ROOT / "tests/fixtures/dlm/sources-expected.json"
DLM_ID = "01HZZZZZZZZZZZZZZZZZZZZZZZ"


def build_tree(root: Path, files: dict[str, Any]) -> None:
    """Write ``files`` (relpath: text, or ``{"hex": bytes}``) below ``root``."""
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes.fromhex(data["hex"]) if isinstance(data, dict) else data.encode("utf-8"))


def import_directives(checkout: Path) -> Any:
    """DLM's ``dlm.directives.expand`` from ``checkout``, stubbing only a missing ``dlm.store``."""
    sys.path.insert(0, str(checkout))
    try:
        importlib.import_module("dlm.store.blobs")
    except ModuleNotFoundError:
        store = types.ModuleType("dlm.store")
        store.__path__ = []
        blobs = types.ModuleType("dlm.store.blobs")
        blobs.BlobStore = type("BlobStore", (), {})  # type: ignore[attr-defined]
        sys.modules.update({"dlm.store": store, "dlm.store.blobs": blobs})
    return importlib.import_module("dlm.directives.expand")


def directives_digest(checkout: Path) -> str:
    """sha256 of DLM's directive sources, naming the DLM the fixture came from."""
    digest = hashlib.sha256()
    for path in sorted((checkout / "dlm/directives").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return "sha256:" + digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="DLM's src/ directory (holding dlm/)")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    expand = import_directives(checkout)
    from dlm.doc.parser import parse_text  # after the path is set

    logging.disable(logging.WARNING)  # DLM logs each skipped file
    description = json.loads(TREE.read_text(encoding="utf-8"))
    results: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_tree(root, description["files"])
        for case in description["cases"]:
            document = root / case["document"]
            frontmatter = {
                "dlm_id": DLM_ID,
                "base_model": "smollm2-135m",
                "training": {"sources": [case["directive"]]},
            }
            parsed = parse_text(f"---\n{json.dumps(frontmatter)}\n---\n\nbody\n", path=document)
            result = expand.expand_sources(parsed, base_path=document.parent)
            results[case["name"]] = [
                _relpath(section.content, description["files"]) for section in result.sections
            ]
    EXPECTED.write_text(
        json.dumps(
            {
                "generated_by": "scripts/dlm-reference-sources.py",
                "dlm_directives": directives_digest(checkout),
                "cases": results,
            },
            indent=1,
            ensure_ascii=False,
        )
        + "\n",
        encoding="utf-8",
    )
    print(
        f"wrote {EXPECTED.relative_to(ROOT)}: {sum(map(len, results.values()))} files in {len(results)} cases"
    )
    return 0


def _relpath(content: str, files: dict[str, Any]) -> str:
    """The relpath of a section ``# source: <relpath>\\n\\n<text>``, safe for names holding a newline."""
    for rel, data in files.items():
        parts = rel.split("/")
        for tail in ("/".join(parts[i:]) for i in range(len(parts))):
            if isinstance(data, str) and content == f"# source: {tail}\n\n{data}":
                return tail
    raise SystemExit(f"error: no file of the tree gives the section {content[:80]!r}")


if __name__ == "__main__":
    sys.exit(main())

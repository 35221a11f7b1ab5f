"""Write the rows DocumentLanguageModel (DLM) makes of the parity corpus.

``tests/test_dlm_parity.py`` proves that dlmstore reads DLM's documents as
DLM does: for every document in ``tests/fixtures/dlm/docs/`` it compares
dlmstore's training rows with the rows this script recorded from DLM's own
code. DLM is not a dependency of dlmstore (it drags in torch and a training
stack), so its answers are recorded once and committed as fixtures:

* ``tests/fixtures/dlm/expected/<doc stem>.jsonl``: DLM's rows for each
  accepted document, in order, one JSON object per line (sorted keys,
  non-ASCII kept as is). The rows are what DLM trains on:
  ``dlm.doc.parser.parse_file``, then ``dlm.directives.expand_sources`` for
  a document with ``training.sources`` (relative paths anchored at the
  document's folder, as ``dlm train`` does), then
  ``dlm.data.sections_to_rows``, with DLM's private ``_dlm_*`` keys
  (section id, row tags) dropped.
* ``tests/fixtures/dlm/expected/refused.json``: for every document in
  ``tests/fixtures/dlm/refused/``, what DLM makes of it: the error class and
  message it stops with, and at which step (``parse_file``,
  ``expand_sources``, ``sections_to_rows``), or ``accepted`` and its row
  count when it trains the document (image and audio sections are counted
  apart: their rows need DLM's blob store). The parity test uses it to tell
  a refusal both tools share from one that is dlmstore's own choice.

The script fails (exit 1) when DLM refuses a document in ``docs/``: a
document there must be one DLM accepts.

Re-run it, and commit what changes, whenever a document or tree under
``tests/fixtures/dlm/`` is added or edited, or to check dlmstore against a
newer DLM release, with the Python of dlmstore's virtualenv::

    .venv/bin/python scripts/dlm-reference-rows.py --dlm-src /path/to/dlm/src

then run ``tests/test_dlm_parity.py``. A row that differs is either a
dlmstore bug (fix it) or a DLM change (decide whether dlmstore follows).
DLM logs warnings of its own while it reads (a stripped BOM, a skipped
non-UTF-8 file, "symlink ... escapes" for the ``../trees`` paths, which are
not symlinks): they are DLM's, and expected.

``--dlm-src`` is the folder holding DLM's ``dlm`` package (a checkout's
``src/``). Only DLM's parser, directives and row code are imported, and
their own dependencies (pydantic, PyYAML) are dlmstore's too. DLM's
``dlm.directives.expand`` imports ``dlm.store.blobs`` only to name the type
of its ``blob_store`` argument; when that module is missing (a partial
checkout), a stand-in class is registered under its name. Nothing calls it:
``blob_store=None`` is how DLM's own read-only commands expand sources (image
and audio files are then counted, not read).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "dlm"


def _import_dlm(src: Path) -> dict[str, Any]:
    """DLM's parse, expand and rows functions, imported from ``src``."""
    sys.path.insert(0, str(src))
    try:
        importlib.import_module("dlm.store.blobs")
    except ModuleNotFoundError as exc:
        if exc.name not in ("dlm.store", "dlm.store.blobs"):
            raise
        # Only the name is needed (a type annotation in dlm.directives.expand).
        store = types.ModuleType("dlm.store")
        blobs = types.ModuleType("dlm.store.blobs")
        blobs.BlobStore = type("BlobStore", (), {"__doc__": "Stand-in: never called."})  # type: ignore[attr-defined]
        store.blobs = blobs  # type: ignore[attr-defined]
        sys.modules.update({"dlm.store": store, "dlm.store.blobs": blobs})
    from dlm.data.sections_to_rows import sections_to_rows
    from dlm.directives import expand_sources
    from dlm.doc.parser import parse_file

    return {"parse_file": parse_file, "expand_sources": expand_sources, "sections_to_rows": sections_to_rows}


def dlm_rows(dlm: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    """DLM's training rows of the document at ``path``, without ``_dlm_*`` keys."""
    rows, media = _stages(dlm, path)
    if media:
        raise ValueError(f"{media} image/audio sections: their rows need DLM's blob store")
    return rows


def _stages(dlm: dict[str, Any], path: Path) -> tuple[list[dict[str, Any]], int]:
    """The text rows of ``path`` and how many media sections were left out.

    A refusal raises :class:`StageError` naming the DLM step that made it:
    the parser, the source expansion or the row grammar.
    """
    parsed = _step("parse_file", dlm["parse_file"], path)
    sections = list(parsed.sections)
    if parsed.frontmatter.training.sources:
        sections.extend(
            _step("expand_sources", dlm["expand_sources"], parsed, base_path=path.parent).sections
        )
    # Image and audio rows carry blob bytes that only a DLM store can supply.
    text = [section for section in sections if section.type.value not in ("image", "audio")]
    rows = _step("sections_to_rows", dlm["sections_to_rows"], text)
    clean = [{key: value for key, value in row.items() if not key.startswith("_dlm_")} for row in rows]
    return clean, len(sections) - len(text)


class StageError(Exception):
    """DLM refused a document; the message names the step and DLM's error."""


def _step(name: str, function: Any, *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, with what it raises re-raised as a :class:`StageError`."""
    try:
        return function(*args, **kwargs)
    except Exception as exc:
        raise StageError(f"{name}: {type(exc).__name__}: {exc}") from exc


def _verdict(dlm: dict[str, Any], path: Path) -> str:
    """``accepted: N rows``, or the step and error DLM stops with (paths made relative)."""
    try:
        rows, media = _stages(dlm, path)
    except StageError as exc:
        return str(exc).replace(str(path.parent) + "/", "")
    verdict = f"accepted: {len(rows)} rows"
    if media:
        verdict += f" and {media} image/audio sections (their rows need DLM's blob store)"
    return verdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dlm-src", type=Path, required=True, help="folder holding DLM's `dlm` package")
    args = parser.parse_args(argv)
    if not (args.dlm_src / "dlm" / "doc" / "parser.py").is_file():
        parser.error(f"{args.dlm_src} does not hold DLM's source (no dlm/doc/parser.py)")
    dlm = _import_dlm(args.dlm_src.resolve())

    expected = FIXTURES / "expected"
    expected.mkdir(exist_ok=True)
    for old in expected.glob("*.jsonl"):
        old.unlink()
    failed = False
    for path in sorted((FIXTURES / "docs").glob("*.dlm")):
        try:
            rows = dlm_rows(dlm, path)
        except (StageError, ValueError) as exc:
            print(f"error: DLM refuses {path.name}: {exc}", file=sys.stderr)
            failed = True
            continue
        lines = [json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n" for row in rows]
        (expected / f"{path.stem}.jsonl").write_text("".join(lines), encoding="utf-8")
        print(f"{path.name}: {len(rows)} rows")

    verdicts = {path.name: _verdict(dlm, path) for path in sorted((FIXTURES / "refused").glob("*.dlm"))}
    (expected / "refused.json").write_text(
        json.dumps(verdicts, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    print(
        f"refused/: {len(verdicts)} documents, {sum(v.startswith('accepted') for v in verdicts.values())} accepted by DLM"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

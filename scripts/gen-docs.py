"""Regenerate docs/schema.md and docs/cli.md from the code (see scripts/docgen.py)."""

from __future__ import annotations

from pathlib import Path

from docgen import generated_docs  # scripts/ is on sys.path when this file runs

root = Path(__file__).resolve().parent.parent
for path, text in generated_docs(root).items():
    old = path.read_text(encoding="utf-8") if path.exists() else None
    if old != text:
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(root)}")
    else:
        print(f"unchanged {path.relative_to(root)}")

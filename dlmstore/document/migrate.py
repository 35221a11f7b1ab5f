"""``dlm migrate``: rewrite a document's frontmatter at the current DLM version.

Reading an older document never needs this (``dlmstore.document.versions``
upgrades it in memory on every read); migrating writes the upgrade down, so
the file says what it means. What changes:

* ``dlm_version`` is set to :data:`CURRENT_DLM_VERSION` (added after
  ``dlm_id`` when the document has none);
* dlmstore's pre-DLM key names are renamed (``training.r`` ->
  ``training.lora_r``, see ``versions.LEGACY_KEYS``);
* a version-1 ``training.dpo`` block becomes ``training.preference``.

Edits are made in place, line by line, so comments, key order, quoting and
line endings survive; only the ``training.dpo`` rewrite has to re-emit the
frontmatter as YAML, which drops its comments (the result says so). The
body is never touched. The new text must parse as a valid document before
anything is written; then the original is copied to ``<path>.bak`` (unless
``backup=False``) and the new text replaces it atomically.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dlmstore.document.loading import FrontmatterLoader
from dlmstore.document.parser import parse_text
from dlmstore.document.versions import CURRENT_DLM_VERSION, LEGACY_KEYS, upgrade
from dlmstore.errors import DocumentError
from dlmstore.store.atomic import write_bytes_atomic


@dataclass(frozen=True)
class MigrationResult:
    """What ``dlm migrate`` did, or would do with ``--dry-run`` (``--json`` prints this).

    Attributes:
        path: The document (as given).
        from_version: The ``dlm_version`` it was written at.
        to_version: The current ``dlm_version``.
        applied: The versions whose upgrade step ran, oldest first; empty when nothing changed.
        renamed: What was renamed or rewritten, one ``old -> new`` line each.
        changed: Whether the document is (or, with ``--dry-run``, would be) different.
        wrote: Whether the document was rewritten (false with ``--dry-run`` or when nothing
            changed).
        backup: Where the original was kept (``PATH.bak``); null when none was written.
        comments_dropped: Whether the frontmatter had to be re-written whole (``training.dpo``
            upgraded), losing its comments.
        diff: Unified diff from the old text to the new; empty when nothing changed.
    """

    path: str
    from_version: int
    to_version: int
    applied: list[int]
    renamed: list[str]
    changed: bool
    wrote: bool
    backup: str | None
    comments_dropped: bool
    diff: str = field(repr=False)


def migrate_document(
    path: str | os.PathLike[str], *, dry_run: bool = False, backup: bool = True
) -> MigrationResult:
    """Bring the document at ``path`` to the current DLM version.

    Raises:
        DocumentError: the file cannot be read, its frontmatter is not YAML,
            its version is newer than this dlmstore reads, or the migrated
            document is not valid (nothing is written then).
    """
    shown = os.fspath(path)
    try:
        raw = Path(shown).read_bytes()
    except OSError as exc:
        raise DocumentError(shown, f"cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(shown, f"not UTF-8 text (invalid byte at offset {exc.start})") from None
    lines = text.split("\n")
    bom = "\ufeff" if lines[0].startswith("\ufeff") else ""
    bare = [line.rstrip("\r") for line in lines]
    bare[0] = bare[0].removeprefix(bom)
    if bare[0] != "---" or "---" not in bare[1:]:
        parse_text(text, shown)  # raises the parser's own error for a missing frontmatter
    close = bare.index("---", 1)
    yaml_lines = bare[1:close]
    root = _compose("\n".join(yaml_lines), shown)
    data = yaml.load("\n".join(yaml_lines), Loader=FrontmatterLoader) or {}
    if not isinstance(data, dict):
        parse_text(text, shown)  # the loader words "must be a mapping"
    version = data.get("dlm_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= CURRENT_DLM_VERSION:
        parse_text(text, shown)  # the loader words the version problem
        raise DocumentError(shown, f"dlm_version {version!r} cannot be migrated")  # pragma: no cover

    upgraded, applied = upgrade(data, version)
    renamed = [f"{a}.{b} -> {a}.{LEGACY_KEYS[(a, b)]}" for a, b in _legacy_keys(data)]
    comments_dropped = upgraded is not data  # only the training.dpo step builds a new mapping
    if comments_dropped:
        new_yaml = _dump(upgraded, data)
    else:
        new_yaml = _edit_in_place(root, list(yaml_lines), renamed=bool(renamed))
    newline = "\r\n" if lines[0].endswith("\r") else "\n"
    new_lines = [bom + "---", *new_yaml, *bare[close:]]
    new_text = newline.join(new_lines)
    new_text_lf = new_text.replace("\r\n", "\n")
    changed = new_text != text
    diff = "".join(
        difflib.unified_diff(
            text.replace("\r\n", "\n").splitlines(keepends=True),
            new_text_lf.splitlines(keepends=True),
            fromfile=shown,
            tofile=f"{shown} (dlm_version {CURRENT_DLM_VERSION})",
        )
    )
    if changed:
        try:
            parse_text(new_text, shown)
        except DocumentError as exc:
            raise DocumentError(
                shown,
                f"the migrated document would not be valid: {exc.message}",
                hint="fix the problem above in the original, then run `dlm migrate` again",
            ) from None
    backup_path = None
    wrote = False
    if changed and not dry_run:
        if backup:
            backup_path = shown + ".bak"
            write_bytes_atomic(Path(backup_path), raw)
        write_bytes_atomic(Path(shown), new_text.encode("utf-8"))
        wrote = True
    return MigrationResult(
        path=shown,
        from_version=version,
        to_version=CURRENT_DLM_VERSION,
        applied=applied if changed else [],
        renamed=renamed,
        changed=changed,
        wrote=wrote,
        backup=backup_path,
        comments_dropped=comments_dropped,
        diff=diff,
    )


def _compose(yaml_text: str, shown: str) -> yaml.Node | None:
    try:
        return yaml.compose(yaml_text, Loader=FrontmatterLoader)
    except yaml.YAMLError:
        parse_text(f"---\n{yaml_text}\n---\n", shown)  # the loader words the YAML error
        raise  # pragma: no cover


def _legacy_keys(data: dict[str, Any]) -> list[tuple[str, str]]:
    training = data.get("training")
    if not isinstance(training, dict):
        return []
    return [(a, b) for (a, b) in LEGACY_KEYS if a == "training" and b in training]


def _edit_in_place(root: yaml.Node | None, lines: list[str], *, renamed: bool) -> list[str]:
    """The frontmatter lines with the version set and legacy keys renamed."""
    top = root.value if isinstance(root, yaml.MappingNode) else []
    version_value = None
    id_line = None
    for key, value in top:
        if key.value == "dlm_version":
            version_value = value
        elif key.value == "dlm_id":
            id_line = value.end_mark.line
        elif key.value == "training" and renamed and isinstance(value, yaml.MappingNode):
            for sub, _ in value.value:
                new = LEGACY_KEYS.get(("training", sub.value))
                if new is not None:
                    line, col = sub.start_mark.line, sub.start_mark.column
                    if lines[line][col : col + len(sub.value)] == sub.value:
                        lines[line] = lines[line][:col] + new + lines[line][col + len(sub.value) :]
    target = str(CURRENT_DLM_VERSION)
    if version_value is not None:
        start, end = version_value.start_mark, version_value.end_mark
        if start.line == end.line:
            text = lines[start.line]
            lines[start.line] = text[: start.column] + target + text[end.column :]
    else:
        at = id_line + 1 if id_line is not None else 0
        lines.insert(at, f"dlm_version: {target}")
    return lines


def _dump(upgraded: dict[str, Any], original: dict[str, Any]) -> list[str]:
    """The upgraded mapping as YAML lines, keys in the original order."""
    out = dict(upgraded)
    out["dlm_version"] = CURRENT_DLM_VERSION
    training = out.get("training")
    if isinstance(training, dict):
        out["training"] = {LEGACY_KEYS.get(("training", k), k): v for k, v in training.items()}
    order = ["dlm_id", "dlm_version", *[k for k in original if k not in ("dlm_id", "dlm_version")]]
    ordered = {k: out[k] for k in order if k in out}
    text = yaml.safe_dump(ordered, sort_keys=False, allow_unicode=True, default_flow_style=False, width=1000)
    lines: list[str] = text.rstrip("\n").split("\n")
    return lines

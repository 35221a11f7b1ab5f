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
body is never touched: from the closing ``---`` on, the file is kept byte
for byte, whatever its line endings (CRLF, LF or a mix); an edited
frontmatter line keeps its own ending. The new text must parse as a valid
document before anything is written; then the original is copied to
``<path>.bak`` (unless ``backup=False``) and the new text replaces it
atomically, as the user's file: a symlinked document is migrated where the
link points and the link stays, and the file keeps its permission bits and
owner (the backup takes the document's permission bits).
"""

from __future__ import annotations

import difflib
import errno
import os
import stat
from dataclasses import dataclass, field
from typing import Any

import yaml

from dlmstore.document.loading import FrontmatterLoader
from dlmstore.document.parser import document_bytes, parse_text
from dlmstore.document.versions import CURRENT_DLM_VERSION, LEGACY_KEYS, upgrade
from dlmstore.errors import DocumentError
from dlmstore.store.atomic import SameAsInputError, replace_user_file
from dlmstore.store.regular_files import NotRegularFileError


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
    raw = document_bytes(shown)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(shown, f"not UTF-8 text (invalid byte at offset {exc.start})") from None
    pieces = text.split("\n")  # each but the last was followed by "\n" in the file
    bom = "\ufeff" if pieces[0].startswith("\ufeff") else ""
    bare = [piece.rstrip("\r") for piece in pieces]
    ends = [piece[len(line) :] + "\n" for piece, line in zip(pieces, bare, strict=True)]
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
        new_ends = [ends[0]] * len(new_yaml)  # re-written whole: the opening fence's line ending
    else:
        new_yaml, new_ends = list(yaml_lines), ends[1:close]
        _edit_in_place(root, new_yaml, new_ends, renamed=bool(renamed), first_end=ends[0])
    # Only frontmatter lines change: from the closing fence on, the text is
    # kept byte for byte (every line keeps its own line ending, mixed or not).
    head = "".join(line + end for line, end in zip(new_yaml, new_ends, strict=True))
    new_text = bom + "---" + ends[0] + head + "\n".join(pieces[close:])
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
            _write(shown, backup_path, raw, backup=True)
        _write(shown, shown, new_text.encode("utf-8"), backup=False)
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


def _write(shown: str, target: str, data: bytes, *, backup: bool) -> None:
    """Write the migrated document, or its backup, as the user's file (one error line if it fails).

    Both go through :func:`~dlmstore.store.atomic.replace_user_file`: a
    symlinked document is migrated where its link points (the link stays),
    and the document keeps its permission bits and owner. The backup takes
    the document's permission bits (a private document keeps a private
    backup) and must not be the document itself under another name.
    """
    try:
        if backup:
            mode = stat.S_IMODE(os.stat(shown).st_mode)
            replace_user_file(target, data, inputs=(shown,), permissions=mode)
        else:
            replace_user_file(target, data)
    except SameAsInputError:
        raise DocumentError(
            shown,
            f"cannot keep the original as {target}: that is the document itself (a link to it)",
            hint=f"remove {target}, or pass --no-backup",
        ) from None
    except NotRegularFileError as exc:
        raise DocumentError(
            shown,
            f"cannot keep the original as {target}: it is {exc.strerror}",
            hint=f"move {target} out of the way, or pass --no-backup",
        ) from None
    except OSError as exc:
        raise DocumentError(
            shown,
            f"cannot write {target}: {exc.strerror or exc}; the document was not changed"
            if backup
            else f"cannot write the migrated document: {exc.strerror or exc}",
            hint="make the folder writable"
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
            else None,
        ) from None


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


def _edit_in_place(
    root: yaml.Node | None, lines: list[str], ends: list[str], *, renamed: bool, first_end: str
) -> None:
    """Set the version and rename legacy keys in the frontmatter ``lines``, in place.

    ``ends`` holds each line's own line ending; a line added (``dlm_version``
    where there was none) takes the ending of the line above it
    (``first_end``, the opening fence's, at the top).
    """
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
        ends.insert(at, ends[at - 1] if at else first_end)


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

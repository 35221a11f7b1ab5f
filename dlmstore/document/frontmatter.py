"""The YAML frontmatter of a .dlm document: pydantic models and their loader.

Every model forbids unknown keys so a typo (``trainig:``) is an error naming
the key instead of a silently ignored setting. Every field except ``dlm_id``
has a default, so a minimal document is just an id. Integer fields are
strict: YAML ``true`` is a boolean, not the number 1, and a quoted ``"42"``
or a float ``2048.0`` is not a whole number either.

:func:`load_frontmatter` turns the YAML text between the ``---`` fences into
a validated :class:`Frontmatter`, reporting every problem as ONE
``DocumentError`` at ``path:line``. How lines are kept:

* **One parse, two uses.** ``yaml.compose`` semantics give the node tree
  with 0-based marks; we walk it once to record the file line of every key
  path (``("training", "sources", 0, "path")``: mark line + ``first_line``),
  then construct the Python object from the same nodes (``safe_load``
  semantics). The walk runs before construction, so it can see what
  ``safe_load`` hides: duplicate keys (an error, naming the first line),
  non-string keys (an unknown key), and merge keys (``<<``, which make an
  override legal). Nodes reached again through an alias are not re-walked,
  so an alias "billion laughs" costs linear time.
* **Pydantic errors become plain words.** Of all validation errors we report
  the one earliest in the file, at its key's line, or at the nearest
  ancestor that has one (a missing key is reported at its parent mapping;
  the frontmatter itself is at the opening ``---``). Bounds are worded from
  the field's own constraints, so messages never drift from the models.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dlmstore.errors import DocumentError
from dlmstore.ulid import is_valid_ulid

#: The newest document format this dlmstore understands.
CURRENT_DLM_VERSION = 1

DEFAULT_BASE_MODEL = "smollm2-135m"

GIB = 1024**3


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceDirective(_Strict):
    """One ``training.sources`` entry: a folder (or file) of training text."""

    path: str = Field(description="Folder or file to train on, relative to the .dlm file (`~` expands).")
    include: list[str] = Field(
        default_factory=lambda: ["**/*"],
        description="Glob patterns of the files to read, relative to `path`.",
    )
    exclude: list[str] = Field(
        default_factory=list,
        description="Glob patterns of files to skip, even when an include matches them.",
    )
    max_bytes_per_file: int | None = Field(
        default=None, gt=0, strict=True, description="Skip files larger than this many bytes."
    )
    max_files: int | None = Field(
        default=None,
        gt=0,
        strict=True,
        description="Read at most this many files, in path order.",
    )
    default_excludes: bool = Field(
        default=True,
        description="Skip VCS folders, virtualenvs, build output, lock files and secrets; "
        "set false to read them.",
    )


class CacheSettings(_Strict):
    """``training.cache``: the tokenized-section cache knobs."""

    enabled: bool = Field(default=True, description="Reuse tokenized sections between runs.")
    max_bytes: int = Field(
        default=10 * GIB,
        gt=0,
        strict=True,
        description="Size limit of the tokenized-section cache, in bytes.",
    )
    prune_older_than_days: int = Field(
        default=90,
        ge=0,
        strict=True,
        description="Prune cache entries that no run has used for this many days.",
    )


class TrainingSettings(_Strict):
    """``training``: tokenization, LoRA and optimizer knobs, and sources."""

    sequence_len: int = Field(
        default=2048,
        ge=64,
        le=32768,
        strict=True,
        description="Maximum length of one training example, in tokens.",
    )
    seed: int = Field(default=42, strict=True, description="Random seed, for reproducible training runs.")
    r: int = Field(default=8, gt=0, strict=True, description="LoRA rank of the adapter matrices.")
    alpha: int = Field(default=16, gt=0, strict=True, description="LoRA alpha: scales the adapter's update.")
    dropout: float = Field(default=0.05, strict=True, ge=0.0, lt=1.0, description="LoRA dropout probability.")
    learning_rate: float = Field(default=2e-4, strict=True, gt=0.0, description="Optimizer learning rate.")
    epochs: int = Field(default=1, gt=0, strict=True, description="Number of passes over the training rows.")
    max_steps: int | None = Field(
        default=None,
        gt=0,
        strict=True,
        description="Stop after this many optimizer steps, even before the last epoch ends.",
    )
    batch_size: int = Field(default=2, gt=0, strict=True, description="Training examples per optimizer step.")
    sources: list[SourceDirective] = Field(
        default_factory=list,
        description="Folders or files whose text is trained on as prose, one section per file.",
    )
    sources_policy: Literal["permissive", "strict"] = Field(
        default="permissive",
        description="`strict` makes a source path or symlink leading outside the document's "
        "folder an error; `permissive` reads such a path and skips such a symlink.",
    )
    cache: CacheSettings = Field(
        default_factory=CacheSettings, description="Settings of the tokenized-section cache."
    )


class Frontmatter(_Strict):
    """The whole frontmatter block of a .dlm document."""

    dlm_id: str = Field(
        description="The document's ULID, written by `dlm init`; it keys the document's store."
    )
    dlm_version: int = Field(
        default=CURRENT_DLM_VERSION,
        ge=1,
        strict=True,
        description="Version of the .dlm format the document is written in.",
    )
    base_model: str = Field(
        default=DEFAULT_BASE_MODEL,
        description="Model to fine-tune: a built-in name, a local folder or a Hugging Face id.",
    )
    system_prompt: str | None = Field(
        default=None,
        description="System message prepended to every instruction and preference row.",
    )
    training: TrainingSettings = Field(
        default_factory=TrainingSettings,
        description="Tokenization, LoRA and optimizer settings, and the training sources.",
    )

    @field_validator("dlm_id")
    @classmethod
    def _ulid(cls, value: str) -> str:
        if not is_valid_ulid(value):
            raise ValueError("must be a 26-character Crockford base32 ULID (run `dlm init` to mint one)")
        return value


# --------------------------------------------------------------------------
# Loading, with line numbers

KeyPath = tuple[str | int, ...]


def load_frontmatter(yaml_text: str, *, path: str, first_line: int) -> Frontmatter:
    """Parse and validate the YAML text of a frontmatter block.

    Args:
        yaml_text: the lines between the two ``---`` fences, joined with
            ``\\n`` (line endings already normalised).
        path: the file name error messages start with, as the user gave it.
        first_line: the 1-based file line of ``yaml_text``'s first line; the
            opening ``---`` fence is taken to be the line before it, where
            problems of the block as a whole (a missing ``dlm_id``) point.

    Returns:
        The validated :class:`Frontmatter`; an empty block is an empty
        mapping (and so lacks ``dlm_id``).

    Raises:
        DocumentError: invalid YAML, a block that is not a mapping, a
            duplicate or unknown key, a ``dlm_version`` newer than
            :data:`CURRENT_DLM_VERSION`, or a value pydantic rejects. The
            error is the earliest problem in the file, with its line.
    """
    try:
        # What yaml.safe_load does, keeping the node tree for its line marks.
        loader = yaml.SafeLoader(yaml_text)
        try:
            node = loader.get_single_node()
            key_lines = _key_lines(node, path, first_line) if node is not None else {}
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = f"invalid YAML in frontmatter: {exc.problem or exc.context}"
        if exc.problem and exc.context and exc.context_mark is not None:
            message += f" ({exc.context} at line {exc.context_mark.line + first_line})"
        raise DocumentError(
            path, message, line=mark.line + first_line if mark is not None else None
        ) from None
    except yaml.YAMLError as exc:  # ReaderError: a character YAML refuses
        line = None
        if isinstance(exc, yaml.reader.ReaderError):
            line = yaml_text[: exc.position].count("\n") + first_line
        raise DocumentError(
            path, f"invalid YAML in frontmatter: {str(exc).splitlines()[0]}", line=line
        ) from None

    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise DocumentError(
            path,
            f"frontmatter must be a mapping of keys to values, not a {_yaml_kind(data)}",
            line=first_line,
            hint="write one `key: value` per line, e.g. `dlm_id: <ULID>`",
        )
    key_lines[()] = first_line - 1

    version = data.get("dlm_version")
    if isinstance(version, int) and not isinstance(version, bool):
        if version > CURRENT_DLM_VERSION:
            raise DocumentError(
                path,
                f"dlm_version {version} needs a newer dlmstore "
                f"(this one reads dlm_version {CURRENT_DLM_VERSION})",
                line=key_lines.get(("dlm_version",)),
                hint="upgrade dlmstore: pip install -U dlmstore",
            )
    try:
        return Frontmatter.model_validate(data)
    except ValidationError as exc:
        raise _frontmatter_error(exc, key_lines, path) from None


def _yaml_kind(value: object) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, bool):
        return "boolean"
    return "number" if isinstance(value, (int, float)) else "string"


_YAML_KEY_TAGS = ("tag:yaml.org,2002:str", "tag:yaml.org,2002:merge")


def _key_lines(root: yaml.Node, shown: str, first_line: int) -> dict[KeyPath, int]:
    """File line of every mapping key and sequence item, by key path.

    Runs on the composed nodes, before construction, so merge keys (``<<``)
    are still visible and a key overriding a merged one is not a duplicate.
    A node reached again through an alias is not walked twice (a YAML
    "billion laughs" stays linear); its keys report the alias's line.
    """
    lines: dict[KeyPath, int] = {}
    seen: set[int] = set()

    def walk(node: yaml.Node, path: KeyPath) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # the constructor reports "found unhashable key"
                child = (*path, key_node.value)
                line = key_node.start_mark.line + first_line
                if key_node.tag not in _YAML_KEY_TAGS:  # 1:, true:, null: ...
                    raise _unknown_key(child, line, shown)
                if child in lines:
                    raise DocumentError(
                        shown,
                        f"duplicate key '{_dotted(child)}' (first set at line {lines[child]})",
                        line=line,
                    )
                lines[child] = line
                walk(value_node, child)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                lines[(*path, index)] = item.start_mark.line + first_line
                walk(item, (*path, index))

    walk(root, ())
    return lines


def _dotted(path: KeyPath) -> str:
    """``("training", "sources", 0, "path")`` -> ``training.sources[0].path``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _line_of(path: KeyPath, key_lines: dict[KeyPath, int]) -> int:
    """Line of ``path``, or of its nearest recorded ancestor."""
    while path not in key_lines:
        path = path[:-1]
    return key_lines[path]


def _model_at(path: KeyPath) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at ``path``."""
    model: type[BaseModel] = Frontmatter
    for part in path:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        sub = _find_model(field.annotation) if field is not None else None
        if sub is None:
            return None
        model = sub
    return model


def _find_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _find_model(arg)
            if found is not None:
                return found
    return None


def _bounds(path: KeyPath) -> str | None:
    """``must be between 64 and 32768``-style wording for a numeric field."""
    model = _model_at(path[:-1])
    field = model.model_fields.get(str(path[-1])) if model is not None else None
    if field is None:
        return None
    limits = {
        name: getattr(item, name)
        for item in field.metadata
        for name in ("ge", "gt", "le", "lt")
        if getattr(item, name, None) is not None
    }
    if "ge" in limits and "le" in limits:
        return f"must be between {limits['ge']} and {limits['le']}"
    words = {"ge": "at least", "gt": "greater than", "le": "at most", "lt": "less than"}
    parts = [f"{words[name]} {value}" for name, value in limits.items()]
    return f"must be {' and '.join(parts)}" if parts else None


_TYPE_WORDS = {
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "model_type": "must be a mapping of keys to values",
    "dict_type": "must be a mapping of keys to values",
}


def _unknown_key(path: KeyPath, line: int, shown: str) -> DocumentError:
    """``unknown key 'training.sequnce_len'``, hinting the allowed keys there."""
    hint = None
    model = _model_at(path[:-1])
    if model is not None:
        allowed = list(model.model_fields)
        where = f"in '{_dotted(path[:-1])}'" if path[:-1] else "at the top level"
        hint = f"allowed keys {where}: {', '.join(allowed)}"
        close = difflib.get_close_matches(str(path[-1]), allowed, n=1)
        if close:
            hint = f"did you mean '{close[0]}'? {hint}"
    return DocumentError(shown, f"unknown key '{_dotted(path)}'", line=line, hint=hint)


def _frontmatter_error(exc: ValidationError, key_lines: dict[KeyPath, int], shown: str) -> DocumentError:
    """The earliest (by line) of pydantic's errors, as one DocumentError."""
    errors = exc.errors()
    first = min(errors, key=lambda e: _line_of(tuple(e["loc"]), key_lines))
    path: KeyPath = tuple(first["loc"])
    dotted = _dotted(path)
    kind = first["type"]
    hint = None
    if kind == "extra_forbidden":
        return _unknown_key(path, _line_of(path, key_lines), shown)
    if kind == "missing":
        line = _line_of(path[:-1], key_lines)
        if path == ("dlm_id",):
            hint = "`dlm init PATH` writes a new document with a fresh dlm_id"
        return DocumentError(shown, f"missing required key '{dotted}'", line=line, hint=hint)
    line = _line_of(path, key_lines)
    if kind == "value_error":
        detail = str(first["ctx"]["error"])
    elif kind == "literal_error":
        detail = f"must be {first['ctx']['expected']}"
    elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        detail = _bounds(path) or first["msg"]
    elif kind in _TYPE_WORDS:
        detail = f"{_TYPE_WORDS[kind]}, not {_short(first['input'])}"
    else:
        detail = first["msg"]
    return DocumentError(shown, f"{dotted}: {detail}", line=line)


def _short(value: object) -> str:
    if value is None:
        return "empty (null)"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

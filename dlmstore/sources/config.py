"""``.dlm/`` folders inside a source tree: ``training.yaml`` and ``ignore``.

A directory holding a ``.dlm/`` folder is an *anchor*: the folder's
``training.yaml`` and ``ignore`` refine which files below the anchor a
``training.sources`` directive reads (``dlmstore.sources.rules`` merges
them). Both are DocumentLanguageModel's formats; ``training.yaml`` keys:

* ``dlm_training_version``: ``1`` (the only version);
* ``include``: globs relative to the *directive root* (as in DLM); when not
  empty, they replace the directive's ``include`` for every file below the
  anchor (the nearest such file wins);
* ``exclude``: globs relative to the anchor, added to the excludes;
* ``exclude_defaults``: ``false`` turns the default excludes off below the
  anchor (the nearest ``training.yaml`` decides, set or not);
* ``metadata`` (name to string) and ``weights`` (name to value to a number
  >= 0): the files below the anchor are tagged with the first and their
  rows repeated by the second, as DLM does (``dlmstore.corpus.weights``);
  neither changes which files are read.

Values are validated as DLM validates them (pydantic, lax: ``yes`` is a
boolean, ``"2"`` a number). Where DLM logs a problem and skips the file,
dlmstore refuses to guess: invalid YAML, a document that is not a mapping, a
duplicate or unknown key, a wrong type, or a file that cannot be read or is
not UTF-8 is a :class:`~dlmstore.errors.SourceError` naming the file and
line. A missing ``training.yaml`` or ``ignore``, or a folder of that name,
is no file, as in DLM. Anything else of that name that is not a readable
regular file (no read permission, a FIFO, a device, a dangling symlink) is
an error under both ``sources_policy`` values, where DLM would read the
tree without its rules: dlmstore fails closed rather than read the files
they exclude. It is read non-blocking
(:mod:`dlmstore.store.regular_files`), so a FIFO never hangs the walk.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from dlmstore.document.frontmatter import short_repr
from dlmstore.document.loading import BoundedLoader, YamlLimit
from dlmstore.errors import SourceError
from dlmstore.sources.ignore import IgnoreRule, parse_ignore
from dlmstore.store.regular_files import NotRegularFileError, read_regular

#: The folder, and the two files in it, relative to an anchor directory.
TRAINING_YAML = ".dlm/training.yaml"
IGNORE_FILE = ".dlm/ignore"


def _not_negative(value: float) -> float:
    # "value < 0" rather than a ge=0 bound: DLM lets NaN through, so do we.
    if value < 0:
        raise ValueError(f"must be 0 or more, not {value}")
    return value


class _TrainingYaml(BaseModel):
    """DLM's ``DlmTrainingConfig``, field for field."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    dlm_training_version: Literal[1] = 1
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    exclude_defaults: bool = True
    metadata: Mapping[str, str] = Field(default_factory=dict)
    weights: Mapping[str, Mapping[str, Annotated[float, AfterValidator(_not_negative)]]] = Field(
        default_factory=dict
    )


@dataclass(frozen=True)
class TrainingConfig:
    """A validated ``.dlm/training.yaml``."""

    include: tuple[str, ...]
    exclude: tuple[str, ...]
    exclude_defaults: bool
    metadata: Mapping[str, str]
    weights: Mapping[str, Mapping[str, float]]


@dataclass(frozen=True)
class DlmFolder:
    """What one ``.dlm/`` folder says.

    Attributes:
        anchor: the directory holding the folder, relative to the directive
            root (``""`` for the root itself).
        config: its ``training.yaml``, or ``None`` without one.
        rules: the rules of its ``ignore`` file, in file order.
        warnings: one line each: ignore lines dropped.
    """

    anchor: str
    config: TrainingConfig | None
    rules: tuple[IgnoreRule, ...]
    warnings: tuple[str, ...]


def load_folder(anchor_abs: str, anchor: str, *, label: str) -> DlmFolder:
    """Read the ``.dlm/`` folder of directory ``anchor_abs`` (``anchor`` relative to the root).

    Raises:
        SourceError: a file there is unreadable, not UTF-8, or (training.yaml)
            malformed.
    """
    warnings: list[str] = []
    config = None
    yaml_path = os.path.join(anchor_abs, TRAINING_YAML)
    text = _read_text(yaml_path, label)
    if text is not None:
        config = _parse_training_yaml(text, yaml_path, label)
    rules: list[IgnoreRule] = []
    ignore_path = os.path.join(anchor_abs, IGNORE_FILE)
    text = _read_text(ignore_path, label)
    if text is not None:
        rules, dropped = parse_ignore(text)
        warnings.extend(f"{label}: {ignore_path}: ignoring {note}" for note in dropped)
    return DlmFolder(anchor, config, tuple(rules), tuple(warnings))


def _read_text(path: str, label: str) -> str | None:
    """The text of regular file ``path`` (BOM dropped, newlines ``\\n``), ``None`` if there is none.

    Fails closed: anything at ``path`` that is not a folder and cannot be
    read as a regular file (a FIFO, a device, a dangling symlink, a file
    without read permission) is an error under either policy, since
    reading the tree without its rules would read files they exclude.
    """
    try:
        data = read_regular(path)
    except (FileNotFoundError, NotADirectoryError):
        if not os.path.islink(path):
            return None
        raise SourceError(
            f"{label}: {path} is a symlink to a missing file, so its rules cannot be applied",
            hint="point the link at a file, or remove it",
        ) from None
    except NotRegularFileError as exc:
        if stat.S_ISDIR(exc.mode):
            return None
        raise SourceError(
            f"{label}: {path} is {exc.strerror}, so its rules cannot be applied",
            hint="make it a regular file, or remove it",
        ) from None
    except OSError as exc:
        raise SourceError(
            f"{label}: cannot read {path}: {exc.strerror}", hint="make it readable, or remove it"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(
            f"{label}: {path}: not valid UTF-8 (byte {exc.start})", hint="save it as UTF-8"
        ) from None
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


_KEYS = ", ".join(_TrainingYaml.model_fields)


class _TrainingYamlLoader(BoundedLoader):
    """PyYAML's safe loader, as DLM reads training.yaml, within the frontmatter's bounds."""

    what = "the file"


def _parse_training_yaml(text: str, path: str, label: str) -> TrainingConfig:
    """Validate ``text`` as DLM does, raising on what DLM would skip."""

    def fail(line: int, what: str, hint: str | None = "fix the file, or remove it") -> SourceError:
        return SourceError(f"{label}: {path}:{line}: {what}", hint=hint)

    lines: dict[tuple[str, ...], int] = {}
    data: Any = {}
    if text.strip():
        try:
            loader = _TrainingYamlLoader(text)
            try:
                node = loader.get_single_node()
                if node is not None:
                    _key_lines(node, (), lines, fail, set())
                data = loader.construct_document(node) if node is not None else None
            finally:
                loader.dispose()
        except YamlLimit as exc:
            raise fail(exc.problem_mark.line + 1, exc.problem) from None
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else 1
            raise fail(line, f"invalid YAML: {exc.problem or exc.context}") from None
        except yaml.YAMLError as exc:
            raise fail(1, f"invalid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise fail(1, f"must be a mapping of keys to values, not {type(data).__name__}", f"keys: {_KEYS}")
    try:
        model = _TrainingYaml.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = tuple(str(part) for part in error["loc"] if part != "[key]")
        line = next((lines[loc[:i]] for i in range(len(loc), 0, -1) if loc[:i] in lines), 1)
        dotted = ".".join(loc)
        if error["type"] in ("extra_forbidden", "invalid_key") and len(loc) == 1:
            raise fail(line, f"unknown key '{dotted}'", f"keys: {_KEYS}") from None
        if error["type"] == "value_error":
            raise fail(line, f"{dotted}: {error['ctx']['error']}") from None
        message = error["msg"]
        raise fail(
            line, f"{dotted}: {message[0].lower()}{message[1:]} (got {short_repr(error['input'])})"
        ) from None
    return TrainingConfig(
        include=model.include,
        exclude=model.exclude,
        exclude_defaults=model.exclude_defaults,
        metadata=dict(model.metadata),
        weights={key: dict(value) for key, value in model.weights.items()},
    )


def _key_lines(
    node: yaml.Node,
    path: tuple[str, ...],
    lines: dict[tuple[str, ...], int],
    fail: Callable[[int, str], SourceError],
    seen: set[int],
) -> None:
    """Record the 1-based line of every key and list item (paths as strings,
    as pydantic's error locations become); refuse duplicate keys. A node
    reached again through a YAML alias is not walked twice."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue  # construction reports the unhashable key
            child = (*path, key_node.value)
            line = key_node.start_mark.line + 1
            if child in lines:
                raise fail(
                    line, f"duplicate key '{'.'.join(map(str, child))}' (first at line {lines[child]})"
                )
            lines[child] = line
            _key_lines(value_node, child, lines, fail, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[(*path, str(index))] = item.start_mark.line + 1
            _key_lines(item, (*path, str(index)), lines, fail, seen)

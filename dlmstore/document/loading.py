"""Load a document's frontmatter: YAML text in, a validated model or every problem out.

:func:`load_frontmatter` turns the YAML text between the ``---`` fences into
a validated :class:`~dlmstore.document.frontmatter.Frontmatter`, upgraded
from the document's ``dlm_version`` (``dlmstore.document.versions``), and
reports every problem at once, each a ``DocumentError`` at ``path:line``.
How lines are kept:

* **One parse, two uses.** ``yaml.compose`` semantics give the node tree
  with 0-based marks; we walk it once to record the file line of every key
  path (``("training", "sources", 0, "path")``: mark line + ``first_line``),
  then construct the Python object from the same nodes (``safe_load``
  semantics, plus YAML 1.2 floats such as ``2e-4``). The walk runs before
  construction, so it can see what ``safe_load`` hides: duplicate keys (an
  error, naming the first line), non-string keys (an unknown key), and
  merge keys (``<<``, which make an override legal). Nodes reached again
  through an alias are not re-walked.
* **Bounded work.** :class:`BoundedLoader` refuses nesting deeper than
  :data:`MAX_NESTING` and an alias "billion laughs" while composing, before
  anything expands it, and every rejected value is quoted through
  :func:`~dlmstore.document.frontmatter.short_repr`, which looks at no more
  of it than it prints. A 64 KiB document parses in well under a second
  and 100 MB whatever it holds (``bench/bench_hostile.py``).
* **Pydantic errors become plain words.** Every validation error is
  reported once per key, at its key's line, or at the nearest ancestor that
  has one (a missing key is reported at its parent mapping; the frontmatter
  itself is at the opening ``---``). Bounds are worded from the field's own
  constraints, so messages never drift from the models.
"""

from __future__ import annotations

import functools
import re
import types
import typing
from collections.abc import Callable
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from dlmstore.document.frontmatter import Frontmatter, short_repr
from dlmstore.document.versions import CURRENT_DLM_VERSION, LEGACY_KEYS, moved_path, upgrade
from dlmstore.errors import DocumentError, DocumentProblems
from dlmstore.plural import plural

KeyPath = tuple[str | int, ...]

#: A problem found, worded only when it is listed: ``(line, wording)``.
Pending = tuple[int, Callable[[], DocumentError]]

#: At most this many frontmatter problems are listed, in line order; one
#: more line counts the rest (wording thousands of unknown keys, each with
#: its did-you-mean, would take seconds and help nobody).
MAX_PROBLEMS = 50


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
        The validated :class:`Frontmatter`, upgraded from the document's
        ``dlm_version`` (``dlmstore.document.versions``); an empty block is
        an empty mapping (and so lacks ``dlm_id``).

    Raises:
        DocumentError: invalid YAML, a block that is not a mapping, or a
            ``dlm_version`` this dlmstore cannot read.
        DocumentProblems: every duplicate or unknown key and every value the
            schema rejects, each at its line, in line order (a single problem
            is raised as a plain ``DocumentError``).
    """
    data, key_lines, problems = _compose(yaml_text, path, first_line)
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

    version = data.get("dlm_version", 1)
    version_line = key_lines.get(("dlm_version",))
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        bad = DocumentError(path, f"dlm_version: must be a whole number of at least 1, not {short_repr(version)}",
                            line=version_line, hint=f"the current version is {CURRENT_DLM_VERSION}")  # fmt: skip
        problems.append((version_line or 0, lambda: bad))
        version = CURRENT_DLM_VERSION
    elif version > CURRENT_DLM_VERSION:
        raise DocumentError(
            path,
            f"dlm_version {short_repr(version)} is newer than the DLM frontmatter this dlmstore reads "
            f"(versions 1 to {CURRENT_DLM_VERSION})",
            line=version_line,
            hint="a newer dlmstore may read it (pip install -U dlmstore); otherwise set dlm_version to "
            f"{CURRENT_DLM_VERSION} if the document uses no newer keys",
        )
    upgraded, _ = upgrade(data, version)
    upgraded = {**upgraded, "dlm_version": version}
    for old, line in list(key_lines.items()):
        new = moved_path(old)
        if new is not None:
            key_lines.setdefault(new, line)
    try:
        frontmatter = Frontmatter.model_validate(upgraded)
    except ValidationError as exc:
        problems.extend(_frontmatter_errors(exc, key_lines, path))
    if problems:
        raise DocumentProblems.of(listed(problems, path))
    return frontmatter


def listed(problems: list[Pending], path: str) -> list[DocumentError]:
    """The first :data:`MAX_PROBLEMS` of ``problems`` by line, worded, and a count of the rest."""
    ordered = sorted(problems, key=lambda problem: problem[0])
    shown = [word() for _, word in ordered[:MAX_PROBLEMS]]
    rest = ordered[MAX_PROBLEMS:]
    if rest:
        shown.append(
            DocumentError(
                path,
                f"{plural(len(rest), 'more problem')} in the frontmatter from this line on "
                f"(only the first {MAX_PROBLEMS} are listed)",
                line=rest[0][0],
            )
        )
    return shown


#: How deep values may nest, counting each mapping and list, also through aliases.
MAX_NESTING = 64

#: How many keys, values and list items (aliases included) a text may hold.
#: PyYAML's pure-Python parser, which DLM uses and whose verdicts we keep,
#: takes tens of microseconds per value; DLM's schema has about sixty.
MAX_VALUES = 10_000

#: How far aliases may grow a text: the values and characters they
#: repeat, on top of those written out (one per value plus each string's
#: length). A "billion laughs" needs more; no real document comes close.
MAX_ALIAS_EXPANSION = 200_000


class YamlLimit(yaml.composer.ComposerError):  # type: ignore[misc]
    """Valid YAML that exceeds one of the loader's bounds (reported in its own words)."""


class BoundedLoader(yaml.SafeLoader):  # type: ignore[misc]
    """PyYAML's safe loader, as DLM uses it, with bounds on the work any text can cause.

    Each bound is a :class:`YamlLimit` at the value that crosses it
    (``what`` names the text in its message):

    * at most :data:`MAX_VALUES` keys and values (aliases count one each);
    * values nest at most :data:`MAX_NESTING` deep, counting the path from
      the top through a mapping or list per level, also through aliases (the
      composer recurses per level, and so would everything walking the
      result);
    * an alias may not name a value it sits inside (a cycle);
    * aliases may add at most :data:`MAX_ALIAS_EXPANSION` to the text's
      size. Sizes are counted on the node tree as it is composed, where a
      repeated value costs nothing yet, so a "billion laughs" is refused
      before anything expands it (merge keys at construction, pydantic, an
      error message).

    A scalar whose tag the constructor cannot honour (``2001-02-30``,
    ``!!int x``, an integer of more than 4300 digits) is a
    ``ConstructorError`` at its line, not a ``ValueError``.
    """

    what = "the frontmatter"

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._values = 0
        self._written = 0
        #: id(node) -> (size, depth) as expanded through aliases, once composed.
        self._measured: dict[int, tuple[int, int]] = {}

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        self._values += 1
        if self._values > MAX_VALUES:
            raise YamlLimit(
                None,
                None,
                f"{self.what} holds more than {MAX_VALUES:,} keys and values",
                self.peek_event().start_mark,
            )
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = super().compose_node(parent, index)
            if id(node) not in self._measured:
                raise YamlLimit(
                    None, None, f"alias *{event.anchor} is used inside the value it names", event.start_mark
                )
            return node
        if self._depth >= MAX_NESTING:
            raise YamlLimit(
                None,
                None,
                f"{self.what} nests values more than {MAX_NESTING} levels deep",
                self.peek_event().start_mark,
            )
        self._depth += 1
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._measure(node)
        return node

    def _measure(self, node: yaml.Node) -> None:
        if isinstance(node, yaml.ScalarNode):
            size, depth = 1 + len(node.value), 1
        else:
            children = (
                [part for pair in node.value for part in pair]
                if isinstance(node, yaml.MappingNode)
                else node.value
            )
            measured = [self._measured[id(child)] for child in children]
            size = 1 + sum(size for size, _ in measured)
            depth = 1 + max((depth for _, depth in measured), default=0)
        self._written += 1 + len(node.value) if isinstance(node, yaml.ScalarNode) else 1
        if depth > MAX_NESTING:
            raise YamlLimit(
                None,
                None,
                f"through aliases, {self.what} nests values more than {MAX_NESTING} levels deep",
                node.start_mark,
            )
        if size > self._written + MAX_ALIAS_EXPANSION:
            raise YamlLimit(
                None,
                None,
                f"aliases grow this value by more than {MAX_ALIAS_EXPANSION:,} values and characters "
                "(a YAML alias bomb?)",
                node.start_mark,
            )
        self._measured[id(node)] = (size, depth)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, KeyError, OverflowError) as exc:
            kind = str(node.tag).rsplit(":", 1)[-1]
            detail = "not one of its values" if isinstance(exc, KeyError) else str(exc).split(";")[0]
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {short_repr(node.value)} as {kind}: {detail}", node.start_mark
            ) from None


class FrontmatterLoader(BoundedLoader):
    """The bounded loader reading YAML 1.2 floats without a dot (``2e-4``) as numbers.

    PyYAML implements YAML 1.1, where ``2e-4`` is a string; every YAML 1.2
    parser (and so everyone writing a learning rate) reads it as a float.
    """


FrontmatterLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _compose(yaml_text: str, path: str, first_line: int) -> tuple[Any, dict[KeyPath, int], list[Pending]]:
    """The constructed YAML value, the line of every key path, and key problems.

    Raises:
        DocumentError: the text is not valid YAML.
    """
    try:
        # What yaml.safe_load does, keeping the node tree for its line marks.
        loader = FrontmatterLoader(yaml_text)
        try:
            node = loader.get_single_node()
            problems: list[Pending] = []
            key_lines = _key_lines(node, path, first_line, problems) if node is not None else {}
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except YamlLimit as exc:
        raise DocumentError(path, exc.problem, line=exc.problem_mark.line + first_line) from None
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
    return data, key_lines, problems


def _yaml_kind(value: object) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, bool):
        return "boolean"
    return "number" if isinstance(value, (int, float)) else "string"


_YAML_KEY_TAGS = ("tag:yaml.org,2002:str", "tag:yaml.org,2002:merge")


def _key_lines(root: yaml.Node, shown: str, first_line: int, problems: list[Pending]) -> dict[KeyPath, int]:
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
                    problems.append((line, functools.partial(_unknown_key, child, line, shown)))
                    continue
                if child in lines:
                    duplicate = f"duplicate key '{_dotted(child)}' (first set at line {lines[child]})"
                    problems.append((line, functools.partial(DocumentError, shown, duplicate, line=line)))
                    continue
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
    keyed = False  # the next part is a key of a dict of models (training.adapters.<name>)
    for part in path:
        if isinstance(part, int) or keyed:
            keyed = False
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        sub = _find_model(field.annotation)
        if sub is None:
            return None
        keyed = _is_dict(field.annotation)
        model = sub
    return model


def _holds_names(path: KeyPath) -> bool:
    """Whether ``path`` is a field mapping names to blocks (``training.adapters``)."""
    if not path or isinstance(path[-1], int):
        return False
    model = _model_at(path[:-1])
    field = model.model_fields.get(str(path[-1])) if model is not None else None
    return field is not None and _is_dict(field.annotation)


def _is_dict(annotation: Any) -> bool:
    if typing.get_origin(annotation) is dict:
        return True
    return any(
        _is_dict(arg) for arg in typing.get_args(annotation) if typing.get_origin(annotation) is not list
    )


def _find_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, dict, typing.Union, types.UnionType):
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
    renamed = LEGACY_KEYS.get((str(path[0]), str(path[-1]))) if len(path) == 2 else None
    if renamed is not None:
        return DocumentError(
            shown,
            f"unknown key '{_dotted(path)}': dlmstore now uses DLM's name '{renamed}'",
            line=line,
            hint=f"rename it to '{renamed}', or run `dlm migrate {shown}` to rename every such key",
        )
    hint = None
    model = _model_at(path[:-1])
    if _holds_names(path[:-1]):  # a key here names a block, it is not a setting
        hint = f"the keys in '{_dotted(path[:-1])}' are adapter names (a lower case letter, then a-z 0-9 _)"
    elif model is not None:
        allowed = list(model.model_fields)
        where = f"in '{_dotted(path[:-1])}'" if path[:-1] else "at the top level"
        hint = f"allowed keys {where}: {', '.join(allowed)}"
        import difflib  # an error path

        close = difflib.get_close_matches(str(path[-1]), allowed, n=1)
        if close:
            hint = f"did you mean '{close[0]}'? {hint}"
    return DocumentError(shown, f"unknown key '{_dotted(path)}'", line=line, hint=hint)


def _frontmatter_errors(exc: ValidationError, key_lines: dict[KeyPath, int], shown: str) -> list[Pending]:
    """Every pydantic error, each at its key's line (one per key), to be worded if listed."""
    out: dict[KeyPath, Pending] = {}
    for error in exc.errors():
        if error["type"] == "invalid_key" or error["loc"][-1:] == ("[key]",):
            continue  # a key that is not a string: _key_lines already reported it as unknown
        path = _key_path(tuple(error["loc"]))
        if path not in out:
            line = _line_of(path[:-1] if error["type"] == "missing" else path, key_lines)
            out[path] = (line, functools.partial(_frontmatter_error, error, path, key_lines, shown))
    return list(out.values())


def _key_path(loc: tuple[str | int, ...]) -> KeyPath:
    """``loc`` without the union-member tags pydantic appends (``int``, ``literal['auto']``)."""
    path: list[str | int] = []
    for part in loc:
        if (
            isinstance(part, str)
            and path
            and _model_at(tuple(path)) is None
            and not isinstance(path[-1], int)
        ):
            break  # below a leaf field: a union member's tag
        path.append(part)
    return tuple(path)


def _frontmatter_error(error: Any, path: KeyPath, key_lines: dict[KeyPath, int], shown: str) -> DocumentError:
    """One pydantic error as a DocumentError at its line."""
    dotted = _dotted(path)
    kind = error["type"]
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
        detail = str(error["ctx"]["error"])
    elif kind == "literal_error":
        detail = f"must be {error['ctx']['expected']}"
    elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        detail = _bounds(path) or error["msg"]
    elif kind in _TYPE_WORDS:
        detail = f"{_TYPE_WORDS[kind]}, not {short_repr(error['input'])}"
    else:
        detail = error["msg"]
    if not dotted or detail.startswith(dotted + "."):  # the detail names the key itself
        return DocumentError(shown, detail, line=line)
    return DocumentError(shown, f"{dotted}: {detail}", line=line)

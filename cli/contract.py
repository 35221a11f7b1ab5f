"""The ``--json`` contract: the JSON Schema of each result dataclass.

Every command's ``--json`` prints ``dataclasses.asdict`` of the frozen
dataclass its library function returns, and the command names that class
(``json_option`` in ``dlmstore/cli/render.py``). This module turns such a
class into a JSON Schema (draft 2020-12), from its fields and type hints
and, for each field's meaning, the ``Attributes:`` section of its
Google-style docstring. One schema serves two readers: ``docs/json.md`` is
rendered from it (``scripts/docgen.py``), and the tests validate each
command's real output against it, so the page cannot promise a shape the
commands do not print.

The mapping is deliberately small: ``str``, ``int``, ``float``, ``bool``,
``None``, ``list[X]``, ``dict[str, X]``, ``Literal[...]``, unions and
nested dataclasses (each once, under ``$defs``). ``Any`` and ``object``
are left open. Every field is required and no other key is allowed:
adding or renaming a field changes the contract, and the stale
``docs/json.md`` says so in the diff.

It sits with the commands because the contract is their output; no
command imports it while running (the docs generator and the tests do).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import types
import typing
from typing import Any

#: ``name: description`` at the start of an entry in a docstring's ``Attributes:`` section.
_ENTRY = re.compile(r"^(\w+)(?:\s*\([^)]*\))?:\s*(.*)$")


def resolve(reference: str) -> type:
    """The class named ``module:Class`` (how commands name their result without importing it)."""
    module, _, name = reference.partition(":")
    value = getattr(importlib.import_module(module), name)
    if not (isinstance(value, type) and dataclasses.is_dataclass(value)):
        raise TypeError(f"{reference} is not a dataclass")
    return value


def field_docs(cls: type) -> dict[str, str]:
    """Each field's description from the ``Attributes:`` section of ``cls``'s docstring.

    An entry is ``name: text`` indented under ``Attributes:``; lines indented
    further continue it. The section ends at the first line indented no
    deeper than ``Attributes:`` itself.
    """
    import inspect

    docs: dict[str, str] = {}
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    except StopIteration:
        return docs
    entry_indent: int | None = None
    current: str | None = None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            break
        if entry_indent is None:
            entry_indent = indent
        match = _ENTRY.match(line.strip())
        if indent == entry_indent and match:
            current = match.group(1)
            docs[current] = match.group(2)
        elif indent > entry_indent and current is not None:
            docs[current] = f"{docs[current]} {line.strip()}".strip()
        else:
            break
    return docs


def summary_line(cls: type) -> str:
    """The first paragraph of ``cls``'s docstring, on one line."""
    import inspect

    text = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0]
    return " ".join(text.split())


def json_schema(cls: type) -> dict[str, Any]:
    """The JSON Schema of ``dataclasses.asdict(instance_of_cls)`` printed as JSON.

    Nested dataclasses are ``$ref``s into ``$defs``, keyed by class name.

    Raises:
        TypeError: a field has a type the contract cannot express (a tuple,
            a set, a dict with non-string keys): such a field would not
            survive ``json.dumps`` unchanged.
    """
    defs: dict[str, dict[str, Any]] = {}
    root = _object_schema(cls, defs)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **root, "$defs": defs}


def dataclasses_of(cls: type) -> list[type]:
    """``cls`` and every dataclass reachable from its fields, in first-seen order."""
    seen: list[type] = []

    def visit(hint: Any) -> None:
        for arg in typing.get_args(hint):
            visit(arg)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint) and hint not in seen:
            seen.append(hint)
            hints = typing.get_type_hints(hint)
            for item in dataclasses.fields(hint):
                visit(hints[item.name])

    visit(cls)
    return seen


def _object_schema(cls: type, defs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    properties: dict[str, Any] = {}
    for item in dataclasses.fields(cls):
        schema = _type_schema(hints[item.name], defs)
        if docs.get(item.name):
            schema = {**schema, "description": docs[item.name]}
        properties[item.name] = schema
    return {
        "title": cls.__name__,
        "description": summary_line(cls),
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _type_schema(hint: Any, defs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any or hint is object:
        return {}
    if hint is type(None) or hint is None:
        return {"type": "null"}
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer"}
    if hint is float:
        return {"type": "number"}
    if hint is str:
        return {"type": "string"}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        name = hint.__name__
        if name not in defs:
            defs[name] = {}  # claimed first, so a class that refers to itself terminates
            defs[name] = _object_schema(hint, defs)
        return {"$ref": f"#/$defs/{name}"}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_type_schema(arg, defs) for arg in args]}
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return {"type": "array", "items": _type_schema(args[0], defs) if args else {}}
    if origin is dict and (not args or args[0] is str):
        return {"type": "object", "additionalProperties": _type_schema(args[1], defs) if args else {}}
    raise TypeError(f"{hint!r} has no JSON form in the --json contract")


def type_label(schema: dict[str, Any]) -> str:
    """A short reading of a property's schema: ``integer or null``, ``list of Problem``."""
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(type_label(part) for part in schema["anyOf"])
    if "enum" in schema:
        return " or ".join(
            f'`"{value}"`' if isinstance(value, str) else f"`{value}`" for value in schema["enum"]
        )
    kind = schema.get("type")
    if kind == "array":
        return f"list of {type_label(schema['items'])}"
    if kind == "object":
        inner = schema.get("additionalProperties", {})
        return "object" if inner == {} else f"object of {type_label(inner)}"
    return str(kind) if kind else "any JSON value"

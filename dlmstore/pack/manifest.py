"""``PACK_HEADER.json`` and ``manifest.json``: what wrote a pack, and what it holds.

Both are JSON with sorted keys, two-space indent and a final newline, and
neither holds a clock: the header's ``created_at`` is the store's own
newest timestamp (its newest adapter, else its newest run), so the pack of
an unchanged store is the same bytes whenever it is made.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dlmstore.errors import PackError
from dlmstore.pack import layout


@dataclass(frozen=True)
class PackHeader:
    """``PACK_HEADER.json``, the member read first.

    Attributes:
        pack_format_version: The pack format (1; DLM's number, DLM's meaning).
        tool: ``dlmstore``; DLM's headers have no such key.
        tool_version: The dlmstore version that wrote it.
        content_type: DLM's coarse label: ``minimal``, ``no-base``
            (exports, no base), ``no-exports`` (base, no exports) or ``full``.
        platform_hint: The system and machine it was written on (advisory).
        created_at: The store's newest timestamp (ISO-8601 UTC), not the packing time.
    """

    pack_format_version: int
    tool: str
    tool_version: str
    content_type: str
    platform_hint: str
    created_at: str | None


@dataclass(frozen=True)
class SourceRoot:
    """One ``training.sources`` directive whose files the pack carries.

    Attributes:
        path: The directive's path, as the document writes it.
        member: Where its files are in the pack (``sources/<place>``), laid
            out as under the directive's root.
        files: How many files.
    """

    path: str
    member: str
    files: int


@dataclass(frozen=True)
class PackedBase:
    """The base model the pack carries (``--include-base``).

    Attributes:
        kind: ``builtin`` (a converted built-in base, installed into the
            home's ``bases/``) or ``local`` (a folder the document names,
            installed where the document expects it).
        name: The document's ``base_model``.
        member: The folder in the pack holding it.
    """

    kind: str
    name: str
    member: str


@dataclass(frozen=True)
class PackManifest:
    """``manifest.json``: the document, its store, what was included, every other member's size.

    Attributes:
        dlm_id: The document's id: the store installs as ``<home>/store/<dlm_id>``.
        document: The document's member (``dlm/<name>.dlm``).
        document_dir: The document's folder relative to the folder the
            pack's tree is laid out from (``.`` unless sources or a local
            base lie above the document's folder).
        base_model: The document's ``base_model``.
        base_model_revision: The revision or sha256 its newest adapter's lock recorded.
        adapter_version: The newest adapter version packed (0: none).
        adapters: Every adapter version packed.
        store_path: The store's folder where it was packed (absolute paths
            under it are rewritten on unpack).
        document_path: The document's path where it was packed.
        sources: The ``training.sources`` directives carried (``--include-sources``).
        base: The base carried (``--include-base``); null otherwise.
        cache: Whether the token cache is carried (``--include-cache``).
        exports: Whether exports are carried (``--include-exports``).
        entries: Every member but the header, the manifest and the checksums -> its size.
        content_sha256: sha256 over ``<member>\\n<sha256>\\n`` of those members, sorted:
            the same content gives the same value whatever wrote the header.
    """

    dlm_id: str
    document: str
    document_dir: str
    base_model: str
    base_model_revision: str | None
    adapter_version: int
    adapters: list[int]
    store_path: str
    document_path: str
    sources: list[SourceRoot] = field(default_factory=list)
    base: PackedBase | None = None
    cache: bool = False
    exports: bool = False
    entries: dict[str, int] = field(default_factory=dict)
    content_sha256: str = ""


def render(value: PackHeader | PackManifest) -> bytes:
    """The member's bytes: sorted keys, two-space indent, a final newline."""
    return (
        json.dumps(dataclasses.asdict(value), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    ).encode()


def rollup(checksums: Mapping[str, str]) -> str:
    """``content_sha256``: sha256 over ``<member>\\n<sha256>\\n`` per member, sorted (DLM's rollup)."""
    digest = hashlib.sha256()
    for name in sorted(checksums):
        digest.update(f"{name}\n{checksums[name]}\n".encode())
    return digest.hexdigest()


def load_json(data: bytes, member: str) -> dict[str, Any]:
    """A member's JSON object.

    Raises:
        PackError: it is not a JSON object.
    """
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        raise PackError(f"pack member {member} is not JSON: the pack is damaged") from None
    if not isinstance(value, dict):
        raise PackError(f"pack member {member} is not a JSON object: the pack is damaged")
    return value


def check_format(header: Mapping[str, Any]) -> None:
    """Refuse a header (dlmstore's or DLM's) without a format version, or with one newer than this reads.

    Raises:
        PackError: the version is missing, or newer than :data:`~dlmstore.pack.layout.PACK_FORMAT_VERSION`.
    """
    version = header.get("pack_format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise PackError(f"pack member {layout.HEADER} has no valid pack_format_version: not a .dlm.pack")
    if version > layout.PACK_FORMAT_VERSION:
        raise PackError(
            f"the pack's format is {version}, newer than the {layout.PACK_FORMAT_VERSION} this dlmstore reads",
            hint="upgrade dlmstore to unpack it",
        )


def parse_header(data: bytes) -> PackHeader:
    """The header of a dlmstore pack, checked (:func:`check_format`).

    Raises:
        PackError: it is malformed, or its format is newer than this dlmstore reads.
    """
    raw = load_json(data, layout.HEADER)
    check_format(raw)
    header: PackHeader = _build(PackHeader, raw, layout.HEADER)
    return header


def parse_manifest(data: bytes) -> PackManifest:
    """The manifest of a dlmstore pack.

    Raises:
        PackError: a field is missing or has the wrong type.
    """
    raw = load_json(data, layout.MANIFEST)
    raw["sources"] = [_build(SourceRoot, item, layout.MANIFEST) for item in _list(raw.get("sources", []))]
    if raw.get("base") is not None:
        raw["base"] = _build(PackedBase, raw["base"], layout.MANIFEST)
    manifest: PackManifest = _build(PackManifest, raw, layout.MANIFEST)
    if not isinstance(manifest.entries, dict) or not all(
        isinstance(v, int) for v in manifest.entries.values()
    ):
        raise PackError(
            f"pack member {layout.MANIFEST}: entries is not an object of sizes: the pack is damaged"
        )
    return manifest


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise PackError(f"pack member {layout.MANIFEST}: sources is not a list: the pack is damaged")
    return value


_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "str": (str,), "bool": (bool,)}


def _build(kind: type[Any], raw: object, member: str) -> Any:
    """``kind(**raw)``, refusing a missing field, an unknown one or a scalar of the wrong type."""
    if not isinstance(raw, dict):
        raise PackError(f"pack member {member} holds a value that is not an object: the pack is damaged")
    names = {f.name: f for f in dataclasses.fields(kind)}
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise PackError(f"pack member {member} has unknown field {unknown[0]}: written by a newer dlmstore?")
    for name, spec in names.items():
        if name not in raw:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                raise PackError(f"pack member {member} has no {name}: the pack is damaged")
            continue
        wanted = str(spec.type).replace(" | None", "")
        value = raw[name]
        if value is None and "None" in str(spec.type):
            continue
        if wanted in _TYPES and (
            not isinstance(value, _TYPES[wanted]) or (wanted == "int" and isinstance(value, bool))
        ):
            raise PackError(f"pack member {member}: {name} is not a {wanted}: the pack is damaged")
    return kind(**raw)

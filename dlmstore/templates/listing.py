"""What the template gallery holds: each template's metadata and document text.

The gallery is the ``gallery/`` folder of this package, read through
``importlib.resources`` so an installed wheel and a source checkout read the
same files. A template is ``NAME.dlm`` with ``NAME.meta.yaml`` beside it.
The metadata keys are DLM's (``src/dlm/templates/schema.py``): ``name``,
``title``, ``summary``, ``domain_tags``, ``recommended_base`` and
``sample_prompts``. Unlike DLM, which drops a template whose metadata is
broken with a log line, a broken template here is an error: the gallery
ships with dlmstore and the tests read every one, so a broken file is a
packaging bug to report, not to hide.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

from dlmstore.errors import TemplateError

#: The keys a ``.meta.yaml`` must have, and the type of each.
_REQUIRED: dict[str, type] = {"name": str, "title": str, "summary": str, "recommended_base": str}
#: The keys it may have, each a list of strings.
_LISTS = ("domain_tags", "sample_prompts")


@dataclass(frozen=True)
class TemplateInfo:
    """One template of the gallery.

    Attributes:
        name: What ``dlm init --template`` takes (the files' shared stem).
        title: A short human title.
        summary: One line on what the trained adapter does.
        domain_tags: Free-form tags (``code``, ``writing``, ...).
        recommended_base: The ``base_model`` its document names.
        sample_prompts: Questions to try with ``dlm prompt`` after training.
    """

    name: str
    title: str
    summary: str
    domain_tags: tuple[str, ...]
    recommended_base: str
    sample_prompts: tuple[str, ...]


@dataclass(frozen=True)
class TemplateListing:
    """``dlm templates list``: every template of the gallery, by name.

    Attributes:
        templates: The templates, sorted by name.
    """

    templates: tuple[TemplateInfo, ...]


def _gallery() -> Traversable:
    return resources.files(__package__ or "dlmstore.templates") / "gallery"


def list_templates() -> TemplateListing:
    """Every template of the gallery, sorted by name.

    Raises:
        TemplateError: a template's metadata is missing or malformed.
    """
    names = sorted(item.name[: -len(".dlm")] for item in _gallery().iterdir() if item.name.endswith(".dlm"))
    return TemplateListing(tuple(_info(name) for name in names))


def template_names() -> list[str]:
    """The names of the gallery's templates, sorted."""
    return [info.name for info in list_templates().templates]


def load_template(name: str) -> tuple[TemplateInfo, str]:
    """The template called ``name``: its metadata and its document's text.

    Raises:
        TemplateError: no template has that name (the message lists those
            that do), or its files are malformed.
    """
    document = _gallery() / f"{name}.dlm"
    if "/" in name or name.startswith(".") or not document.is_file():
        raise TemplateError(
            f"no template named {name!r}; the templates are: {', '.join(template_names())}",
            hint="`dlm templates list` shows each with its summary",
        )
    return _info(name), document.read_text(encoding="utf-8")


def _info(name: str) -> TemplateInfo:
    import yaml

    path = _gallery() / f"{name}.meta.yaml"
    where = f"template {name!r}: {name}.meta.yaml"
    if not path.is_file():
        raise TemplateError(f"template {name!r} has no {name}.meta.yaml beside its document")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise TemplateError(f"{where}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise TemplateError(f"{where}: must be a mapping of keys to values")
    unknown = sorted(set(raw) - set(_REQUIRED) - set(_LISTS))
    if unknown:
        raise TemplateError(f"{where}: unknown key {unknown[0]!r}")
    for key, kind in _REQUIRED.items():
        if not isinstance(raw.get(key), kind) or not raw[key].strip():
            raise TemplateError(f"{where}: {key} must be a non-empty string")
    for key in _LISTS:
        items = raw.get(key, [])
        if not isinstance(items, list) or not all(isinstance(item, str) and item for item in items):
            raise TemplateError(f"{where}: {key} must be a list of non-empty strings")
    if raw["name"] != name:
        raise TemplateError(f"{where}: name is {raw['name']!r}; it must be the file's stem {name!r}")
    return TemplateInfo(
        name=name,
        title=raw["title"].strip(),
        summary=raw["summary"].strip(),
        domain_tags=tuple(raw.get("domain_tags", [])),
        recommended_base=raw["recommended_base"].strip(),
        sample_prompts=tuple(raw.get("sample_prompts", [])),
    )

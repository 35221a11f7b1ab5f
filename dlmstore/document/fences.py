"""Fence lines and section markers: DLM's body grammar, line by line.

A fence line starts a section. DLM knows three forms, each a whole line
with nothing before or after it:

* ``::instruction::`` — a bare fence; the types are ``prose``,
  ``instruction``, ``preference``, ``image`` and ``audio``;
* ``::instruction#tone::`` — a routed fence: the section trains the named
  adapter of a multi-adapter document (``training.adapters``);
* ``::image path="a.png" alt="..."::`` — an attribute fence, for the media
  types (``image``: ``path``, optional ``alt``; ``audio``: ``path`` and
  ``transcript``), values double-quoted ASCII.

dlmstore trains text models: it parses media fences as DLM does (a
malformed one gets DLM's error) and then refuses them by name, since
training them as something else would silently train the wrong thing. A
routed fence's adapter name is checked against ``training.adapters`` once
the frontmatter is known (:func:`route_problems`; the routing itself is
``dlmstore.document.adapter_routing``).
Anything that looks like a fence but is not one (an unknown or misspelled
type, ``::INSTRUCTION::``, a fence indented or followed by spaces) is an
error with what to write instead, where DLM would either refuse it too or
train the line as prose.

Markers are DLM's magic comments on the first lines of a section, written
by its harvest, preference-mining and instruction-synthesis loops
(``<!-- dlm-auto-harvest: source="..." -->`` and friends). They are
provenance, not training text: :func:`strip_markers` validates and drops
them as DLM does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from dlmstore.errors import DocumentError

if TYPE_CHECKING:
    from dlmstore.document.frontmatter import Frontmatter
    from dlmstore.document.sections import Section

#: Every section type DLM's body grammar knows.
FENCE_TYPES = ("prose", "instruction", "preference", "image", "audio")

#: The types dlmstore trains.
TRAINED_TYPES = ("prose", "instruction", "preference")

#: Attribute fences: type -> (required keys, allowed keys).
ATTRIBUTES = {
    "image": (frozenset({"path"}), frozenset({"path", "alt"})),
    "audio": (frozenset({"path", "transcript"}), frozenset({"path", "transcript"})),
}

_BARE = re.compile(r"^::([A-Za-z0-9_#-]+)::$")
_WITH_ATTRIBUTES = re.compile(r'^::([a-z][a-z0-9_]*)((?:\s+[a-z][a-z0-9_]*="[^"\n]*")+)\s*::$')
_ATTRIBUTE = re.compile(r'([a-z][a-z0-9_]*)="([^"\n]*)"')
_ADAPTER = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# Looks like a fence once surrounding spaces go: "  ::instruction::", ":: prose ::".
_NEAR = re.compile(r"^::\s*[A-Za-z][A-Za-z0-9_# -]*::$|^::[a-z][a-z0-9_]*\s.*::$")

_MEDIA_WORDS = {
    "image": "image sections train vision-language models",
    "audio": "audio sections train audio-language models",
}


class FenceProblem(Exception):
    """A fence line that DLM's grammar rejects, or that dlmstore cannot train."""

    def __init__(self, message: str, hint: str | None = None, *, index: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        #: Which of the lines given to :func:`strip_markers` is at fault (0 otherwise).
        self.index = index


@dataclass(frozen=True)
class Fence:
    """A fence line's meaning: the section type it starts, and the adapter it routes to (``#name``)."""

    type: str
    adapter: str | None = None


def read_fence(line: str) -> Fence | None:
    """The fence ``line`` is, or ``None`` for an ordinary line.

    Raises:
        FenceProblem: the line is a fence DLM rejects (unknown type, bad
            adapter name or attributes), a fence dlmstore does not train
            (media), or a near miss of a fence.
    """
    if not line.startswith("::") and not line.lstrip().startswith("::"):
        return None  # the common case, decided without a regex
    match = _WITH_ATTRIBUTES.match(line)
    if match:
        _check_attributes(match.group(1), match.group(2))
        media = match.group(1)
        raise FenceProblem(
            f"`::{media} ...::` section: {_MEDIA_WORDS[media]}, and dlmstore trains text models only",
            hint="remove the section, or train this document with DocumentLanguageModel",
        )
    match = _BARE.match(line)
    if match:
        return _bare_fence(match.group(1))
    stripped = line.strip()
    if not _NEAR.match(stripped):
        return None
    name = re.sub(r"\s+", "", stripped[2:-2]) if _BARE.match(stripped) is None else stripped[2:-2]
    if not _fence_like(name):
        return None  # prose that happens to sit between colons
    if _BARE.match(stripped) or _WITH_ATTRIBUTES.match(stripped):
        raise FenceProblem(
            f"fence line '{line}' has spaces around it",
            hint=f"a fence is a whole line with nothing before or after it: write `{stripped}`",
        )
    raise FenceProblem(f"fence line '{line}' has spaces inside it", hint=f"write `::{name}::`")


def _fence_like(name: str) -> bool:
    base = re.split(r"[#\s]", name, maxsplit=1)[0].lower()
    if base in FENCE_TYPES:
        return True
    import difflib  # only for a line that looks like a fence: most documents have none

    return bool(difflib.get_close_matches(base, FENCE_TYPES, n=1, cutoff=0.75))


def _bare_fence(name: str) -> Fence:
    base, hash_, adapter = name.partition("#")
    if hash_ and not adapter:
        raise FenceProblem(f"fence '::{name}::' has nothing after '#'", hint=f"write `::{base}::`")
    if hash_ and not _ADAPTER.match(adapter):
        raise FenceProblem(
            f"fence '::{name}::' names adapter '{adapter}', which is not an adapter name",
            hint="an adapter name is a lower-case letter then up to 31 of a-z, 0-9 and _",
        )
    if base not in FENCE_TYPES:
        raise FenceProblem(f"unknown section fence '::{name}::'", hint=_fence_hint(base))
    if base in ATTRIBUTES:
        required = " ".join(f'{key}="..."' for key in sorted(ATTRIBUTES[base][0]))
        raise FenceProblem(
            f"fence '::{name}::' needs attributes", hint=f"DLM writes it as `::{base} {required}::`"
        )
    return Fence(base, adapter or None)


def _fence_hint(base: str) -> str:
    if base.lower() in FENCE_TYPES:
        return f"fence names are lower case: write `::{base.lower()}::`"
    import difflib  # an error path

    close = difflib.get_close_matches(base.lower(), FENCE_TYPES, n=1, cutoff=0.6)
    known = ", ".join(f"::{t}::" for t in TRAINED_TYPES)
    if close:
        return f"did you mean `::{close[0]}::`? The fences dlmstore trains: {known}"
    return f"the fences dlmstore trains: {known}"


def _check_attributes(media: str, blob: str) -> None:
    if media not in ATTRIBUTES:
        if media in FENCE_TYPES:
            raise FenceProblem(
                f"fence '::{media} ...::' does not take attributes", hint=f"write `::{media}::`"
            )
        raise FenceProblem(f"unknown section fence '::{media} ...::'", hint=_fence_hint(media))
    required, allowed = ATTRIBUTES[media]
    seen: set[str] = set()
    for key, value in _ATTRIBUTE.findall(blob):
        if key in seen:
            raise FenceProblem(f"fence '::{media} ...::' repeats attribute '{key}'")
        if key not in allowed:
            raise FenceProblem(
                f"fence '::{media} ...::' has unknown attribute '{key}'",
                hint=f"allowed: {', '.join(sorted(allowed))}",
            )
        if not value.isascii():
            raise FenceProblem(f"fence '::{media} ...::' attribute '{key}' is not ASCII")
        seen.add(key)
    missing = sorted(required - seen)
    if missing:
        raise FenceProblem(f"fence '::{media} ...::' lacks attribute {', '.join(missing)}")


# --------------------------------------------------------------------------
# Markers

_MARKERS = {
    # marker name -> (section types it may lead, its attribute keys; None = source="...")
    "dlm-auto-harvest": (("instruction", "preference"), None),
    "dlm-auto-mined": (
        ("preference",),
        frozenset({"judge_name", "judge_score_chosen", "judge_score_rejected", "mined_at", "mined_run_id"}),
    ),
    "dlm-auto-synth": (
        ("instruction",),
        frozenset({"synth_teacher", "synth_strategy", "synth_at", "source_section_id"}),
    ),
}
_HARVEST = re.compile(r'^<!-- dlm-auto-harvest: source="([^"]*)" -->$')
_MARKER = re.compile(r"^<!-- (dlm-auto-mined|dlm-auto-synth):(.*) -->$")
_MARKER_BLOB = re.compile(r'(?:\s+[a-z][a-z0-9_]*="[^"\n]*")+')


def strip_markers(type: str, lines: list[str]) -> int:
    """How many leading lines of a ``type`` section are DLM markers (validated).

    Raises:
        FenceProblem: a marker line is malformed (the message says which;
            ``index`` is the line's position in ``lines``).
    """
    count = 0
    for line in lines:
        if _HARVEST.match(line) and type in _MARKERS["dlm-auto-harvest"][0]:
            count += 1
            continue
        match = _MARKER.match(line)
        if match is None or type not in _MARKERS[match.group(1)][0]:
            break
        try:
            _check_marker(match.group(1), match.group(2))
        except FenceProblem as exc:
            raise FenceProblem(exc.message, exc.hint, index=count) from None
        count += 1
    return count


def _check_marker(name: str, blob: str) -> None:
    keys = _MARKERS[name][1]
    assert keys is not None
    if not _MARKER_BLOB.fullmatch(blob):
        raise FenceProblem(f"{name} marker is malformed", hint='write key="value" pairs separated by spaces')
    values: dict[str, str] = {}
    for key, value in _ATTRIBUTE.findall(blob):
        if key in values:
            raise FenceProblem(f"{name} marker repeats '{key}'")
        if key not in keys:
            raise FenceProblem(
                f"{name} marker has unknown attribute '{key}'", hint=f"allowed: {', '.join(sorted(keys))}"
            )
        values[key] = value
    missing = sorted(keys - values.keys())
    if missing:
        raise FenceProblem(f"{name} marker lacks {', '.join(missing)}")
    for key in ("mined_at", "synth_at"):
        if key in values:
            try:
                datetime.fromisoformat(values[key].replace("Z", "+00:00"))
            except ValueError:
                raise FenceProblem(f"{name} marker: {key} is not an ISO-8601 time") from None
    if name == "dlm-auto-mined":
        try:
            scores = [float(values["judge_score_chosen"]), float(values["judge_score_rejected"])]
            run = int(values["mined_run_id"])
        except ValueError:
            raise FenceProblem(
                f"{name} marker: judge scores must be numbers, mined_run_id a whole number"
            ) from None
        if not all(abs(x) != float("inf") and x == x for x in scores) or run < 1:
            raise FenceProblem(f"{name} marker: judge scores must be finite and mined_run_id at least 1")
    if name == "dlm-auto-synth":
        # DLM's Section refuses a synthesized section that names no teacher or strategy.
        for key in ("synth_teacher", "synth_strategy"):
            if not values[key]:
                raise FenceProblem(f"{name} marker: {key} is empty", hint=f'write {key}="<name>"')
        if not re.fullmatch(r"[0-9a-f]{16}", values["source_section_id"]):
            raise FenceProblem(f"{name} marker: source_section_id must be 16 lower-case hex digits")


def route_problems(frontmatter: Frontmatter, sections: Sequence[Section], shown: str) -> list[DocumentError]:
    """One error per routed fence that names no declared adapter (all of them when none is declared)."""
    declared = tuple(frontmatter.training.adapters or ())
    problems = []
    for section in sections:
        name = section.adapter
        if name is None or name in declared:
            continue
        fence = f"::{section.type}#{name}::"
        if not declared:
            problems.append(
                DocumentError(
                    shown,
                    f"fence '{fence}' routes the section to adapter '{name}', but the document declares no "
                    "training.adapters",
                    line=section.line,
                    hint=f"declare it (training.adapters: {{{name}: {{}}}}), or write `::{section.type}::`",
                )
            )
        else:
            problems.append(
                DocumentError(
                    shown,
                    f"fence '{fence}' routes the section to adapter '{name}', which training.adapters does not "
                    f"declare (declared: {', '.join(declared)})",
                    line=section.line,
                    hint=f"use one of the declared names, or add {name} to training.adapters",
                )
            )
    return problems

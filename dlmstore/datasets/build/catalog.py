"""The data sources of ``dlm data build-all``, from the Hugging Face hub or local files.

Each source yields what a builder consumes: texts (pretrain) or
conversations (SFT), lazily. Hub sources use the ``datasets`` library in
streaming mode, so nothing is downloaded up front and fineweb-edu is never
materialised: ``load_dataset(..., streaming=True)`` then, for fineweb-edu,
``.shuffle(seed=seed, buffer_size=10_000)`` as the spec asks (that shuffle
is the ``datasets`` library's own, seeded; everything else we draw comes
from torch). Every source also reads a local copy (``--local NAME=PATH``:
Parquet/JSONL/text files, see :mod:`.local`).

A source that cannot be reached or read raises
:class:`~dlmstore.errors.SourceUnavailableError` with one line naming it and how
to point it at local files, whether the failure happens when the dataset
is opened or later while streaming; build-all records it and goes on with
the other sources.

Conversions, kept light on purpose:

* wikitext rows are lines; an article starts at a top-level `` = Title = ``
  heading and runs to the next one;
* dolly-15k: user = instruction (+ blank line + context when present),
  assistant = response;
* oasst1: one conversation per message tree, following the best-ranked
  reply at each turn from the root prompt (the "top-1 thread"), deleted
  messages dropped, ending on an assistant turn; roles prompter/assistant
  become user/assistant. oasst1 is about 90k rows, so its trees are held
  in memory while they are assembled (unlike fineweb-edu).
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from dlmstore.datasets.build.chat import Message
from dlmstore.errors import DatasetError, SourceUnavailableError

T = TypeVar("T")

FINEWEB_DATASET = "HuggingFaceFW/fineweb-edu"
FINEWEB_CONFIG = "CC-MAIN-2024-10"
FINEWEB_SHUFFLE_BUFFER = 10_000
FINEWEB_TRAIN_TOKENS = 200_000_000
FINEWEB_VAL_TOKENS = 5_000_000
WIKITEXT_DATASET = "Salesforce/wikitext"
WIKITEXT_CONFIG = "wikitext-103-raw-v1"
DOLLY_DATASET = "databricks/databricks-dolly-15k"
OASST_DATASET = "OpenAssistant/oasst1"


@dataclass(frozen=True)
class SourceSpec:
    """One source of build-all: its name, kind, directory and what a local copy may be."""

    name: str
    kind: str
    directory: str
    local_formats: str


SOURCES: dict[str, SourceSpec] = {
    spec.name: spec
    for spec in (
        SourceSpec(
            "fineweb-edu",
            "pretrain",
            "pretrain/fineweb_edu",
            "Parquet/JSONL files with a 'text' field, or text files",
        ),
        SourceSpec(
            "wikitext",
            "pretrain",
            "pretrain/wikitext",
            "Parquet/JSONL line records ('validation' in a file name marks val)",
        ),
        SourceSpec("roam", "pretrain", "pretrain/roam", "a folder of text files"),
        SourceSpec(
            "gutenberg", "pretrain", "pretrain/gutenberg", "a folder of text files (a stub when absent)"
        ),
        SourceSpec("dolly-15k", "sft", "sft/dolly15k", "JSONL/Parquet with instruction/context/response"),
        SourceSpec("oasst1", "sft", "sft/oasst1", "JSONL/Parquet of oasst1 message rows"),
    )
}


def local_hint(name: str) -> str:
    """How to point a source at local files, for one-line messages."""
    return f"point it at local files with --local {name}=PATH ({SOURCES[name].local_formats})"


def hf_rows(name: str, dataset_id: str, config: str | None, split: str, **options: Any) -> Any:
    """A streaming ``datasets`` split; one-line errors naming the source."""
    try:
        import datasets
    except ImportError:
        raise SourceUnavailableError(
            f"{name}: streaming {dataset_id} needs the datasets package: pip install datasets; "
            f"or {local_hint(name)}"
        ) from None
    try:
        return datasets.load_dataset(dataset_id, name=config, split=split, streaming=True, **options)
    except Exception as exc:  # network, auth, offline, missing config: all the same to the user
        raise _unreachable(name, dataset_id, config, exc) from None


def _unreachable(
    name: str, dataset_id: str, config: str | None, exc: BaseException
) -> SourceUnavailableError:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
    where = "the Hugging Face hub" + (" (HF_HUB_OFFLINE is set)" if offline else "")
    label = f"{dataset_id} ({config})" if config else dataset_id
    return SourceUnavailableError(f"{name}: cannot read {label} from {where}: {first}; {local_hint(name)}")


def guarded(name: str, dataset_id: str, config: str | None, items: Iterable[T]) -> Iterator[T]:
    """Re-raise a failure *while streaming* as the same one-line error."""
    iterator = iter(items)
    while True:
        try:
            item = next(iterator)
        except StopIteration:
            return
        except DatasetError:
            raise
        except Exception as exc:  # a dropped connection mid-stream
            raise _unreachable(name, dataset_id, config, exc) from None
        yield item


def field(records: Iterable[dict[str, Any]], key: str, name: str) -> Iterator[str]:
    """One string field of each record."""
    for number, record in enumerate(records, start=1):
        value = record.get(key)
        if not isinstance(value, str):
            raise DatasetError(f"{name}: record {number} has no string field {key!r}")
        yield value


_HEADING = re.compile(r"^ = [^=].* = $")


def wikitext_articles(lines: Iterable[str]) -> Iterator[str]:
    """Join wikitext's line rows into articles, split at top-level headings."""
    article: list[str] = []
    for line in lines:
        if _HEADING.match(line.rstrip("\n")) and any(part.strip() for part in article):
            yield "".join(article).strip("\n")
            article = []
        article.append(line if line.endswith("\n") else line + "\n")
    if any(part.strip() for part in article):
        yield "".join(article).strip("\n")


def dolly_messages(record: dict[str, Any]) -> list[Message] | dict[str, Any]:
    """A dolly-15k record as a conversation (records with ``messages`` pass through)."""
    if "messages" in record:
        return record
    instruction = str(record.get("instruction") or "").strip()
    context = str(record.get("context") or "").strip()
    response = str(record.get("response") or "").strip()
    prompt = f"{instruction}\n\n{context}" if context else instruction
    messages: list[Message] = [{"role": "user", "content": prompt}]
    if response:
        messages.append({"role": "assistant", "content": response})
    return messages


def oasst_threads(rows: Iterable[dict[str, Any]], *, lang: str | None = None) -> Iterator[list[Message]]:
    """One top-ranked thread per oasst1 message tree, in order of first appearance."""
    children: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    roots: list[dict[str, Any]] = []
    for row in rows:
        if row.get("deleted") or (lang is not None and row.get("lang") != lang):
            continue
        if row.get("parent_id") is None:
            roots.append(row)
        else:
            children[row["parent_id"]].append(row)

    def best(candidates: list[dict[str, Any]]) -> dict[str, Any]:
        return min(candidates, key=lambda r: (r.get("rank") is None, r.get("rank") or 0, r["message_id"]))

    for root in roots:
        thread: list[Message] = []
        node: dict[str, Any] | None = root
        while node is not None:
            role = "user" if node.get("role") == "prompter" else "assistant"
            thread.append({"role": role, "content": str(node.get("text") or "")})  # type: ignore[typeddict-item]
            replies = children.get(node["message_id"])
            node = best(replies) if replies else None
        while thread and thread[-1]["role"] != "assistant":
            thread.pop()
        yield thread


def split_by_name(files: Iterable[Any], is_val: Callable[[str], bool]) -> tuple[list[Any], list[Any]]:
    """Partition files into (train, val) by name; ``test`` files are left out."""
    train: list[Any] = []
    val: list[Any] = []
    for file in files:
        lowered = file.name.lower()
        if "test" in lowered:
            continue
        (val if is_val(lowered) else train).append(file)
    return train, val

"""dlmstore reads DocumentLanguageModel's documents as DLM does.

The corpus lives in ``tests/fixtures/dlm/``:

* ``docs/``: documents DLM accepts, one per frontmatter version (1 to 15)
  with that version's keys, and one per body form (fence kinds, code
  blocks, padded headings, CRLF, BOM, markers, whitespace-only sections,
  ``training.sources``);
* ``trees/``: the folders those documents' ``training.sources`` read;
* ``refused/``: documents DLM or dlmstore refuses, each with the ``error:``
  lines ``dlm show`` prints for it in ``<name>.expected``;
* ``expected/``: what DLM itself made of them, recorded by
  ``scripts/dlm-reference-rows.py`` from DLM's source: its rows for each
  document in ``docs/`` (``<stem>.jsonl``) and its verdict on each refused
  one (``refused.json``). Re-run that script when the corpus changes.

The corpus and its rows are fixtures, not generated here, so these tests
need no DLM install.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.corpus.show import document_rows
from dlmstore.document.parser import parse_document, parse_text
from dlmstore.document.versions import CURRENT_DLM_VERSION
from dlmstore.errors import DocumentError

from .helpers import VALID_ID

FIXTURES = Path(__file__).parent / "fixtures" / "dlm"
DOCS = sorted((FIXTURES / "docs").glob("*.dlm"))
REFUSED = sorted((FIXTURES / "refused").glob("*.dlm"))

#: Refused documents that DLM accepts: dlmstore refuses them on purpose, and why.
DLMSTORE_ONLY = {
    "audio-fence.dlm": "dlmstore trains text models only",
    "image-fence.dlm": "dlmstore trains text models only",
    "spaced-fence.dlm": "a near miss of a fence is an error, where DLM trains the line as prose",
    "heading-text-inside-answer.dlm": "`### Q. text` is an error, where DLM makes the line part of the answer",
    "quoted-numbers.dlm": "numbers are strict: a quoted '16' is not a whole number, where DLM converts it",
}


def _name(path: Path) -> str:
    return path.name


def _dlm_rows(doc: Path) -> list[dict[str, Any]]:
    """DLM's recorded rows for ``doc``."""
    text = (FIXTURES / "expected" / f"{doc.stem}.jsonl").read_text(encoding="utf-8")
    # Split on LF only: rows keep U+2028 and friends unescaped, and str.splitlines splits on them.
    return [json.loads(line) for line in text.split("\n") if line]


def _dlm_verdicts() -> dict[str, str]:
    verdicts: dict[str, str] = json.loads(
        (FIXTURES / "expected" / "refused.json").read_text(encoding="utf-8")
    )
    return verdicts


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_dlmstore_makes_the_same_rows_as_dlm_in_the_same_order(doc: Path) -> None:
    assert [row.data for row in document_rows(doc)] == _dlm_rows(doc)


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_every_row_of_a_document_has_its_own_row_key(doc: Path) -> None:
    keys = [row.row_key for row in document_rows(doc)]
    assert len(set(keys)) == len(keys)


def test_each_accepted_document_has_dlms_rows_recorded_and_no_other_rows_are() -> None:
    recorded = sorted(path.stem for path in (FIXTURES / "expected").glob("*.jsonl"))
    assert recorded == [doc.stem for doc in DOCS]


def test_the_accepted_documents_cover_every_frontmatter_version_and_row_kind() -> None:
    versions = {parse_document(doc).frontmatter.dlm_version for doc in DOCS}
    kinds = {row.kind for doc in DOCS for row in document_rows(doc)}
    assert versions == set(range(1, CURRENT_DLM_VERSION + 1))
    assert kinds == {"text", "messages", "preference"}


@pytest.mark.parametrize("doc", REFUSED, ids=_name)
def test_dlm_show_refuses_the_document_with_one_error_line_per_problem(
    doc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(doc.parent)  # messages name the file as given: no temporary paths in them
    result = CliRunner().invoke(cli, ["show", doc.name])
    expected = doc.with_suffix(".expected").read_text(encoding="utf-8").splitlines()
    lines = result.stderr.splitlines()
    assert (result.exit_code, [line for line in lines if line.startswith("error: ")]) == (1, expected)
    # Nothing but error and hint lines, and no exception escaping the CLI's handler.
    assert all(line.startswith(("error: ", "hint: ")) for line in lines)
    assert isinstance(result.exception, SystemExit)
    assert result.stdout == ""


@pytest.mark.parametrize("doc", REFUSED, ids=_name)
def test_dlm_refuses_the_document_too_unless_dlmstore_refuses_it_on_purpose(doc: Path) -> None:
    verdict = _dlm_verdicts()[doc.name]
    assert verdict.startswith("accepted") == (doc.name in DLMSTORE_ONLY), verdict


def test_each_refused_document_has_its_error_lines_and_dlms_verdict_recorded() -> None:
    names = [doc.name for doc in REFUSED]
    expected_files = sorted(
        path.with_suffix(".dlm").name for path in (FIXTURES / "refused").glob("*.expected")
    )
    assert (expected_files, sorted(_dlm_verdicts())) == (names, names)
    assert set(DLMSTORE_ONLY) <= set(names)


NAMED_ADAPTERS = "training:\n  adapters:\n    tone: {}\n    facts: {}\n"


def test_flat_lora_keys_written_at_their_defaults_sit_beside_named_adapters_as_in_dlm() -> None:
    flat = "  adapter: lora\n  lora_r: 8\n  learning_rate: 2e-4\n  target_modules: auto\n"
    document = parse_text(f"---\ndlm_id: {VALID_ID}\n{NAMED_ADAPTERS}{flat}---\nText.\n")
    assert sorted(document.frontmatter.training.adapters or {}) == ["facts", "tone"]


def test_a_flat_lora_key_off_its_default_beside_named_adapters_is_refused_as_in_dlm() -> None:
    with pytest.raises(DocumentError) as caught:
        parse_text(f"---\ndlm_id: {VALID_ID}\n{NAMED_ADAPTERS}  lora_r: 16\n---\nText.\n", "doc.dlm")
    assert caught.value.message == (
        "doc.dlm:3: training.adapters is set, so lora_r must keep the default here "
        "and move into each adapter's block"
    )


@pytest.mark.parametrize("key", ["synth_teacher", "synth_strategy"])
def test_an_auto_synth_marker_with_an_empty_teacher_or_strategy_is_refused_as_in_dlm(key: str) -> None:
    attributes = {
        "synth_teacher": "self",
        "synth_strategy": "extraction",
        "synth_at": "2026-02-03T04:05:06Z",
        "source_section_id": "0123456789abcdef",
        key: "",
    }
    marker = "<!-- dlm-auto-synth:" + "".join(f' {k}="{v}"' for k, v in attributes.items()) + " -->"
    body = f"::instruction::\n{marker}\n### Q\nQ?\n### A\nA.\n"
    with pytest.raises(DocumentError) as caught:
        parse_text(f"---\ndlm_id: {VALID_ID}\n---\n{body}", "doc.dlm")
    assert (caught.value.message, caught.value.hint) == (
        f"doc.dlm:5: dlm-auto-synth marker: {key} is empty",
        f'write {key}="<name>"',
    )

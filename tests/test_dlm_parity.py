"""dlmstore reads DocumentLanguageModel's documents as DLM does."""

from __future__ import annotations

import pytest

from dlmstore.document.parser import parse_text
from dlmstore.errors import DocumentError

from .helpers import VALID_ID

NAMED_ADAPTERS = "training:\n  adapters:\n    tone: {}\n    facts: {}\n"


def test_flat_lora_keys_written_at_their_defaults_sit_beside_named_adapters_as_in_dlm() -> None:
    flat = "  adapter: lora\n  lora_r: 8\n  learning_rate: 2e-4\n  target_modules: auto\n"
    document = parse_text(f"---\ndlm_id: {VALID_ID}\n{NAMED_ADAPTERS}{flat}---\nText.\n")
    assert sorted(document.frontmatter.training.adapters or {}) == ["facts", "tone"]


def test_a_flat_lora_key_off_its_default_beside_named_adapters_is_refused_as_in_dlm() -> None:
    with pytest.raises(DocumentError) as caught:
        parse_text(f"---\ndlm_id: {VALID_ID}\n{NAMED_ADAPTERS}  lora_r: 16\n---\nText.\n", "doc.dlm")
    assert caught.value.message == (
        "doc.dlm:3: training: training.adapters is set, so lora_r must keep the default here "
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

"""Preference rows through the tokenized cache: parity with TRL's DPO and ORPO trainers, counting, checks.

The parity tests build TRL's real trainers on ``tiny_base`` (the real
SmolLM2 tokenizer) from the raw conversational triples and compare what
their own processing produced, column by column, with the columns built
from the cached tokens, and with what the pre-tokenized trainer classes
keep when given those columns.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlmstore.cache.preferences import PARTS, TokenizedPreferences, conversations, encode_preferences
from dlmstore.corpus.pass_result import PassResult
from dlmstore.corpus.tokenize import tokenize_pass
from dlmstore.document.rows import Row
from dlmstore.errors import TrainingError
from dlmstore.train.data.preference_data import (
    DPO_COLUMNS,
    ORPO_COLUMNS,
    check_preferences,
    dpo_columns,
    dpo_dataset,
    orpo_columns,
    orpo_dataset,
    pretokenized_dpo_trainer_class,
    pretokenized_orpo_trainer_class,
)

from .helpers import write_doc

TRIPLES = """::preference::
### Prompt
Explain this code:

```python
print("hi")
```
### Chosen
It prints `hi`.

Then the program exits.
### Rejected
It crashes.

### Prompt
Qu'est-ce qu'un café ? 中文 🙂
### Chosen
Une boisson ☕.
### Rejected
Un pays.

### Prompt
Count to three.
### Chosen
One, two, three.
### Rejected
One, two, three. Four!
"""

BODY = f"Some prose, trained with SFT.\n\n{TRIPLES}"

#: Triples the parser cannot produce (it strips every part), handed to the encoder directly.
EDGE_TRIPLES = [
    ("Finish the line: roses are ", "red.", "blue."),
    ("Ends in a newline\n", "\n  Starts with spaces.", "Tab\tinside."),
    ("Mentions <|im_end|> in text", "Fine.", "Fine!"),
]


@pytest.fixture
def doc(tmp_path: Path, tiny_base: Path) -> Path:
    return write_doc(
        tmp_path / "doc.dlm",
        body=BODY,
        frontmatter=f"base_model: {tiny_base}\ntraining:\n  sequence_len: 256\n",
    )


@pytest.fixture
def tiny_tokenizer(tiny_base: Path) -> Any:
    """The tokenizer the trainers are given (a fresh object: TRL sets its pad token)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_base)


def run_pass(
    doc: Path, *, use_cache: bool = True, load_tokenizer: Callable[[], Any] | None = None
) -> PassResult:
    """The tokenize pass as ``dlm train`` runs it (a recorded run, the base's own tokenizer)."""
    from dlmstore.bases import load_tokenizer as load_base_tokenizer
    from dlmstore.bases import resolve_base
    from dlmstore.corpus.assemble import load_corpus
    from dlmstore.document.parser import parse_document
    from dlmstore.fingerprint import tokenizer_sha256
    from dlmstore.store.database import open_store
    from dlmstore.store.runs import recorded_run

    document = parse_document(doc)
    ref = resolve_base(document.base_model, relative_to=document.directory)
    with (
        open_store(document.dlm_id) as store,
        recorded_run(store, command="tokenize", dlm_path=document.path, dlm_sha256=document.sha256) as run_id,
    ):
        return tokenize_pass(
            store, load_corpus(document), run_id=run_id, tokenizer_sha256=tokenizer_sha256(ref),
            load_tokenizer=load_tokenizer or (lambda: load_base_tokenizer(ref)), use_cache=use_cache,
            cache_mode="on" if use_cache else "bypassed", max_bytes=document.frontmatter.training.cache.max_bytes,
        )  # fmt: skip


def preferences_of(result: PassResult) -> TokenizedPreferences:
    assert result.preferences is not None
    return result.preferences


def parts_as_lists(prefs: TokenizedPreferences) -> dict[str, list[list[int]]]:
    return {part: [getattr(prefs, part)[i].tolist() for i in range(len(prefs))] for part in PARTS}


def as_lists(columns: dict[str, Any]) -> dict[str, list[list[int]]]:
    return {name: [ragged[i].tolist() for i in range(len(ragged))] for name, ragged in columns.items()}


def raw_dataset(rows: list[Row]) -> Any:
    """The triples as the conversational dataset TRL would be given."""
    import datasets

    return datasets.Dataset.from_list(
        [dict(zip(("prompt", "chosen", "rejected"), conversations(row), strict=True)) for row in rows]
    )


def dpo_trainer(
    trainer_class: Any, base: Path, tokenizer: Any, dataset: Any, out: Path, max_length: int
) -> Any:
    from transformers import AutoModelForCausalLM
    from trl.trainer.dpo_config import DPOConfig

    model = AutoModelForCausalLM.from_pretrained(base)
    args = DPOConfig(output_dir=str(out), max_length=max_length, report_to=[], use_cpu=True)
    return trainer_class(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)


def orpo_trainer(
    trainer_class: Any, base: Path, tokenizer: Any, dataset: Any, out: Path, max_length: int
) -> Any:
    from transformers import AutoModelForCausalLM
    from trl.experimental.orpo import ORPOConfig

    model = AutoModelForCausalLM.from_pretrained(base)
    args = ORPOConfig(output_dir=str(out), max_length=max_length, report_to=[], use_cpu=True)
    return trainer_class(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)


def trainer_columns(trainer: Any, names: tuple[str, ...]) -> dict[str, list[list[int]]]:
    columns: dict[str, list[list[int]]] = trainer.train_dataset.select_columns(list(names)).to_dict()
    return columns


def preference_rows(doc: Path) -> list[Row]:
    from dlmstore.corpus.assemble import load_corpus
    from dlmstore.document.parser import parse_document

    return [row for row in load_corpus(parse_document(doc)).rows() if row.kind == "preference"]


# --- parity -----------------------------------------------------------------------------------


def test_cached_uncached_and_trl_processing_give_identical_dpo_and_orpo_ids(
    doc: Path, tiny_base: Path, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    from trl.experimental.orpo import ORPOTrainer
    from trl.trainer.dpo_trainer import DPOTrainer

    cold, warm, bypass = run_pass(doc), run_pass(doc), run_pass(doc, use_cache=False)
    assert (cold.event.cache_misses, warm.event.cache_hits, bypass.event.cache_misses) == (4, 4, 4)
    prefs = preferences_of(warm)
    assert (
        parts_as_lists(preferences_of(cold))
        == parts_as_lists(prefs)
        == parts_as_lists(preferences_of(bypass))
    )
    rows = preference_rows(doc)
    assert len(prefs) == len(rows) == 3

    raw = raw_dataset(rows)
    trl_dpo = dpo_trainer(DPOTrainer, tiny_base, tiny_tokenizer, raw, tmp_path / "dpo", 256)
    assert len(trl_dpo.train_dataset) == 3
    assert as_lists(dpo_columns(prefs)) == trainer_columns(trl_dpo, DPO_COLUMNS)
    ours = dpo_trainer(
        pretokenized_dpo_trainer_class(), tiny_base, tiny_tokenizer, dpo_dataset(prefs), tmp_path / "d", 256
    )
    assert ours.train_dataset.column_names == list(DPO_COLUMNS)
    assert trainer_columns(ours, DPO_COLUMNS) == trainer_columns(trl_dpo, DPO_COLUMNS)
    assert ours.train_dataset.features == trl_dpo.train_dataset.select_columns(list(DPO_COLUMNS)).features

    # 256 leaves room for everything; 40 cuts answers short and leaves the code prompt none.
    ids = {"bos_token_id": tiny_tokenizer.bos_token_id, "eos_token_id": tiny_tokenizer.eos_token_id}
    for max_length in (256, 40):
        trl_orpo = orpo_trainer(ORPOTrainer, tiny_base, tiny_tokenizer, raw, tmp_path / "orpo", max_length)
        expected = trainer_columns(trl_orpo, ORPO_COLUMNS)
        assert as_lists(orpo_columns(prefs, max_length=max_length, **ids)) == expected
        dataset = orpo_dataset(prefs, max_length=max_length, **ids)
        ours = orpo_trainer(
            pretokenized_orpo_trainer_class(), tiny_base, tiny_tokenizer, dataset, tmp_path / "o", max_length
        )
        assert ours.train_dataset.column_names == list(ORPO_COLUMNS)
        assert trainer_columns(ours, ORPO_COLUMNS) == expected
        assert (
            ours.train_dataset.features == trl_orpo.train_dataset.select_columns(list(ORPO_COLUMNS)).features
        )
    # With room, ORPO's chosen sequence is DPO's prompt + chosen and TRL's extra EOS.
    full = as_lists(orpo_columns(prefs, max_length=256, **ids))["chosen_input_ids"][0]
    dpo = as_lists(dpo_columns(prefs))
    assert full == dpo["prompt_ids"][0] + dpo["chosen_ids"][0] + [tiny_tokenizer.eos_token_id]


def edge_rows() -> list[Row]:
    return [
        Row(
            f"sha256:{i:064x}", "0123456789abcdef", i, "preference", {"prompt": p, "chosen": c, "rejected": r}
        )
        for i, (p, c, r) in enumerate(EDGE_TRIPLES)
    ]


def prefs_from_rows(tokenizer: Any, rows: list[Row]) -> TokenizedPreferences:
    from dlmstore.cache.preferences import part_keys

    arrays: dict[str, Any] = {}
    for row, parts in zip(rows, encode_preferences(tokenizer, rows), strict=True):
        arrays.update(zip(part_keys(row.row_key), (parts[part] for part in PARTS), strict=True))
    return TokenizedPreferences.of("doc.dlm", rows, [None] * len(rows), arrays)


#: SmolLM2's template, but the generation prompt opens an empty thought block the
#: conversation does not have (as Gemma 4's does): the prompt alone is then no
#: prefix of the conversation, and DPO and ORPO cut it in different places.
THINKING = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n<think></think>' }}{% endif %}"


#: A template with no special tokens: TRL's ORPO prepends BOS, and the space that
#: ends the generation prompt merges with the response's first word.
PLAIN = (
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


@pytest.mark.parametrize("template", ["smollm2", "thinking", "plain"])
def test_triples_the_parser_never_makes_and_a_template_that_renders_the_prompt_apart_keep_parity(
    template: str, tiny_base: Path, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    from trl.experimental.orpo import ORPOTrainer
    from trl.trainer.dpo_trainer import DPOTrainer

    rows = edge_rows()
    if template == "thinking":
        generation = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
        assert generation in tiny_tokenizer.chat_template
        tiny_tokenizer.chat_template = tiny_tokenizer.chat_template.replace(generation, THINKING)
        # a response that starts like the thought block shares a character with it
        rows.append(Row("sha256:" + "f" * 64, "0123456789abcdef", 3, "preference",
                        {"prompt": "Tag?", "chosen": "<b>bold</b>", "rejected": "<i>it</i>"}))  # fmt: skip
    if template == "plain":
        tiny_tokenizer.chat_template = PLAIN
    prefs = prefs_from_rows(tiny_tokenizer, rows)
    if template == "thinking":
        assert all(len(prefs.shared_prompt[i]) < len(prefs.prompt[i]) for i in range(len(prefs)))
    raw = raw_dataset(rows)
    trl_dpo = dpo_trainer(DPOTrainer, tiny_base, tiny_tokenizer, raw, tmp_path / "dpo", 256)
    assert as_lists(dpo_columns(prefs)) == trainer_columns(trl_dpo, DPO_COLUMNS)
    trl_orpo = orpo_trainer(ORPOTrainer, tiny_base, tiny_tokenizer, raw, tmp_path / "orpo", 256)
    ids = {"bos_token_id": tiny_tokenizer.bos_token_id, "eos_token_id": tiny_tokenizer.eos_token_id}
    assert as_lists(orpo_columns(prefs, max_length=256, **ids)) == trainer_columns(trl_orpo, ORPO_COLUMNS)


# --- the cache --------------------------------------------------------------------------------


def test_a_second_pass_hits_every_preference_row_and_an_edited_triple_is_one_miss(
    tmp_path: Path, tiny_base: Path
) -> None:
    # Row keys follow their section's content (as for instruction pairs), so the
    # triple to edit gets a section of its own.
    alone = "\n::preference::\n### Prompt\nAlone?\n### Chosen\nYes.\n### Rejected\nNo.\n"
    doc = write_doc(tmp_path / "doc.dlm", body=BODY + alone, frontmatter=f"base_model: {tiny_base}\n")
    cold = run_pass(doc)
    assert (cold.event.total_rows, cold.event.cache_misses, cold.preference_rows) == (5, 5, 4)
    warm = run_pass(doc, load_tokenizer=_no_tokenizer)
    assert (warm.event.cache_hits, warm.event.cache_misses) == (5, 0)
    doc.write_text(doc.read_text().replace("No.", "Never."))
    edited = run_pass(doc)
    assert (edited.event.total_rows, edited.event.cache_hits, edited.event.cache_misses) == (5, 4, 1)
    before, after = preferences_of(warm), preferences_of(edited)
    assert after.row_keys[:3] == before.row_keys[:3] and after.row_keys[3] != before.row_keys[3]
    assert after.rejected[3].tolist() != before.rejected[3].tolist()
    assert after.chosen[3].tolist() == before.chosen[3].tolist()


def test_the_sft_rows_are_the_same_with_or_without_preference_sections(
    tmp_path: Path, tiny_base: Path
) -> None:
    front = f"base_model: {tiny_base}\n"
    with_prefs = run_pass(write_doc(tmp_path / "a.dlm", body=BODY, frontmatter=front))
    assert with_prefs.rows is not None and with_prefs.rows.kinds == ("text",)
    alone = run_pass(write_doc(tmp_path / "b.dlm", body="Some prose, trained with SFT.\n", frontmatter=front))
    assert alone.rows is not None
    assert alone.rows.values.tolist() == with_prefs.rows.values.tolist()
    assert alone.token_count == with_prefs.token_count == with_prefs.rows.token_count


def _no_tokenizer() -> Any:
    raise AssertionError("an all-hit pass must not load the tokenizer")


def test_switching_between_dpo_and_orpo_reuses_the_cached_parts(doc: Path, tiny_tokenizer: Any) -> None:
    run_pass(doc)
    warm = run_pass(doc, load_tokenizer=_no_tokenizer)
    prefs = preferences_of(warm)
    assert warm.event.cache_misses == 0
    assert len(dpo_columns(prefs)["chosen_ids"]) == 3
    ids = {"bos_token_id": tiny_tokenizer.bos_token_id, "eos_token_id": tiny_tokenizer.eos_token_id}
    assert len(orpo_columns(prefs, max_length=256, **ids)["chosen_labels"]) == 3


def test_each_part_is_a_cache_entry_under_its_own_key_and_a_lost_part_is_a_miss(doc: Path) -> None:
    import sqlite3

    from dlmstore.cache.preferences import part_key
    from dlmstore.home import store_dir

    from .helpers import VALID_ID

    cold = run_pass(doc)
    prefs = preferences_of(cold)
    keys = [part_key(prefs.row_keys[2], part) for part in PARTS]
    assert len(set(keys)) == 4 and prefs.row_keys[2] not in keys
    with sqlite3.connect(store_dir(VALID_ID) / "store.db") as conn:
        found = {k for (k,) in conn.execute("SELECT row_key FROM cache_entries")}
        assert set(keys) <= found
        conn.execute("DELETE FROM cache_entries WHERE row_key = ?", (keys[1],))
    again = run_pass(doc)
    assert (again.event.cache_hits, again.event.cache_misses) == (3, 1)
    assert parts_as_lists(preferences_of(again)) == parts_as_lists(prefs)


def test_dlm_tokenize_reports_the_preference_rows_it_tokenized(doc: Path) -> None:
    from dlmstore.cli.main import cli

    result = CliRunner().invoke(cli, ["tokenize", str(doc)])
    assert result.exit_code == 0, result.output
    assert "run 1: 4 rows," in result.output
    line = next(line for line in result.output.splitlines() if line.startswith("prefs:"))
    assert re.fullmatch(
        r"prefs:  3 preference rows, [\d,]+ tokens in their chosen and rejected conversations "
        r"\(for DPO/ORPO, not SFT\)",
        line,
    )


# --- checks -----------------------------------------------------------------------------------


def test_a_triple_whose_chosen_equals_its_rejected_is_refused_before_training(
    tmp_path: Path, tiny_base: Path
) -> None:
    body = "Prose.\n\n" + TRIPLES.replace("Un pays.", "Une boisson ☕.")
    doc = write_doc(tmp_path / "doc.dlm", body=body, frontmatter=f"base_model: {tiny_base}\n")
    prefs = preferences_of(run_pass(doc))
    with pytest.raises(TrainingError) as caught:
        check_preferences(prefs, sequence_len=2048)
    # the ::preference:: fence is line 7 (3 frontmatter lines, prose, blank line)
    assert (
        str(caught.value)
        == f"{doc}:7: preference triple 2: chosen and rejected are the same text, so it teaches no preference"
    )
    assert caught.value.hint == "edit one of the two responses, or delete the triple"


def test_a_prompt_that_fills_sequence_len_is_refused_where_dpo_would_drop_it(
    doc: Path, tiny_base: Path, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    from trl.trainer.dpo_trainer import DPOTrainer

    prefs = preferences_of(run_pass(doc))
    lengths = [len(prefs.prompt[i]) for i in range(len(prefs))]
    longest = max(lengths)
    check_preferences(prefs, sequence_len=longest + 1)
    with pytest.raises(TrainingError) as caught:
        check_preferences(prefs, sequence_len=longest)
    first = lengths.index(longest)
    assert str(caught.value) == (
        f"{doc}:9: preference triple {first + 1}: the prompt is {longest} tokens with the chat template, "
        f"which leaves no room for a response in training.sequence_len ({longest})"
    )
    assert caught.value.hint == "shorten the prompt or raise training.sequence_len"
    # what TRL does with it: drops the triple without a word
    trl_dpo = dpo_trainer(
        DPOTrainer, tiny_base, tiny_tokenizer, raw_dataset(preference_rows(doc)), tmp_path, longest
    )
    assert len(trl_dpo.train_dataset) == 2
    # and the pre-tokenized trainer applies TRL's same rule
    ours = dpo_trainer(
        pretokenized_dpo_trainer_class(), tiny_base, tiny_tokenizer, dpo_dataset(prefs), tmp_path, longest
    )
    assert trainer_columns(ours, DPO_COLUMNS) == trainer_columns(trl_dpo, DPO_COLUMNS)


def test_several_refused_triples_are_counted_in_one_message(tmp_path: Path, tiny_base: Path) -> None:
    body = "::preference::\n" + "".join(
        f"### Prompt\np{i}\n### Chosen\nsame\n### Rejected\nsame\n\n" for i in range(3)
    )
    doc = write_doc(tmp_path / "doc.dlm", body=body, frontmatter=f"base_model: {tiny_base}\n")
    with pytest.raises(
        TrainingError,
        match=r"doc.dlm:5: preference triple 1: .* \(2 more preference triples cannot be trained either\)$",
    ):
        check_preferences(preferences_of(run_pass(doc)), sequence_len=2048)


def test_dlm_show_warns_about_a_triple_whose_chosen_equals_its_rejected(tmp_path: Path) -> None:
    from dlmstore.corpus.show import document_warnings
    from dlmstore.document.parser import parse_document

    body = "::preference::\n### Prompt\np\n### Chosen\nsame\n### Rejected\nr\n\n### Prompt\nq\n### Chosen\nsame\n### Rejected\nsame\n"
    doc = write_doc(tmp_path / "doc.dlm", body=body)
    assert document_warnings(parse_document(doc)) == [
        f"{doc}:4: preference triple 2: chosen and rejected are the same text; "
        "it teaches no preference, and preference training refuses it"
    ]

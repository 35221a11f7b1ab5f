"""The frontmatter: models, defaults, and every error message with its line.

Most tests go through ``parse_text`` so line numbers are file lines, as a
user sees them; a few call ``load_frontmatter`` directly to pin its
``first_line`` contract.
"""

from __future__ import annotations

import pytest

from dlmstore.document.frontmatter import (
    CURRENT_DLM_VERSION,
    DEFAULT_BASE_MODEL,
    CacheSettings,
    Frontmatter,
    SourceDirective,
    TrainingSettings,
    load_frontmatter,
)
from dlmstore.document.parser import parse_text
from dlmstore.errors import DocumentError

ULID = "01J9ZK3M4N5P6Q7R8S9T0VWXYZ"
HEAD = f"---\ndlm_id: {ULID}\n---\n"


def error_of(text: str, path: str = "doc.dlm") -> DocumentError:
    with pytest.raises(DocumentError) as info:
        parse_text(text, path)
    return info.value


# --------------------------------------------------------------------------
# Defaults and the public loader


def test_frontmatter_defaults_fill_every_other_field():
    fm = parse_text(HEAD).frontmatter
    assert fm.dlm_version == CURRENT_DLM_VERSION
    assert fm.base_model == DEFAULT_BASE_MODEL
    assert fm.system_prompt is None
    assert fm.training.sequence_len == 2048
    assert fm.training.sources == []
    assert fm.training.cache.enabled is True


def test_load_frontmatter_returns_the_validated_model():
    fm = load_frontmatter(f"dlm_id: {ULID}\ntraining:\n  seed: 7", path="x.dlm", first_line=2)
    assert isinstance(fm, Frontmatter)
    assert fm.training.seed == 7


def test_load_frontmatter_counts_lines_from_first_line():
    with pytest.raises(DocumentError) as info:
        load_frontmatter(f"dlm_id: {ULID}\ntraining:\n  sead: 7", path="x.dlm", first_line=10)
    assert str(info.value) == "x.dlm:12: unknown key 'training.sead'"


def test_load_frontmatter_reports_a_missing_top_level_key_at_the_opening_fence():
    with pytest.raises(DocumentError) as info:
        load_frontmatter("", path="x.dlm", first_line=10)
    assert str(info.value) == "x.dlm:9: missing required key 'dlm_id'"


@pytest.mark.parametrize("model", [Frontmatter, TrainingSettings, CacheSettings, SourceDirective])
def test_every_frontmatter_field_has_a_one_line_description(model):
    for name, field in model.model_fields.items():
        assert field.description, f"{model.__name__}.{name} has no description"
        assert "\n" not in field.description and "|" not in field.description
        assert field.description.endswith(".")


# --------------------------------------------------------------------------
# Errors


def test_bad_yaml_names_the_problem_and_its_line():
    err = error_of(f"---\ndlm_id: {ULID}\nbase_model: 'unterminated\n---\n")
    assert str(err) == (
        "doc.dlm:3: invalid YAML in frontmatter: found unexpected end of stream "
        "(while scanning a quoted scalar at line 3)"
    )


def test_a_character_yaml_refuses_is_an_error_at_its_line():
    err = error_of(f"---\ndlm_id: {ULID}\nbase_model: a\x01\n---\n")
    assert str(err) == (
        "doc.dlm:3: invalid YAML in frontmatter: unacceptable character #x0001: "
        "special characters are not allowed"
    )


def test_frontmatter_that_is_not_a_mapping_is_an_error():
    err = error_of("---\n- a\n- b\n---\n")
    assert str(err) == "doc.dlm:2: frontmatter must be a mapping of keys to values, not a list"


def test_empty_frontmatter_is_missing_its_id():
    err = error_of("---\n---\nbody\n")
    assert str(err) == "doc.dlm:1: missing required key 'dlm_id'"
    assert err.hint == "`dlm init PATH` writes a new document with a fresh dlm_id"


def test_an_unknown_top_level_key_is_an_error_with_the_allowed_keys():
    err = error_of(f"---\ndlm_id: {ULID}\ntrainig:\n  seed: 1\n---\n")
    assert str(err) == "doc.dlm:3: unknown key 'trainig'"
    assert err.line == 3
    assert err.hint == (
        "did you mean 'training'? allowed keys at the top level: "
        "dlm_id, dlm_version, base_model, system_prompt, training"
    )


def test_an_unknown_nested_key_is_reported_at_its_own_line():
    text = (
        "---\n"
        f"dlm_id: {ULID}\n"
        "base_model: smollm2-135m\n"
        "training:\n"
        "  seed: 7\n"
        "  cache:\n"
        "    enabled: true\n"
        "    max_byts: 10\n"
        "---\n"
    )
    err = error_of(text)
    assert str(err) == "doc.dlm:8: unknown key 'training.cache.max_byts'"
    assert err.hint == (
        "did you mean 'max_bytes'? allowed keys in 'training.cache': "
        "enabled, max_bytes, prune_older_than_days"
    )


def test_the_earliest_error_in_the_file_is_reported():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  sequnce_len: 1\n  seed: x\n---\n"
    assert str(error_of(text)) == "doc.dlm:4: unknown key 'training.sequnce_len'"


def test_an_unknown_key_in_a_source_directive_names_the_list_item():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  sources:\n    - path: a\n      inclde: ['*.md']\n---\n"
    assert str(error_of(text)) == "doc.dlm:6: unknown key 'training.sources[0].inclde'"


def test_a_source_directive_without_a_path_is_reported_at_the_item():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  sources:\n    - include: ['*.md']\n---\n"
    assert str(error_of(text)) == "doc.dlm:5: missing required key 'training.sources[0].path'"


def test_an_invalid_ulid_is_an_error():
    err = error_of("---\nbase_model: x\ndlm_id: 01j9zk3m4n5p6q7r8s9t0vwxyz\n---\n")
    assert str(err) == (
        "doc.dlm:3: dlm_id: must be a 26-character Crockford base32 ULID (run `dlm init` to mint one)"
    )


def test_an_out_of_range_value_names_both_bounds():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  sequence_len: 32\n---\n"
    assert str(error_of(text)) == "doc.dlm:4: training.sequence_len: must be between 64 and 32768"


def test_a_half_open_range_is_worded_from_the_field_constraints():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  dropout: 1.5\n---\n"
    assert str(error_of(text)) == ("doc.dlm:4: training.dropout: must be at least 0.0 and less than 1.0")
    text = f"---\ndlm_id: {ULID}\ntraining:\n  epochs: 0\n---\n"
    assert str(error_of(text)) == "doc.dlm:4: training.epochs: must be greater than 0"


def test_a_wrong_type_says_what_was_expected_and_what_was_found():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  seed: many\n---\n"
    assert str(error_of(text)) == "doc.dlm:4: training.seed: must be a whole number, not 'many'"
    text = f"---\ndlm_id: {ULID}\ntraining:\n  cache:\n---\n"
    assert str(error_of(text)) == (
        "doc.dlm:4: training.cache: must be a mapping of keys to values, not empty (null)"
    )


def test_a_bad_choice_lists_the_allowed_values():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  sources_policy: lax\n---\n"
    assert str(error_of(text)) == ("doc.dlm:4: training.sources_policy: must be 'permissive' or 'strict'")


def test_a_duplicate_key_is_an_error():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  seed: 1\n  seed: 2\n---\n"
    assert str(error_of(text)) == "doc.dlm:5: duplicate key 'training.seed' (first set at line 4)"


def test_a_key_that_is_not_a_string_is_an_unknown_key():
    err = error_of(f"---\ndlm_id: {ULID}\ntraining:\n  1: 2\n---\n")
    assert str(err) == "doc.dlm:4: unknown key 'training.1'"


def test_a_key_overriding_a_yaml_merge_is_not_a_duplicate():
    text = (
        "---\n"
        f"dlm_id: {ULID}\n"
        "training:\n"
        "  sources:\n"
        "    - &notes {path: notes, max_files: 3}\n"
        "    - <<: *notes\n"
        "      path: more\n"
        "---\n"
    )
    sources = parse_text(text).frontmatter.training.sources
    assert [(s.path, s.max_files) for s in sources] == [("notes", 3), ("more", 3)]


def test_a_yaml_alias_bomb_is_rejected_quickly():
    bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)
    )
    err = error_of(f"---\ndlm_id: {ULID}\n{bomb}---\n")
    assert str(err) == "doc.dlm:3: unknown key 'a0'"


def test_a_newer_dlm_version_asks_for_a_newer_dlmstore():
    newer = CURRENT_DLM_VERSION + 1
    err = error_of(f"---\ndlm_id: {ULID}\ndlm_version: {newer}\nfuture_key: 1\n---\n")
    assert str(err) == (
        f"doc.dlm:3: dlm_version {newer} needs a newer dlmstore "
        f"(this one reads dlm_version {CURRENT_DLM_VERSION})"
    )
    assert err.hint == "upgrade dlmstore: pip install -U dlmstore"


# --------------------------------------------------------------------------
# Whole numbers are strict: a YAML boolean is not 1


def test_a_boolean_where_a_whole_number_belongs_is_an_error():
    err = error_of(f"---\ndlm_id: {ULID}\ndlm_version: true\n---\n")
    assert str(err) == "doc.dlm:3: dlm_version: must be a whole number, not True"
    assert err.line == 3


@pytest.mark.parametrize(
    ("yaml", "line", "dotted"),
    [
        ("training:\n  sequence_len: true", 4, "training.sequence_len"),
        ("training:\n  seed: false", 4, "training.seed"),
        ("training:\n  r: true", 4, "training.r"),
        ("training:\n  alpha: true", 4, "training.alpha"),
        ("training:\n  epochs: true", 4, "training.epochs"),
        ("training:\n  max_steps: true", 4, "training.max_steps"),
        ("training:\n  batch_size: true", 4, "training.batch_size"),
        ("training:\n  cache:\n    max_bytes: true", 5, "training.cache.max_bytes"),
        ("training:\n  cache:\n    prune_older_than_days: false", 5, "training.cache.prune_older_than_days"),
        ("training:\n  sources:\n    - path: a\n      max_files: true", 6, "training.sources[0].max_files"),
        (
            "training:\n  sources:\n    - path: a\n      max_bytes_per_file: true",
            6,
            "training.sources[0].max_bytes_per_file",
        ),
    ],
)
def test_every_whole_number_field_refuses_a_boolean(yaml, line, dotted):
    err = error_of(f"---\ndlm_id: {ULID}\n{yaml}\n---\n")
    assert str(err).startswith(f"doc.dlm:{line}: {dotted}: must be a whole number, not ")


def test_yaml_integers_still_validate_as_whole_numbers():
    text = (
        "---\n"
        f"dlm_id: {ULID}\n"
        "dlm_version: 1\n"
        "training:\n"
        "  sequence_len: 4096\n"
        "  seed: 0\n"
        "  r: 0x10\n"
        "  alpha: 32\n"
        "  epochs: 3\n"
        "  max_steps: 1_000\n"
        "  batch_size: 4\n"
        "  sources:\n"
        "    - {path: a, max_bytes_per_file: 200000, max_files: 5}\n"
        "  cache: {max_bytes: 2147483648, prune_older_than_days: 0}\n"
        "---\n"
    )
    training = parse_text(text).frontmatter.training
    assert (training.sequence_len, training.seed, training.r, training.alpha) == (4096, 0, 16, 32)
    assert (training.epochs, training.max_steps, training.batch_size) == (3, 1000, 4)
    assert (training.sources[0].max_bytes_per_file, training.sources[0].max_files) == (200000, 5)
    assert (training.cache.max_bytes, training.cache.prune_older_than_days) == (2147483648, 0)


def test_a_quoted_number_or_a_float_is_not_a_whole_number():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  seed: '42'\n---\n"
    assert str(error_of(text)) == "doc.dlm:4: training.seed: must be a whole number, not '42'"
    text = f"---\ndlm_id: {ULID}\ntraining:\n  sequence_len: 2048.0\n---\n"
    assert str(error_of(text)) == ("doc.dlm:4: training.sequence_len: must be a whole number, not 2048.0")

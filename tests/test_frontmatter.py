"""The frontmatter: DLM's schema, its versions, defaults, and every error message with its line.

Most tests go through ``parse_text`` so line numbers are file lines, as a
user sees them; a few call ``load_frontmatter`` directly to pin its
``first_line`` contract.
"""

from __future__ import annotations

import typing

import pytest
from pydantic import BaseModel

from dlmstore.corpus.show import document_warnings
from dlmstore.document.frontmatter import (
    DEFAULT_BASE_MODEL,
    AdapterSettings,
    AudioSettings,
    CacheSettings,
    CptSettings,
    ExportSettings,
    Frontmatter,
    GateSettings,
    PreferenceHyperparams,
    PreferenceSettings,
    SourceDirective,
    TrainingSettings,
    set_keys,
    unused_keys,
)
from dlmstore.document.loading import load_frontmatter
from dlmstore.document.parser import parse_text
from dlmstore.document.versions import CURRENT_DLM_VERSION
from dlmstore.errors import DocumentError, DocumentProblems

ULID = "01J9ZK3M4N5P6Q7R8S9T0VWXYZ"
HEAD = f"---\ndlm_id: {ULID}\n---\n"


def error_of(text: str, path: str = "doc.dlm") -> DocumentError:
    with pytest.raises(DocumentError) as info:
        parse_text(text, path)
    return info.value


def problems_of(text: str, path: str = "doc.dlm") -> list[str]:
    """The ``path:line: message`` of every problem a document has, in the order reported."""
    with pytest.raises(DocumentProblems) as info:
        parse_text(text, path)
    return [str(problem) for problem in info.value.problems]


def training(yaml: str) -> TrainingSettings:
    return parse_text(f"---\ndlm_id: {ULID}\n{yaml}\n---\n").frontmatter.training


# --------------------------------------------------------------------------
# Defaults and the public loader


def test_frontmatter_defaults_fill_every_other_field():
    fm = parse_text(HEAD).frontmatter
    assert fm.dlm_version == 1  # unset reads as 1, as in DLM
    assert fm.base_model == DEFAULT_BASE_MODEL
    assert fm.system_prompt is None
    assert fm.training.sequence_len == 2048
    assert fm.training.sources == []
    assert fm.training.cache.enabled is True


def test_the_training_defaults_are_dlms():
    t = parse_text(HEAD).frontmatter.training
    assert t.model_dump(
        exclude={
            "sequence_len",
            "seed",
            "max_steps",
            "report_to",
            "sources",
            "sources_policy",
            "cache",
            "replay",
            "datasets",
            "checkpoint_steps",
            "dedup",
        }  # fmt: skip
    ) == {
        "adapter": "lora",
        "lora_r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.05,
        "target_modules": "auto",
        "micro_batch_size": "auto",
        "grad_accum": "auto",
        "learning_rate": 2e-4,
        "num_epochs": 3,
        "optimizer": "adamw_torch",
        "lr_scheduler": "cosine",
        "warmup_ratio": 0.1,
        "precision": None,
        "preference": {
            "enabled": False,
            "method": "dpo",
            "hyperparams": {"beta": 0.1, "alpha": 0.1, "learning_rate": 5e-6, "num_epochs": 1},
            "loss_type": "sigmoid",
            "reference": "pre_adapter",
        },
        "cpt": {"schedule": "auto", "embed_warmup_steps": 0},
        "gate": {
            "enabled": False,
            "hidden_proj_dim": 64,
            "steps": 200,
            "lr": 3e-4,
            "cold_start_floor": 4,
            "entropy_lambda": 0.01,
        },
        "audio": {"auto_resample": False},
        "adapters": None,
    }
    assert parse_text(HEAD).frontmatter.export == ExportSettings(default_quant="Q4_K_M")


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


@pytest.mark.parametrize(
    "model",
    [
        Frontmatter, TrainingSettings, CacheSettings, SourceDirective, PreferenceSettings,
        PreferenceHyperparams, CptSettings, GateSettings, AudioSettings, AdapterSettings, ExportSettings,
    ],
)  # fmt: skip
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
        "dlm_id, dlm_version, base_model, system_prompt, training, export"
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
        "enabled, max_bytes, prune_older_than_days, share"
    )


def test_every_error_in_the_frontmatter_is_reported_in_line_order():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  sequnce_len: 1\n  seed: x\n---\n"
    assert problems_of(text) == [
        "doc.dlm:4: unknown key 'training.sequnce_len'",
        "doc.dlm:5: training.seed: must be a whole number, not 'x'",
    ]


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
    text = f"---\ndlm_id: {ULID}\ntraining:\n  num_epochs: 0\n---\n"
    assert str(error_of(text)) == "doc.dlm:4: training.num_epochs: must be at least 1"
    text = f"---\ndlm_id: {ULID}\ntraining:\n  learning_rate: 0\n---\n"
    assert str(error_of(text)) == "doc.dlm:4: training.learning_rate: must be greater than 0.0"
    text = f"---\ndlm_id: {ULID}\ntraining:\n  lora_dropout: 1.5\n---\n"
    assert str(error_of(text)) == "doc.dlm:4: training.lora_dropout: must be between 0.0 and 0.5"


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


def test_a_key_that_is_not_a_string_among_named_adapters_says_what_the_keys_are():
    err = error_of(f"---\ndlm_id: {ULID}\ntraining:\n  adapters:\n    1: {{}}\n    a: {{}}\n---\n")
    assert str(err) == "doc.dlm:5: unknown key 'training.adapters.1'"
    assert err.hint == (
        "the keys in 'training.adapters' are adapter names (a lower case letter, then a-z 0-9 _)"
    )


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


# --------------------------------------------------------------------------
# Whole numbers are strict: a YAML boolean is not 1


def test_a_boolean_where_a_whole_number_belongs_is_an_error():
    err = error_of(f"---\ndlm_id: {ULID}\ndlm_version: true\n---\n")
    assert str(err) == "doc.dlm:3: dlm_version: must be a whole number of at least 1, not True"
    assert err.line == 3
    assert err.hint == f"the current version is {CURRENT_DLM_VERSION}"


@pytest.mark.parametrize(
    ("yaml", "line", "dotted"),
    [
        ("training:\n  sequence_len: true", 4, "training.sequence_len"),
        ("training:\n  seed: false", 4, "training.seed"),
        ("training:\n  lora_r: true", 4, "training.lora_r"),
        ("training:\n  lora_alpha: true", 4, "training.lora_alpha"),
        ("training:\n  num_epochs: true", 4, "training.num_epochs"),
        ("training:\n  max_steps: true", 4, "training.max_steps"),
        ("training:\n  cpt:\n    embed_warmup_steps: true", 5, "training.cpt.embed_warmup_steps"),
        ("training:\n  gate:\n    steps: true", 5, "training.gate.steps"),
        (
            "training:\n  preference:\n    hyperparams:\n      num_epochs: true",
            6,
            "training.preference.hyperparams.num_epochs",
        ),
        ("training:\n  adapters:\n    tone:\n      lora_r: true", 6, "training.adapters.tone.lora_r"),
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
        "  lora_r: 0x10\n"
        "  lora_alpha: 32\n"
        "  num_epochs: 3\n"
        "  max_steps: 1_000\n"
        "  micro_batch_size: 4\n"
        "  grad_accum: 8\n"
        "  sources:\n"
        "    - {path: a, max_bytes_per_file: 200000, max_files: 5}\n"
        "  cache: {max_bytes: 2147483648, prune_older_than_days: 0}\n"
        "---\n"
    )
    training = parse_text(text).frontmatter.training
    assert (training.sequence_len, training.seed, training.lora_r, training.lora_alpha) == (4096, 0, 16, 32)
    assert (training.num_epochs, training.max_steps, training.micro_batch_size) == (3, 1000, 4)
    assert training.grad_accum == 8
    assert (training.sources[0].max_bytes_per_file, training.sources[0].max_files) == (200000, 5)
    assert (training.cache.max_bytes, training.cache.prune_older_than_days) == (2147483648, 0)


def test_a_quoted_number_or_a_float_is_not_a_whole_number():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  seed: '42'\n---\n"
    assert str(error_of(text)) == "doc.dlm:4: training.seed: must be a whole number, not '42'"
    text = f"---\ndlm_id: {ULID}\ntraining:\n  sequence_len: 2048.0\n---\n"
    assert str(error_of(text)) == ("doc.dlm:4: training.sequence_len: must be a whole number, not 2048.0")


# --------------------------------------------------------------------------
# Floats are finite: YAML's .inf and .nan are refused in every float field


def _float_fields(model: type[BaseModel] = Frontmatter, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The key path of every float field under ``model`` (a named adapter is ``tone``)."""
    found: list[tuple[str, ...]] = []
    for name, info in model.model_fields.items():
        here = (*path, name)
        if typing.get_origin(info.annotation) is list:
            continue  # a list of models (training.datasets): its own test below
        kinds = typing.get_args(info.annotation) or (info.annotation,)
        if float in kinds:
            found.append(here)
        for kind in kinds:
            args = typing.get_args(kind)
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                found.extend(_float_fields(kind, here))
            elif args and isinstance(args[-1], type) and issubclass(args[-1], BaseModel):  # dict[str, Model]
                found.extend(_float_fields(args[-1], (*here, "tone")))
    return found


def _nested_yaml(path: tuple[str, ...], value: str) -> str:
    return "".join(f"{'  ' * depth}{key}:\n" for depth, key in enumerate(path[:-1])) + (
        f"{'  ' * (len(path) - 1)}{path[-1]}: {value}"
    )


FLOAT_FIELDS = _float_fields()


def test_the_float_fields_found_include_every_learning_rate_and_ratio():
    dotted = {".".join(path) for path in FLOAT_FIELDS}
    assert {
        "training.learning_rate", "training.lora_dropout", "training.warmup_ratio",
        "training.preference.hyperparams.learning_rate", "training.preference.hyperparams.beta",
        "training.preference.hyperparams.alpha", "training.gate.lr", "training.adapters.tone.learning_rate",
        "export.default_temperature",
    } <= dotted  # fmt: skip


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", ".NaN", "+.INF"])
@pytest.mark.parametrize("path", FLOAT_FIELDS, ids=".".join)
def test_every_float_field_refuses_a_number_that_is_not_finite(path, value):
    err = error_of(f"---\ndlm_id: {ULID}\n{_nested_yaml(path, value)}\n---\n")
    shown = "nan" if "n" in value.lower().replace("inf", "") else ("-inf" if value.startswith("-") else "inf")
    assert str(err) == f"doc.dlm:{2 + len(path)}: {'.'.join(path)}: must be a finite number, not {shown}"


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_a_dataset_weight_that_is_not_finite_is_refused_at_its_line(value):
    err = error_of(
        f"---\ndlm_id: {ULID}\ntraining:\n  datasets:\n    - path: data/wiki\n      weight: {value}\n---\n"
    )
    assert "training.datasets" in str(err) and "weight" in str(err) and "finite" in str(err)


def test_a_huge_but_finite_learning_rate_is_read_and_left_to_the_trainer_to_stop():
    # DLM bounds learning_rate below only; 1e308 diverges in training, where the NaN guard stops it.
    assert training("training:\n  learning_rate: 1.0e+308").learning_rate == 1e308


# --------------------------------------------------------------------------
# DLM's key names, and dlmstore's old ones


def test_every_dlm_training_key_is_read():
    t = training(
        "training:\n"
        "  adapter: dora\n"
        "  lora_r: 16\n"
        "  lora_alpha: 32\n"
        "  lora_dropout: 0.1\n"
        "  target_modules: [q_proj, v_proj]\n"
        "  micro_batch_size: 4\n"
        "  grad_accum: 2\n"
        "  learning_rate: 1e-4\n"
        "  num_epochs: 5\n"
        "  optimizer: paged_adamw_8bit\n"
        "  lr_scheduler: linear\n"
        "  warmup_ratio: 0.05\n"
        "  precision: bf16"
    )
    assert (t.adapter, t.lora_r, t.lora_alpha, t.lora_dropout) == ("dora", 16, 32, 0.1)
    assert t.target_modules == ["q_proj", "v_proj"]
    assert (t.micro_batch_size, t.grad_accum, t.learning_rate, t.num_epochs) == (4, 2, 1e-4, 5)
    assert (t.optimizer, t.lr_scheduler, t.warmup_ratio, t.precision) == (
        "paged_adamw_8bit", "linear", 0.05, "bf16",
    )  # fmt: skip


def test_micro_batch_size_and_grad_accum_take_auto_or_a_positive_whole_number():
    t = training("training:\n  micro_batch_size: auto\n  grad_accum: auto")
    assert (t.micro_batch_size, t.grad_accum) == ("auto", "auto")
    assert problems_of(
        f"---\ndlm_id: {ULID}\ntraining:\n  micro_batch_size: 0\n  grad_accum: many\n---\n"
    ) == [
        "doc.dlm:4: training.micro_batch_size: must be a whole number of at least 1, or auto, not 0",
        "doc.dlm:5: training.grad_accum: must be a whole number of at least 1, or auto, not 'many'",
    ]
    text = f"---\ndlm_id: {ULID}\ntraining:\n  micro_batch_size: true\n---\n"
    assert str(error_of(text)) == (
        "doc.dlm:4: training.micro_batch_size: must be a whole number of at least 1, or auto, not True"
    )


@pytest.mark.parametrize("value", ["all", "[]", "[q_proj, 3]"])
def test_target_modules_is_auto_or_a_list_of_module_names(value):
    assert training("training:\n  target_modules: auto").target_modules == "auto"
    err = error_of(f"---\ndlm_id: {ULID}\ntraining:\n  target_modules: {value}\n---\n")
    assert str(err).startswith(
        "doc.dlm:4: training.target_modules: must be auto or a list of module names, not "
    )


@pytest.mark.parametrize(
    ("key", "allowed"),
    [
        ("adapter", "'lora', 'qlora' or 'dora'"),
        (
            "optimizer",
            "'adamw_torch', 'adamw_bnb_8bit', 'paged_adamw_8bit', 'galore_adamw' or 'galore_adamw_8bit'",
        ),
        ("lr_scheduler", "'cosine', 'linear' or 'constant'"),
        ("precision", "'bf16', 'fp16' or 'fp32'"),
    ],
)
def test_a_choice_outside_dlms_list_names_the_allowed_ones(key, allowed):
    err = error_of(f"---\ndlm_id: {ULID}\ntraining:\n  {key}: sgd\n---\n")
    assert str(err) == f"doc.dlm:4: training.{key}: must be {allowed}"


@pytest.mark.parametrize(
    ("old", "new", "value"),
    [
        ("r", "lora_r", "8"),
        ("alpha", "lora_alpha", "16"),
        ("dropout", "lora_dropout", "0.05"),
        ("epochs", "num_epochs", "3"),
        ("batch_size", "micro_batch_size", "2"),
    ],
)
def test_a_key_dlmstore_used_to_name_is_an_error_naming_dlms_key_and_dlm_migrate(old, new, value):
    err = error_of(f"---\ndlm_id: {ULID}\ntraining:\n  {old}: {value}\n---\n", "notes.dlm")
    assert str(err) == f"notes.dlm:4: unknown key 'training.{old}': dlmstore now uses DLM's name '{new}'"
    assert err.hint == f"rename it to '{new}', or run `dlm migrate notes.dlm` to rename every such key"


def test_every_old_key_in_a_document_is_reported_at_once():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  r: 8\n  alpha: 16\n  epochs: 1\n---\n"
    assert problems_of(text) == [
        "doc.dlm:4: unknown key 'training.r': dlmstore now uses DLM's name 'lora_r'",
        "doc.dlm:5: unknown key 'training.alpha': dlmstore now uses DLM's name 'lora_alpha'",
        "doc.dlm:6: unknown key 'training.epochs': dlmstore now uses DLM's name 'num_epochs'",
    ]


# --------------------------------------------------------------------------
# Versions


def test_an_unset_dlm_version_reads_as_version_1():
    assert parse_text(HEAD).frontmatter.dlm_version == 1
    assert load_frontmatter(f"dlm_id: {ULID}", path="x.dlm", first_line=2).dlm_version == 1


@pytest.mark.parametrize("version", range(1, CURRENT_DLM_VERSION + 1))
def test_every_dlm_version_up_to_the_current_one_is_read(version):
    text = f"---\ndlm_id: {ULID}\ndlm_version: {version}\ntraining:\n  lora_r: 4\n---\n"
    fm = parse_text(text).frontmatter
    assert (fm.dlm_version, fm.training.lora_r) == (version, 4)


def test_the_current_dlm_version_is_dlms_15():
    assert CURRENT_DLM_VERSION == 15


def test_a_newer_dlm_version_is_refused_with_the_versions_this_dlmstore_reads():
    newer = CURRENT_DLM_VERSION + 1
    err = error_of(f"---\ndlm_id: {ULID}\ndlm_version: {newer}\nfuture_key: 1\n---\n")
    assert str(err) == (
        f"doc.dlm:3: dlm_version {newer} is newer than the DLM frontmatter this dlmstore reads "
        f"(versions 1 to {CURRENT_DLM_VERSION})"
    )
    assert err.hint == (
        "a newer dlmstore may read it (pip install -U dlmstore); otherwise set dlm_version to "
        f"{CURRENT_DLM_VERSION} if the document uses no newer keys"
    )


@pytest.mark.parametrize("value", ["0", "-1", "'3'", "2.0"])
def test_a_dlm_version_that_is_not_a_positive_whole_number_is_an_error(value):
    err = error_of(f"---\ndlm_id: {ULID}\ndlm_version: {value}\n---\n")
    assert str(err).startswith("doc.dlm:3: dlm_version: must be a whole number of at least 1, not ")


def test_a_bad_dlm_version_does_not_hide_the_other_problems():
    text = f"---\ndlm_id: {ULID}\ndlm_version: 0\ntraining:\n  seed: x\n---\n"
    assert problems_of(text) == [
        "doc.dlm:3: dlm_version: must be a whole number of at least 1, not 0",
        "doc.dlm:5: training.seed: must be a whole number, not 'x'",
    ]


DPO_V1 = (
    "training:\n"
    "  dpo:\n"
    "    enabled: true\n"
    "    beta: 0.2\n"
    "    learning_rate: 1e-6\n"
    "    num_epochs: 2\n"
    "    loss_type: ipo\n"
    "    reference: pre_dpo_adapter\n"
)


@pytest.mark.parametrize("version_line", ["", "dlm_version: 1\n"])
def test_a_version_1_dpo_block_is_read_as_training_preference(version_line):
    fm = parse_text(f"---\ndlm_id: {ULID}\n{version_line}{DPO_V1}---\n").frontmatter
    assert fm.dlm_version == 1
    assert fm.training.preference == PreferenceSettings(
        enabled=True,
        method="dpo",
        hyperparams=PreferenceHyperparams(beta=0.2, learning_rate=1e-6, num_epochs=2),
        loss_type="ipo",
        reference="pre_adapter",
    )


def test_a_version_1_dpo_reference_other_than_pre_dpo_adapter_is_kept():
    fm = parse_text(f"---\ndlm_id: {ULID}\ntraining:\n  dpo:\n    reference: base\n---\n").frontmatter
    assert fm.training.preference.reference == "base"


def test_a_bad_value_in_a_version_1_dpo_block_is_reported_at_its_line_under_its_new_name():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  dpo:\n    enabled: true\n    beta: 7\n    bogus: 1\n---\n"
    assert problems_of(text) == [
        "doc.dlm:6: training.preference.hyperparams.beta: must be between 0.0 and 1.0",
        "doc.dlm:7: unknown key 'training.preference.bogus'",
    ]


def test_a_version_1_dpo_block_that_is_not_a_mapping_is_an_error_at_its_line():
    err = error_of(f"---\ndlm_id: {ULID}\ntraining:\n  dpo: 3\n---\n")
    assert str(err) == "doc.dlm:4: training.preference: must be a mapping of keys to values, not 3"


@pytest.mark.parametrize("version", [2, CURRENT_DLM_VERSION])
def test_training_dpo_in_a_version_2_or_later_document_is_an_unknown_key(version):
    err = error_of(f"---\ndlm_id: {ULID}\ndlm_version: {version}\n{DPO_V1}---\n")
    assert str(err) == "doc.dlm:5: unknown key 'training.dpo'"
    assert err.hint is not None and "preference" in err.hint


# --------------------------------------------------------------------------
# YAML 1.2 numbers


@pytest.mark.parametrize(
    ("text", "value"), [("2e-4", 2e-4), ("1e-5", 1e-5), ("3E+2", 300.0), ("1.5e-3", 1.5e-3)]
)
def test_a_float_written_in_yaml_1_2_exponent_form_is_a_number(text, value):
    assert training(f"training:\n  learning_rate: {text}").learning_rate == value


def test_a_negative_exponent_float_is_a_number_checked_against_its_bounds():
    err = error_of(f"---\ndlm_id: {ULID}\ntraining:\n  learning_rate: -3E+2\n---\n")
    assert str(err) == "doc.dlm:4: training.learning_rate: must be greater than 0.0"


def test_an_exponent_float_is_still_not_a_whole_number():
    err = error_of(f"---\ndlm_id: {ULID}\ntraining:\n  seed: 1e3\n---\n")
    assert str(err) == "doc.dlm:4: training.seed: must be a whole number, not 1000.0"


# --------------------------------------------------------------------------
# Every problem at once


FIVE_MISTAKES = (
    "---\n"
    f"dlm_id: {ULID}\n"
    "base_modl: smollm2-135m\n"
    "training:\n"
    "  r: 8\n"
    "  seed: x\n"
    "  sequence_len: 32\n"
    "  cache:\n"
    "    enabled: maybe\n"
    "---\n"
    "Prose.\n"
)


def test_a_document_with_five_frontmatter_mistakes_reports_all_five_in_line_order():
    with pytest.raises(DocumentProblems) as info:
        parse_text(FIVE_MISTAKES, "doc.dlm")
    problems = info.value.problems
    assert [str(p) for p in problems] == [
        "doc.dlm:3: unknown key 'base_modl'",
        "doc.dlm:5: unknown key 'training.r': dlmstore now uses DLM's name 'lora_r'",
        "doc.dlm:6: training.seed: must be a whole number, not 'x'",
        "doc.dlm:7: training.sequence_len: must be between 64 and 32768",
        "doc.dlm:9: training.cache.enabled: must be true or false, not 'maybe'",
    ]
    assert [p.line for p in problems] == [3, 5, 6, 7, 9]
    assert problems[0].hint is not None and problems[0].hint.startswith("did you mean 'base_model'?")
    assert str(info.value) == "\n".join(str(p) for p in problems)
    assert info.value.line == 3
    assert info.value.reports() == [(p.message, p.hint) for p in problems]


def test_load_frontmatter_raises_every_problem_together():
    with pytest.raises(DocumentProblems) as info:
        load_frontmatter(f"dlm_id: {ULID}\nseed: 1\ntraining:\n  sead: 7", path="x.dlm", first_line=2)
    assert [str(p) for p in info.value.problems] == [
        "x.dlm:3: unknown key 'seed'",
        "x.dlm:5: unknown key 'training.sead'",
    ]


def test_a_single_problem_is_a_plain_document_error():
    err = error_of(f"---\ndlm_id: {ULID}\ntraining:\n  seed: x\n---\n")
    assert not isinstance(err, DocumentProblems)


def test_a_duplicate_key_and_a_bad_value_are_reported_together():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  seed: 1\n  seed: 2\n  lora_r: 0\n---\n"
    assert problems_of(text) == [
        "doc.dlm:5: duplicate key 'training.seed' (first set at line 4)",
        "doc.dlm:6: training.lora_r: must be between 1 and 256",
    ]


# --------------------------------------------------------------------------
# Blocks DLM has and dlmstore does not use


UNUSED = (
    "---\n"
    f"dlm_id: {ULID}\n"
    "system_prompt: Be brief.\n"
    "training:\n"
    "  seed: 3\n"
    "  lora_r: 4\n"
    "  cpt:\n"
    "    schedule: dapt\n"
    "  audio:\n"
    "    auto_resample: true\n"
    "  cache:\n"
    "    enabled: false\n"
    "export:\n"
    "  default_quant: Q8_0\n"
    "  default_temperature: 0.7\n"
    "---\n"
)


def test_set_keys_lists_the_keys_a_document_sets_in_field_order():
    fm = parse_text(UNUSED).frontmatter
    assert set_keys(fm) == [
        "dlm_id",
        "dlm_version",
        "system_prompt",
        "training.lora_r",
        "training.seed",
        "training.cpt.schedule",
        "training.cache.enabled",
        "training.audio.auto_resample",
        "export.default_quant",
        "export.default_temperature",
    ]


def test_unused_keys_lists_the_keys_set_for_capabilities_dlmstore_lacks():
    fm = parse_text(UNUSED).frontmatter
    assert unused_keys(fm) == ["training.cpt.schedule", "training.audio.auto_resample"]
    assert unused_keys(parse_text(HEAD).frontmatter) == []


def test_an_export_block_is_validated_like_dlms():
    fm = parse_text(UNUSED).frontmatter
    assert fm.export == ExportSettings(default_quant="Q8_0", default_temperature=0.7, default_top_p=None)
    text = f"---\ndlm_id: {ULID}\nexport:\n  default_quant: Q2\n  default_top_p: 1.5\n---\n"
    assert problems_of(text) == [
        "doc.dlm:4: export.default_quant: must be 'Q4_K_M', 'Q5_K_M', 'Q6_K' or 'Q8_0'",
        "doc.dlm:5: export.default_top_p: must be greater than 0.0 and at most 1.0",
    ]


def test_a_document_setting_unused_keys_gets_a_warning_naming_them():
    document = parse_text(UNUSED, "doc.dlm")
    assert document_warnings(document) == [
        f"{document.path}: not used by dlmstore: training.cpt.schedule, training.audio.auto_resample"
    ]  # export: is dlm export's
    assert document_warnings(parse_text(HEAD)) == []


def test_the_preference_block_is_used_so_it_is_neither_unused_nor_warned_about():
    document = parse_text(
        f"---\ndlm_id: {ULID}\ntraining:\n  preference:\n    enabled: true\n    method: orpo\n---\n"
    )
    assert document.frontmatter.training.preference.enabled is True
    assert unused_keys(document.frontmatter) == []
    assert document_warnings(document) == []


def test_named_adapters_and_a_gate_over_two_of_them_are_read_and_used():
    fm = parse_text(
        f"---\ndlm_id: {ULID}\ntraining:\n  adapters:\n    tone: {{}}\n    facts:\n      lora_r: 4\n"
        "  gate:\n    enabled: true\n---\n"
    ).frontmatter
    assert fm.training.adapters == {"tone": AdapterSettings(), "facts": AdapterSettings(lora_r=4)}
    assert fm.training.gate.enabled is True
    assert unused_keys(fm) == []


@pytest.mark.parametrize("adapters", ["", "  adapters:\n    tone: {}\n"])
def test_a_gate_needs_two_or_more_named_adapters(adapters):
    err = error_of(f"---\ndlm_id: {ULID}\ntraining:\n{adapters}  gate:\n    enabled: true\n---\n")
    assert str(err) == "doc.dlm:3: training: gate.enabled needs training.adapters with two or more adapters"


def test_named_adapters_and_the_flat_adapter_keys_exclude_each_other():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  lora_r: 4\n  learning_rate: 1e-4\n  adapters:\n    tone: {{}}\n---\n"
    assert str(error_of(text)) == (
        "doc.dlm:3: training.adapters is set, so learning_rate, lora_r must keep the default here "
        "and move into each adapter's block"
    )


def test_named_adapters_must_be_named_and_there_must_be_one():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  adapters: {{}}\n---\n"
    assert str(error_of(text)) == (
        "doc.dlm:4: training.adapters: must declare at least one adapter (or leave the key out)"
    )
    text = f"---\ndlm_id: {ULID}\ntraining:\n  adapters:\n    Tone: {{}}\n---\n"
    assert str(error_of(text)) == (
        "doc.dlm:4: training.adapters: 'Tone' is not an adapter name (lower case letter, then a-z 0-9 _)"
    )


def test_a_problem_inside_a_named_adapter_names_its_key_path():
    text = f"---\ndlm_id: {ULID}\ntraining:\n  adapters:\n    tone:\n      lora_r: 0\n      bogus: 1\n---\n"
    assert problems_of(text) == [
        "doc.dlm:6: training.adapters.tone.lora_r: must be between 1 and 256",
        "doc.dlm:7: unknown key 'training.adapters.tone.bogus'",
    ]

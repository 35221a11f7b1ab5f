"""What evaluating needs the model for: the val loss, and the probes' answers and NLLs.

Everything here runs under :func:`evaluating`: the model in eval mode (no
dropout), no gradients, and the random state of Python, NumPy and torch
(CPU and CUDA) saved before and put back after, so an evaluation in the
middle of training changes neither the weights nor the random stream the
training draws from: a run trains the same adapter bytes with or without
it.

* :func:`val_loss` - the mean negative log-likelihood per target token over
  the val items, batched and padded by the training collator: each batch's
  loss is the model's own (the one training minimises) times its target
  count, summed, then divided by the total count. The items are batched
  longest first, and a batch takes another item only while its padded
  positions stay within :data:`PADDING_SLACK` of its real tokens: a forward
  pass costs what its padded positions do, and the tour's two val rows (65
  and 170 tokens) padded to one batch were 340 positions for 235 tokens. Under ``--nproc`` each
  rank takes every ``world_size``-th item and the sums and counts are
  added across ranks, so every rank gets the same loss (and takes the same
  early-stopping decision).
* :func:`ask` - each probe as ``dlm prompt`` asks it (the document's system
  prompt, the question, the chat template's generation prompt), answered
  greedily with at most the reference's token count plus
  :data:`ANSWER_SLACK` new tokens, and the reference's mean NLL: the chat
  template's assistant turn holding the reference, up to and including its
  end-of-turn token, teacher-forced after the same prompt. The probes are
  batched (one forward pass for the NLLs, one generation for the answers,
  its linear layers computed weight-first, :mod:`dlmstore.eval.linears`):
  the base answering the demo's three probes took 1.51 s batched against
  3.59 s one at a time (``bench/bench_eval.py``, 2-core machine). A token
  of a draft (the reference, another model's answer) that the model
  predicts is taken without a decoding step: on CPU a decoding step costs
  as much for three rows as for one (SmolLM2-135M reads its 540 MB of
  weights each step, about 65 ms on the 2-core machine), while one pass
  checks a whole draft. A batch's
  padding, or the one pass that checks a draft against step-by-step
  decoding, can move a float's last bits, so an answer may differ from
  ``dlm prompt``'s at a near tie between two tokens; the same probes asked
  of the same models in the same order always give the same answers.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from dlmstore.eval.linears import few_row_linears
from dlmstore.eval.probes import Probe
from dlmstore.eval.results import ModelEval, ProbeScore
from dlmstore.eval.scores import exact_match, token_f1

#: New tokens a probe's answer may run past the reference's length.
ANSWER_SLACK = 8
#: How many padded positions a val batch may hold per real token (:func:`val_loss`).
PADDING_SLACK = 1.25
#: The batch key the training collator counts real tokens under (``dlmstore.train.data.examples``).
_TOKENS_KEY = "dlm_tokens"


@contextmanager
def kept_random_state() -> Iterator[None]:
    """Put back the random state of Python, NumPy and torch (CPU, CUDA) when the block ends."""
    import numpy as np
    import torch

    python, numpy, cpu = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


@contextmanager
def evaluating(model: Any) -> Iterator[None]:
    """Eval mode, no gradients, the random state kept; the model's mode put back after."""
    import torch

    training = bool(model.training)
    model.eval()
    try:
        with torch.no_grad(), kept_random_state():
            yield
    finally:
        if training:
            model.train()


def as_base(model: Any) -> Any:
    """A context in which a peft model answers as its base (its adapters disabled)."""
    disable = getattr(model, "disable_adapter", None)
    return disable() if callable(disable) and hasattr(model, "peft_config") else nullcontext()


def _device(model: Any) -> Any:
    return next(model.parameters()).device


def val_loss(
    model: Any, dataset: Any, collate: Any, batch_size: int, *, rank: int = 0, world_size: int = 1
) -> tuple[float | None, int, int]:
    """``(loss, items, target tokens)`` of ``dataset``; ``loss`` None without a target token.

    ``collate`` is the training collator (a fresh instance: it counts what
    it sees). Call under :func:`evaluating`.
    """
    import torch

    device = _device(model)
    total = torch.zeros(3, dtype=torch.float64)  # NLL sum, target tokens, items
    share = [dataset[i] for i in range(rank, len(dataset), world_size)]
    for items in _length_batches(share, batch_size):
        batch = collate(items)
        batch.pop(_TOKENS_KEY, None)
        targets = int((batch["labels"][:, 1:] != -100).sum())
        total[2] += len(items)
        if not targets:
            continue
        outputs = model(**{key: value.to(device) for key, value in batch.items()})
        total[0] += float(outputs.loss.detach().double()) * targets
        total[1] += targets
    if world_size > 1:
        import torch.distributed as dist

        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    tokens = int(total[1])
    return (float(total[0] / total[1]) if tokens else None), int(total[2]), tokens


def _length_batches(items: list[Any], batch_size: int) -> Iterator[list[Any]]:
    """``items`` longest first, in batches of at most ``batch_size`` whose padding stays within
    :data:`PADDING_SLACK` (an item that would pass it starts the next batch); ties keep their order."""
    batch: list[Any] = []
    real = 0
    for item in sorted(items, key=lambda item: -len(item["input_ids"])):
        size = len(item["input_ids"])
        longest = len(batch[0]["input_ids"]) if batch else size
        if batch and (len(batch) >= batch_size or (len(batch) + 1) * longest > PADDING_SLACK * (real + size)):
            yield batch
            batch, real = [], 0
        batch.append(item)
        real += size
    if batch:
        yield batch


def conversation(system_prompt: str | None, question: str) -> list[dict[str, str]]:
    """The messages a probe is asked with: as ``dlm prompt`` asks a question."""
    messages = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
    return [*messages, {"role": "user", "content": question}]


def reference_ids(
    tokenizer: Any, messages: list[dict[str, str]], reference: str
) -> tuple[list[int], list[int]]:
    """The prompt's token ids and the reference turn's, up to and including its end-of-turn token."""
    prompt = _ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    full = _ids(
        tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": reference}], tokenize=True)
    )
    if full[: len(prompt)] != prompt:  # a template that renders the prompt differently inside a turn
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        full = (
            prompt
            + _ids(tokenizer(text + reference, add_special_tokens=False)["input_ids"])[
                len(_ids(tokenizer(text, add_special_tokens=False)["input_ids"])) :
            ]
        )
        if tokenizer.eos_token_id is not None:
            full.append(int(tokenizer.eos_token_id))
    turn = full[len(prompt) :]
    eos = tokenizer.eos_token_id
    if eos is not None and eos in turn:
        turn = turn[: turn.index(eos) + 1]
    return prompt, turn


def _ids(value: Any) -> list[int]:
    """Token ids from what ``apply_chat_template`` returns (a list, or a mapping holding ``input_ids``)."""
    if hasattr(value, "keys"):
        value = value["input_ids"]
    return [int(token) for token in value]


def _accepted(predicted: list[int], draft: list[int], eos: int | None, cap: int) -> tuple[list[int], bool]:
    """How far greedy decoding follows ``draft``: the answer's first tokens, and whether that is all of it.

    ``predicted`` is the model's argmax after the prompt and after each
    prefix of ``draft``, teacher-forced (``len(draft) + 1`` tokens). Greedy
    decoding takes the draft's tokens as long as each is the model's choice,
    then the model's own next token; the answer is complete once it holds
    the end-of-turn token ``eos`` or ``cap`` tokens.
    """
    taken = 0
    while taken < min(len(draft), len(predicted)) and predicted[taken] == draft[taken]:
        taken += 1
    answer = draft[:taken] + predicted[taken : taken + 1]
    if eos is not None and eos in answer:
        return answer[: answer.index(eos) + 1], True
    return answer[:cap], len(answer) >= cap


def _teacher_forced(
    model: Any, rows: Sequence[tuple[list[int], list[int]]], pad: int, *, cache: bool = False
) -> tuple[Any, Any]:
    """The logits of one forward pass over each prompt (left-padded) followed by its turn (right-padded),
    and its key/value cache when ``cache`` is set.

    ``logits[r, i]`` predicts token ``i`` of row ``r``'s turn, and
    ``logits[r, len(turn)]`` what follows the whole turn; the positions are
    the ones generation gives left-padded rows.
    """
    import torch

    width = max(len(prompt) for prompt, _ in rows)
    turns = max(len(turn) for _, turn in rows)
    ids = torch.full((len(rows), width + turns), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width + turns), dtype=torch.long)
    for row, (prompt, turn) in enumerate(rows):
        ids[row, width - len(prompt) : width + len(turn)] = torch.tensor(prompt + turn)
        mask[row, width - len(prompt) : width + len(turn)] = 1
    device = _device(model)
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=cache, logits_to_keep=turns + 1
    )
    return out.logits, out.cache if cache else None  # (`past_key_values`, its old name, warns on every read)


def _continued(
    model: Any,
    cache: Any,
    prompts: Sequence[list[int]],
    rows: Sequence[int],
    turns: Sequence[list[int]],
    pad: int,
    *,
    width: int,
) -> Any:
    """The logits of one forward pass over each of ``turns`` after its prompt, the prompts' keys and
    values taken from the cache of the :func:`_teacher_forced` pass that held them, its prompts
    left-padded to ``width`` (``rows`` says which row of it each turn follows; the cache itself is
    left as it was).

    ``logits[r, i]`` predicts token ``i + 1`` of turn ``r`` (token 0's
    prediction is the earlier pass's, after the prompt). The prompts, about
    half of each row's tokens, are not computed again.
    """
    import copy

    import torch

    longest = max(len(turn) for turn in turns)
    prefix = copy.deepcopy(cache)
    prefix.crop(width - prefix.get_seq_length())  # the left-padded prompts, without the turns after them
    prefix.reorder_cache(torch.tensor(list(rows), dtype=torch.long, device=_device(model)))
    ids = torch.full((len(turns), longest), pad, dtype=torch.long)
    mask = torch.zeros((len(turns), width + longest), dtype=torch.long)
    for row, (prompt, turn) in enumerate(zip(prompts, turns, strict=True)):
        ids[row, : len(turn)] = torch.tensor(turn)
        mask[row, width - len(prompt) : width + len(turn)] = 1
    device = _device(model)
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, width:]
    return model(
        input_ids=ids, attention_mask=mask, position_ids=positions, cache=prefix, use_cache=True
    ).logits


def _unique(turns: Iterable[list[int]]) -> list[list[int]]:
    """``turns`` without repeats, in order."""
    seen: list[list[int]] = []
    for turn in turns:
        if turn not in seen:
            seen.append(turn)
    return seen


def _generate(
    model: Any, starts: Sequence[list[int]], budgets: Sequence[int], pad: int, cache: Any = None
) -> list[list[int]]:
    """Greedy continuations of ``starts`` (each a prompt and the answer's first tokens, left-padded), row
    ``r`` cut at ``budgets[r]`` new tokens; ``cache`` holds the first columns' keys and values."""
    import torch

    width = max(len(start) for start in starts)
    ids = torch.full((len(starts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(starts), width), dtype=torch.long)
    for row, start in enumerate(starts):
        ids[row, width - len(start) :] = torch.tensor(start)
        mask[row, width - len(start) :] = 1
    device = _device(model)
    with few_row_linears(model):
        output = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            cache=cache,
            max_new_tokens=max(budgets),
            do_sample=False,
            use_cache=True,
            pad_token_id=pad,
        )
    return [
        [int(token) for token in output[row, width : width + budget]] for row, budget in enumerate(budgets)
    ]


def ask(
    model: Any,
    tokenizer: Any,
    probes: Sequence[Probe],
    system_prompt: str | None,
    *,
    draft: bool = True,
    answered: dict[str, list[list[int]]] | None = None,
) -> tuple[list[ProbeScore], float]:
    """Each probe's greedy answer and scores, and the seconds spent. Call under :func:`evaluating`.

    The probes go through the model together, and answers are generated
    only where no draft gives them, as speculative decoding does:

    1. one forward pass over every prompt (left-padded, as transformers
       batches generation) followed by its reference turn (right-padded)
       gives the references' NLLs (the logits of the turn positions only)
       and the start of each greedy answer: the reference's tokens as long
       as each is the model's argmax after the ones before it, then the
       model's own next token (:func:`_accepted`);
    2. ``answered`` holds, by probe row key, the answers (token ids) the
       models asked before this one gave, and receives this one's: another
       pass checks them as drafts the same way, over the drafts' tokens
       alone (the prompts' keys and values come from the first pass's
       cache, :func:`_continued`). An adapter trained a few
       steps on a document answers most probes as the base did (the tour's
       SFT and DPO adapters every one), so it is answered from the base's
       answers without generating;
    3. an answer no draft completes (up to its end of turn, or the
       reference's length plus :data:`ANSWER_SLACK` tokens) is generated
       from where its best draft left off.

    The answers are greedy decoding's whichever draft is used: a draft only
    says which tokens to check, and a checked token is the model's argmax.
    ``draft=False`` checks no draft and generates every answer from its prompt.
    """
    import torch

    t0 = time.perf_counter()
    if not probes:
        return [], 0.0
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    pad = int(pad if pad is not None else 0)
    eos = None if tokenizer.eos_token_id is None else int(tokenizer.eos_token_id)
    messages = [conversation(system_prompt, probe.question) for probe in probes]
    pairs = [reference_ids(tokenizer, m, p.reference) for m, p in zip(messages, probes, strict=True)]
    caps = [len(turn) + ANSWER_SLACK for _, turn in pairs]
    logits, cache = _teacher_forced(model, pairs, pad, cache=True)
    first = [int(token) for token in logits[:, 0].argmax(-1).tolist()]  # each answer's first token
    nlls = []
    for row, (_, turn) in enumerate(pairs):
        predicted = logits[row, : len(turn)].float()  # from the last prompt position on
        target = torch.tensor(turn, dtype=torch.long, device=predicted.device)
        nlls.append(float(torch.nn.functional.cross_entropy(predicted, target, reduction="mean")))
    begun: list[tuple[list[int], bool]] = [([], False)] * len(pairs)
    if draft:
        begun = [
            _accepted(logits[row, : len(turn) + 1].argmax(-1).tolist(), turn, eos, caps[row])
            for row, (_, turn) in enumerate(pairs)
        ]
        others = [
            (row, turn)
            for row, probe in enumerate(probes)
            if not begun[row][1]
            for turn in _unique(answered.get(probe.row_key, []) if answered is not None else [])
            if turn != pairs[row][1]
        ]
        if others:
            logits = _continued(model, cache, [pairs[row][0] for row, _ in others],
                                [row for row, _ in others], [turn for _, turn in others], pad,
                                width=max(len(prompt) for prompt, _ in pairs))  # fmt: skip
            for index, (row, turn) in enumerate(others):
                predicted = [first[row], *logits[index, : len(turn)].argmax(-1).tolist()]
                found = _accepted(predicted, turn, eos, caps[row])
                if (found[1], len(found[0])) > (begun[row][1], len(begun[row][0])):
                    begun[row] = found
    answers = [tokens for tokens, _ in begun]
    rest = [row for row, (_, done) in enumerate(begun) if not done]
    if rest and all(answers[row] == first[row : row + 1] for row in rest):
        # every row generated goes on from its first token: the reference pass's cache holds the prompts
        # (but their last token, fed again with the first); the other rows, if any, cost next to nothing
        cache.crop(-(max(len(turn) for _, turn in pairs) + 1))
        more = _generate(model, [prompt + first[row : row + 1] for row, (prompt, _) in enumerate(pairs)],
                         [caps[row] - 1 for row in range(len(pairs))], pad, cache)  # fmt: skip
        for row in rest:
            answers[row] = answers[row] + more[row]
    elif rest:
        more = _generate(
            model,
            [pairs[row][0] + answers[row] for row in rest],
            [caps[row] - len(answers[row]) for row in rest],
            pad,
        )
        for row, tokens in zip(rest, more, strict=True):
            answers[row] = answers[row] + tokens
    scores: list[ProbeScore] = []
    for row, probe in enumerate(probes):
        new = answers[row][: caps[row]]
        if eos is not None and eos in new:
            new = new[: new.index(eos) + 1]
        if answered is not None:
            answered.setdefault(probe.row_key, []).append(new)
        answer = tokenizer.decode(new, skip_special_tokens=True).strip()
        scores.append(
            ProbeScore(
                row_key=probe.row_key, marked=probe.marked, question=probe.question, reference=probe.reference,
                answer=answer, answer_tokens=len(new), nll=round(nlls[row], 6),
                exact=exact_match(answer, probe.reference), f1=round(token_f1(answer, probe.reference), 6),
                retained=probe.retained,
            )
        )  # fmt: skip
    return scores, time.perf_counter() - t0


def evaluate_model(
    model: Any,
    tokenizer: Any,
    *,
    adapter_version: int | None,
    val: tuple[Any, Any, int] | None,
    label: str | None = None,
    probes: Sequence[Probe],
    system_prompt: str | None,
    rank: int = 0,
    world_size: int = 1,
    known_val: tuple[float | None, int, int] | None = None,
    answered: dict[str, list[list[int]]] | None = None,
    retained: Sequence[Probe] = (),
    retention: tuple[Any, Any, int] | None = None,
) -> ModelEval:
    """One model on the val split (``(dataset, collate, batch size)``) and the probes (rank 0 asks them).

    ``known_val`` is a val loss already measured for these weights (the
    training's last evaluation step), used instead of measuring it again.
    ``answered`` collects the probes' answers of the models asked one after
    the other, each checked as a draft for the next (:func:`ask`).
    ``label`` names the model before its adapter has a version (``adapter``);
    by default it is ``base`` or ``v0003``. Wrap the call in :func:`as_base`
    to evaluate a peft model's base. ``retained`` are the probes of earlier
    versions of the document (asked apart from ``probes``, so the current
    probes' scores do not depend on them) and ``retention`` the retention
    slice's rows the document no longer holds, measured as ``val`` is.
    """
    from dlmstore.eval.results import model_name, summarise

    t0 = time.perf_counter()
    with evaluating(model):
        if known_val is not None:
            measured = known_val
        elif val is not None:
            dataset, collate, batch_size = val
            measured = val_loss(model, dataset, collate, batch_size, rank=rank, world_size=world_size)
        else:
            measured = (None, 0, 0)
        kept: tuple[float | None, int, int] = (None, 0, 0)
        if retention is not None:
            dataset, collate, batch_size = retention
            kept = val_loss(model, dataset, collate, batch_size, rank=rank, world_size=world_size)
        scores = ask(model, tokenizer, probes, system_prompt, answered=answered)[0] if rank == 0 else []
        scores_kept = (
            ask(model, tokenizer, retained, system_prompt, answered=answered)[0]
            if rank == 0 and retained
            else []
        )
    return summarise(
        label or model_name(adapter_version), adapter_version, measured, scores, time.perf_counter() - t0,
        scores_kept, kept,
    )  # fmt: skip

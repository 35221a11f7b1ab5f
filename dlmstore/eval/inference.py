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
  count, summed, then divided by the total count. Under ``--nproc`` each
  rank takes every ``world_size``-th item and the sums and counts are
  added across ranks, so every rank gets the same loss (and takes the same
  early-stopping decision).
* :func:`ask` - each probe as ``dlm prompt`` asks it (the document's system
  prompt, the question, the chat template's generation prompt), answered
  greedily with at most the reference's token count plus
  :data:`ANSWER_SLACK` new tokens, and the reference's mean NLL: the chat
  template's assistant turn holding the reference, up to and including its
  end-of-turn token, teacher-forced after the same prompt. The probes are
  batched (one forward pass for the NLLs, one generation for the answers):
  two thirds of the CPU time of one at a time (the demo's three probes on
  one thread, SmolLM2-135M: 4.5 s against 6.9 s), and a probe whose
  reference the model predicts token by token is answered without
  generating (:func:`ask`). A batch's padding, or the one pass that checks
  a reference against step-by-step decoding, can move a float's last bits,
  so an answer may differ from ``dlm prompt``'s at a near tie between two
  tokens; the same probes always give the same answers.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from dlmstore.eval.probes import Probe
from dlmstore.eval.results import ModelEval, ProbeScore
from dlmstore.eval.scores import exact_match, token_f1

#: New tokens a probe's answer may run past the reference's length.
ANSWER_SLACK = 8
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
    positions = range(rank, len(dataset), world_size)
    total = torch.zeros(3, dtype=torch.float64)  # NLL sum, target tokens, items
    for start in range(0, len(positions), batch_size):
        items = [dataset[i] for i in positions[start : start + batch_size]]
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


def _accepted(logits: Any, turn: list[int], eos: int | None) -> bool:
    """Whether greedy decoding answers ``turn`` itself: its argmax after every prefix of it is its next token.

    ``logits`` are the model's predictions for each token of ``turn``,
    teacher-forced after the prompt; the turn must end with the end-of-turn
    token, where generation stops.
    """
    return eos is not None and turn[-1:] == [eos] and logits.argmax(-1).tolist() == turn


def ask(
    model: Any, tokenizer: Any, probes: Sequence[Probe], system_prompt: str | None, *, draft: bool = True
) -> tuple[list[ProbeScore], float]:
    """Each probe's greedy answer and scores, and the seconds spent. Call under :func:`evaluating`.

    The probes go through the model together. One forward pass over every
    prompt (left-padded, as transformers batches generation) followed by
    its reference turn (right-padded) gives the references' NLLs (the
    logits of the turn positions only) and, cut back to the prompts, the
    key/value cache the greedy generation of every answer starts from, so
    no prompt is computed twice; each answer is cut at its own limit.

    The same pass says which answers need no generation: where the argmax
    after every prefix of the reference turn is its next token, end of turn
    included, greedy decoding answers the reference, token for token (the
    reference is a draft the model accepts whole, as assisted generation
    accepts one). Those rows are answered so and only the others are
    generated (``draft=False`` generates every row). A model that learned
    its probes (the demo's adapter) is answered with no generation at all.
    """
    import torch

    t0 = time.perf_counter()
    if not probes:
        return [], 0.0
    device = _device(model)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    pad = int(pad if pad is not None else 0)
    pairs = [reference_ids(tokenizer, conversation(system_prompt, p.question), p.reference) for p in probes]
    width = max(len(prompt) for prompt, _ in pairs)
    turns = max(len(turn) for _, turn in pairs)
    ids = torch.full((len(pairs), width + turns), pad, dtype=torch.long)
    mask = torch.zeros((len(pairs), width + turns), dtype=torch.long)
    for row, (prompt, turn) in enumerate(pairs):
        ids[row, width - len(prompt) : width + len(turn)] = torch.tensor(prompt + turn)
        mask[row, width - len(prompt) : width + len(turn)] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # what generation gives left-padded rows
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=turns + 1
    )
    nlls = []
    for row, (_, turn) in enumerate(pairs):
        predicted = out.logits[row, : len(turn)].float()  # kept: from the last prompt position on
        target = torch.tensor(turn, dtype=torch.long, device=predicted.device)
        nlls.append(float(torch.nn.functional.cross_entropy(predicted, target, reduction="mean")))
    eos = tokenizer.eos_token_id
    known = {
        row: turn
        for row, (_, turn) in enumerate(pairs)
        if draft and _accepted(out.logits[row, : len(turn)], turn, eos)
    }
    rest = [row for row in range(len(pairs)) if row not in known]
    answers = dict(known)
    if rest:
        cache = out.cache  # (`past_key_values`, its old name, warns on every read)
        cache.crop(-(turns + 1))  # the prompts but their last token, which generation feeds again
        if len(rest) < len(pairs):
            cache.batch_select_indices(torch.tensor(rest, device=device))
        output = model.generate(
            input_ids=ids[rest, :width],
            attention_mask=mask[rest, :width],
            cache=cache,
            max_new_tokens=max(len(pairs[row][1]) for row in rest) + ANSWER_SLACK,
            do_sample=False,
            use_cache=True,
            pad_token_id=pad,
        )
        answers.update(
            {row: [int(token) for token in output[index, width:]] for index, row in enumerate(rest)}
        )
    scores: list[ProbeScore] = []
    for row, (probe, (_, turn)) in enumerate(zip(probes, pairs, strict=True)):
        new = answers[row][: len(turn) + ANSWER_SLACK]
        if eos is not None and eos in new:
            new = new[: new.index(eos) + 1]
        answer = tokenizer.decode(new, skip_special_tokens=True).strip()
        scores.append(
            ProbeScore(
                row_key=probe.row_key, marked=probe.marked, question=probe.question, reference=probe.reference,
                answer=answer, answer_tokens=len(new), nll=round(nlls[row], 6),
                exact=exact_match(answer, probe.reference), f1=round(token_f1(answer, probe.reference), 6),
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
) -> ModelEval:
    """One model on the val split (``(dataset, collate, batch size)``) and the probes (rank 0 asks them).

    ``known_val`` is a val loss already measured for these weights (the
    training's last evaluation step), used instead of measuring it again.
    ``label`` names the model before its adapter has a version (``adapter``);
    by default it is ``base`` or ``v0003``. Wrap the call in :func:`as_base`
    to evaluate a peft model's base.
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
        scores = ask(model, tokenizer, probes, system_prompt)[0] if rank == 0 else []
    return summarise(
        label or model_name(adapter_version), adapter_version, measured, scores, time.perf_counter() - t0
    )

"""The preference dataset: cached preference tokens -> the columns DPO and ORPO train on.

The tokenize pass stores four token arrays per preference row
(``dlmstore.cache.preferences``); every column TRL's ``DPOTrainer`` and
``ORPOTrainer`` compute when tokenizing a conversational dataset themselves
follows from those arrays alone, so this module recomputes them with numpy
instead of handing TRL the text:

* DPO (``DPOTrainer._prepare_dataset``): ``prompt_ids``, ``chosen_ids``,
  ``rejected_ids``; each conversation is split after the longest prefix it
  shares with the prompt's tokens (``trl.data_utils.common_prefix_length``).
* ORPO (``ORPOTrainer.tokenize_row``): ``prompt_*``, ``chosen_*`` and
  ``rejected_*`` ids, attention masks and labels, with TRL's handling of a
  prompt token merged into the answer, BOS prepended unless already there,
  EOS appended unless already there (SmolLM2's chat turn ends in a newline,
  so TRL appends one), answers truncated to ``max_length`` and labels
  ``-100`` over the prompt.

``tests/test_preference_tokens.py`` checks every column against the
trainers' own processing on the real SmolLM2 tokenizer. Columns are
``int64`` lists, the types TRL's own ``map`` writes, so a trainer sees the
same features either way.

The trainer classes from :func:`pretokenized_dpo_trainer_class` and
:func:`pretokenized_orpo_trainer_class` take such a dataset as it is (TRL
tokenizes nothing); they are defined on first call so importing this
module does not import TRL.

:func:`check_preferences` refuses, before any model loads, the triples TRL
would drop without a word or train to no effect.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from dlmstore.cache.preferences import Ragged, TokenizedPreferences
from dlmstore.errors import TrainingError

if TYPE_CHECKING:
    import numpy as np

#: The label TRL gives prompt tokens (ignored by the loss).
IGNORE_INDEX = -100

DPO_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")
ORPO_COLUMNS = (
    "chosen_input_ids", "chosen_attention_mask", "chosen_labels",
    "rejected_input_ids", "rejected_attention_mask", "rejected_labels",
    "prompt_input_ids", "prompt_attention_mask",
)  # fmt: skip


def check_preferences(prefs: TokenizedPreferences, *, sequence_len: int) -> None:
    """Refuse preference rows that cannot be trained as written.

    * chosen and rejected the same (identical token ids): the triple carries
      no preference, and DPO's loss on it is a constant;
    * a prompt (with the chat template and generation prompt) of
      ``sequence_len`` tokens or more: no answer token fits after it, and
      DPO would silently drop the triple.

    Raises:
        TrainingError: naming the first such triple (file, line of its
            section, its number there) and how many more there are.
    """
    problems: list[tuple[str, str]] = []
    for i in range(len(prefs)):
        prompt_tokens = len(prefs.prompt[i])
        if _equal(prefs.chosen[i], prefs.rejected[i]):
            problems.append(
                (
                    f"{prefs.where(i)}: chosen and rejected are the same text, so it teaches no preference",
                    "edit one of the two responses, or delete the triple",
                )
            )
        elif prompt_tokens >= sequence_len:
            problems.append(
                (
                    f"{prefs.where(i)}: the prompt is {prompt_tokens} tokens with the chat template, "
                    f"which leaves no room for a response in training.sequence_len ({sequence_len})",
                    "shorten the prompt or raise training.sequence_len",
                )
            )
    if problems:
        message, hint = problems[0]
        if len(problems) > 1:
            more = len(problems) - 1
            message += f" ({more} more preference triple{'s' if more > 1 else ''} cannot be trained either)"
        raise TrainingError(message, hint=hint)


def dpo_columns(prefs: TokenizedPreferences) -> dict[str, Ragged]:
    """``prompt_ids``, ``chosen_ids`` and ``rejected_ids`` as ``DPOTrainer`` computes them."""
    import numpy as np

    columns: dict[str, list[np.ndarray]] = {name: [] for name in DPO_COLUMNS}
    for i in range(len(prefs)):
        prompt, chosen, rejected = prefs.prompt[i], prefs.chosen[i], prefs.rejected[i]
        cut = min(_common_prefix(prompt, chosen), _common_prefix(prompt, rejected))
        columns["prompt_ids"].append(prompt[:cut].astype(np.int64))
        columns["chosen_ids"].append(chosen[cut:].astype(np.int64))
        columns["rejected_ids"].append(rejected[cut:].astype(np.int64))
    return {name: Ragged.of(arrays) for name, arrays in columns.items()}


def orpo_columns(
    prefs: TokenizedPreferences, *, bos_token_id: int | None, eos_token_id: int, max_length: int
) -> dict[str, Ragged]:
    """The columns ``ORPOTrainer.tokenize_row`` computes (decoder-only models).

    Args:
        prefs: the preference rows.
        bos_token_id, eos_token_id: the tokenizer's (``None`` BOS: none is added).
        max_length: ``ORPOConfig.max_length``; answers are cut so that
            prompt + answer fit, the prompt is kept whole.

    Raises:
        TrainingError: the tokenizer splits a triple in a way TRL refuses
            (its prompt tokens are not a prefix of a conversation's, beyond
            the one merged token it allows).
    """
    import numpy as np

    def ones(array: np.ndarray) -> np.ndarray:
        return np.ones(len(array), dtype=np.int64)

    columns: dict[str, list[np.ndarray]] = {name: [] for name in ORPO_COLUMNS}
    bos = [] if bos_token_id is None else [bos_token_id]
    for i in range(len(prefs)):
        shared = prefs.shared_prompt[i].astype(np.int64)
        answers = {}
        for side, part in (("chosen", prefs.chosen), ("rejected", prefs.rejected)):
            full = part[i].astype(np.int64)
            if len(shared) > len(full):
                raise TrainingError(
                    f"{prefs.where(i)}: the prompt is longer in tokens than the prompt and {side} response together",
                    hint="the tokenizer's chat template cannot be trained with ORPO; use method: dpo",
                )
            # build_tokenized_answer: a prompt token merged into the answer moves the cut back one token
            cut = len(shared) - (0 if np.array_equal(full[: len(shared)], shared) else 1)
            answers[side] = (full[:cut], full[cut:])
        (chosen_prompt, chosen), (rejected_prompt, rejected) = answers["chosen"], answers["rejected"]
        prompt = shared[: min(len(chosen_prompt), len(rejected_prompt))]
        if (
            abs(len(chosen_prompt) - len(rejected_prompt)) > 1
            or _mismatches(chosen_prompt, rejected_prompt) > 1
        ):
            raise TrainingError(
                f"{prefs.where(i)}: the tokenizer splits the prompt differently before the chosen "
                "and the rejected response",
                hint="the tokenizer's chat template cannot be trained with ORPO; use method: dpo",
            )
        if bos and (len(prompt) == 0 or prompt[0] != bos_token_id):
            prompt = np.concatenate([bos, prompt]).astype(np.int64)
        columns["prompt_input_ids"].append(prompt)
        columns["prompt_attention_mask"].append(ones(prompt))
        for side, side_prompt, answer in (
            ("chosen", chosen_prompt, chosen),
            ("rejected", rejected_prompt, rejected),
        ):
            if bos and (len(side_prompt) == 0 or side_prompt[0] != bos_token_id):
                side_prompt = np.concatenate([bos, side_prompt]).astype(np.int64)
            if len(answer) == 0 or answer[-1] != eos_token_id:
                answer = np.append(answer, np.int64(eos_token_id))
            if len(side_prompt) + len(answer) > max_length:
                answer = answer[: max(0, max_length - len(side_prompt))]
            sequence = np.concatenate([side_prompt, answer])
            labels = sequence.copy()
            labels[: len(side_prompt)] = IGNORE_INDEX
            columns[f"{side}_input_ids"].append(sequence)
            columns[f"{side}_attention_mask"].append(ones(sequence))
            columns[f"{side}_labels"].append(labels)
    return {name: Ragged.of(arrays) for name, arrays in columns.items()}


def dpo_dataset(prefs: TokenizedPreferences) -> Any:
    """A ``datasets.Dataset`` of :func:`dpo_columns`, for :func:`pretokenized_dpo_trainer_class`."""
    return _dataset(dpo_columns(prefs))


def orpo_dataset(
    prefs: TokenizedPreferences, *, bos_token_id: int | None, eos_token_id: int, max_length: int
) -> Any:
    """A ``datasets.Dataset`` of :func:`orpo_columns`, for :func:`pretokenized_orpo_trainer_class`."""
    return _dataset(
        orpo_columns(prefs, bos_token_id=bos_token_id, eos_token_id=eos_token_id, max_length=max_length)
    )


@cache
def pretokenized_dpo_trainer_class() -> type[Any]:
    """``trl.DPOTrainer``, taking a dataset with ``prompt_ids`` / ``chosen_ids`` / ``rejected_ids`` as it is.

    TRL's filter still applies: with ``max_length`` and ``keep_start``
    truncation, rows whose prompt fills ``max_length`` are dropped (after
    :func:`check_preferences` there are none). Any other dataset goes
    through TRL's own preparation.
    """
    from trl.trainer.dpo_trainer import DPOTrainer

    class PretokenizedDPOTrainer(DPOTrainer):
        def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
            if "prompt_ids" not in (getattr(dataset, "column_names", None) or ()):
                return super()._prepare_dataset(dataset, processing_class, args, dataset_name)
            if args.max_length is not None and args.truncation_mode == "keep_start":
                import pyarrow.compute as pc

                lengths = pc.list_value_length(dataset.data.column("prompt_ids"))
                if pc.any(pc.greater_equal(lengths, args.max_length)).as_py():
                    limit = args.max_length
                    dataset = dataset.filter(lambda example: len(example["prompt_ids"]) < limit)
            return dataset

    return PretokenizedDPOTrainer


@cache
def pretokenized_orpo_trainer_class() -> type[Any]:
    """``trl.experimental.orpo.ORPOTrainer``, taking a dataset of :data:`ORPO_COLUMNS` as it is.

    The trainer's constructor still maps its prompt-extraction and
    chat-template steps over the dataset; both return a row without
    ``prompt`` / ``chosen`` / ``rejected`` unchanged, and ``tokenize_row``
    adds nothing to a row already tokenized.
    """
    import warnings

    with warnings.catch_warnings():
        # TRL warns on every import from trl.experimental that its API may change;
        # the version is pinned (dlm.lock) and the parity tests cover this one.
        warnings.simplefilter("ignore")
        from trl.experimental.orpo import ORPOTrainer

    class PretokenizedORPOTrainer(ORPOTrainer):
        def tokenize_row(self, feature: dict[str, Any], model: Any = None) -> dict[str, Any]:
            if "prompt" not in feature and "chosen_input_ids" in feature:
                return {}
            result: dict[str, Any] = super().tokenize_row(feature, model)
            return result

    return PretokenizedORPOTrainer


def _dataset(columns: dict[str, Ragged]) -> Any:
    """A ``datasets.Dataset`` of ``list<int64>`` columns built from the arrays."""
    import datasets
    import numpy as np
    import pyarrow as pa

    table = {}
    for name, ragged in columns.items():
        offsets = pa.array(ragged.offsets.astype(np.int32))
        table[name] = pa.ListArray.from_arrays(offsets, pa.array(ragged.values.astype(np.int64, copy=False)))
    return datasets.Dataset(pa.table(table))


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """``trl.data_utils.common_prefix_length`` over arrays."""
    import numpy as np

    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def _mismatches(a: np.ndarray, b: np.ndarray) -> int:
    """Positions where ``a`` and ``b`` differ, over the shorter's length (TRL's ``zip`` count)."""
    n = min(len(a), len(b))
    return int((a[:n] != b[:n]).sum())


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    return len(a) == len(b) and bool((a == b).all())


def training_preferences(preferences: Any, tokenizer: Any, method: str, sequence_len: int) -> Any:
    """The checked, pre-tokenized preference dataset for ``method`` (``dpo`` or ``orpo``).

    Raises:
        TrainingError: a triple cannot train (:func:`check_preferences`).
    """
    check_preferences(preferences, sequence_len=sequence_len)
    if method == "dpo":
        return dpo_dataset(preferences)
    return orpo_dataset(
        preferences,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        max_length=sequence_len,
    )

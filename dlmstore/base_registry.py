"""The registry of named base models a ``.dlm`` document may ask for.

The names, hub ids and pinned commits are DocumentLanguageModel's curated
registry, so a document written for DLM (``base_model: qwen2.5-1.5b``)
trains on exactly the weights it would there. Each entry pins a full commit
hash, never a branch: the same document trains on the same bytes next year,
and the lock can record that commit without asking the network.

Only a few of DLM's facts are kept: the hub id and commit to load, the
modality (to refuse what is not text), whether the hub gates the download
(so the "how to get it" hint can say so), the context length, and the LoRA
target modules DLM picks for ``target_modules: auto``. DLM's export and
licence-policy fields have no counterpart here.

Vision-language and audio-language entries are listed too, although
dlmstore trains text models only: knowing their names lets
:func:`dlmstore.bases.resolve_base` refuse them by name instead of calling
them unknown.

``smollm2-135m`` is absent on purpose: it is dlmstore's built-in base
(``dlmstore.bases.BUILTIN_BASES``), loaded offline from a GGUF file in a
PyPI package rather than from the hub.

This module is plain data and imports nothing, so resolving a name stays
cheap (``dlm show`` uses it).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Modalities dlmstore can train: a causal LM over text (dense or mixture of experts).
TEXT_MODALITIES = frozenset({"text", "text-moe"})

#: The attention projections: DLM's LoRA targets for every architecture but Phi-3.
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
#: Phi-3 fuses q/k/v and gate/up into single linear layers.
PHI3 = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@dataclass(frozen=True)
class RegisteredBase:
    """One named base model, pinned to a hub commit.

    Attributes:
        key: the name a document writes as ``base_model``.
        hub_id: the Hugging Face repository (``org/name``).
        revision: the 40-hex commit loaded, never a branch.
        context_length: the model's nominal context window in tokens.
        modality: ``text``, ``text-moe``, ``vision-language`` or ``audio-language``.
        target_modules: the linear layers DLM puts LoRA adapters on.
        gated: the hub asks you to accept a licence (and log in) before downloading.
    """

    key: str
    hub_id: str
    revision: str
    context_length: int
    modality: str = "text"
    target_modules: tuple[str, ...] = ATTENTION
    gated: bool = False

    @property
    def is_text(self) -> bool:
        """Whether dlmstore can train it (text and text-moe models)."""
        return self.modality in TEXT_MODALITIES


# Notes on single rows: qwen3-1.7b-thinking has qwen3-1.7b's weights (in DLM the
# name only picks the thinking chat template for export); llama-3.3-8b-instruct
# is a community mirror (Meta serves Llama 3.3 8B through its own API, not a hub
# repository), which the hub does not gate. One row per line reads as a table.
# fmt: off
_ENTRIES = (
    #              key                               hub id                                           revision                                    context  extras
    RegisteredBase("qwen2.5-0.5b",                   "Qwen/Qwen2.5-0.5B-Instruct",                    "7ae557604adf67be50417f59c2c2f167def9a775", 32_768),
    RegisteredBase("qwen2.5-1.5b",                   "Qwen/Qwen2.5-1.5B-Instruct",                    "989aa7980e4cf806f80c7fef2b1adb7bc71aa306", 32_768),
    RegisteredBase("qwen2.5-3b",                     "Qwen/Qwen2.5-3B-Instruct",                      "aa8e72537993ba99e69dfaafa59ed015b17504d1", 32_768),
    RegisteredBase("qwen2.5-coder-1.5b",             "Qwen/Qwen2.5-Coder-1.5B-Instruct",              "2e1fd397ee46e1388853d2af2c993145b0f1098a", 32_768),
    RegisteredBase("qwen3-1.7b",                     "Qwen/Qwen3-1.7B",                               "70d244cc86ccca08cf5af4e1e306ecf908b1ad5e", 32_768),
    RegisteredBase("qwen3-1.7b-thinking",            "Qwen/Qwen3-1.7B",                               "70d244cc86ccca08cf5af4e1e306ecf908b1ad5e", 32_768),
    RegisteredBase("qwen3-4b",                       "Qwen/Qwen3-4B",                                 "1cfa9a7208912126459214e8b04321603b3df60c", 32_768),
    RegisteredBase("qwen3-8b",                       "Qwen/Qwen3-8B",                                 "b968826d9c46dd6066d109eabc6255188de91218", 32_768),
    RegisteredBase("llama-3.2-1b",                   "meta-llama/Llama-3.2-1B-Instruct",              "9213176726f574b556790deb65791e0c5aa438b6", 131_072, gated=True),
    RegisteredBase("llama-3.2-3b",                   "meta-llama/Llama-3.2-3B-Instruct",              "0cb88a4f764b7a12671c53f0838cd831a0843b95", 131_072, gated=True),
    RegisteredBase("llama-3.3-8b-instruct",          "allura-forge/Llama-3.3-8B-Instruct",            "df95224cf87c32d9f4958dd284a07ded620aa4fc", 131_072),
    RegisteredBase("smollm3-3b",                     "HuggingFaceTB/SmolLM3-3B",                      "a07cc9a04f16550a088caea529712d1d335b0ac1", 65_536),
    RegisteredBase("olmo-2-7b-instruct",             "allenai/OLMo-2-1124-7B-Instruct",               "470b1fba1ae01581f270116362ee4aa1b97f4c84", 4_096),
    RegisteredBase("gemma-2-2b-it",                  "google/gemma-2-2b-it",                          "299a8560bedf22ed1c72a8a11e7dce4a7f9f51f8", 8_192,   gated=True),
    RegisteredBase("gemma-2-9b-it",                  "google/gemma-2-9b-it",                          "11c9b309abf73637e4b6f9a3fa1e92e615547819", 8_192,   gated=True),
    RegisteredBase("smollm2-360m",                   "HuggingFaceTB/SmolLM2-360M-Instruct",           "a10cc1512eabd3dde888204e902eca88bddb4951", 8_192),
    RegisteredBase("smollm2-1.7b",                   "HuggingFaceTB/SmolLM2-1.7B-Instruct",           "31b70e2e869a7173562077fd711b654946d38674", 8_192),
    RegisteredBase("phi-3.5-mini",                   "microsoft/Phi-3.5-mini-instruct",               "2fe192450127e6a83f7441aef6e3ca586c338b77", 131_072, target_modules=PHI3),
    RegisteredBase("phi-4-mini-reasoning",           "microsoft/Phi-4-mini-reasoning",                "0e3b1e2d02ee478a3743abe3f629e9c0cb722e0a", 131_072, target_modules=PHI3),
    RegisteredBase("mixtral-8x7b-instruct",          "mistralai/Mixtral-8x7B-Instruct-v0.1",          "eba92302a2861cdc0098cc54bc9f17cb2c47eb61", 32_768,  modality="text-moe"),
    # Multimodal: listed so that they are refused by name (see the module docstring).
    RegisteredBase("mistral-small-3.1-24b-instruct", "mistralai/Mistral-Small-3.1-24B-Instruct-2503", "68faf511d618ef198fef186659617cfd2eb8e33a", 131_072, modality="vision-language"),
    RegisteredBase("paligemma-3b-mix-224",           "google/paligemma-3b-mix-224",                   "d1d8734c9c3ad0ccfeea4afc270faa356c2ba515", 8_192,   modality="vision-language", gated=True),
    RegisteredBase("qwen2-vl-2b-instruct",           "Qwen/Qwen2-VL-2B-Instruct",                     "895c3a49bc3fa70a340399125c650a463535e71c", 32_768,  modality="vision-language"),
    RegisteredBase("internvl2-2b",                   "OpenGVLab/InternVL2-2B",                        "e4f6747bd20f139e637642c6a058c6bd00b36919", 8_192,   modality="vision-language"),
    RegisteredBase("internvl3-2b",                   "OpenGVLab/InternVL3-2B",                        "899155015275a9b7338c7f4677e19c784e0e5a21", 32_768,  modality="vision-language"),
    RegisteredBase("qwen2-audio-7b-instruct",        "Qwen/Qwen2-Audio-7B-Instruct",                  "0a095220c30b7b31434169c3086508ef3ea5bf0a", 8_192,   modality="audio-language"),
)
# fmt: on

#: Every registered name, in DLM's order.
REGISTRY: dict[str, RegisteredBase] = {entry.key: entry for entry in _ENTRIES}

"""Named adapters mixed into one: ``dlm export --adapter-mix knowledge:1.0,tone:0.5``.

A multi-adapter document (``training.adapters``) trains one LoRA adapter per
name. A runtime such as Ollama or llama.cpp loads one adapter per model, so
the export can carry one adapter mixed from several, as DocumentLanguageModel
does: PEFT's ``add_weighted_adapter`` on the base model, each named adapter's
newest version loaded under its name, the result saved as an ordinary PEFT
adapter folder (``mix/`` in the export) that the rest of the export (the
merge, the GGUF files, the Modelfile) takes as it takes any adapter.

How the adapters combine (PEFT's ``combination_type``), for a layer adapted
by ``B_i A_i`` with scaling ``s_i = alpha_i / r_i`` and weight ``w_i``:

* ``linear`` (DLM's default, and ours when every adapter has the same rank):
  ``A = sum(sqrt(w_i s_i) A_i)``, ``B = sum(sqrt(w_i s_i) B_i)``. Its
  product carries cross terms ``B_i A_j``, so it approximates the weighted
  sum of the deltas; PEFT needs one rank for it.
* ``cat`` (ours when the ranks differ; DLM refuses them): the ``A_i`` stacked
  and the ``B_i`` side by side, rank ``sum(r_i)``, so ``B A`` is exactly
  ``sum(w_i s_i B_i A_i)``.
* ``svd``: the exact weighted sum of the deltas, cut back to the largest
  rank by SVD.

``--adapter-mix-method`` picks one of the three. Every limit of
``add_weighted_adapter`` that the adapters' configs show (DoRA, whole layers
trained, adapters on parameters, mixed kinds of ``target_modules``, unequal
ranks for ``linear``, different bases) is one error before the base model
loads. The mixed adapter's config says ``lora_alpha = r`` (scaling 1: each
part's own scaling is already inside its ``A``/``B``); its ``target_modules``
are written sorted, since PEFT writes a set in hash order, which changes from
process to process, and every zero is +0.0 (PEFT leaves -0.0 where a random
initial weight was negative). Mixing the same versions with the same
weights twice gives the same bytes.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmstore.bases import TOKENIZER_FILES
from dlmstore.errors import AdapterChoiceError, ExportError
from dlmstore.export.adapter_gguf import adapter_config

#: PEFT combination types ``dlm export --adapter-mix-method`` offers.
COMBINATIONS = ("linear", "cat", "svd")
#: The export's folder holding the mixed adapter.
MIX_DIR = "mix"
#: The mixed adapter's name inside PEFT: no adapter name starts with ``_`` (``training.adapters``).
_MIXED = "_mix"
_CONFIG = "adapter_config.json"
_EXAMPLE = "knowledge:1.0,tone:0.5"


@dataclass(frozen=True)
class MixPart:
    """One ``name:weight`` of ``--adapter-mix``."""

    name: str
    weight: float


def parse_mix(spec: str, declared: Sequence[str] | None = None) -> tuple[MixPart, ...]:
    """The parts of ``spec`` (``name:weight,name:weight``), in the order written.

    Args:
        spec: the ``--adapter-mix`` value.
        declared: the document's adapter names (``training.adapters``);
            None checks the spec's shape alone.

    Raises:
        ExportError: the spec is empty, a part is not ``name:weight``, a
            name comes twice, or a weight is not a finite number above 0.
        AdapterChoiceError: a name is not declared (a usage error, exit 2).
    """
    if not spec.strip():
        raise ExportError(f"--adapter-mix is empty: give name:weight parts, e.g. {_EXAMPLE}")
    parts: list[MixPart] = []
    for piece in spec.split(","):
        name, colon, text = (item.strip() for item in piece.strip().rpartition(":"))
        if not colon or not name or not text:
            raise ExportError(f"--adapter-mix part {piece.strip()!r} is not name:weight (e.g. {_EXAMPLE})")
        if declared is not None and name not in declared:
            raise AdapterChoiceError(
                f"--adapter-mix names {name!r}: no such adapter (declared: {', '.join(declared)})",
                hint="name the declared adapters",
            )
        if any(part.name == name for part in parts):
            raise ExportError(f"--adapter-mix names {name!r} twice; give each adapter one weight")
        try:
            weight = float(text)
        except ValueError:
            weight = math.nan
        if not math.isfinite(weight) or weight <= 0:
            why = "; leave the adapter out instead" if weight == 0 else ""
            raise ExportError(
                f"--adapter-mix weight {text!r} of {name!r} is not a finite number above 0{why}"
            )
        parts.append(MixPart(name, weight))
    return tuple(parts)


def combination(parts: Sequence[MixPart], folders: Sequence[Path], method: str | None) -> str:
    """The combination type to mix the adapters in ``folders`` with, once their configs allow it.

    ``method`` is ``--adapter-mix-method``; None chooses ``linear`` when every
    adapter has one rank, else ``cat``. One adapter is always ``linear``, as
    PEFT mixes it (exact for one).

    Raises:
        ExportError: an adapter PEFT cannot mix (see the module docstring),
            or ``linear`` asked for adapters of different ranks.
    """
    if method is not None and method not in COMBINATIONS:
        raise ValueError(f"unknown combination {method!r}; expected one of {', '.join(COMBINATIONS)}")
    configs = [adapter_config(folder) for folder in folders]
    for part, config in zip(parts, configs, strict=True):
        why = _unmixable(config)
        if why is not None:
            raise ExportError(
                f"--adapter-mix: adapter {part.name!r} cannot be mixed: {why}",
                hint=f"export it alone with --adapter {part.name}",
            )
    kinds = {type(config.get("target_modules")).__name__ for config in configs}
    if len(kinds) > 1:
        raise ExportError(
            "--adapter-mix: the adapters name their target modules in different ways (a list and a "
            "pattern), which PEFT cannot mix; train them with target_modules of one kind"
        )
    ranks = [_rank(config) for config in configs]
    if len(parts) == 1:
        return "linear"  # PEFT mixes one adapter linearly whatever it is asked: exactly weight * B A
    if method is None:
        return "linear" if len(set(ranks)) == 1 else "cat"
    if method == "linear" and len(set(ranks)) > 1:
        shown = ", ".join(f"{part.name} r={rank}" for part, rank in zip(parts, ranks, strict=True))
        raise ExportError(
            f"--adapter-mix-method linear needs adapters of one rank ({shown})",
            hint="leave --adapter-mix-method out (cat mixes adapters of any rank), or give svd",
        )
    return method


def build_mix(model: Any, parts: Sequence[MixPart], folders: Sequence[Path], how: str, out: Path) -> Any:
    """Mix the adapters in ``folders`` on ``model`` (their base) and save the result in ``out`` (new).

    Each part is loaded under its name, mixed by PEFT's ``add_weighted_adapter``
    with ``how`` (see :func:`combination`) in float32, and saved as a PEFT
    adapter folder with the first part's tokenizer files. Returns the base
    model again, without adapters, in its own dtype and with its weights as
    they were.

    Raises:
        ExportError: an adapter does not fit the model.
        OSError, or what the writing libraries raise on a failed write (the caller reports it).
    """
    from peft import PeftModel

    dtype = next(model.parameters()).dtype
    model.float()
    try:
        mixed = PeftModel.from_pretrained(model, str(folders[0]), adapter_name=parts[0].name)
        for part, folder in zip(parts[1:], folders[1:], strict=True):
            mixed.load_adapter(str(folder), adapter_name=part.name)
        mixed.add_weighted_adapter(
            adapters=[part.name for part in parts],
            weights=[part.weight for part in parts],
            adapter_name=_MIXED,
            combination_type=how,
        )
    except (OSError, ValueError, RuntimeError) as exc:
        raise ExportError(f"cannot mix the adapters {', '.join(p.name for p in parts)}: {exc}") from None
    # PEFT zeroes the new adapter's random initial weights by multiplying them by 0.0, which leaves -0.0
    # where a weight started negative (rows and columns a part does not fill: cat, a layer only some parts
    # adapt); adding +0.0 makes every zero +0.0, so the bytes do not depend on the random draw.
    for name, param in mixed.named_parameters():
        if f".{_MIXED}." in name:
            param.data.add_(0.0)
    saved = out.parent / f".{out.name}-peft"
    mixed.save_pretrained(str(saved), selected_adapters=[_MIXED], safe_serialization=True)
    # PEFT saves an adapter not named "default" into a folder of its name.
    (saved / _MIXED).rename(out)
    shutil.rmtree(saved)
    config = adapter_config(out)
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    # Each part's scaling is inside the mixed A and B; rsLoRA's alpha / sqrt(r) would scale them again.
    config["use_rslora"] = False
    (out / _CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for name in TOKENIZER_FILES:
        if (folders[0] / name).is_file():
            shutil.copyfile(folders[0] / name, out / name)
    base = mixed.unload()
    return base.to(dtype)


def _unmixable(config: dict[str, Any]) -> str | None:
    """Why PEFT's ``add_weighted_adapter`` cannot mix an adapter of ``config``, or None."""
    if config.get("peft_type", "LORA") != "LORA":
        return f"it is a {config['peft_type']} adapter; only LoRA adapters mix"
    if config.get("use_dora"):
        return "it is a DoRA adapter, whose magnitude vectors add_weighted_adapter does not combine"
    if config.get("modules_to_save"):
        return f"it trains whole layers too ({', '.join(config['modules_to_save'])})"
    if config.get("target_parameters"):
        return "it adapts parameters (target_parameters), which add_weighted_adapter does not support"
    return None


def _rank(config: dict[str, Any]) -> int:
    # As PEFT counts it: a rank_pattern can raise some layers' rank above r.
    return max([int(config["r"]), *(int(r) for r in (config.get("rank_pattern") or {}).values())])

"""``dlm export``: a trained adapter leaves the store as files a runtime loads.

One export of adapter version N writes, into one folder
(``<store>/exports/vNNNN-<QUANT>/`` unless ``-o`` says otherwise):

* ``hf/``: the merged model as a Hugging Face folder (:mod:`.merge`);
* ``model.<QUANT>.gguf``: the merged model as GGUF, written in F16
  (:mod:`.model_gguf`) and quantised by llama.cpp (:mod:`.quantize`);
* ``base.<QUANT>.gguf`` and ``adapter.gguf``: the base model as GGUF and
  the adapter alone as a GGUF LoRA llama.cpp applies on top of it
  (:mod:`.adapter_gguf`);
* ``Modelfile`` (``--target ollama``) or ``llama-server.sh``
  (``--target llama-server``) (:mod:`.targets`);
* ``dlm-export.json``: every file with its sha256 (:mod:`.folder`).

``--target hf`` writes the merged folder alone (any architecture, no
llama.cpp). The quantisation is ``--quant``, else the document's
``export.default_quant``, else ``Q4_K_M``; the adapter is ``--adapter``
(a version number, or a name of ``training.adapters``: that adapter's newest
version), else the newest (:mod:`.choice`). A document of named adapters
needs ``--adapter`` or ``--adapter-mix``, which mixes named adapters into
one (:mod:`.mix`, written as ``mix/`` beside the other files and recorded
in ``exports.mix``), unless it has a learned gate, whose mean output is
then the mix.

The order is the order of cost: the document, the store, the adapter (its
weights checked against the sha256 recorded when it was trained),
llama-cpp-python, the output folder and the architecture and tokenizer are
all checked before the base model is loaded, so every refusal is quick.
Everything is written into a staging folder and published at the end
(:mod:`.folder`), then recorded in store.db (:mod:`.record`).

The base model is loaded once, in float32: its weights are saved (for the
base GGUF) before the adapter is merged into them. Nothing written depends
on the time, the machine's thread count or the output folder's name, so
exporting the same adapter twice gives byte-identical files.
"""

from __future__ import annotations

import shutil
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from dlmstore.bases import BaseModelRef, resolve_base
from dlmstore.errors import ExportError
from dlmstore.export.adapter_gguf import adapter_unsupported, write_adapter_gguf
from dlmstore.export.architectures import Hyperparameters, hyperparameters
from dlmstore.export.choice import MixPlan, choose, gate_note, label, resolve
from dlmstore.export.folder import (
    HF_DIR,
    MANIFEST,
    ExportedFile,
    claim_folder,
    hash_files,
    manifest_bytes,
    publish,
    stage,
    sweep,
)
from dlmstore.export.mix import MIX_DIR, build_mix, combination
from dlmstore.export.model_gguf import write_model_gguf
from dlmstore.export.modelfile import ModelfileSettings, modelfile_text
from dlmstore.export.quantize import DEFAULT_QUANT, QUANTS, quantize, smoke
from dlmstore.export.record import record_export
from dlmstore.export.runtime import require_llama_cpp
from dlmstore.export.targets import (
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    chat_framing,
    server_command,
    server_script,
    stop_strings,
)
from dlmstore.export.vocab import read_vocabulary
from dlmstore.progress import Task
from dlmstore.store.atomic import write_bytes_atomic
from dlmstore.store.digests import file_sha256
from dlmstore.store.path_text import utf8_alias
from dlmstore.train.adapters import (
    WEIGHTS,
    AdapterVersion,
    checked_folder,
    is_write_failure,
    write_failure_hint,
    write_failure_reason,
)

TARGETS = ("ollama", "llama-server", "hf")
_DAMAGED_HINT = "train again (dlm train) or export another version with --adapter"
DEFAULT_TARGET = "ollama"
#: Where an export goes by default, inside the store.
EXPORTS_DIR = "exports"
#: Tools whose versions decide an export's bytes (distribution names; ``llama_cpp`` is llama-cpp-python).
TOOLS = {"llama_cpp": "llama-cpp-python", "gguf": "gguf", "transformers": "transformers", "peft": "peft",
         "torch": "torch", "safetensors": "safetensors"}  # fmt: skip


@dataclass(frozen=True)
class ExportResult:
    """What ``dlm export`` wrote (the JSON shape of ``dlm export --json``).

    Attributes:
        dlm_id: The document id.
        export_id: The export's row in store.db's ``exports``.
        adapter_version: The adapter version exported (a mix's first part).
        adapter_sha256: sha256 of its ``adapter_model.safetensors`` (a mix's: ``mix/adapter_model.safetensors``).
        adapter_name: The named adapter (``training.adapters``) exported; null for a document's one
            adapter and for a mix.
        mix: What ``--adapter-mix`` mixed: parts [{name, version, sha256, weight}], combination (PEFT's
            combination_type) and gate_id (always null here); null when one adapter was exported.
        base_model: The base model it was trained on.
        target: ``ollama``, ``llama-server`` or ``hf``.
        quant: The GGUF files' quantisation; null for ``hf``.
        folder: The export folder.
        files: Every file written, relative to the folder, with its sha256 and size.
        model_gguf: The merged model's GGUF, relative to the folder; null for ``hf``.
        adapter_gguf: The adapter's GGUF LoRA; null for ``hf`` or an adapter llama.cpp cannot apply (see notes).
        base_gguf: The base model's GGUF the adapter applies to; null when there is no adapter GGUF.
        modelfile: The Modelfile (``ollama``); null otherwise.
        command: The llama-server command line (``llama-server``); null otherwise.
        tools: The versions of the tools that wrote the files.
        seconds: How long the export took.
        notes: What was left out and why.
        warnings: Lock differences (WARN) this export recorded.
    """

    dlm_id: str
    export_id: int
    adapter_version: int
    adapter_sha256: str
    adapter_name: str | None
    mix: dict[str, Any] | None
    base_model: str
    target: str
    quant: str | None
    folder: str
    files: list[ExportedFile]
    model_gguf: str | None
    adapter_gguf: str | None
    base_gguf: str | None
    modelfile: str | None
    command: list[str] | None
    tools: dict[str, str | None]
    seconds: float
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def export_document(
    path: str,
    *,
    adapter: int | str | None = None,
    mix: str | None = None,
    mix_method: str | None = None,
    quant: str | None = None,
    target: str = DEFAULT_TARGET,
    out: str | None = None,
    force: bool = False,
) -> ExportResult:
    """Export an adapter of the document at ``path`` (see the module docstring).

    Args:
        path: the .dlm document.
        adapter: the adapter version, or a named adapter (whose newest
            version is exported); a string of digits (``3``, ``v0003``)
            is a version unless the document declares an adapter of that
            name. The newest when None, which a document of named adapters refuses.
        mix: ``--adapter-mix``: named adapters and their weights
            (``knowledge:1.0,tone:0.5``), mixed into one (:mod:`.mix`).
        mix_method: the combination type of ``mix``
            (:data:`~dlmstore.export.mix.COMBINATIONS`); chosen when None.
        quant: one of :data:`~dlmstore.export.quantize.QUANTS`; the
            document's ``export.default_quant`` when None.
        target: one of :data:`TARGETS`.
        out: the export folder; ``<store>/exports/vNNNN-<QUANT>`` when None.
        force: write into a folder that is not an export dlm wrote
            (replacing only the names an export writes).

    Raises:
        DocumentError: the document is invalid.
        StoreError: no store, no adapter (or not that version), a damaged
            adapter, or store.db cannot be written.
        AdapterChoiceError: the adapters asked for do not fit the document (a
            name it does not declare, no choice on a document of named adapters).
        ExportError: a mix PEFT cannot make, llama-cpp-python is missing or crashes, the folder is
            not dlm's, the architecture or tokenizer cannot be written as
            GGUF, or a file cannot be written (a full disk).
        BaseModelError: the base model cannot be loaded.
    """
    from dlmstore.document.parser import parse_document
    from dlmstore.store.database import open_store

    started = time.perf_counter()
    if target not in TARGETS:
        raise ValueError(f"unknown export target {target!r}; expected one of {', '.join(TARGETS)}")
    document = parse_document(path)
    choice = choose(document, adapter, mix, mix_method)
    chosen = None if target == "hf" else (quant or document.frontmatter.export.default_quant or DEFAULT_QUANT)
    if chosen is not None and chosen not in QUANTS:
        raise ValueError(f"unknown quantisation {chosen!r}; expected one of {', '.join(QUANTS)}")
    with open_store(document.dlm_id, create=False) as store, ExitStack() as aliases:
        picked = resolve(store, path, choice)
        versions, parts, gate = picked.versions, picked.parts, picked.gate
        # Loaded by safetensors, tokenizers and peft, which open only UTF-8 paths.
        folders = [
            aliases.enter_context(utf8_alias(checked_folder(store, v, hint=_DAMAGED_HINT))) for v in versions
        ]
        version, adapter_dir = versions[0], folders[0]
        plan = (
            None
            if parts is None
            else MixPlan(
                parts,
                versions,
                folders,
                combination(parts, folders, mix_method),
                None if gate is None else gate.id,
            )
        )
        if target != "hf":
            require_llama_cpp("dlm export")
        stem = f"v{version.version:04d}" if plan is None else plan.folder_name()
        default = store.path / EXPORTS_DIR / f"{stem}-{chosen or 'hf'}"
        claim = claim_folder(Path(out) if out is not None else default, force=force)
        # The base the adapter was trained on, which the document may have changed since.
        ref = resolve_base(version.base_model, relative_to=document.directory)
        params = None if target == "hf" else _gguf_params(ref, adapter_dir)
        modelfile = None
        if target == "ollama" and params is not None and chosen is not None:
            modelfile = _modelfile(document, version, plan, adapter_dir, chosen, params)
        notes = [
            f"removed {path}: the staging folder of an export that was killed before it finished"
            for path in sweep(claim, store.path / EXPORTS_DIR)
        ]
        if gate is not None and parts is not None:
            notes.append(gate_note(gate, parts))
        staging = stage(claim)
        try:
            with staging, utf8_alias(staging.path) as root:
                written = _write(
                    root,
                    ref,
                    adapter_dir,
                    version,
                    plan,
                    document,
                    chosen,
                    target,
                    params,
                    modelfile,
                    notes,
                )
                files = hash_files(staging.path)
                tools = _tools(target)
                mixed = None if plan is None else plan.record()
                sha256 = version.sha256 if plan is None else _sha256(files, f"{MIX_DIR}/{WEIGHTS}")
                manifest = manifest_bytes(
                    {
                        "dlm_id": document.dlm_id,
                        "base_model": version.base_model,
                        "adapter": None
                        if plan is not None
                        else {
                            "version": version.version,
                            "phase": version.phase,
                            "sha256": version.sha256,
                            "name": version.name,
                        },
                        "mix": mixed,
                        "target": target,
                        "quant": chosen,
                        "files": {f.path: {"sha256": f.sha256, "bytes": f.bytes} for f in files},
                        "tools": tools,
                    }
                )
                with Task("publishing the export"):
                    publish(staging, claim, manifest)
        except OSError as exc:
            raise _write_error(claim.folder, exc) from None
        except Exception as exc:
            if not is_write_failure(exc):
                raise
            raise _write_error(claim.folder, exc) from None
        seconds = time.perf_counter() - started
        export_id, warnings = record_export(
            store,
            adapter_version=version.version,
            target=target,
            quant=chosen,
            folder=claim.folder,
            files=files,
            manifest_sha256=file_sha256(claim.folder / MANIFEST),
            tools=tools,
            seconds=seconds,
            mix=mixed,
        )
    return ExportResult(
        dlm_id=document.dlm_id,
        export_id=export_id,
        adapter_version=version.version,
        adapter_sha256=sha256,
        adapter_name=version.name if plan is None else None,
        mix=mixed,
        base_model=version.base_model,
        target=target,
        quant=chosen,
        folder=str(claim.folder),
        files=files,
        model_gguf=written.get("model"),
        adapter_gguf=written.get("adapter"),
        base_gguf=written.get("base"),
        modelfile=written.get("modelfile"),
        command=_command(claim.folder, written),
        tools=tools,
        seconds=round(seconds, 3),
        notes=notes,
        warnings=warnings,
    )


def _sha256(files: list[ExportedFile], name: str) -> str:
    return next(f.sha256 for f in files if f.path == name)


def _write(
    root: Path,
    ref: BaseModelRef,
    adapter_dir: Path,
    version: AdapterVersion,
    plan: MixPlan | None,
    document: Any,
    quant: str | None,
    target: str,
    params: Hyperparameters | None,
    modelfile: str | None,
    notes: list[str],
) -> dict[str, str]:
    """Write every file of the export into ``root``; returns the names of the main ones by role.

    ``params`` is None for ``--target hf`` (no GGUF); ``modelfile`` is the
    Modelfile's text for ``--target ollama``, written before anything loads.
    With ``plan``, the adapters are mixed into ``mix/`` on the loaded base
    (after its weights are saved for the base GGUF), and the mix is what is
    merged and written as the adapter GGUF.
    """
    from dlmstore.bases import _quiet_transformers, load_model
    from dlmstore.export.merge import merge_adapter, save_model

    written: dict[str, str] = {}
    hf = root / HF_DIR
    base_dir = root / ".base-hf"
    model = load_model(ref)
    unsupported = None if params is None else adapter_unsupported(adapter_dir)
    with _quiet_transformers():
        if params is not None and unsupported is None:
            with Task("saving the base model"):
                base_dir.mkdir()
                save_model(model, adapter_dir, base_dir)
        if plan is not None:
            with Task(f"mixing {len(plan.parts)} adapters ({plan.how})"):
                model = build_mix(model, plan.parts, plan.folders, plan.how, root / MIX_DIR)
            adapter_dir = root / MIX_DIR
        with Task("merging the adapter"):
            merged = merge_adapter(model, adapter_dir, ref)
            hf.mkdir()
            save_model(merged, adapter_dir, hf)
    del model, merged
    written["hf"] = HF_DIR
    if params is None or quant is None:
        return written
    name = f"{document.dlm_id} {label(version, plan)}"
    written["model"] = _gguf(hf, root, "model", quant, name)
    if unsupported is None:
        written["base"] = _gguf(base_dir, root, "base", quant, ref.name)
        shutil.rmtree(base_dir)
        with Task("writing the adapter GGUF"):
            write_adapter_gguf(adapter_dir, root / "adapter.gguf", params, name=name)
        written["adapter"] = "adapter.gguf"
    else:
        notes.append(f"no adapter.gguf: {unsupported}; the merged model.{quant}.gguf carries the adapter")
    num_ctx = _num_ctx(document, params)
    if modelfile is not None:
        write_bytes_atomic(root / "Modelfile", modelfile.encode("utf-8"))
        written["modelfile"] = "Modelfile"
    elif target == "llama-server":
        script = root / "llama-server.sh"
        header = _header(document, version, plan, quant)
        text = server_script(written["model"], num_ctx=num_ctx, header=header)
        write_bytes_atomic(script, text.encode("utf-8", "surrogateescape"))
        script.chmod(0o755)
        written["script"] = "llama-server.sh"
        written["num_ctx"] = str(num_ctx)
    return written


def _num_ctx(document: Any, params: Hyperparameters) -> int:
    """The context window: the training sequence length, capped at the model's."""
    return min(int(document.frontmatter.training.sequence_len), params.context_length)


def _header(document: Any, version: AdapterVersion, plan: MixPlan | None, quant: str) -> list[str]:
    what = label(version, plan) + ("" if plan is not None else f" ({version.sha256})")
    return [
        f"Written by dlm export: document {document.dlm_id}, {what},",
        f"base model {version.base_model}, quantisation {quant}.",
    ]


def _modelfile(
    document: Any,
    version: AdapterVersion,
    plan: MixPlan | None,
    adapter_dir: Path,
    quant: str,
    params: Hyperparameters,
) -> str:
    """The Modelfile's text, made (and every value checked) before the base model loads.

    Raises:
        ExportError: the chat template cannot be translated, or a value
            (the system prompt first) cannot be carried by a Modelfile.
    """
    system = document.frontmatter.system_prompt
    tokenizer = _tokenizer(adapter_dir)
    framing = chat_framing(tokenizer, where=str(adapter_dir), system=system)
    export_block = document.frontmatter.export
    return modelfile_text(
        framing.go_template(),
        ModelfileSettings(
            gguf=f"model.{quant}.gguf",
            header=[
                *_header(document, version, plan, quant),
                "Create the model: ollama create NAME -f Modelfile",
            ],
            stops=stop_strings(framing, eos=tokenizer.eos_token, special=tokenizer.all_special_tokens),
            temperature=export_block.default_temperature or DEFAULT_TEMPERATURE,
            top_p=export_block.default_top_p or DEFAULT_TOP_P,
            num_ctx=_num_ctx(document, params),
            system=system,
        ),
        where=str(document.path),
    )


def _gguf_params(ref: BaseModelRef, adapter_dir: Path) -> Hyperparameters:
    """The base's shape as GGUF needs it, and its tokenizer's vocabulary, checked before anything loads.

    Raises:
        ExportError: an architecture, RoPE scaling or tokenizer the GGUF writer does not support.
    """
    from dlmstore.bases import _quiet_transformers, model_source

    with _quiet_transformers() as transformers:
        try:
            revision = {"revision": ref.revision} if ref.revision is not None else {}
            config = transformers.AutoConfig.from_pretrained(model_source(ref), **revision)
        except (OSError, ValueError) as exc:
            raise ExportError(f"cannot read the config of base model {ref.name!r}: {exc}") from None
    params = hyperparameters(config, where=f"base model {ref.name!r}")
    read_vocabulary(adapter_dir, vocab_size=params.vocab_size)
    return params


def _tokenizer(adapter_dir: Path) -> Any:
    from dlmstore.bases import _quiet_transformers

    with _quiet_transformers() as transformers:
        return transformers.AutoTokenizer.from_pretrained(str(adapter_dir))


def _gguf(source: Path, root: Path, role: str, quant: str, name: str) -> str:
    """Write ``<role>.<quant>.gguf`` from the folder ``source`` (F16, then quantised); returns its name."""
    final = f"{role}.{quant}.gguf"
    f16 = root / (final if quant == "F16" else f".{role}.F16.gguf")
    with Task(f"writing {role}.F16.gguf"):
        write_model_gguf(source, f16, file_type="F16", name=name)
    if quant == "F16":
        with Task(f"loading {final} in llama.cpp"):
            smoke(f16)
        return final
    with Task(f"quantizing {final}"):
        quantize(f16, root / final, quant)
    f16.unlink()
    return final


def _tools(target: str) -> dict[str, str | None]:
    tools: dict[str, str | None] = {}
    for key, distribution in TOOLS.items():
        if key in ("llama_cpp", "gguf") and target == "hf":
            continue
        try:
            tools[key] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            tools[key] = None
    return tools


def _command(folder: Path, written: dict[str, str]) -> list[str] | None:
    if "script" not in written:
        return None
    return server_command(str(folder / written["model"]), num_ctx=int(written["num_ctx"]))


def _write_error(folder: Path, exc: BaseException) -> ExportError:
    return ExportError(
        f"cannot write the export {folder}: {write_failure_reason(exc)}",
        hint=write_failure_hint(
            exc, writable=str(folder.parent), then=" and export again (nothing was changed in the folder)"
        ),
    )

"""``dlm export PATH``: the trained adapter as files a runtime loads (GGUF, Ollama, llama-server, HF)."""

from __future__ import annotations

import shlex

import click

from .params import LocalPath
from .render import emit_json, human_bytes, json_option, note, warn


def _mix_spec(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse a --adapter-mix whose shape is wrong as a usage error (the names are checked against the document)."""
    if value is not None:
        from dlmstore.errors import ExportError
        from dlmstore.export.mix import parse_mix

        try:
            parse_mix(value)
        except ExportError as exc:
            raise click.UsageError(str(exc), ctx=ctx) from None
    return value


@click.command("export")
@click.argument("path", type=LocalPath(dir_okay=False))
@click.option(
    "--adapter",
    "adapter",
    metavar="N|NAME",
    help="Export adapter version N (as in vNNNN), or the newest version of the named adapter NAME "
    "(training.adapters); default: the newest. A document of named adapters needs --adapter or --adapter-mix, "
    "unless it has a learned gate: then its mean output over its training prompts is the mix.",
)
@click.option(
    "--adapter-mix",
    "mix",
    metavar="NAME:WEIGHT,...",
    callback=_mix_spec,
    help="Export one adapter mixed from named adapters with these weights (PEFT's add_weighted_adapter), "
    "e.g. knowledge:1.0,tone:0.5; it is also written as a PEFT adapter folder, mix/.",
)
@click.option(
    "--adapter-mix-method",
    "mix_method",
    type=click.Choice(["linear", "cat", "svd"]),
    help="How --adapter-mix combines the adapters: linear (A and B summed; one rank only), cat (exact, "
    "rank = the sum of ranks) or svd (exact sum cut to the largest rank); default: linear when the ranks "
    "agree, else cat.",
)
@click.option(
    "--quant",
    type=click.Choice(["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16"]),
    help="Quantisation of the GGUF files (llama.cpp's quantiser); default: the document's "
    "export.default_quant, else Q4_K_M.",
)
@click.option(
    "--target",
    type=click.Choice(["ollama", "llama-server", "hf"]),
    default="ollama",
    show_default=True,
    help="ollama: GGUF files and a Modelfile; llama-server: GGUF files and the server's command line "
    "(llama-server.sh); hf: the merged Hugging Face folder only.",
)
@click.option(
    "-o",
    "--out",
    type=LocalPath(file_okay=False),
    help="The export folder: new, empty or an export dlm wrote; default: <store>/exports/vNNNN-<QUANT>.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Write into an -o folder dlm did not write, replacing only the names an export writes.",
)
@json_option("dlmstore.export.exporter:ExportResult", help="Print what was written as JSON.")
def export_command(
    path: str,
    adapter: str | None,
    mix: str | None,
    mix_method: str | None,
    quant: str | None,
    target: str,
    out: str | None,
    force: bool,
    as_json: bool,
) -> None:
    """Export the document's adapter: a merged HF folder, GGUF files and a Modelfile or server command.

    Writes the merged model as a Hugging Face folder (hf/), the merged model
    as GGUF at the chosen quantisation, the base model as GGUF with the
    adapter alone as a GGUF LoRA on top, and, for --target ollama, a
    Modelfile (ollama create NAME -f Modelfile) or, for --target
    llama-server, llama-server.sh. Every file is listed with its sha256 in
    dlm-export.json and in store.db, and the lock pins the llama.cpp used.
    """
    if adapter is not None and mix is not None:
        raise click.UsageError("--adapter and --adapter-mix both choose what to export; give one of them")
    if mix_method is not None and mix is None:
        raise click.UsageError("--adapter-mix-method says how to mix adapters; give --adapter-mix too")
    from dlmstore.torch_loader import require_torch

    require_torch("dlm export merges the adapter into the base model in torch")
    from dlmstore.export.exporter import export_document

    from .progress import progress_shown

    with progress_shown(as_json=as_json):
        result = export_document(
            path,
            adapter=adapter,
            mix=mix,
            mix_method=mix_method,
            quant=quant,
            target=target,
            out=out,
            force=force,
        )
    for line in result.warnings:
        warn(line)
    for line in result.notes:
        note(line)
    if as_json:
        emit_json(result)
        return
    if result.mix is not None:
        parts = ", ".join(f"{p['name']} v{p['version']:04d} x{p['weight']:g}" for p in result.mix["parts"])
        what = f"adapters mixed ({result.mix['combination']}): {parts}"
    else:
        what = (
            f"adapter {result.adapter_name + ' ' if result.adapter_name else ''}v{result.adapter_version:04d}"
        )
    click.echo(
        f"export {result.export_id}: {what} of {result.base_model}, "
        f"target {result.target}"
        + (f", {result.quant}" if result.quant else "")
        + f", {result.seconds:.1f} s"
    )
    click.echo(f"folder: {result.folder}")
    hf_bytes = sum(f.bytes for f in result.files if f.path.startswith("hf/"))
    for item in (f for f in result.files if "/" not in f.path):
        click.echo(f"  {item.path:<28} {human_bytes(item.bytes):>10}  {item.sha256}")
    click.echo(f"  {'hf/':<28} {human_bytes(hf_bytes):>10}  (the merged model, transformers reloads it)")
    if result.modelfile is not None:
        click.echo(f"run it: cd {shlex.quote(result.folder)} && ollama create NAME -f Modelfile")
    if result.command is not None:
        click.echo(f"serve it: {shlex.join(result.command)}")

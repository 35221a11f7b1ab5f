"""``dlm init PATH``: write a new .dlm document with a fresh id."""

from __future__ import annotations

import click

from .params import LocalPath
from .render import emit_json, json_option


@click.command("init")
@click.argument("path", type=LocalPath(dir_okay=False))
@click.option(
    "--base-model",
    default="smollm2-135m",
    show_default=True,
    help="A named base such as qwen2.5-1.5b, hf:org/name, or a local model directory.",
)
@click.option(
    "--template",
    metavar="NAME",
    help="Start from a template of the gallery (`dlm templates list`) instead of the example; "
    "its recommended base unless --base-model is given.",
)
@json_option("dlmstore.document.init:InitResult")
@click.pass_context
def init_command(ctx: click.Context, path: str, base_model: str, template: str | None, as_json: bool) -> None:
    """Write a new .dlm document at PATH and create its store.

    The document gets a fresh ULID and a commented example of every
    section type and of training.sources; with --template NAME, the
    gallery's starter document NAME instead. An existing file is never
    overwritten.
    """
    if template is not None:
        from click.core import ParameterSource

        from dlmstore.templates.instantiate import init_from_template

        named = ctx.get_parameter_source("base_model") is not ParameterSource.DEFAULT
        result = init_from_template(path, template, base_model=base_model if named else None)
    else:
        from dlmstore.document.init import init_document

        result = init_document(path, base_model=base_model)
    if as_json:
        emit_json(result)
        return
    click.echo(f"wrote {result.path}" + (f" from template {result.template}" if result.template else ""))
    click.echo(f"id:    {result.dlm_id}")
    click.echo(f"store: {result.store_path}")
    click.echo(f"next:  edit it, then `dlm show {path}`")

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
@json_option("dlmstore.document.init:InitResult")
def init_command(path: str, base_model: str, as_json: bool) -> None:
    """Write a new .dlm document at PATH and create its store.

    The document gets a fresh ULID and a commented example of every
    section type and of training.sources. An existing file is never
    overwritten.
    """
    from dlmstore.document.init import init_document

    result = init_document(path, base_model=base_model)
    if as_json:
        emit_json(result)
        return
    click.echo(f"wrote {result.path}")
    click.echo(f"id:    {result.dlm_id}")
    click.echo(f"store: {result.store_path}")
    click.echo(f"next:  edit it, then `dlm show {path}`")

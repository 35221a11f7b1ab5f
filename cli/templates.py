"""``dlm templates list``: the gallery of starter documents for ``dlm init --template``."""

from __future__ import annotations

import click

from .render import emit_json, json_option


@click.group("templates")
def templates_group() -> None:
    """List the gallery of starter documents for `dlm init PATH --template NAME`."""


@templates_group.command("list")
@json_option("dlmstore.templates.listing:TemplateListing")
def list_command(as_json: bool) -> None:
    """List every template of the gallery: its name, title and what it trains.

    Each is a .dlm document with instruction pairs, `### Q !probe`
    questions and settings that train on a CPU; `dlm init PATH --template
    NAME` writes one with a fresh id. --json adds its tags, recommended
    base and sample prompts.
    """
    from dlmstore.templates.listing import list_templates

    listing = list_templates()
    if as_json:
        emit_json(listing)
        return
    name_width = max(len("name"), *(len(t.name) for t in listing.templates))
    title_width = max(len("title"), *(len(t.title) for t in listing.templates))
    click.echo(f"{'name':{name_width}}  {'title':{title_width}}  summary")
    for template in listing.templates:
        click.echo(f"{template.name:{name_width}}  {template.title:{title_width}}  {template.summary}")

"""``dlm prompt PATH "question"``: what does the trained adapter answer?"""

from __future__ import annotations

import click

from .params import LocalPath
from .render import emit_json, json_option


@click.command("prompt")
@click.argument("path", type=LocalPath(dir_okay=False))
@click.argument("question")
@click.option("--max-new-tokens", type=click.IntRange(1, 4096), default=128, show_default=True)
@click.option(
    "--backend",
    type=click.Choice(["transformers", "llama.cpp"]),
    default="transformers",
    show_default=True,
    help="transformers: the base model plus the adapter; llama.cpp: the GGUF of the newest `dlm export`.",
)
@click.option(
    "--adapter",
    metavar="NAME",
    help="The named adapter that answers (documents with training.adapters need it, unless gated).",
)
@click.option(
    "--gate",
    type=click.Choice(["auto", "off"]),
    default="auto",
    show_default=True,
    help="Without --adapter, a gated document's adapters answer mixed by its learned gate (auto) or "
    "equally (off).",
)
@json_option("dlmstore.prompt.answer:PromptAnswer", help="Print the answer as JSON.")
def prompt_command(
    path: str, question: str, max_new_tokens: int, backend: str, adapter: str | None, gate: str, as_json: bool
) -> None:
    """Answer QUESTION with the base model plus the document's latest adapter (greedy).

    A document with named adapters (training.adapters) answers with the one
    --adapter names; a gated one (training.gate) without --adapter answers
    with its adapters mixed by the weights its gate gives the question, and
    says them (--gate off: equal weights).
    """
    from dlmstore.train.threads import configure

    configure()  # threads and how they wait, before torch is imported, as dlm train and dlm eval set them
    if backend == "transformers":
        from dlmstore.torch_loader import require_torch

        require_torch("dlm prompt --backend transformers runs the base model and the adapter in torch")
    from dlmstore.prompt.answer import answer_question

    from .progress import progress_shown

    with progress_shown(as_json=as_json):
        result = answer_question(
            path, question, max_new_tokens=max_new_tokens, backend=backend, adapter=adapter, gate=gate
        )
    if as_json:
        emit_json(result)
        return
    if result.mix:
        weights = ", ".join(f"{part.name} {part.weight:.2f}" for part in result.mix)
        click.echo(f"{result.routed_by}: {weights}", err=True)
    click.echo(result.answer)

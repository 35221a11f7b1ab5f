"""``dlm eval PATH``: the val split and the probes, for a stored adapter, the base, or two side by side."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from .params import LocalPath
from .render import emit_json, json_option, plural

if TYPE_CHECKING:
    from collections.abc import Callable

    from dlmstore.eval.results import EvalReport, ModelEval, ProbeScore


def _version(text: str) -> int:
    """``v3``, ``v0003`` or ``3`` -> 3."""
    digits = text[1:] if text[:1] in ("v", "V") else text
    if not digits.isdigit() or int(digits) < 1:
        raise click.BadParameter(f"{text!r} is not an adapter version (v1, v0003, 3)")
    return int(digits)


class Version(click.ParamType[int]):
    name = "vN"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return _version(str(value))
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


class VersionOrName(click.ParamType[int | str]):
    """``vN`` (a version) or a named adapter's name (``training.adapters``)."""

    name = "vN|NAME"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        import re

        if isinstance(value, int):
            return value
        text = str(value)
        if re.fullmatch(r"[vV]?[0-9]+", text):
            return Version().convert(text, param, ctx)
        if re.fullmatch(r"[a-z][a-z0-9_]{0,31}", text):
            return text
        self.fail(f"{text!r} is neither an adapter version (v1, v0003, 3) nor an adapter name", param, ctx)


@click.command("eval")
@click.argument("path", type=LocalPath(dir_okay=False))
@click.option(
    "--adapter",
    type=VersionOrName(),
    help="The adapter version to evaluate (default: the newest), or the named adapter whose newest "
    "version is evaluated (documents with training.adapters need one).",
)
@click.option("--base", is_flag=True, help="Evaluate the base model instead of an adapter.")
@click.option("--against", type=Version(), help="The adapter version to compare with (default: the base).")
@click.option("--no-cache", is_flag=True, help="Tokenize every row; neither read nor write cache entries.")
@json_option("dlmstore.eval.results:EvalReport", help="Print the evaluation as JSON.")
def eval_command(
    path: str, adapter: int | str | None, base: bool, against: int | None, no_cache: bool, as_json: bool
) -> None:
    """Evaluate a stored adapter of the document at PATH on its val split and probes.

    The val split and the probes are the ones `dlm train` evaluates after
    each phase: the rows its seed holds out (their tokens from the cache),
    the `### Q !probe` pairs or a seeded sample of the Q/A pairs. Each probe
    is answered greedily and scored against the document's answer: the
    answer's mean token NLL (teacher-forced), exact match and token-F1.
    Recorded as a run of its own (`dlm metrics` lists it).
    """
    name = adapter if isinstance(adapter, str) else None
    version = adapter if isinstance(adapter, int) else None
    if version is not None and base:
        raise click.UsageError("--adapter and --base cannot be combined; pass one of them")
    if version is not None and version == against:
        raise click.UsageError(
            f"--adapter and --against both name v{version:04d}; compare it with another version, "
            "or leave --against out to compare it with the base"
        )
    from dlmstore.train.threads import configure

    configure()  # threads and how they wait, before torch is imported, as dlm train sets them
    from dlmstore.torch_loader import require_torch

    require_torch("dlm eval runs the base model and the adapter in torch")
    from dlmstore.train.evaluate import evaluate_document

    from .progress import progress_shown

    with progress_shown(as_json=as_json):
        report = evaluate_document(
            path, adapter=version, base=base, against=against, no_cache=no_cache, name=name
        )
    if as_json:
        emit_json(report)
    else:
        _print(report)


def _print(report: EvalReport) -> None:
    first = report.models[0]
    click.echo(
        f"run {report.run_id} eval: {plural(report.val_rows, 'val row')}, {plural(len(first.probes), 'probe')}"
    )
    width = max(len(model.model) for model in report.models)
    for model in report.models:
        click.echo(f"  {model.model:<{width}}  {_line(model)}")
    if first.retained:
        click.echo(f"kept:   {plural(len(first.retained), 'probe')} of earlier versions")
        for model in report.models:
            click.echo(
                f"  {model.model:<{width}}  NLL {_number(model.retained_nll, '.2f')}, "
                f"{model.retained_exact}/{len(model.retained)} exact, F1 {_number(model.retained_f1, '.2f')}"
            )
    if first.retention_loss is not None:
        click.echo(f"retain: {plural(first.retention_rows, 'row')} of the retention slice")
        for model in report.models:
            line = f"loss {_number(model.retention_loss, '.4f')}"
            if model.retention_delta is not None:
                line += f", {model.retention_delta:+.4f} against {report.models[1].model}"
            click.echo(f"  {model.model:<{width}}  {line}")
    _answers(report, "probe", lambda model: model.probes)
    _answers(report, "kept probe", lambda model: model.retained)


def _answers(report: EvalReport, label: str, probes: Callable[[ModelEval], list[ProbeScore]]) -> None:
    """Each probe, the document's answer and each model's answer and scores."""
    width = max(9, *(len(model.model) for model in report.models))
    for index, probe in enumerate(probes(report.models[0])):
        click.echo(f"{label} {index + 1}: {probe.question}")
        click.echo(f"  {'reference':>{width}}: {probe.reference}")
        for model in report.models:
            answer = probes(model)[index]
            mark = "exact" if answer.exact else f"F1 {answer.f1:.2f}"
            click.echo(f"  {model.model:>{width}}: {answer.answer}  ({mark}, NLL {_number(answer.nll)})")


def _line(model: ModelEval) -> str:
    val = (
        "no val rows"
        if model.val_loss is None
        else f"val loss {model.val_loss:.4f} (perplexity {_number(model.val_perplexity, '.2f')})"
    )
    if not model.probes:
        return f"{val}; no probes"
    return (
        f"{val}; probes NLL {_number(model.probe_nll)}, {model.probe_exact}/{len(model.probes)} exact, "
        f"F1 {_number(model.probe_f1, '.2f')}"
    )


def _number(value: float | None, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)

"""``dlm data``: build, validate and show token datasets.

Thin commands over :mod:`dlmstore.datasets`: each parses its flags, calls
one library function (imported inside the command, so ``dlm --help``
never loads torch, numpy or transformers) and renders the dataclass it
returns as text or ``--json``. Progress goes to stderr, only on a
terminal or every 10 s on a pipe (``cli/progress.py``), never with
``--json``.
"""

from __future__ import annotations

from typing import Any

import click

from .params import SIZE, LocalPath, LocalPathText, PathOrObject
from .render import emit_json, human_bytes, json_option, plural

_engine_options = [
    click.option(
        "--engine",
        type=click.Choice(["local", "ray"]),
        default="local",
        show_default=True,
        help="Tokenize in this process, or on Ray (same output bytes).",
    ),
    click.option(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="Ray cluster (host:port); default: $RAY_ADDRESS, else a local Ray for this command.",
    ),
    click.option(
        "--workers",
        type=click.IntRange(min=1),
        default=None,
        help="CPUs of the local Ray; on a cluster, 2N tasks kept in flight (default: its CPUs).",
    ),
]


def _with_engine(command: Any) -> Any:
    for option in reversed(_engine_options):
        command = option(command)
    return command


def _engine(engine: str, ray_address: str | None, workers: int | None) -> Any:
    from dlmstore.datasets.build.recipes import engine_for

    if engine == "local" and (ray_address or workers):
        raise click.UsageError("--ray-address and --workers need --engine ray")
    return engine_for(engine, ray_address=ray_address, workers=workers)


@click.group("data")
def data_group() -> None:
    """Token datasets: pretrain shards and SFT caches, registered in store.db.

    Build them from the spec's sources (`build-all`) or local files
    (`build pretrain|sft`), check them (`validate`), and see what a
    directory holds (`show`).
    """


@data_group.command("build-all")
@click.option(
    "--cache-dir",
    required=True,
    type=LocalPath(file_okay=False),
    help="Where the cache and its store.db go.",
)
@click.option("--seed", default=42, show_default=True, help="Seed of every split and shuffle.")
@click.option("--base", default="smollm2-135m", show_default=True, help="Base model whose tokenizer is used.")
@click.option(
    "--local",
    "local",
    multiple=True,
    type=LocalPathText(),
    metavar="NAME=PATH",
    help="Read source NAME from local files (repeatable).",
)
@click.option("--only", multiple=True, metavar="NAME", help="Build only these sources (repeatable).")
@click.option("--fineweb-dataset", default="HuggingFaceFW/fineweb-edu", show_default=True)
@click.option("--fineweb-config", default="CC-MAIN-2024-10", show_default=True)
@click.option("--fineweb-train-tokens", type=SIZE, default="200M", show_default=True)
@click.option("--fineweb-val-tokens", type=SIZE, default="5M", show_default=True)
@click.option(
    "--shuffle-buffer", type=SIZE, default=10_000, show_default=True, help="fineweb-edu shuffle buffer."
)
@click.option("--wikitext-dataset", default="Salesforce/wikitext", show_default=True)
@click.option("--wikitext-config", default="wikitext-103-raw-v1", show_default=True)
@click.option("--dolly-dataset", default="databricks/databricks-dolly-15k", show_default=True)
@click.option("--oasst-dataset", default="OpenAssistant/oasst1", show_default=True)
@click.option("--oasst-lang", default=None, help="Keep only oasst1 trees in this language (default: all).")
@click.option("--sft-val-frac", default=0.10, show_default=True, help="Share of SFT examples in val.")
@click.option("--roam-val-frac", default=0.10, show_default=True, help="Share of roam files in val.")
@click.option("--shard-bytes", type=SIZE, default="128MiB", show_default=True)
@click.option("--chat-format", default="auto", show_default=True, help="auto, chatml, llama3 or gemma.")
@click.option(
    "--force",
    is_flag=True,
    help="Build into a --cache-dir dlm did not write (and into dataset folders there that dlm did not "
    "write), replacing only the files a build writes.",
)
@_with_engine
@json_option("dlmstore.datasets.build.recipes:BuildAllResult")
def build_all_command(
    cache_dir: str,
    seed: int,
    base: str,
    local: tuple[str, ...],
    only: tuple[str, ...],
    force: bool,
    as_json: bool,
    engine: str,
    ray_address: str | None,
    workers: int | None,
    **flags: Any,
) -> None:
    """Build every source of the spec into CACHE_DIR and register it there.

    Pretrain: fineweb-edu (streamed from the hub, shuffled, token budgets),
    wikitext (its own splits), roam (a local folder) and gutenberg (a stub
    unless given a local folder). SFT: dolly-15k and oasst1. A source that
    cannot be reached fails with one line saying how to point it at local
    files (--local NAME=PATH); the others still build. Exit 1 if any failed.

    CACHE_DIR must be new, empty or a cache dlm wrote; each dataset folder
    in it is written only when it is new, empty or a dataset dlm wrote
    (--force: replace the dataset files of one it did not write).
    """
    from dlmstore.datasets.build.recipes import BuildAllOptions, build_all
    from dlmstore.errors import DatasetError

    pairs = {}
    for item in local:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"{item!r} is not NAME=PATH", param_hint="--local")
        pairs[name] = path
    from dlmstore.datasets.build.catalog import SOURCES

    for name in [*pairs, *only]:
        if name not in SOURCES:
            raise click.BadParameter(
                f"unknown source {name!r} (sources: {', '.join(SOURCES)})",
                param_hint="--local" if name in pairs else "--only",
            )
    from .progress import BuildTasks, progress_shown

    with progress_shown(as_json=as_json):
        result = build_all(
            cache_dir,
            seed=seed,
            base=base,
            options=BuildAllOptions(**flags),
            local=pairs,
            only=list(only) or None,
            progress=BuildTasks(),
            engine=_engine(engine, ray_address, workers),
            force=force,
        )
    if as_json:
        emit_json(result)
    else:
        for source in result.sources:
            detail = source.message
            if source.status == "built":
                detail = ", ".join(
                    f"{split} {plural(tokens, 'token')}" for split, tokens in source.tokens.items()
                )
            click.echo(f"{source.name:<12} {source.status:<9} {detail}")
        click.echo(f"store: {result.db_path}")
    if result.failed:
        raise DatasetError(
            f"{len(result.failed)} of {len(result.sources)} sources failed: {', '.join(result.failed)}",
            hint="the other sources were built and registered; see the lines above",
        )


@data_group.group("build")
def build_group() -> None:
    """Build one dataset from local files (text, JSONL or Parquet)."""


_common = [
    click.option(
        "--from",
        "source",
        required=True,
        type=PathOrObject(exists=True),
        help="Input file or folder, or s3://bucket/prefix (read by range where it is).",
    ),
    click.option(
        "--out",
        required=True,
        type=PathOrObject(file_okay=False),
        help="Dataset directory to write: new, empty, or a dataset dlm wrote (else --force); or "
        "s3://bucket/prefix: built locally, then uploaded with meta.json last.",
    ),
    click.option(
        "--force",
        is_flag=True,
        help="Write into an --out folder dlm did not write, replacing its meta.json and "
        "train/ val/ shards (nothing else is removed).",
    ),
    click.option("--name", default=None, help="Dataset name (default: the --out folder's name)."),
    click.option(
        "--base", default="smollm2-135m", show_default=True, help="Base model whose tokenizer is used."
    ),
    click.option("--seed", default=42, show_default=True),
    click.option(
        "--token-dtype",
        type=click.Choice(["uint16", "uint32"]),
        default=None,
        help="Default: uint16 when the vocabulary fits, else uint32.",
    ),
    click.option(
        "--store",
        "store_dir",
        default=None,
        type=LocalPath(file_okay=False),
        help="Register in this directory's store.db (default: the --out directory; for s3:// "
        "<dlm home>/datasets).",
    ),
    json_option("dlmstore.datasets.build.recipes:DatasetBuild"),
]


def _with_common(command: Any) -> Any:
    for option in reversed(_common):
        command = option(command)
    return _with_engine(command)


@build_group.command("pretrain")
@_with_common
@click.option(
    "--val-frac",
    type=float,
    default=None,
    help="Share of documents in val (default 0.01, or the budgets' ratio).",
)
@click.option("--train-tokens", type=SIZE, default=None, help="Stop train at this many tokens.")
@click.option("--val-tokens", type=SIZE, default=None, help="Stop val at this many tokens.")
@click.option("--shard-bytes", type=SIZE, default="128MiB", show_default=True)
@click.option(
    "--shuffle-buffer", type=SIZE, default=None, help="Shuffle documents with a buffer of this many."
)
@click.option(
    "--text-field", default="text", show_default=True, help="Field of JSONL/Parquet records holding the text."
)
@click.option("--eos-token", default=None, help="End-of-document token (default: the tokenizer's EOS).")
def build_pretrain_command(
    source: str,
    out: str,
    as_json: bool,
    engine: str,
    ray_address: str | None,
    workers: int | None,
    **options: Any,
) -> None:
    """Tokenize local documents into train/val shards with document indexes.

    With --engine ray the documents are tokenized by Ray workers (a local
    Ray, or the cluster at --ray-address) into the same bytes; an
    interrupted build resumes where it stopped when run again.

    --out must be a new or empty folder, or a dataset dlm wrote, apart from
    --from; any other folder is refused unless --force. --out
    s3://bucket/prefix builds in a local staging folder, then uploads the
    same files, meta.json last (the same rule for a prefix that holds
    objects); the dataset is registered under its URL.
    """
    from dlmstore.datasets.build.recipes import build_pretrain_from

    from .progress import BuildTasks, progress_shown

    with progress_shown(as_json=as_json):
        done = build_pretrain_from(
            source, out, progress=BuildTasks(), engine=_engine(engine, ray_address, workers), **options
        )
    _render_build(done, as_json)


@build_group.command("sft")
@_with_common
@click.option("--val-frac", type=float, default=0.10, show_default=True, help="Share of examples in val.")
@click.option("--chat-format", default="auto", show_default=True, help="auto, chatml, llama3 or gemma.")
def build_sft_command(
    source: str,
    out: str,
    as_json: bool,
    engine: str,
    ray_address: str | None,
    workers: int | None,
    **options: Any,
) -> None:
    """Tokenize local conversations (JSONL/Parquet) with an assistant-only loss mask.

    Each record is {"messages": [{"role", "content"}, ...]} or a
    dolly-style {"instruction", "context", "response"}. --out: as for
    `dlm data build pretrain`.
    """
    from dlmstore.datasets.build.recipes import build_sft_from

    from .progress import BuildTasks, progress_shown

    with progress_shown(as_json=as_json):
        done = build_sft_from(
            source, out, progress=BuildTasks(), engine=_engine(engine, ray_address, workers), **options
        )
    _render_build(done, as_json)


def _render_build(done: Any, as_json: bool) -> None:
    if as_json:
        emit_json(done)
        return
    build = done.build
    unit = "doc" if build.kind == "pretrain" else "example"
    click.echo(f"built {build.kind} dataset {build.name} at {build.path} in {build.seconds:.1f}s")
    for split, totals in build.splits.items():
        click.echo(
            f"{split + ':':<6} {plural(totals.tokens, 'token')}, {plural(totals.docs, unit)}, "
            f"{plural(totals.files, 'file')}, {human_bytes(totals.bytes)}"
        )
    skipped = ", ".join(f"{n} {why.replace('_', ' ')}" for why, n in build.skipped.items() if n)
    if skipped:
        click.echo(f"skipped: {skipped}")
    click.echo(f"dtype:  {build.token_dtype} (vocab {build.vocab_size}), tokenizer {build.tokenizer_sha256}")
    if build.driver_bytes is not None:
        click.echo(f"driver: {_driver_line(build.driver_bytes)}")
    if done.uploaded is not None:
        up = done.uploaded
        click.echo(
            f"upload: {plural(up.files, 'object')}, {human_bytes(up.bytes)} to {up.url} in {up.seconds:.1f}s"
            + (f", {plural(up.removed, 'stale object')} removed" if up.removed else "")
        )
    click.echo(f"store:  {done.registered.db_path} (dataset {done.registered.dataset_id})")
    click.echo(f"next:   dlm data validate {build.path}")


def _driver_line(moved: Any) -> str:
    """What passed through the Ray driver: the tokenizer once, then a share of the input."""
    rest = moved.read + moved.sent + moved.received - moved.tokenizer
    share = f"{rest / moved.input:.2%} of" if moved.input else "for"
    reader = "the workers read the input" if moved.reader == "workers" else "the driver read the input"
    return (
        f"{human_bytes(moved.read + moved.sent + moved.received)} through it: the tokenizer "
        f"({human_bytes(moved.tokenizer)}) once, then {share} the {human_bytes(moved.input)} input; {reader}"
    )


@data_group.command("validate")
@click.argument("path", type=PathOrObject(file_okay=False))
@click.option("--base", default=None, help="Also check the dataset was built by this base model's tokenizer.")
@click.option(
    "--quick", is_flag=True, help="Skip hashing and scanning tokens (sizes, indexes and meta only)."
)
@json_option("dlmstore.datasets.validate:ValidationReport", help="Print the report as JSON.")
def validate_command(path: str, base: str | None, quick: bool, as_json: bool) -> None:
    """Check a dataset's files against its meta.json and print how to read it.

    Checks shards, dtype, token counts, document indexes, offsets and loss
    masks (and, unless --quick, every sha256 and token id). Exit 1 when
    there is a problem. PATH may be s3://bucket/prefix: this node's copy is
    downloaded through the node cache (every file verified against meta.json
    as it arrives), then checked, and the report names the URL.
    """
    from dlmstore.datasets.validate import check_dataset
    from dlmstore.errors import DatasetError

    from .progress import progress_shown

    expected = None
    if base is not None:
        from dlmstore.bases import resolve_base
        from dlmstore.fingerprint import tokenizer_sha256

        with progress_shown(as_json=as_json):  # a built-in base is converted from GGUF on first use
            expected = tokenizer_sha256(resolve_base(base))
    report = check_dataset(path, tokenizer_sha256=expected, deep=not quick)
    if as_json:
        emit_json(report)
    elif report.ok and report.reader is not None:
        tokens = " + ".join(f"{report.totals.get(f'{s}_tokens', 0):,}" for s in ("train", "val"))
        click.echo(
            f"ok: {report.path} ({report.kind} {report.name}, {report.token_dtype}, "
            f"{tokens} tokens, {plural(report.files_checked, 'file')} checked{', deep' if report.deep else ''})"
        )
        for line in report.notes:
            click.echo(f"note: {line}")
        click.echo("train it with dlm:")
        click.echo(f"  {report.reader.train}")
        click.echo("or with KempnerForge (its scripts/train.py flags):")
        click.echo(f"  {report.reader.flags}")
        click.echo("or read it from Python:")
        for line in report.reader.python.rstrip("\n").splitlines():
            click.echo(f"  {line}")
    else:
        for problem in report.problems:
            click.echo(f"problem: {problem}")
    if not report.ok:
        raise DatasetError(
            f"{report.path}: {plural(len(report.problems), 'problem')}",
            hint="rebuild the dataset (`dlm data build ...`); files must match its meta.json",
        )


@data_group.command("show")
@click.argument("path", type=PathOrObject(file_okay=False))
@json_option("dlmstore.datasets.show:DataShow", help="Print the summary as JSON.")
def show_command(path: str, as_json: bool) -> None:
    """Summarise the dataset in PATH, or every dataset of a build-all cache (read-only).

    PATH may be s3://bucket/prefix: the dataset there, from its meta.json alone (no shard is downloaded).
    """
    from dlmstore.datasets.show import show_datasets

    shown = show_datasets(path)
    if as_json:
        emit_json(shown)
        return
    for dataset in shown.datasets:
        state = "built" if dataset.built else "not built"
        click.echo(f"{dataset.name} ({dataset.kind}, {state}) {dataset.path}")
        if not dataset.built:
            continue
        unit = "doc" if dataset.kind == "pretrain" else "example"
        for split, totals in dataset.splits.items():
            click.echo(
                f"  {split + ':':<6} {plural(totals.tokens, 'token')}, {plural(totals.docs, unit)}, "
                f"{plural(totals.files, 'file')}, {human_bytes(totals.bytes)}"
            )
        click.echo(
            f"  dtype {dataset.token_dtype}, vocab {dataset.vocab_size}, seed {dataset.seed}, "
            f"tokenizer {dataset.tokenizer_name} {dataset.tokenizer_sha256}"
        )

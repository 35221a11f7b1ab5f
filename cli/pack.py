"""``dlm pack``, ``dlm unpack`` and ``dlm verify``: a document and its store in one checked file."""

from __future__ import annotations

from pathlib import Path

import click

from .params import LocalPath
from .render import emit_json, human_bytes, json_option, note, plural


@click.command("pack")
@click.argument("path", type=LocalPath(dir_okay=False))
@click.option(
    "-o", "--out", type=LocalPath(dir_okay=False), help="The pack to write (default: PATH.pack beside it)."
)
@click.option(
    "--adapters",
    default="newest",
    show_default=True,
    help="The adapter versions to carry: newest, all, or a list such as v1,v3.",
)
@click.option(
    "--include-sources", is_flag=True, help="Carry the training.sources files, so the pack alone retrains."
)
@click.option("--include-base", is_flag=True, help="Carry the base model's weights and tokenizer.")
@click.option("--include-exports", is_flag=True, help="Carry the exports kept in the store.")
@click.option("--include-cache", is_flag=True, help="Carry the tokenized cache.")
@click.option(
    "--sign", type=LocalPath(dir_okay=False, exists=True), help="Sign the pack with this Ed25519 key."
)
@click.option("--force", is_flag=True, help="Replace a file already at the output.")
@json_option("dlmstore.pack.writer:PackResult")
def pack_command(
    path: str,
    out: str | None,
    adapters: str,
    include_sources: bool,
    include_base: bool,
    include_exports: bool,
    include_cache: bool,
    sign: str | None,
    force: bool,
    as_json: bool,
) -> None:
    """Write the document at PATH, its store and the adapters chosen into one .dlm.pack file.

    Every member is checksummed (CHECKSUMS.sha256, the manifest included);
    the pack of an unchanged store is the same bytes every time.
    """
    from dlmstore.pack.writer import PackOptions, pack_document

    options = PackOptions(
        adapters=adapters, sources=include_sources, base=include_base, exports=include_exports,
        cache=include_cache, sign=Path(sign) if sign else None,
    )  # fmt: skip
    result = pack_document(Path(path), out=Path(out) if out else None, options=options, force=force)
    if as_json:
        emit_json(result)
        return
    versions = ", ".join(f"v{v:04d}" for v in result.adapters)
    click.echo(
        f"packed: {result.path} ({human_bytes(result.bytes)}, {plural(result.members, 'member')}, "
        f"{result.content_type}; adapters {versions})"
    )
    click.echo(f"sha256: {result.sha256.removeprefix('sha256:')}")


@click.command("unpack")
@click.argument("pack", type=LocalPath(dir_okay=False, exists=True))
@click.option(
    "--home", type=LocalPath(file_okay=False), help="Install into this dlm home instead of DLM_HOME's."
)
@click.option(
    "--to",
    type=LocalPath(file_okay=False),
    help="Where the document (and its sources) go (default: PACK's folder).",
)
@click.option(
    "--force", is_flag=True, help="Replace a store of the same document (never one with a newer history)."
)
@json_option("dlmstore.pack.install:UnpackResult")
def unpack_command(pack: str, home: str | None, to: str | None, force: bool, as_json: bool) -> None:
    """Check every member of PACK, then install its document and store.

    Nothing is written until every member is checked; a file of yours is
    never overwritten.
    """
    from dlmstore.home import home_at
    from dlmstore.pack.install import unpack

    with home_at(home or None):
        result = unpack(Path(pack), to=Path(to) if to else None, force=force)
    if as_json:
        emit_json(result)
        return
    click.echo(f"unpacked: {result.document}")
    versions = ", ".join(f"v{v:04d}" for v in result.adapters) or "none"
    click.echo(f"  store:    {result.store}{' (replaced)' if result.replaced else ''}")
    click.echo(f"  adapters: {versions}")
    if result.files_written or result.files_kept:
        click.echo(f"  files:    {result.files_written:,} written, {result.files_kept:,} already there")
    if result.base:
        click.echo(f"  base:     {result.base}")
    for line in result.notes:
        note(line)


@click.command("verify")
@click.argument("pack", type=LocalPath(dir_okay=False, exists=True))
@click.option(
    "--key", type=LocalPath(dir_okay=False, exists=True), help="Check the signature with this public key."
)
@click.option(
    "--retrain", is_flag=True, help="Train the packed document in a scratch home and compare the adapter."
)
@json_option("dlmstore.pack.verification:VerifyReport")
def verify_command(pack: str, key: str | None, retrain: bool, as_json: bool) -> None:
    """Check every member of PACK, its adapters against store.db, its signature, and optionally a retrain.

    Exits 1 when a check fails or a retrain gives other adapter bytes.
    """
    if retrain:
        from dlmstore.train.threads import configure

        configure()  # threads and how they wait, before torch is imported, as dlm train sets them
    from dlmstore.pack.verification import verify_pack

    report = verify_pack(Path(pack), key=Path(key) if key else None, retrain=retrain)
    if as_json:
        emit_json(report)
    else:
        _print(report)
    if not report.ok:
        raise SystemExit(1)


def _print(report: object) -> None:
    from dlmstore.pack.verification import VerifyReport

    assert isinstance(report, VerifyReport)
    click.echo(
        f"checked: {plural(report.members, 'member')} ({human_bytes(report.bytes)}), every sha256 as listed"
    )
    for adapter in report.adapters:
        click.echo(f"  adapter v{adapter.version:04d}: {adapter.sha256} (as store.db recorded)")
    if report.document_matches is not None:
        said = "is" if report.document_matches else "is NOT"
        click.echo(f"  document: {said} the one the newest adapter was trained on")
    if report.signed_by is None:
        click.echo("  signature: none")
    else:
        how = "checked against the key given" if report.signature_checked else "not checked (pass --key)"
        click.echo(f"  signature: {report.signed_by}, {how}")
    if report.retrain is not None:
        found = report.retrain
        verdict = "reproduced" if found.reproduced else "NOT reproduced"
        click.echo(
            f"retrain: {plural(found.steps, 'step')} -> {found.sha256} ({verdict}: packed "
            f"v{found.packed_version:04d} is {found.packed_sha256})"
        )

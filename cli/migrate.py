"""``dlm migrate PATH``: rewrite a document at the current DLM frontmatter version."""

from __future__ import annotations

import click

from .params import LocalPath
from .render import emit_json, json_option


@click.command("migrate")
@click.argument("path", type=LocalPath(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Print the diff; change nothing.")
@click.option("--no-backup", is_flag=True, help="Do not keep the original as PATH.bak.")
@json_option("dlmstore.document.migrate:MigrationResult")
def migrate_command(path: str, dry_run: bool, no_backup: bool, as_json: bool) -> None:
    """Rewrite the .dlm document at PATH at the current dlm_version.

    Sets dlm_version, renames dlmstore's pre-DLM keys (training.r ->
    training.lora_r, ...) and upgrades a version-1 training.dpo block, in
    place: comments and formatting are kept (except where training.dpo is
    rewritten) and the body is untouched. The original is kept as PATH.bak.
    """
    from dlmstore.document.migrate import migrate_document

    result = migrate_document(path, dry_run=dry_run, backup=not no_backup)
    if as_json:
        emit_json(result)
        return
    if dry_run and result.diff:
        click.echo(result.diff, nl=False)
    if not result.changed:
        click.echo(f"{path} is already at dlm_version {result.to_version}; nothing to do")
        return
    what = [f"dlm_version {result.from_version} -> {result.to_version}", *result.renamed]
    if result.comments_dropped:
        what.append("training.dpo -> training.preference (frontmatter re-written: its comments are gone)")
    verb = "would migrate" if dry_run else "migrated"
    click.echo(f"{verb} {path}: {'; '.join(what)}")
    if result.backup:
        click.echo(f"backup: {result.backup}")

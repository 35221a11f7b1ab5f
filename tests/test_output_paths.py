"""Output paths are the user's: dlm writes only into folders it owns, and edits a user's file as an editor would.

* `dlm data build ... --out DIR` writes into DIR only when it is new, empty
  or a dataset dlm wrote (its meta.json, or the marker an unfinished build
  leaves in `.build/`); anything else is refused, naming the folder, before
  Ray is reached or a file is touched, unless `--force`, and even then only
  the files a build writes are replaced. An `--out` that is, holds or sits
  inside `--from` is refused.
* `dlm report -o` and `dlm migrate` go through one helper
  (`store.atomic.replace_user_file`): a symlink is followed and stays, the
  replaced file keeps its mode (and owner), the command's own input is
  never replaced, and a folder or FIFO in the way is one error line.
* `dlm migrate` changes frontmatter keys only: the body keeps its bytes,
  CRLF, LF or mixed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from dlmstore.cli.main import cli
from dlmstore.store.database import open_store

from .helpers import VALID_ID, write_doc

DOCS = [f"Document {i} says something about tokens and shards." for i in range(30)]
FORCE_HINT = (
    "hint: choose a new or empty folder, or pass --force to let dlm replace the dataset files there "
    "(meta.json, train/ and val/ shards; nothing else is removed)"
)


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS))
    return path


@pytest.fixture
def chats(tmp_path: Path) -> Path:
    path = tmp_path / "chats.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": f"Ping {i}"},
                        {"role": "assistant", "content": "Pong"},
                    ]
                }
            )
            + "\n"
            for i in range(10)
        )
    )
    return path


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (hidden ones too) with the sha256 of its bytes."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def someone_elses(folder: Path) -> Path:
    """A folder of a user's files, some of them with the names a dataset build writes."""
    (folder / "train").mkdir(parents=True)
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "meta.json").write_text('{"mine": true}\n')
    (folder / "train" / "shard_00007.bin").write_bytes(b"not tokens")
    (folder / "train" / "shard_notes.txt").write_text("a file whose name starts like a shard's\n")
    return folder


def build(runner: CliRunner, kind: str, source: Path, out: Path, *extra: str) -> Result:
    return runner.invoke(
        cli,
        ["data", "build", kind, "--from", str(source), "--out", str(out), "--shard-bytes", "256", *extra]
        if kind == "pretrain"
        else ["data", "build", kind, "--from", str(source), "--out", str(out), *extra],
    )


# --- dlm data build --out ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["pretrain", "sft"])
def test_a_build_into_a_folder_of_someone_elses_files_is_refused_and_changes_nothing(
    runner: CliRunner, tmp_path: Path, docs: Path, chats: Path, kind: str
) -> None:
    out = someone_elses(tmp_path / "mine")
    before = tree(out)
    result = build(runner, kind, docs if kind == "pretrain" else chats, out)
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"error: {out} is not a folder dlm wrote: it holds meta.json, notes.txt and train/, "
        "and no meta.json of a dlm dataset",
        FORCE_HINT,
    ]
    assert tree(out) == before and sorted(os.listdir(out)) == ["meta.json", "notes.txt", "train"]


def test_a_folder_that_is_not_dlms_is_refused_before_ray_is_reached(
    runner: CliRunner, tmp_path: Path, docs: Path
) -> None:
    pytest.importorskip("ray")
    out = someone_elses(tmp_path / "mine")
    before = tree(out)
    # Nothing listens at this address: reaching for Ray first would fail with another message.
    result = build(runner, "pretrain", docs, out, "--engine", "ray", "--ray-address", "127.0.0.1:9")
    assert result.exit_code == 1
    assert result.output.splitlines()[0] == (
        f"error: {out} is not a folder dlm wrote: it holds meta.json, notes.txt and train/, "
        "and no meta.json of a dlm dataset"
    )
    assert tree(out) == before


def test_force_replaces_only_the_files_a_build_writes(runner: CliRunner, tmp_path: Path, docs: Path) -> None:
    out = someone_elses(tmp_path / "mine")
    result = build(runner, "pretrain", docs, out, "--force")
    assert result.exit_code == 0, result.output
    assert (out / "notes.txt").read_text() == "my notes\n"
    assert (out / "train" / "shard_notes.txt").read_text() == "a file whose name starts like a shard's\n"
    assert json.loads((out / "meta.json").read_text())["format"] == "dlm-token-dataset/1"
    assert not (out / "train" / "shard_00007.bin").exists()  # a shard name: the build's to replace
    assert not (out / ".build").exists()
    again = build(runner, "pretrain", docs, out)  # now a dataset dlm wrote: no --force needed
    assert again.exit_code == 0, again.output
    assert (out / "notes.txt").read_text() == "my notes\n"


def test_a_build_folder_dlm_did_not_make_is_never_removed_even_with_force(
    runner: CliRunner, tmp_path: Path, docs: Path
) -> None:
    out = tmp_path / "mine"
    (out / ".build").mkdir(parents=True)
    (out / ".build" / "work.txt").write_text("my build notes\n")
    before = tree(out)
    for extra in ((), ("--force",)):
        result = build(runner, "pretrain", docs, out, *extra)
        assert result.exit_code == 1
        assert result.output.splitlines() == [
            f"error: {out / '.build'} is not a folder a dlm build made, and a build keeps its working files there",
            f"hint: move {out / '.build'} elsewhere, or choose a new folder for the dataset",
        ]
    assert tree(out) == before


def test_a_rebuild_after_an_interrupted_build_needs_no_force(
    runner: CliRunner, tmp_path: Path, docs: Path
) -> None:
    out = tmp_path / "ds"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(docs.read_text() + '{"body": "no text field"}\n')
    failed = build(runner, "pretrain", bad, out)
    assert failed.exit_code == 1 and "has no string field 'text'" in failed.output
    assert not (out / "meta.json").exists() and (out / ".build" / "dlm-build").is_file()
    rebuilt = build(runner, "pretrain", docs, out)
    assert rebuilt.exit_code == 0, rebuilt.output
    assert (out / "meta.json").is_file() and not (out / ".build").exists()


@pytest.mark.parametrize("where", ["is", "is inside", "holds"])
def test_an_out_folder_that_overlaps_the_input_is_refused(
    runner: CliRunner, tmp_path: Path, where: str
) -> None:
    source = tmp_path / "texts"
    source.mkdir()
    (source / "a.txt").write_text("Some text to build from.\n")
    if where == "is":
        out = source
    elif where == "is inside":
        out = source / "ds"
    else:
        out, moved = tmp_path / "outer", tmp_path / "outer" / "texts"
        out.mkdir()
        source.rename(moved)
        source = moved
    before = tree(tmp_path)
    result = build(runner, "pretrain", source, out)
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"error: the dataset folder {out} {where} the input {source}",
        "hint: write the dataset to a folder apart from what it is built from",
    ]
    assert tree(tmp_path) == before


def test_a_damaged_store_db_is_refused_before_the_old_dataset_is_touched(
    runner: CliRunner, tmp_path: Path, docs: Path
) -> None:
    out = tmp_path / "ds"
    assert build(runner, "pretrain", docs, out).exit_code == 0
    (out / "store.db").write_bytes(b"this is not a database" * 100)
    for extra in ("store.db-wal", "store.db-shm"):
        (out / extra).unlink(missing_ok=True)
    before = tree(out)
    result = build(runner, "pretrain", docs, out, "--seed", "7")
    assert result.exit_code == 1
    assert result.output.startswith("error: ") and "store.db" in result.output
    assert tree(out) == before  # meta.json and every shard as they were


def test_build_all_refuses_a_cache_folder_of_someone_elses_files(runner: CliRunner, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "notes.txt").write_text("mine\n")
    result = runner.invoke(cli, ["data", "build-all", "--cache-dir", str(cache), "--only", "gutenberg"])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"error: {cache} is not a cache folder dlm wrote: it holds notes.txt, and no tokenizer/ of a dlm cache",
        "hint: choose a new or empty folder for --cache-dir, or pass --force to build there "
        "(only the dataset files dlm writes are replaced)",
    ]
    assert os.listdir(cache) == ["notes.txt"]


def test_build_all_never_replaces_a_tokenizer_folder_it_did_not_write(
    runner: CliRunner, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    (cache / "tokenizer").mkdir(parents=True)
    (cache / "tokenizer" / "vocab.txt").write_text("my vocabulary\n")
    result = runner.invoke(
        cli, ["data", "build-all", "--cache-dir", str(cache), "--only", "gutenberg", "--force"]
    )
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"error: {cache / 'tokenizer'} is not a tokenizer folder dlm wrote, and build-all replaces that folder whole",
        f"hint: move {cache / 'tokenizer'} elsewhere, or choose a new folder for --cache-dir",
    ]
    assert tree(cache) == {"tokenizer/vocab.txt": hashlib.sha256(b"my vocabulary\n").hexdigest()}


def test_build_all_refuses_a_local_source_that_holds_its_dataset_folder(
    runner: CliRunner, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    result = runner.invoke(
        cli,
        [
            "data",
            "build-all",
            "--cache-dir",
            str(cache),
            "--only",
            "roam",
            "--local",
            f"roam={cache}",
            "--json",
        ],
    )
    assert result.exit_code == 1
    roam = json.loads(result.stdout)["sources"][2]
    assert roam["name"] == "roam" and roam["status"] == "failed"
    assert roam["message"] == f"the dataset folder {cache / 'pretrain' / 'roam'} is inside the input {cache}"


# --- dlm report -o -----------------------------------------------------------------------------


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    path = write_doc(tmp_path / "doc.dlm")
    open_store(VALID_ID).close()
    return path


def report(runner: CliRunner, doc: Path, out: Path | str) -> Result:
    return runner.invoke(cli, ["report", str(doc), "-o", str(out)])


@pytest.mark.parametrize("how", ["itself", "a symlink to it", "a hard link to it"])
def test_report_refuses_to_write_over_its_own_document(
    runner: CliRunner, doc: Path, tmp_path: Path, how: str
) -> None:
    out = doc
    if how == "a symlink to it":
        out = tmp_path / "page.html"
        out.symlink_to(doc)
    elif how == "a hard link to it":
        out = tmp_path / "page.html"
        os.link(doc, out)
    before = doc.read_bytes()
    result = report(runner, doc, out)
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"error: cannot write the report to {out}: it is {doc}, which this command reads",
        "hint: pass -o with another path (the default is report.html)",
    ]
    assert doc.read_bytes() == before and (how != "a symlink to it" or out.is_symlink())


def test_report_refuses_to_write_over_the_store_database(runner: CliRunner, doc: Path) -> None:
    db = open_store(VALID_ID).db_path
    result = report(runner, doc, db)
    assert result.exit_code == 1
    assert (
        result.output.splitlines()[0]
        == f"error: cannot write the report to {db}: it is {db}, which this command reads"
    )


def test_report_through_a_symlink_writes_its_target_and_keeps_the_link(
    runner: CliRunner, doc: Path, tmp_path: Path
) -> None:
    (tmp_path / "pages").mkdir()
    target = tmp_path / "pages" / "latest.html"
    target.write_text("old page\n")
    link = tmp_path / "report.html"
    link.symlink_to(Path("pages") / "latest.html")
    result = report(runner, doc, link)
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and os.readlink(link) == os.path.join("pages", "latest.html")
    assert target.read_text().startswith("<!DOCTYPE html>")


def test_report_through_a_dangling_symlink_creates_its_target(
    runner: CliRunner, doc: Path, tmp_path: Path
) -> None:
    link = tmp_path / "report.html"
    link.symlink_to(tmp_path / "new.html")
    assert report(runner, doc, link).exit_code == 0
    assert link.is_symlink() and (tmp_path / "new.html").read_text().startswith("<!DOCTYPE html>")


def test_report_over_a_private_file_keeps_it_private(runner: CliRunner, doc: Path, tmp_path: Path) -> None:
    out = tmp_path / "private.html"
    out.write_text("old\n")
    out.chmod(0o600)
    assert report(runner, doc, out).exit_code == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and out.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("kind", ["a FIFO", "a symlink loop"])
def test_report_refuses_an_output_that_is_not_a_regular_file(
    runner: CliRunner, doc: Path, tmp_path: Path, kind: str
) -> None:
    out = tmp_path / "page"
    if kind == "a FIFO":
        os.mkfifo(out)
        why = "a FIFO, not a regular file"
    else:
        out.symlink_to(tmp_path / "other")
        (tmp_path / "other").symlink_to(out)
        why = "a symlink loop"
    result = report(runner, doc, out)
    assert result.exit_code == 1
    assert result.output.splitlines()[0] == f"error: cannot write the report to {out}: {why}"
    assert stat.S_ISFIFO(out.lstat().st_mode) if kind == "a FIFO" else out.is_symlink()


def test_report_as_root_keeps_the_owner_of_the_file_it_replaces(
    runner: CliRunner, doc: Path, tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give a file to another user")
    out = tmp_path / "theirs.html"
    out.write_text("old\n")
    os.chown(out, 4321, 4322)
    assert report(runner, doc, out).exit_code == 0
    assert (out.stat().st_uid, out.stat().st_gid) == (4321, 4322)


# --- dlm migrate -------------------------------------------------------------------------------

OLD_FRONTMATTER = f"---\ndlm_id: {VALID_ID}\ntraining:\n  r: 8\n---\n"


def migrate(runner: CliRunner, path: Path, *extra: str) -> Result:
    return runner.invoke(cli, ["migrate", str(path), *extra])


def test_migrate_through_a_symlink_migrates_the_target_and_keeps_the_link(
    runner: CliRunner, tmp_path: Path
) -> None:
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "doc.dlm"
    real.write_text(OLD_FRONTMATTER + "Body.\n")
    link = tmp_path / "doc.dlm"
    link.symlink_to(Path("real") / "doc.dlm")
    result = migrate(runner, link)
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and os.readlink(link) == os.path.join("real", "doc.dlm")
    assert "lora_r: 8" in real.read_text() and "dlm_version: 15" in real.read_text()
    assert Path(f"{link}.bak").read_text() == OLD_FRONTMATTER + "Body.\n"


def test_migrate_keeps_a_private_document_and_its_backup_private(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "doc.dlm"
    path.write_text(OLD_FRONTMATTER + "Secret body.\n")
    path.chmod(0o600)
    assert migrate(runner, path).exit_code == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(Path(f"{path}.bak").stat().st_mode) == 0o600


def test_migrate_as_root_keeps_the_documents_owner(runner: CliRunner, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give a file to another user")
    path = tmp_path / "doc.dlm"
    path.write_text(OLD_FRONTMATTER + "Body.\n")
    os.chown(path, 4321, 4322)
    assert migrate(runner, path).exit_code == 0
    assert (path.stat().st_uid, path.stat().st_gid) == (4321, 4322)


def test_a_backup_path_that_is_a_folder_is_one_error_and_the_document_is_unchanged(
    runner: CliRunner, tmp_path: Path
) -> None:
    path = tmp_path / "doc.dlm"
    path.write_text(OLD_FRONTMATTER)
    Path(f"{path}.bak").mkdir()
    result = migrate(runner, path)
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"error: {path}: cannot keep the original as {path}.bak: it is a directory, not a regular file",
        f"hint: move {path}.bak out of the way, or pass --no-backup",
    ]
    assert path.read_text() == OLD_FRONTMATTER


def test_a_backup_path_that_links_to_the_document_is_refused(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "doc.dlm"
    path.write_text(OLD_FRONTMATTER)
    Path(f"{path}.bak").symlink_to(path)
    result = migrate(runner, path)
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"error: {path}: cannot keep the original as {path}.bak: that is the document itself (a link to it)",
        f"hint: remove {path}.bak, or pass --no-backup",
    ]
    assert path.read_text() == OLD_FRONTMATTER


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A folder no file can be created in, and the strerror of trying: chmod, or for root `chattr +i`."""
    folder = tmp_path / "locked"
    folder.mkdir()
    (folder / "doc.dlm").write_text(OLD_FRONTMATTER)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder, os.strerror(13)
        folder.chmod(0o755)
        return
    if shutil.which("chattr") is None:
        pytest.skip("root writes into any folder, and chattr is not installed")
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem has no immutable attribute (chattr +i)")
    try:
        yield folder, os.strerror(1)
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_migrate_in_a_read_only_folder_is_one_error_line(
    runner: CliRunner, read_only: tuple[Path, str]
) -> None:
    folder, why = read_only
    path = folder / "doc.dlm"
    result = migrate(runner, path)
    assert result.exit_code == 1
    assert result.output.splitlines()[0] == (
        f"error: {path}: cannot write {path}.bak: {why}; the document was not changed"
    )
    assert "Traceback" not in result.output and path.read_text() == OLD_FRONTMATTER
    no_backup = migrate(runner, path, "--no-backup")
    assert no_backup.exit_code == 1
    assert no_backup.output.splitlines()[0] == f"error: {path}: cannot write the migrated document: {why}"


@pytest.mark.parametrize(
    "body",
    [
        b"Line one.\r\nLine two.\r\n",  # CRLF under an LF frontmatter
        b"CRLF line.\r\nLF line.\nCR-less end",  # mixed, no final newline
        b"\r\n\r\n::instruction::\r\n### Q\r\nWhy?\r\n### A\r\nBecause.\r\n",
    ],
)
def test_migrate_keeps_the_body_byte_for_byte(runner: CliRunner, tmp_path: Path, body: bytes) -> None:
    path = tmp_path / "doc.dlm"
    path.write_bytes(OLD_FRONTMATTER.encode() + body)
    assert migrate(runner, path).exit_code == 0
    migrated = path.read_bytes()
    assert migrated.endswith(b"\n---\n" + body)
    assert migrated.startswith(f"---\ndlm_id: {VALID_ID}\ndlm_version: 15\ntraining:\n  lora_r: 8\n".encode())


def test_migrate_keeps_each_frontmatter_lines_own_line_ending(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "doc.dlm"
    path.write_bytes(f"---\r\ndlm_id: {VALID_ID}\r\ntraining:\n  r: 8\r\n---\nBody\r\n".encode())
    assert migrate(runner, path).exit_code == 0
    assert path.read_bytes() == (
        f"---\r\ndlm_id: {VALID_ID}\r\ndlm_version: 15\r\ntraining:\n  lora_r: 8\r\n---\nBody\r\n".encode()
    )

"""Debris of killed writers: `dlm cache verify` finds it all, `--repair` removes it, a live writer's is safe.

A writer killed at the wrong moment leaves a segment temp file, or a segment
renamed into place whose rows never committed, a dataset shard's temp
file, or a base conversion's staging folder. Which of these is debris is
decided by the store lock (``dlmstore.store.flock``), never by the file's
age: with no other process holding the store, every one of them goes, even
one written a moment ago; while another process holds it, the young ones
are left alone and the command says why. The other holder here is a real
second process.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli
from dlmstore.home import store_dir
from dlmstore.store.flock import FileLock

from .helpers import REPO, VALID_ID, as_written_before_0018, write_doc

IN_USE_NOTE = (
    "note: another dlm process may have this store open (its lock could not be taken); files younger "
    "than an hour were left alone in case it is writing them (run again when it is done)"
)

#: Opens the store of argv[1], says so, and keeps it open until its stdin closes.
HOLDER = """
import sys
from dlmstore.store.database import open_store
store = open_store(sys.argv[1], create=False)
print("open", flush=True)
sys.stdin.read()
"""


def _dlm(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    doc = write_doc(tmp_path / "doc.dlm", body="Prose.\n\n::instruction::\n### Q\nq?\n### A\na.\n")
    assert _dlm("tokenize", str(doc))[0] == 0
    return doc


def _killed_segment_writer_leftovers() -> list[str]:
    """What kill -9 leaves in tokens/: a temp segment, and a segment renamed into place but never registered."""
    tokens = store_dir(VALID_ID) / "tokens"
    temp = tokens / ".segment-01M8ZZZZZZZZZZZZZZZZZZZZZZ.bin.x1y2z3.tmp"
    unregistered = tokens / "segment-01M8ZZZZZZZZZZZZZZZZZZZZZY.bin"
    temp.write_bytes(b"\1\0" * 10)
    unregistered.write_bytes(b"\1\0" * 10)
    return [f"tokens/{unregistered.name}", f"tokens/{temp.name}"]


@pytest.fixture
def holder() -> Iterator[subprocess.Popen[str]]:
    """Another process with the store open (as a running `dlm tokenize` would have)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, VALID_ID],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "open\n"
    yield proc
    proc.communicate("")


def test_verify_reports_what_a_killed_segment_writer_left_however_new_and_repair_removes_it(
    doc: Path,
) -> None:
    orphan, temp = _killed_segment_writer_leftovers()
    code, stdout, stderr = _dlm("cache", "verify", str(doc))
    assert (code, stderr) == (1, "")
    assert stdout.splitlines() == [
        f"problem: orphan_file: {orphan}: segment file not registered in store.db",
        f"problem: temp_file: {temp}: leftover temporary file",
        "checked 2 entries in 1 token file: 2 problems, 2 remaining",
    ]
    code, stdout, _ = _dlm("cache", "verify", "--repair", str(doc))
    assert (
        code == 0 and stdout.splitlines()[-1] == "checked 2 entries in 1 token file: 2 problems, 0 remaining"
    )
    assert not (store_dir(VALID_ID) / orphan).exists() and not (store_dir(VALID_ID) / temp).exists()
    assert _dlm("cache", "verify", str(doc))[:2] == (
        0,
        "checked 2 entries in 1 token file: 0 problems, 0 remaining\n",
    )


def test_prune_removes_what_a_killed_segment_writer_left_however_new(doc: Path) -> None:
    _killed_segment_writer_leftovers()
    code, stdout, _ = _dlm("cache", "prune", str(doc), "--json")
    assert code == 0
    result = json.loads(stdout)
    assert (result["orphan_files_removed"], result["temp_files_removed"], result["store_in_use"]) == (
        1,
        1,
        False,
    )


def test_while_another_process_holds_the_store_repair_leaves_young_files_alone_and_says_so(
    doc: Path, holder: subprocess.Popen[str]
) -> None:
    orphan, temp = _killed_segment_writer_leftovers()
    old = store_dir(VALID_ID) / "tokens" / ".segment-01M8ZZZZZZZZZZZZZZZZZZZZZX.bin.old.tmp"
    old.write_bytes(b"")
    hour_and_a_bit = time.time() - 3700
    os.utime(old, (hour_and_a_bit, hour_and_a_bit))
    code, stdout, stderr = _dlm("cache", "verify", "--repair", str(doc))
    assert (code, stderr) == (0, IN_USE_NOTE + "\n")
    assert stdout.splitlines() == [
        f"repaired: temp_file: tokens/{old.name}: leftover temporary file",
        "checked 2 entries in 1 token file: 1 problem, 0 remaining",
    ]
    assert (store_dir(VALID_ID) / orphan).exists() and (store_dir(VALID_ID) / temp).exists()
    holder.communicate("")  # the other process is done
    assert _dlm("cache", "verify", "--repair", str(doc))[0] == 0
    assert not (store_dir(VALID_ID) / orphan).exists() and not (store_dir(VALID_ID) / temp).exists()


def _truncate_after_the_first_entry() -> Path:
    """Cut the one segment after its first entry: that entry still reads back, the other is gone."""
    (segment,) = (store_dir(VALID_ID) / "tokens").glob("segment-*.bin")
    conn = sqlite3.connect(store_dir(VALID_ID) / "store.db")
    (first_end,) = conn.execute("SELECT bytes FROM cache_entries WHERE byte_offset = 0").fetchone()
    conn.close()
    os.truncate(segment, first_end)
    return segment


def test_a_truncated_segment_stays_healed_after_repair(doc: Path) -> None:
    _truncate_after_the_first_entry()
    code, stdout, _ = _dlm("cache", "verify", "--repair", str(doc))
    assert code == 0
    assert [line.split(":")[1].strip() for line in stdout.splitlines()[:-1]] == ["short_segment", "bad_entry"]
    assert _dlm("cache", "verify", str(doc))[:2] == (
        0,
        "checked 1 entry in 1 token file: 0 problems, 0 remaining\n",
    )


def test_a_truncated_segment_healed_by_the_next_run_leaves_nothing_for_repair(doc: Path) -> None:
    _truncate_after_the_first_entry()
    assert _dlm("tokenize", str(doc))[0] == 0  # the lost entry misses and is written to a new segment
    assert _dlm("cache", "verify", "--repair", str(doc))[:2] == (  # the pass settled the short segment
        0,
        "checked 2 entries in 2 token files: 0 problems, 0 remaining\n",
    )
    assert _dlm("cache", "verify", str(doc))[:2] == (
        0,
        "checked 2 entries in 2 token files: 0 problems, 0 remaining\n",
    )


def test_verify_of_a_dataset_directory_finds_and_removes_a_killed_builds_shard_temp_file(
    tmp_path: Path,
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(4):
        (notes / f"{i}.md").write_text(f"note {i}\n")
    out = tmp_path / "ds"
    build = ["data", "build", "pretrain", "--from", str(notes), "--out", str(out), "--val-frac", "0.25"]
    assert _dlm(*build)[0] == 0
    temp = out / "train" / ".shard_00001.bin.k3j2w9.tmp"
    temp.write_bytes(b"\0" * 6)
    code, stdout, _ = _dlm("cache", "verify", str(out))
    assert code == 1
    assert stdout.splitlines() == [
        "problem: temp_file: train/.shard_00001.bin.k3j2w9.tmp: leftover temporary file",
        "checked 0 entries in 0 token files: 1 problem, 1 remaining",
    ]
    assert _dlm("cache", "verify", "--repair", str(out))[0] == 0
    assert not temp.exists()


def test_a_dataset_build_holds_the_store_lock_of_its_store_while_it_writes(tmp_path: Path) -> None:
    from dlmstore.datasets.build.recipes import build_pretrain_from

    source = tmp_path / "notes.md"
    source.write_text("a note\n")
    out = tmp_path / "ds"
    held = []

    def progress(_: object) -> None:
        with FileLock(out / ".store.lock") as lock:
            held.append(not lock.try_exclusive())

    build_pretrain_from(source, out, val_frac=0.0, progress=progress)
    assert held and all(held)
    with FileLock(out / ".store.lock") as lock:
        assert lock.try_exclusive()  # and lets go when it is done


def test_verify_removes_base_conversion_leftovers_unless_a_conversion_holds_their_lock(
    doc: Path, dlm_home: Path
) -> None:
    bases = dlm_home / "bases"
    bases.unlink()  # this test's own bases/, not the session's shared one
    staging = bases / "smollm2-135m" / ".model-q8w7e6"
    staging.mkdir(parents=True)
    (staging / "model.safetensors").write_bytes(b"\0" * 16)
    with FileLock(bases / "smollm2-135m" / ".convert.lock") as converting:
        converting.exclusive()
        assert _dlm("cache", "verify", str(doc))[0] == 0  # a live conversion's folder is not debris
    code, stdout, _ = _dlm("cache", "verify", str(doc))
    assert code == 1
    assert stdout.splitlines()[0] == (
        f"problem: staging_dir: {staging}: leftover folder of a base conversion that never finished"
    )
    assert _dlm("cache", "verify", "--repair", str(doc))[0] == 0
    assert not staging.exists()


@pytest.mark.slow  # converts the SmolLM2 tokenizer from GGUF afresh
def test_a_conversion_removes_the_staging_folder_a_killed_conversion_left(dlm_home: Path) -> None:
    from dlmstore.bases import resolve_base, tokenizer_source

    bases = dlm_home / "bases"
    bases.unlink()  # convert afresh into this test's own bases/
    staging = bases / "smollm2-135m" / ".tokenizer-dead01"
    staging.mkdir(parents=True)
    (staging / "tokenizer.json").write_text("{")
    converted = Path(tokenizer_source(resolve_base("smollm2-135m")))
    assert (converted / "tokenizer.json").is_file()
    assert sorted(p.name for p in converted.parent.iterdir()) == [".convert.lock", "tokenizer"]


def test_a_filesystem_without_flock_opens_the_store_and_sweeps_only_old_files(
    doc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import fcntl

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    orphan, temp = _killed_segment_writer_leftovers()
    code, stdout, stderr = _dlm("cache", "verify", "--repair", str(doc))
    assert (code, stderr) == (0, IN_USE_NOTE + "\n")  # it cannot know it is alone, so it assumes not
    assert (store_dir(VALID_ID) / orphan).exists() and (store_dir(VALID_ID) / temp).exists()


def test_docs_cache_md_explains_every_kind_of_problem_verify_reports() -> None:
    from dlmstore.cache.admin import PROBLEM_KINDS

    text = (REPO / "docs" / "cache.md").read_text(encoding="utf-8")
    assert [kind for kind in PROBLEM_KINDS if f"| `{kind}` |" not in text] == []


def test_a_segment_written_before_the_rename_keeps_its_pack_name_and_is_read_not_swept(doc: Path) -> None:
    """Stores made before migration 0018 named their token files ``tokens/pack-*.bin``; rows record
    each file's path, so such a file is still read, verified and kept, and never taken for debris."""
    store = store_dir(VALID_ID)
    (legacy,) = as_written_before_0018(store)
    assert legacy.startswith("tokens/pack-")
    code, out, _ = _dlm("cache", "verify", str(doc), "--repair", "--json")
    assert code == 0 and json.loads(out)["problems"] == []
    code, out, _ = _dlm("cache", "prune", str(doc), "--json")
    pruned = json.loads(out)
    assert code == 0 and (pruned["segments_removed"], pruned["orphan_files_removed"]) == (0, 0)
    code, out, _ = _dlm("tokenize", str(doc), "--json")
    event = json.loads(out)["tokenization"]
    assert code == 0 and (event["cache_hits"], event["cache_misses"]) == (2, 0)
    assert (store / legacy).is_file() and not list((store / "tokens").glob("segment-*"))

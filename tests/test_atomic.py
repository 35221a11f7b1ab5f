"""Atomic writes: a file or directory appears whole or not at all."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from dlmstore.store import atomic
from dlmstore.store.atomic import AtomicFile, StagingDir, atomic_file, publish_dir, write_bytes_atomic


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """An empty directory (the autouse ``dlm_home`` fixture lives in ``tmp_path``)."""
    directory = tmp_path / "work"
    directory.mkdir()
    return directory


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_file_appears_only_when_the_block_ends_and_then_whole(work: Path) -> None:
    target = work / "blob.bin"
    with atomic_file(target) as f:
        f.write(b"first half ")
        f.flush()
        assert not target.exists()
        f.write(b"second half")
    assert target.read_bytes() == b"first half second half"
    assert _names(work) == ["blob.bin"]
    assert _mode(target) == 0o644


def test_the_temp_file_is_a_hidden_tmp_file_beside_the_target_so_sweepers_find_it(work: Path) -> None:
    with atomic_file(work / "segment-1.bin") as f:
        f.write(b"x")
        (temp,) = work.iterdir()
    assert temp.name.startswith(".segment-1.bin.") and temp.name.endswith(".tmp")


def test_an_exception_in_the_block_leaves_the_old_content_and_no_temp_file(work: Path) -> None:
    target = work / "meta.json"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="boom"), atomic_file(target) as f:
        f.write(b"new and partial")
        raise RuntimeError("boom")
    assert target.read_bytes() == b"old"
    assert _names(work) == ["meta.json"]


def test_a_failed_fsync_publishes_nothing_and_removes_the_temp_file(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    target = work / "blob.bin"
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left on device"), atomic_file(target) as f:
        f.write(b"data")
    assert _names(work) == []


def test_overwrite_false_refuses_an_existing_file_and_leaves_it_untouched(work: Path) -> None:
    target = work / "doc.dlm"
    target.write_text("mine")
    with pytest.raises(FileExistsError), atomic_file(target, "w", overwrite=False) as f:
        f.write("theirs")
    assert target.read_text() == "mine"
    assert _names(work) == ["doc.dlm"]


def test_overwrite_false_creates_a_file_that_does_not_exist_yet(work: Path) -> None:
    target = work / "doc.dlm"
    write_bytes_atomic(target, b"new", overwrite=False)
    assert target.read_bytes() == b"new"
    assert _names(work) == ["doc.dlm"]


@pytest.mark.parametrize("refused", [errno.EPERM, errno.EOPNOTSUPP], ids=["EPERM", "EOPNOTSUPP"])
def test_overwrite_false_works_where_the_filesystem_makes_no_hard_links(
    work: Path, monkeypatch: pytest.MonkeyPatch, refused: int
) -> None:
    def no_links(*_: object, **__: object) -> None:  # FAT says EPERM, some network shares EOPNOTSUPP
        raise OSError(refused, os.strerror(refused))

    monkeypatch.setattr(os, "link", no_links)
    target = work / "doc.dlm"
    write_bytes_atomic(target, b"new", overwrite=False)
    assert target.read_bytes() == b"new" and _mode(target) == 0o644
    with pytest.raises(FileExistsError), atomic_file(target, "w", overwrite=False) as f:
        f.write("theirs")
    assert target.read_bytes() == b"new"
    assert _names(work) == ["doc.dlm"]


def test_text_mode_writes_utf8_whatever_the_locale(work: Path) -> None:
    target = work / "dlm.lock"
    with atomic_file(target, "w") as f:
        f.write("naïve — ✓\n")
    assert target.read_bytes() == "naïve — ✓\n".encode()


def test_write_bytes_atomic_replaces_an_existing_file(work: Path) -> None:
    target = work / "meta.json"
    target.write_bytes(b"old")
    write_bytes_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert _names(work) == ["meta.json"]


def test_a_streamed_file_can_be_committed_later_or_aborted(work: Path) -> None:
    kept, dropped = AtomicFile(work / "shard_0.bin"), AtomicFile(work / "shard_1.bin")
    kept.file.write(b"kept")
    dropped.file.write(b"dropped")
    kept.commit()
    dropped.abort()
    assert _names(work) == ["shard_0.bin"]
    assert (work / "shard_0.bin").read_bytes() == b"kept"


def test_an_unknown_mode_is_refused_before_any_file_is_made(work: Path) -> None:
    with pytest.raises(ValueError, match="unsupported mode 'ab'"):
        AtomicFile(work / "x", "ab")  # type: ignore[arg-type]
    assert _names(work) == []


def test_a_published_directory_appears_only_when_complete(work: Path) -> None:
    target = work / "tokenizer"
    with publish_dir(target) as staging:
        assert staging.parent == work and staging.name.startswith(".tokenizer-")
        (staging / "tokenizer.json").write_text("{}")
        (staging / "sub").mkdir()
        (staging / "sub" / "part.bin").write_bytes(b"1")
        assert not target.exists()
    assert _names(work) == ["tokenizer"]
    assert _names(target) == ["sub", "tokenizer.json"]
    assert (target / "sub" / "part.bin").read_bytes() == b"1"
    assert _mode(target) == 0o755


def test_an_exception_while_filling_a_directory_leaves_neither_it_nor_its_staging(work: Path) -> None:
    target = work / "model"
    with pytest.raises(RuntimeError, match="conversion failed"), publish_dir(target) as staging:
        (staging / "config.json").write_text("{}")
        raise RuntimeError("conversion failed")
    assert _names(work) == []


def test_publish_dir_refuses_an_existing_directory_and_leaves_it_untouched(work: Path) -> None:
    target = work / "v0001"
    target.mkdir()
    (target / "adapter_model.safetensors").write_bytes(b"old")
    with pytest.raises(FileExistsError), publish_dir(target) as staging:
        (staging / "adapter_model.safetensors").write_bytes(b"new")
    assert _names(work) == ["v0001"]
    assert (target / "adapter_model.safetensors").read_bytes() == b"old"


def test_publish_dir_replace_swaps_in_the_new_directory(work: Path) -> None:
    target = work / "tokenizer"
    target.mkdir()
    (target / "stale.json").write_text("old")
    with publish_dir(target, existing="replace") as staging:
        (staging / "tokenizer.json").write_text("new")
    assert _names(work) == ["tokenizer"]
    assert _names(target) == ["tokenizer.json"]


def test_publish_dir_keep_leaves_the_directory_another_process_published_first(work: Path) -> None:
    target = work / "model"
    with publish_dir(target, existing="keep") as staging:
        (staging / "config.json").write_text("ours")
        target.mkdir()
        (target / "config.json").write_text("theirs")
    assert _names(work) == ["model"]
    assert (target / "config.json").read_text() == "theirs"


def test_a_refused_staging_directory_can_be_published_under_the_next_name(work: Path) -> None:
    (work / "v0001").mkdir()
    (work / "v0001" / "w").write_bytes(b"old")
    with StagingDir(work, name=".incoming-run2") as staging:
        (staging.path / "w").write_bytes(b"new")
        with pytest.raises(FileExistsError):
            staging.publish(work / "v0001")
        assert staging.publish(work / "v0002")
    assert _names(work) == ["v0001", "v0002"]
    assert (work / "v0002" / "w").read_bytes() == b"new"


def test_a_named_staging_directory_replaces_a_leftover_of_the_same_name(work: Path) -> None:
    leftover = work / ".incoming-run3"
    leftover.mkdir()
    (leftover / "half-written").write_bytes(b"x")
    staging = StagingDir(work, name=".incoming-run3")
    assert staging.path == leftover and _names(leftover) == []
    staging.abort()
    assert _names(work) == []


def test_every_file_of_a_published_directory_is_fsynced_before_the_rename(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        synced.append(f"rename {Path(dst).name}")
        real_rename(src, dst)

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to name file descriptors")
    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "rename", rename)
    target = work / "out"
    with publish_dir(target) as staging:
        (staging / "a.bin").write_bytes(b"a")
        (staging / "sub").mkdir()
        (staging / "sub" / "b.bin").write_bytes(b"b")
    renamed = synced.index("rename out")
    before = {Path(p).name for p in synced[:renamed]}
    assert {"a.bin", "b.bin", "sub"} <= before
    assert synced[renamed + 1 :] == [str(work.resolve())]

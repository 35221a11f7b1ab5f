"""Bad packs and interrupted commands: one `error:` line each, and nothing written.

A good pack of the module's trained store (``trained_store``) is read back
member by member and written again with one thing wrong; `dlm unpack`
must refuse it with one line naming what is wrong, and leave the home's
``store/`` and the ``--to`` folder as they were. Kills are real signals
to real ``dlm`` processes.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlmstore.cli.main import cli

from .helpers import VALID_ID, export_doc

PATIENCE_S = 120
Entry = tuple[tarfile.TarInfo, bytes]


@pytest.fixture
def doc(tmp_path: Path, tiny_base: Path, trained_store: Path, dlm_home: Path) -> Path:
    shutil.copytree(trained_store, dlm_home / "store" / VALID_ID)
    (tmp_path / "project").mkdir()
    return export_doc(tmp_path / "project", tiny_base)


@pytest.fixture
def pack(doc: Path) -> Path:
    assert CliRunner().invoke(cli, ["pack", str(doc)]).exit_code == 0
    return doc.with_name(doc.name + ".pack")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The home the bad packs are unpacked into (empty: nothing may appear in it)."""
    (tmp_path / "other-home").mkdir()
    return tmp_path / "other-home"


def _entries(pack: Path) -> list[Entry]:
    import zstandard

    with open(pack, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as stream:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            return [(member, tar.extractfile(member).read()) for member in tar]  # type: ignore[union-attr]


def _write(path: Path, entries: list[Entry]) -> Path:
    import zstandard

    with open(path, "wb") as f, zstandard.ZstdCompressor(level=3).stream_writer(f) as stream:
        with tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for info, data in entries:
                info.size = len(data) if info.isreg() else 0
                tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _file(name: str, data: bytes) -> Entry:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _refused(pack: Path, home: Path, tmp_path: Path) -> str:
    """`dlm unpack` of ``pack`` into ``home``: exit 1, one error line; nothing written; that line."""
    to = tmp_path / "to"
    result = CliRunner().invoke(cli, ["unpack", str(pack), "--home", str(home), "--to", str(to)])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("error: ") and all(line.startswith("hint: ") for line in lines[1:]), (
        result.output
    )
    assert "Traceback" not in result.output
    assert not to.exists()
    assert sorted(p.name for p in (home / "store").iterdir()) == [] if (home / "store").exists() else True
    return lines[0]


def _listed(entries: list[Entry]) -> list[Entry]:
    """``entries`` with CHECKSUMS.sha256 rewritten to list them as they are now."""
    import hashlib

    body = [(info, data) for info, data in entries if info.name != "CHECKSUMS.sha256"]
    sums = "".join(
        f"{hashlib.sha256(data).hexdigest()}  {info.name}\n"
        for info, data in sorted(body, key=lambda item: item[0].name.encode())
        if info.isreg()
    )
    return [*body, _file("CHECKSUMS.sha256", sums.encode())]


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.9, 0.999])
def test_a_truncated_pack_is_refused(pack: Path, home: Path, tmp_path: Path, fraction: float) -> None:
    data = pack.read_bytes()
    cut = tmp_path / "cut.dlm.pack"
    cut.write_bytes(data[: int(len(data) * fraction)])
    assert "is truncated, damaged or not a .dlm.pack" in _refused(cut, home, tmp_path)


def test_every_member_with_a_flipped_byte_is_refused_by_name(pack: Path, home: Path, tmp_path: Path) -> None:
    entries = _entries(pack)
    for index, (info, data) in enumerate(entries):
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0x01
        bad = list(entries)
        bad[index] = (info, bytes(flipped))
        line = _refused(_write(tmp_path / "bad.dlm.pack", bad), home, tmp_path)
        if info.name == "CHECKSUMS.sha256":  # a listed sha256 or name no longer matches its member
            assert "is damaged" in line or "not listed" in line or "CHECKSUMS.sha256 line" in line, line
        elif info.name == "PACK_HEADER.json":  # read before anything: its JSON or its tool broken
            assert "PACK_HEADER.json" in line or "is damaged" in line, line
        else:
            assert line.startswith(f"error: pack member {info.name} is damaged: its sha256 is "), line


def test_a_flipped_byte_in_the_compressed_stream_is_refused(pack: Path, home: Path, tmp_path: Path) -> None:
    data = bytearray(pack.read_bytes())
    data[len(data) // 2] ^= 0x40
    bad = tmp_path / "bad.dlm.pack"
    bad.write_bytes(bytes(data))
    line = _refused(bad, home, tmp_path)
    assert "is truncated, damaged or not a .dlm.pack" in line or "is damaged" in line, line


def test_a_member_not_listed_in_checksums_is_refused(pack: Path, home: Path, tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.dlm.pack", [*_entries(pack), _file("store/extra.bin", b"unlisted")])
    assert _refused(bad, home, tmp_path) == (
        "error: pack member store/extra.bin is not listed in CHECKSUMS.sha256: refused (a pack installs only "
        "checked members)"
    )


def test_a_member_listed_but_missing_is_refused(pack: Path, home: Path, tmp_path: Path) -> None:
    entries = [entry for entry in _entries(pack) if entry[0].name != "store/high-water.json"]
    assert _refused(_write(tmp_path / "bad.dlm.pack", entries), home, tmp_path) == (
        "error: pack member store/high-water.json is listed in CHECKSUMS.sha256 but missing: the pack is damaged"
    )


def test_a_member_present_twice_is_refused(pack: Path, home: Path, tmp_path: Path) -> None:
    entries = _entries(pack)
    twice = [*entries, next(entry for entry in entries if entry[0].name == "store/dlm.lock")]
    assert _refused(_write(tmp_path / "bad.dlm.pack", twice), home, tmp_path).endswith(
        "holds member store/dlm.lock twice: refused (the pack was altered)"
    )


def test_a_manifest_swapped_in_from_another_documents_pack_is_refused(
    pack: Path, home: Path, tmp_path: Path
) -> None:
    entries = _entries(pack)
    manifest = json.loads(next(data for info, data in entries if info.name == "manifest.json"))
    manifest["dlm_id"] = "01M8HHSDSRXJ33QF518TVHA9KD"
    swapped = [(info, json.dumps(manifest).encode()) if info.name == "manifest.json" else (info, data)
               for info, data in entries]  # fmt: skip
    line = _refused(_write(tmp_path / "bad.dlm.pack", _listed(swapped)), home, tmp_path)
    assert line == (
        f"error: pack member manifest.json says dlm_id 01M8HHSDSRXJ33QF518TVHA9KD, but the packed document "
        f"declares {VALID_ID}: refused (the manifest was swapped)"
    )


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../evil.txt", "a name that climbs out with '..'"),
        ("store/../../evil.txt", "a name that climbs out with '..'"),
        ("/etc/evil.txt", "an absolute name"),
        ("store/./evil.txt", "an empty or '.' part in its name"),
    ],
)
def test_a_member_with_an_unsafe_name_is_refused(
    pack: Path, home: Path, tmp_path: Path, name: str, why: str
) -> None:
    bad = _write(tmp_path / "bad.dlm.pack", [_file(name, b"x"), *_entries(pack)])
    assert _refused(bad, home, tmp_path) == f"error: {bad}: member {name!r} is refused: {why}"
    assert not (tmp_path / "evil.txt").exists()


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE])
def test_a_link_member_is_refused(pack: Path, home: Path, tmp_path: Path, kind: bytes) -> None:
    link = tarfile.TarInfo("store/link")
    link.type, link.linkname = kind, "/etc/passwd"
    bad = _write(tmp_path / "bad.dlm.pack", [*_entries(pack), (link, b"")])
    assert _refused(bad, home, tmp_path) == (
        f"error: {bad}: member store/link is a link: refused (a pack holds only regular files)"
    )


def test_a_ten_gigabyte_member_of_zeros_is_refused_at_its_header(
    pack: Path, home: Path, tmp_path: Path
) -> None:
    import zstandard

    size = 10 * 1024**3
    bomb = tmp_path / "bomb.dlm.pack"
    info = tarfile.TarInfo("store/zeros.bin")
    info.size = size
    zeros = bytes(1 << 24)
    with open(bomb, "wb") as f, zstandard.ZstdCompressor(level=1).stream_writer(f) as stream:
        stream.write(info.tobuf(tarfile.PAX_FORMAT))
        for _ in range(size // len(zeros)):  # the whole 10 GB, compressed as it goes (about a second)
            stream.write(zeros)
        stream.write(bytes(2 * tarfile.BLOCKSIZE))
    assert bomb.stat().st_size < 2 * 1024**2
    line = _refused(bomb, home, tmp_path)
    assert line.startswith(
        f"error: {bomb}: member store/zeros.bin would unpack to 10,737,418,240 bytes, over the "
    )
    assert line.endswith("refused (a decompression bomb?)")


def test_a_pack_of_a_newer_format_is_refused(pack: Path, home: Path, tmp_path: Path) -> None:
    entries = _entries(pack)
    header = json.loads(entries[0][1])
    header["pack_format_version"] = 2
    newer = [(entries[0][0], json.dumps(header).encode()), *entries[1:]]
    result = CliRunner().invoke(cli, ["unpack", str(_write(tmp_path / "new.dlm.pack", _listed(newer))),
                                      "--home", str(home), "--to", str(tmp_path / "to")])  # fmt: skip
    assert result.exit_code == 1 and result.output == (
        "error: the pack's format is 2, newer than the 1 this dlmstore reads\nhint: upgrade dlmstore to unpack it\n"
    )


def test_a_file_that_is_not_a_pack_is_refused(home: Path, tmp_path: Path) -> None:
    other = tmp_path / "notes.txt"
    other.write_text("just some notes\n")
    assert _refused(other, home, tmp_path).startswith(
        f"error: {other} is truncated, damaged or not a .dlm.pack"
    )


# --- unpacking over what is there ----------------------------------------------------------------------------


def _unpack(pack: Path, home: Path, to: Path, *extra: str) -> Any:
    return CliRunner().invoke(cli, ["unpack", str(pack), "--home", str(home), "--to", str(to), *extra])


def test_a_store_of_the_same_document_is_replaced_only_with_force(
    pack: Path, home: Path, tmp_path: Path
) -> None:
    assert _unpack(pack, home, tmp_path / "one").exit_code == 0
    again = _unpack(pack, home, tmp_path / "two")
    assert again.exit_code == 1 and again.output == (
        f"error: a store for {VALID_ID} is already at {home / 'store' / VALID_ID}\n"
        "hint: pass --force to replace it with the pack's, or unpack with --home into another home\n"
    )
    assert not (tmp_path / "two").exists()
    forced = _unpack(pack, home, tmp_path / "two", "--force", "--json")
    assert forced.exit_code == 0 and json.loads(forced.stdout)["replaced"] is True
    assert sorted(p.name for p in (home / "store").iterdir()) == [VALID_ID]


def test_force_never_replaces_a_store_with_a_newer_history(pack: Path, home: Path, tmp_path: Path) -> None:
    assert _unpack(pack, home, tmp_path / "one").exit_code == 0
    mark = home / "store" / VALID_ID / "high-water.json"
    data = json.loads(mark.read_text())
    data["expected"]["runs"] += 5  # as if five more runs had been recorded in this home
    mark.write_text(json.dumps(data))
    refused = _unpack(pack, home, tmp_path / "two", "--force")
    assert refused.exit_code == 1 and refused.output.startswith(
        f"error: the store at {home / 'store' / VALID_ID} holds a newer history than the pack (runs beyond the "
        "pack's): it is not replaced, even with --force\n"
    )


def test_force_refuses_while_another_process_has_the_store_open(
    pack: Path, home: Path, tmp_path: Path
) -> None:
    assert _unpack(pack, home, tmp_path / "one").exit_code == 0
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from dlmstore.store.database import open_store; "
         f"s = open_store({VALID_ID!r}, create=False); print('open', flush=True); sys.stdin.read()"],
        env={**os.environ, "DLM_HOME": str(home)}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        refused = _unpack(pack, home, tmp_path / "two", "--force")
        assert refused.exit_code == 1 and refused.output == (
            f"error: the store at {home / 'store' / VALID_ID} is in use by another dlm process: not replaced; "
            "try again\n"
        )
        assert not (tmp_path / "two").exists()
    finally:
        holder.communicate("")


def test_a_different_file_where_the_document_goes_is_refused_and_left_as_it_was(
    pack: Path, home: Path, tmp_path: Path, doc: Path
) -> None:
    to = tmp_path / "to"
    to.mkdir()
    (to / doc.name).write_text("my own notes\n")
    result = _unpack(pack, home, to)
    assert result.exit_code == 1 and result.output == (
        f"error: {to / doc.name} is already there and is not the packed file: refused (a file of yours is never "
        "overwritten)\nhint: move it away, or unpack with --to another folder\n"
    )
    assert (to / doc.name).read_text() == "my own notes\n" and not (home / "store" / VALID_ID).exists()
    (to / doc.name).write_bytes(doc.read_bytes())  # the same bytes: kept, not written again
    kept = _unpack(pack, home, to, "--json")
    assert kept.exit_code == 0 and json.loads(kept.stdout)["files_kept"] == 1


# --- signatures and damaged adapters ----------------------------------------------------------------------------


def _rolled_up(entries: list[Entry]) -> list[Entry]:
    """``entries`` with the manifest's ``entries`` and ``content_sha256`` redone over them as they are now."""
    import hashlib

    from dlmstore.pack.manifest import rollup

    skip = {"PACK_HEADER.json", "manifest.json", "CHECKSUMS.sha256", "SIGNATURE.ed25519"}
    content = {info.name: hashlib.sha256(data).hexdigest() for info, data in entries if info.name not in skip}
    manifest = json.loads(next(data for info, data in entries if info.name == "manifest.json"))
    manifest["content_sha256"] = rollup(content)
    manifest["entries"] = {info.name: len(data) for info, data in entries if info.name in content}
    return [(info, json.dumps(manifest).encode()) if info.name == "manifest.json" else (info, data)
            for info, data in entries]  # fmt: skip


def _keys(folder: Path, name: str, *, ssh: bool = False) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    if ssh:
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    else:
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    (folder / f"{name}.key").write_bytes(private)
    (folder / f"{name}.pub").write_bytes(public)
    return folder / f"{name}.key", folder / f"{name}.pub"


@pytest.mark.parametrize("ssh", [False, True])
def test_a_signed_pack_verifies_with_its_key_and_fails_with_another(
    doc: Path, tmp_path: Path, ssh: bool
) -> None:
    mine, mine_pub = _keys(tmp_path, "mine", ssh=ssh)
    _, other_pub = _keys(tmp_path, "other", ssh=ssh)
    runner = CliRunner()
    assert runner.invoke(cli, ["pack", str(doc), "--sign", str(mine)]).exit_code == 0
    pack = doc.with_name(doc.name + ".pack")
    good = runner.invoke(cli, ["verify", str(pack), "--key", str(mine_pub), "--json"])
    assert good.exit_code == 0 and json.loads(good.stdout)["signature_checked"] is True
    bad = runner.invoke(cli, ["verify", str(pack), "--key", str(other_pub)])
    assert bad.exit_code == 1 and bad.output.startswith("error: the pack is signed by key SHA256:")
    assert bad.output.count("\n") == 1 and "not by the key given" in bad.output


def test_key_on_an_unsigned_pack_fails(pack: Path, tmp_path: Path) -> None:
    _, public = _keys(tmp_path, "mine")
    result = CliRunner().invoke(cli, ["verify", str(pack), "--key", str(public)])
    assert result.exit_code == 1 and result.output == (
        f"error: {pack} is not signed: --key cannot be checked\nhint: ask for a pack made with --sign\n"
    )


def test_a_signature_over_altered_checksums_does_not_verify(doc: Path, home: Path, tmp_path: Path) -> None:
    mine, mine_pub = _keys(tmp_path, "mine")
    assert CliRunner().invoke(cli, ["pack", str(doc), "--sign", str(mine)]).exit_code == 0
    entries = _entries(doc.with_name(doc.name + ".pack"))
    # An attacker's consistent edit: a member changed (same size), the manifest's rollup and the list redone.
    lock = [(info, data.replace(b"7", b"8", 1)) if info.name == "store/dlm.lock" else (info, data)
            for info, data in entries]  # fmt: skip
    assert lock != entries
    resigned = [entry for entry in _listed(_rolled_up(lock)) if entry[0].name != "SIGNATURE.ed25519"]
    signature = next(entry for entry in entries if entry[0].name == "SIGNATURE.ed25519")
    altered = _write(tmp_path / "altered.dlm.pack", [*resigned, signature])
    result = CliRunner().invoke(cli, ["verify", str(altered), "--key", str(mine_pub)])
    assert result.exit_code == 1 and result.output.startswith(
        "error: the pack's signature does not verify with key"
    )


def test_a_damaged_adapter_is_never_packed(doc: Path, dlm_home: Path, tmp_path: Path) -> None:
    weights = dlm_home / "store" / VALID_ID / "adapter" / "versions" / "v0001" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    result = CliRunner().invoke(cli, ["pack", str(doc)])
    assert result.exit_code == 1 and result.output.startswith(
        "error: adapter v0001 is damaged: its weights' sha256 is sha256:"
    )
    assert not doc.with_name(doc.name + ".pack").exists()
    assert not [p for p in doc.parent.iterdir() if p.name.endswith(".tmp")]


# --- killed ---------------------------------------------------------------------------------------------------


def _big_base_doc(doc: Path, megabytes: int = 300) -> Path:
    """The document with a local base folder holding random bytes (300 MB: packing it takes seconds)."""
    base = doc.parent / "bigbase"
    base.mkdir()
    with open(base / "weights.bin", "wb") as f:
        for _ in range(megabytes):
            f.write(os.urandom(1 << 20))
    text = doc.read_text()
    lines = [
        ("base_model: ./bigbase" if line.startswith("base_model:") else line) for line in text.splitlines()
    ]
    doc.write_text("\n".join(lines) + "\n")
    return doc


def _dlm_process(home: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dlmstore.cli.main", *args], env={**os.environ, "DLM_HOME": str(home)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _when(found: Callable[[], bool], process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not found():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_pack_killed_midway_leaves_no_pack_at_the_output(doc: Path, dlm_home: Path, signum: int) -> None:
    doc = _big_base_doc(doc)
    out = doc.with_name(doc.name + ".pack")
    process = _dlm_process(dlm_home, "pack", str(doc), "--include-base")
    _when(lambda: any(p.name.endswith(".tmp") for p in doc.parent.iterdir()), process)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=PATIENCE_S)
    assert not out.exists()
    leftovers = [p.name for p in doc.parent.iterdir() if p.name.endswith(".tmp")]
    if signum == signal.SIGTERM:  # stopped cleanly: its temp file removed, one line said
        assert (
            process.returncode == 143
            and leftovers == []
            and stderr.splitlines() == ["error: terminated by SIGTERM"]
        )
    else:  # SIGKILL runs no code: a temp file may stay beside the output, never at it
        assert process.returncode == -signal.SIGKILL and all(
            name.startswith(f".{out.name}.") for name in leftovers
        )


def _stores(home: Path) -> Any:
    listed = CliRunner().invoke(cli, ["stores", "--json"], env={"DLM_HOME": str(home)})
    assert listed.exit_code == 0, listed.output
    return json.loads(listed.stdout)["stores"]


@pytest.mark.slow
@pytest.mark.parametrize("over", [False, True], ids=["into-an-empty-home", "over-its-store-with-force"])
def test_an_unpack_killed_midway_leaves_the_home_as_it_was_and_the_next_one_sweeps(
    doc: Path, dlm_home: Path, tmp_path: Path, over: bool
) -> None:
    doc = _big_base_doc(doc)
    assert CliRunner().invoke(cli, ["pack", str(doc), "--include-base"]).exit_code == 0
    pack = doc.with_name(doc.name + ".pack")
    home = tmp_path / "colleague"
    (home / "store").mkdir(parents=True)
    force = ["--force"] if over else []
    if over:  # the store is there already, and --force is to replace it
        assert _unpack(pack, home, tmp_path / "to").exit_code == 0
    before = _stores(home)
    db_before = (home / "store" / VALID_ID / "store.db").read_bytes() if over else b""
    process = _dlm_process(home, "unpack", str(pack), "--to", str(tmp_path / "to"), *force)
    # Killed while the members are extracted (a kill between the staging folder's mkdtemp and its owner
    # file, a window of microseconds, leaves an empty folder that no sweep attributes: store/atomic.py).
    _when(lambda: any((p / "pack").exists() for p in (home / "store").glob(".unpack-*")), process)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=PATIENCE_S)
    assert _stores(home) == before
    if over:
        assert (home / "store" / VALID_ID / "store.db").read_bytes() == db_before
    again = _unpack(pack, home, tmp_path / "to", *force)
    assert again.exit_code == 0, again.output
    assert sorted(p.name for p in (home / "store").iterdir()) == [VALID_ID]


def test_a_file_where_a_packed_folder_goes_is_refused_before_the_document_is_written(
    doc: Path, home: Path, tmp_path: Path
) -> None:
    doc = _big_base_doc(doc, megabytes=1)
    assert CliRunner().invoke(cli, ["pack", str(doc), "--include-base"]).exit_code == 0
    to = tmp_path / "to"
    to.mkdir()
    (to / "bigbase").write_text("not a folder\n")
    result = _unpack(doc.with_name(doc.name + ".pack"), home, to)
    assert result.exit_code == 1 and result.output == (
        f"error: {to / 'bigbase'} is already there and is not a folder: refused (a file of yours is never "
        "overwritten)\nhint: move it away, or unpack with --to another folder\n"
    )
    assert [p.name for p in to.iterdir()] == ["bigbase"] and (to / "bigbase").read_text() == "not a folder\n"
    assert sorted(p.name for p in (home / "store").iterdir()) == []


def test_two_members_unpacking_to_one_file_leave_the_folder_as_it_was(
    pack: Path, home: Path, tmp_path: Path, doc: Path
) -> None:
    # A consistent but crafted pack: a source file that lands where the document does, written after it.
    entries = _listed(_rolled_up([*_entries(pack), _file(f"sources/{doc.name}", b"not the document\n")]))
    to = tmp_path / "to"
    result = _unpack(_write(tmp_path / "bad.dlm.pack", entries), home, to)
    assert result.exit_code == 1 and result.output == (
        f"error: {to / doc.name} appeared while unpacking: refused (a file of yours is never overwritten)\n"
    )
    assert not to.exists()  # the document written first is removed again, and the folder made for it
    assert sorted(p.name for p in (home / "store").iterdir()) == []


@pytest.mark.parametrize("replaced", [False, True], ids=["killed-before-the-new-was-in", "killed-after"])
def test_a_store_a_killed_force_left_aside_is_put_back_or_removed_by_the_next_unpack(
    pack: Path, home: Path, tmp_path: Path, replaced: bool
) -> None:
    assert _unpack(pack, home, tmp_path / "to").exit_code == 0
    store = home / "store" / VALID_ID
    db = (store / "store.db").read_bytes()
    aside = store.with_name(f".unpack-replaced-{VALID_ID}-99999999")  # no such process
    if replaced:  # the pack's store was renamed in: the old one was being removed
        shutil.copytree(store, aside)
    else:  # killed between `--force`'s two renames: the old store aside, none in its place
        store.rename(aside)
    assert len(_stores(home)) == (1 if replaced else 0)
    again = _unpack(pack, home, tmp_path / "to")
    assert again.exit_code == 1 and again.output.startswith(
        f"error: a store for {VALID_ID} is already at {store}"
    )
    assert [p.name for p in (home / "store").iterdir()] == [VALID_ID]
    assert (store / "store.db").read_bytes() == db and [s["dlm_id"] for s in _stores(home)] == [VALID_ID]

"""The pack's stream: a tar of regular files through zstd, written the same way every time, read warily.

**Writing** (:class:`PackWriter`). Members are added in the order the
caller gives (the writer sorts nothing itself), each a regular file with
mtime 0, uid/gid 0, no owner names and mode 0644, so the same members give
the same bytes on every machine and at every hour. Each member is read
once: its sha256 is taken on the way into the stream, and a file whose
size changes while it is read is refused by name. The zstd stream is
written with a frame checksum by zstd's multi-threaded engine, whose output
is the same for any number of workers (so a 2-core and a 64-core machine
write the same pack). The pack is written to a temp file beside the output
and renamed onto it only when complete: a killed ``dlm pack`` leaves no
partial file at the output path.

**Reading** (:func:`extract`). The stream is read once, member by member,
into a staging folder the caller owns, and every member's sha256 is taken
as it is written there. Before a member's first byte is written it is
refused when its name is absolute, climbs out with ``..``, holds an empty,
``.`` or backslash part or a NUL, or repeats an earlier name; when it is
anything but a regular file or a folder (a symlink, a hard link, a device,
a sparse file); when it is larger than :data:`~dlmstore.pack.layout.MAX_MEMBER_BYTES`
or than :data:`~dlmstore.pack.layout.MAX_RATIO` times the whole pack file
(a bomb: a 10 GB member of zeros in a 1 MB pack is refused at its header);
or when the members together pass :data:`~dlmstore.pack.layout.MAX_TOTAL_BYTES`.
A truncated or corrupted stream is one :class:`~dlmstore.errors.PackError`.
"""

from __future__ import annotations

import hashlib
import os
import queue
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from dlmstore.errors import PackError
from dlmstore.pack import layout
from dlmstore.store.atomic import AtomicFile

_CHUNK = 1 << 20


def _header(name: str, size: int) -> bytes:
    """The tar header block(s) of a regular file member: mtime 0, uid/gid 0, no owner names, mode 0644."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _padding(size: int) -> bytes:
    """The zeros that end a member's data on a tar block boundary."""
    return bytes(-size % tarfile.BLOCKSIZE)


class _HashedOut:
    """The file the compressed stream goes to, hashing what is written (the pack's own sha256)."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


class PackWriter:
    """A ``.dlm.pack`` being written at ``out`` (published by :meth:`commit`).

    Each member is a tar header, its bytes, and zeros to the next block,
    written straight into the zstd stream (tarfile's own writer copies in
    16 KB pieces through two buffers; this is the same format at a third of
    the cost), and the stream ends as tar ends: two zero blocks, zeros to
    a 10 KB record.

    Args:
        out: the pack's path; its folder must exist.
        overwrite: replace a file already at ``out`` (otherwise
            :meth:`commit` refuses with ``FileExistsError``, leaving it).
        level: the zstd level.
    """

    def __init__(self, out: Path, *, overwrite: bool = False, level: int = layout.ZSTD_LEVEL) -> None:
        import zstandard

        self._file = AtomicFile(out, overwrite=overwrite, buffering=_CHUNK)
        self._out = _HashedOut(self._file.file)
        params = zstandard.ZstdCompressionParameters.from_level(
            level, threads=max(1, min(os.cpu_count() or 1, 8)), write_checksum=True
        )
        self._zstd = zstandard.ZstdCompressor(compression_params=params).stream_writer(
            self._out,  # type: ignore[arg-type]  # write() and flush() are all it calls
            closefd=False,
            write_size=_CHUNK,
        )
        self._written = 0
        #: Member -> sha256 hex of its bytes, in the order added.
        self.checksums: dict[str, str] = {}
        #: Member -> its size in bytes.
        self.sizes: dict[str, int] = {}
        #: sha256 hex of the whole pack, once committed.
        self.sha256 = ""

    def _write(self, data: Any) -> None:
        self._zstd.write(data)
        self._written += len(data)

    def add_bytes(self, name: str, data: bytes) -> str:
        """Add a member holding ``data``; return its sha256 hex."""
        self._claim(name)
        self._write(_header(name, len(data)))
        self._write(data)
        self._write(_padding(len(data)))
        return self._done(name, hashlib.sha256(data).hexdigest(), len(data))

    def add_file(self, name: str, path: Path) -> str:
        """Add the regular file ``path`` as member ``name`` (links not followed); return its sha256 hex.

        Raises:
            PackError: the file cannot be read, is not a regular file, or
                changed size while it was read.
        """
        from dlmstore.store.regular_files import NotRegularFileError, open_regular

        self._claim(name)
        digest = hashlib.sha256()
        try:
            fd, st = open_regular(path)
            with os.fdopen(fd, "rb", buffering=0) as source:
                size = left = st.st_size
                self._write(_header(name, size))
                while left:
                    chunk = source.read(min(left, _CHUNK))
                    if not chunk:
                        raise PackError(
                            f"{path} shrank while it was packed; pack again when nothing is writing it"
                        )
                    digest.update(chunk)
                    self._write(chunk)
                    left -= len(chunk)
                if source.read(1):
                    raise PackError(f"{path} grew while it was packed; pack again when nothing is writing it")
                self._write(_padding(size))
        except NotRegularFileError as exc:
            raise PackError(
                f"{path} is not a regular file ({exc}); a pack holds only regular files"
            ) from None
        except OSError as exc:
            raise PackError(f"cannot read {path}: {exc.strerror or exc}") from None
        return self._done(name, digest.hexdigest(), size)

    def _claim(self, name: str) -> None:
        if name in self.checksums:
            raise ValueError(f"member {name} added twice")

    def _done(self, name: str, digest: str, size: int) -> str:
        self.checksums[name] = digest
        self.sizes[name] = size
        return digest

    def commit(self) -> int:
        """End the stream, fsync and rename onto the output; return the pack's size in bytes."""
        end = 2 * tarfile.BLOCKSIZE
        self._write(bytes(end + (-(self._written + end) % tarfile.RECORDSIZE)))
        self._zstd.close()  # type: ignore[no-untyped-call]  # ends the frame; closefd=False keeps the file
        self._file.commit()
        self.sha256 = self._out.digest.hexdigest()
        return self._out.size

    def abort(self) -> None:
        """Drop the temp file; the output path is as it was."""
        self._file.abort()

    def __enter__(self) -> PackWriter:
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        if kind is not None:
            self.abort()


@dataclass(frozen=True)
class Extracted:
    """What :func:`extract` wrote into the staging folder.

    Attributes:
        checksums: Member -> sha256 hex of the bytes written, in stream order.
        sizes: Member -> its size.
        bytes: The members' sizes together.
    """

    checksums: dict[str, str]
    sizes: dict[str, int]
    bytes: int


def unsafe_name(name: str) -> str | None:
    """Why ``name`` may not be a member's name, or ``None`` when it may."""
    if not name:
        return "an empty name"
    if "\x00" in name or "\\" in name:
        return "a NUL or backslash in its name"
    if name.startswith("/"):
        return "an absolute name"
    parts = name.rstrip("/").split("/")
    if ".." in parts:
        return "a name that climbs out with '..'"
    if any(part in ("", ".") for part in parts):
        return "an empty or '.' part in its name"
    return None


class _ReadAhead:
    """The decompressed stream, read ahead on a thread: zstd decompresses the next megabytes while
    this thread hashes and writes the last ones (both let go of the GIL). At most
    :data:`_AHEAD` chunks wait; an error of the stream is raised here, where it is read."""

    def __init__(self, stream: Any) -> None:
        self._chunks: queue.Queue[bytes | BaseException] = queue.Queue(_AHEAD)
        self._stop = threading.Event()
        self._buffer = b""
        self._done = False
        self._thread = threading.Thread(
            target=self._fill, args=(stream,), name="dlm-unpack-read", daemon=True
        )
        self._thread.start()

    def _fill(self, stream: Any) -> None:
        while not self._stop.is_set():
            try:
                chunk: bytes | BaseException = stream.read(_CHUNK)
            except BaseException as exc:  # handed to the reader, who raises it
                chunk = exc
            while not self._stop.is_set():
                try:
                    self._chunks.put(chunk, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if not chunk or isinstance(chunk, BaseException):
                return

    def read(self, size: int = -1) -> bytes:
        while not self._done and (size < 0 or len(self._buffer) < size):
            chunk = self._chunks.get()
            if isinstance(chunk, BaseException):
                self._done = True
                raise chunk
            if not chunk:
                self._done = True
            self._buffer += chunk
        if size < 0:
            size = len(self._buffer)
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def __enter__(self) -> _ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


#: Chunks of :data:`_CHUNK` bytes the read-ahead keeps waiting, at most.
_AHEAD = 8


def extract(pack: Path, staging: Path) -> Extracted:
    """Read the pack at ``pack`` into the empty folder ``staging``, refusing what the module says.

    Raises:
        PackError: the pack cannot be read, is truncated or corrupted, or
            holds a member refused above (named, with why).
    """
    import zstandard

    try:
        packed_size = pack.stat().st_size
        source = open(pack, "rb")
    except OSError as exc:
        raise PackError(f"cannot read {pack}: {exc.strerror or exc}") from None
    cap = max(layout.RATIO_FLOOR, layout.MAX_RATIO * packed_size)
    checksums: dict[str, str] = {}
    sizes: dict[str, int] = {}
    total = 0
    try:
        with (
            source,
            zstandard.ZstdDecompressor(max_window_size=layout.MAX_WINDOW_BYTES).stream_reader(
                source, read_size=_CHUNK, read_across_frames=True
            ) as stream,
            _ReadAhead(stream) as ahead,
            tarfile.open(fileobj=ahead, mode="r|", bufsize=_CHUNK) as tar,  # type: ignore[call-overload]
        ):
            for member in _members(tar, pack):
                if member.name in checksums or member.name.rstrip("/") in checksums:
                    raise PackError(
                        f"{pack} holds member {member.name} twice: refused (the pack was altered)"
                    )
                if member.isdir():
                    continue
                size = member.size
                if size > layout.MAX_MEMBER_BYTES or size > cap:
                    limit = min(layout.MAX_MEMBER_BYTES, cap)
                    raise PackError(
                        f"{pack}: member {member.name} would unpack to {size:,} bytes, over the "
                        f"{limit:,}-byte limit for a pack of this size: refused (a decompression bomb?)"
                    )
                total += size
                if total > layout.MAX_TOTAL_BYTES or total > cap:
                    raise PackError(
                        f"{pack}: its members would unpack to more than "
                        f"{min(layout.MAX_TOTAL_BYTES, cap):,} bytes: refused (a decompression bomb?)"
                    )
                if len(checksums) >= layout.MAX_MEMBERS:
                    raise PackError(f"{pack} holds more than {layout.MAX_MEMBERS:,} members: refused")
                checksums[member.name] = _write_member(tar, member, staging)
                sizes[member.name] = size
    except PackError:
        raise
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as exc:
        raise PackError(f"{pack} is truncated, damaged or not a .dlm.pack ({_why(exc)})") from None
    except OSError as exc:
        raise PackError(f"cannot unpack {pack} into {staging}: {exc.strerror or exc}") from None
    return Extracted(checksums, sizes, total)


def _why(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _members(tar: tarfile.TarFile, pack: Path) -> Iterator[tarfile.TarInfo]:
    for member in tar:
        if (why := unsafe_name(member.name)) is not None:
            raise PackError(f"{pack}: member {member.name!r} is refused: {why}")
        if member.issym() or member.islnk():
            raise PackError(
                f"{pack}: member {member.name} is a link: refused (a pack holds only regular files)"
            )
        if not (member.isreg() or member.isdir()) or member.issparse():
            raise PackError(f"{pack}: member {member.name} is not a regular file: refused")
        yield member


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, staging: Path) -> str:
    target = staging.joinpath(*member.name.split("/"))
    target.parent.mkdir(parents=True, exist_ok=True)
    data = tar.extractfile(member)
    if data is None:  # pragma: no cover - isreg() members always have data
        raise PackError(f"member {member.name} has no data")
    digest = hashlib.sha256()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        while chunk := data.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()

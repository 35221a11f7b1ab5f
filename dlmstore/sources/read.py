"""Read the files a directive's walk chose into prose sections.

Each chosen file (:mod:`dlmstore.sources.walk`) becomes
``Section(type="prose", content="# source: <relpath>\\n\\n<text>",
source=<relpath>)``, in the walk's order. Content checks are counted, never
errors: over ``max_bytes_per_file``; a NUL byte in the first KiB (binary);
not valid UTF-8 (the text, or the file name); beyond ``max_files`` in path
order (not read). An unreadable file is skipped with a warning.

With a stat cache (``dlmstore.sources.statcache``), a file whose stat fields
prove it unchanged is not read: its section carries the recorded digest and
loads its text only when asked, re-hashing it and refusing a file that
changed since (:func:`_load_checked`). The file is checked (``stat``) before
it is trusted, and read (``open``/``fstat``) otherwise; what a read finds is
recorded with the time taken *before* any read, so that the cache's
racy-clean guard compares mtimes against it.

Speed: each file costs ``open``/``fstat``/``readv``/``close`` into one
reused buffer that already holds the ``prose\\n# source: <rel>\\n\\n``
header, so a single ``str()`` decodes (and validates) the whole section
content and a single ``sha256`` over the same buffer is the section digest:
no concatenated copies. What is left is about a third kernel time, a third
hashing and a third Python.

Threads were measured and dropped. ``sha256(data)`` holds the GIL on Python
3.11; with ``update()``, which releases it, neither a 2-4 worker pool for
read + hash nor one hashing thread fed the large files (reused buffers) beat
a single thread on two cores: the GIL hand-offs around four syscalls per
file cost what the overlap saved. One thread also keeps the order trivial.
Memory is the price: all section texts are held at once, as the
``SourceExpansion`` result requires anyway.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import sha256

from dlmstore.document.sections import Section, normalise_newlines, section_digest
from dlmstore.errors import SourceError
from dlmstore.sources.statcache import StatCache, proves_unchanged
from dlmstore.sources.walk import ChosenFile
from dlmstore.store.regular_files import ReplacedFileError, open_regular, read_regular

#: A NUL byte within this many leading bytes marks a file as binary.
BINARY_SNIFF_BYTES = 1024

#: Files larger than this are sniffed (their first KiB read and checked)
#: before the rest is read; smaller ones are read in one call, sniffed after.
SNIFF_FIRST_ABOVE = 64 * 1024

_HEAD = b"prose\n# source: "
_TYPE_LEN = len(b"prose\n")


@dataclass(frozen=True)
class SourceRead:
    """The sections read from one directive's files, and what was left out.

    Attributes:
        sections: one per file read (or trusted from the stat cache), in order.
        bytes_included: their total size in bytes, as read from disk.
        skipped_binary: files with a NUL byte in the first KiB.
        skipped_encoding: files (or file names) that are not valid UTF-8.
        skipped_too_large: files over ``max_bytes_per_file``.
        skipped_max_files: files past ``max_files`` in path order (not read).
        warnings: one line each, meant for stderr.
    """

    sections: tuple[Section, ...]
    bytes_included: int
    skipped_binary: int
    skipped_encoding: int
    skipped_too_large: int
    skipped_max_files: int
    warnings: tuple[str, ...]


def read_files(
    files: Sequence[ChosenFile],
    *,
    label: str,
    max_bytes_per_file: int | None = None,
    max_files: int | None = None,
    stat_cache: StatCache | None = None,
    strict: bool = False,
) -> SourceRead:
    """Read ``files`` into prose sections, in order.

    ``label`` starts every warning and error message. ``stat_cache`` lets
    files whose stat fields prove them unchanged skip the read, and records
    what reading the others found (saved by its owner).

    Each file is opened with :func:`~dlmstore.store.regular_files.open_regular`
    (``exact``): a FIFO or device never blocks the read, and a file (or a
    folder above it) swapped for a symlink after the walk chose it is not
    read: with ``strict`` (``sources_policy: strict``) that is an error,
    otherwise the file is skipped with a warning.

    Each file is read with one ``readv`` into a reused buffer that starts
    with ``prose\\n# source: <rel>\\n\\n``, so the section content is one
    ``str()`` of the buffer and its digest one ``sha256`` over it.
    """
    max_bytes = max_bytes_per_file
    buf = bytearray(1 << 16)
    view = memoryview(buf)
    sections: list[Section] = []
    warnings: list[str] = []
    append = sections.append
    nbytes = examined = binary = encoding = too_large = 0
    stats = stat_cache
    known = stats.stamps if stats is not None else {}
    seen = stats.seen if stats is not None else set()
    keyed = (stats or StatCache()).keyed
    stat = os.stat
    partial = functools.partial
    checked_ns = time.time_ns()  # before any read: records compare mtimes against it
    for rel, path in files:
        if max_files is not None and len(sections) >= max_files:
            break
        examined += 1
        # A recorded file's name was encoded when it was read, so the stat
        # check comes first and a trusted file costs one ``stat`` and no
        # more: no open, no read, no hash, and its row key comes from the
        # record.
        key = (path, rel)
        stamp = known.get(key)
        if stamp is not None:
            seen.add(key)
            try:
                st = stat(path)
            except OSError as exc:
                warnings.append(f"{label}: skipping {rel}: {exc.strerror}")
                continue
            size = st.st_size
            if proves_unchanged(stamp, st) and (max_bytes is None or size <= max_bytes):
                status = stamp[6]  # FileStamp's fields by position: status, digest, row_key
                if status == "ok":
                    digest = stamp[7] or ""
                    text_key = stamp[9] or keyed(key, stamp)
                    loader = partial(_load_checked, label, path, rel, digest)
                    append(Section("prose", None, None, rel, digest, load=loader, text_key=text_key))
                    nbytes += size
                elif status == "binary":
                    binary += 1
                else:
                    encoding += 1
                continue
        try:
            head = _HEAD + (rel + "\n\n").encode()
        except UnicodeEncodeError:  # a file name that is not valid UTF-8
            encoding += 1
            continue
        start = len(head)
        try:
            # Non-blocking, no symlink, and the descriptor must be the file
            # the walk chose: a file swapped after the walk is not read.
            fd, st = open_regular(path, exact=True)
        except ReplacedFileError as exc:
            if strict:
                raise SourceError(
                    f"{label}: {rel} was {exc.strerror}; under sources_policy: strict it is not read",
                    hint="run the command again once nothing is moving files in the tree",
                ) from None
            warnings.append(f"{label}: skipping {rel}: {exc.strerror}")
            continue
        except OSError as exc:
            warnings.append(f"{label}: skipping {rel}: {exc.strerror}")
            continue
        try:
            size = st.st_size
            if max_bytes is not None and size > max_bytes:
                too_large += 1
                continue
            # Ask for one byte more than fstat promised, to notice growth.
            need = start + size + 1
            count = 0
            sniffed = size > SNIFF_FIRST_ABOVE
            if sniffed:
                # Look at the first KiB before growing the buffer or reading
                # the rest: a large binary file costs one small read.
                if start + BINARY_SNIFF_BYTES > len(buf):  # a very long file name
                    buf = bytearray(start + BINARY_SNIFF_BYTES)
                    view = memoryview(buf)
                count = os.readv(fd, [view[start : start + BINARY_SNIFF_BYTES]])
                if buf.find(0, start, start + count) >= 0:
                    binary += 1
                    if stats is not None:
                        stats.record(path, rel, st, "binary", None, checked_ns)
                    continue
            if need > len(buf):
                grown = bytearray(need + (need >> 3))
                grown[start : start + count] = view[start : start + count]
                buf, view = grown, memoryview(grown)
            if not sniffed or count == BINARY_SNIFF_BYTES:  # a short sniff read met the end
                count += os.readv(fd, [view[start + count : need]])
            if count > size:
                buf, view, end = _read_rest(fd, buf, start + count)
                count = end - start
                if max_bytes is not None and count > max_bytes:
                    too_large += 1
                    continue
        except OSError as exc:
            warnings.append(f"{label}: skipping {rel}: {exc.strerror}")
            continue
        finally:
            os.close(fd)
        end = start + count
        buf[:start] = head
        if buf.find(0, start, min(end, start + BINARY_SNIFF_BYTES)) >= 0:
            binary += 1
            if stats is not None:
                stats.record(path, rel, st, "binary", None, checked_ns)
            continue
        try:
            content = str(view[_TYPE_LEN:end], "utf-8")
        except UnicodeDecodeError:
            encoding += 1
            if stats is not None:
                stats.record(path, rel, st, "encoding", None, checked_ns)
            continue
        if buf.find(13, _TYPE_LEN, end) >= 0:  # "\r": hash the normalised text
            content = normalise_newlines(content)
            digest = section_digest("prose", content)
        else:  # the buffer is exactly "prose\n" + content, as UTF-8
            digest = sha256(view[:end]).hexdigest()
        append(Section("prose", content, None, rel, digest))
        nbytes += count
        if stats is not None and count == size:  # a file that grew while read is not recorded
            stats.record(path, rel, st, "ok", digest, checked_ns)
    return SourceRead(
        sections=tuple(sections),
        bytes_included=nbytes,
        skipped_binary=binary,
        skipped_encoding=encoding,
        skipped_too_large=too_large,
        skipped_max_files=len(files) - examined,
        warnings=tuple(warnings),
    )


def _load_checked(label: str, path: str, rel: str, digest: str | None) -> str:
    """Read a file known by its stat record, refusing it if its digest moved."""
    try:
        text = read_regular(path, exact=True).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise SourceError(
            f"{label}: {rel} changed while dlm was running ({why})", hint="run the command again"
        ) from None
    content = normalise_newlines(f"# source: {rel}\n\n{text}")
    if section_digest("prose", content) != digest:
        raise SourceError(f"{label}: {rel} changed while dlm was running", hint="run the command again")
    return content


def _read_rest(fd: int, buf: bytearray, end: int) -> tuple[bytearray, memoryview, int]:
    """Read to EOF a file that grew after ``fstat``; ``end`` bytes are in ``buf``."""
    while True:
        grown = bytearray(len(buf) * 2)
        grown[:end] = buf[:end]
        buf, view = grown, memoryview(grown)
        while end < len(buf):
            count = os.readv(fd, [view[end:]])
            if count == 0:
                return buf, view, end
            end += count

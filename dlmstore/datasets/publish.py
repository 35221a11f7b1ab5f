"""A built dataset published to object storage: ``dlm data build ... --out s3://bucket/prefix``.

A build for a bucket is a local build into a staging folder, then an
upload of the same files, byte for byte: the objects under the prefix are
the folder a local ``--out`` would hold (``meta.json`` and the files it
lists; the store.db is registered elsewhere, see below). The staging
folder is ``<staging>/<sha256 of the URL>/``, where ``<staging>`` is
``$DLM_BUILD_STAGING``, else ``<node cache>/builds`` (the node cache of
:mod:`dlmstore.objstore.node_cache`, so a local disk; a Ray build's
tasks upload their files themselves and stage nothing there but
``meta.json``, see below). It is held
by an exclusive lock beside it for the build's length (a second build to
the same URL is refused while one runs), removed once the upload has
ended, and kept when the build itself stops, so that a Ray build resumes.

**The prefix is claimed first**, before the tokenizer loads or anything is
written, by the rule :func:`~.build.output.claim_out_dir` applies to a
folder: a prefix may be written when it holds no object, or holds a
dataset dlm wrote (a ``meta.json`` carrying dlm's format tag) or the
marker an unfinished upload leaves (``.build/dlm-build``); any other is
refused, naming the URL and what it holds, unless ``--force``, and even
then only the names a build writes are replaced.

**The upload** (:func:`publish`), in this order:

1. the marker ``.build/dlm-build`` is written (the prefix is dlm's, and
   incomplete);
2. the remote ``meta.json`` is deleted, so no reader takes an older
   ``meta.json`` over new shards, and a killed upload's unfinished
   multipart uploads are aborted;
3. every file ``meta.json`` lists is uploaded whole, its sha256 computed
   as it is read and checked against ``meta.json``'s
   (:func:`dlmstore.objstore.transfer.put_files`): a file changed since it
   was built is refused by name, never uploaded as if it were good;
4. shards and indexes of an earlier build that this one did not write are
   deleted (before the new ``meta.json``: a reader reads only what
   ``meta.json`` lists, and the old one is gone already);
5. ``meta.json`` is uploaded last: the commit. A reader that finds it finds
   every file it lists complete; a failed or killed upload leaves none;
6. the marker is deleted.

**A Ray build** (``--engine ray``) uploads without the staging folder's
shards: :func:`mark_upload` does step 1 before the first task runs, the
engine step 2 before the first shard task; each task that writes a shard or an SFT split file writes it on its
worker and uploads it to its final key itself, and the tokenizing tasks
keep their spill files as objects under ``.build/blocks/`` (so the
cluster needs no shared filesystem for the output); then
:func:`commit_uploaded` checks every object's size against ``meta.json``
with one listing and does steps 4 to 6, deleting the spill objects with
the marker. The driver stores only the marker and ``meta.json``. A failed
build leaves the marker and its spill objects: the rerun claims the
prefix without ``--force`` and reuses every complete spill object.

The dataset is registered under its URL (``datasets.path`` is
``s3://bucket/prefix``) from the staged copy, in ``--store`` or, by
default, ``<dlm home>/datasets/store.db``: a SQLite database wants a local
disk, never a bucket.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dlmstore.datasets.build.output import BUILD_DIR, BUILD_MARKER
from dlmstore.datasets.meta import FORMAT, MAX_META_BYTES, META_NAME, load_meta
from dlmstore.errors import DatasetError, ObjectStoreError
from dlmstore.objstore.transfer import (
    LocalFile,
    abort_incomplete,
    delete_names,
    list_names,
    list_sizes,
    put_bytes,
    put_files,
    read_object,
)
from dlmstore.objstore.uri import ObjectURI
from dlmstore.progress import Task
from dlmstore.store.flock import FileLock
from dlmstore.store.regular_files import load_json, read_regular

#: Where builds for object storage are staged, when not under the node cache.
STAGING_ENV = "DLM_BUILD_STAGING"
#: The marker an unfinished upload leaves under the prefix (as a local build leaves in its folder).
MARKER_NAME = f"{BUILD_DIR}/{BUILD_MARKER}"
#: The names a build writes: pretrain shards and their indexes, SFT token, index and mask files.
_DATASET_FILE = re.compile(
    r"(?:train|val)/shard_[0-9]{5,}\.(?:bin|docs\.npy)|(?:train|val)_(?:tokens\.bin|idx\.npy|mask\.bin)"
)


@dataclass(frozen=True)
class Published:
    """A dataset uploaded to object storage.

    Attributes:
        url: Where it is: ``s3://bucket/prefix``.
        files: Objects written: the files meta.json lists, and meta.json.
        bytes: Bytes of those objects.
        removed: Objects of an earlier build deleted (shards this build did not write).
        seconds: Time the upload took.
    """

    url: str
    files: int
    bytes: int
    removed: int
    seconds: float


def claim_prefix(url: str, *, force: bool = False) -> ObjectURI:
    """Check that a build may write under ``url``; writes nothing.

    Raises:
        ObjectStoreError: ``url`` is malformed; the store cannot be reached
            or refuses; the bucket does not exist; or (without ``force``)
            objects are there that are not a dataset dlm wrote.
    """
    uri = ObjectURI.parse(url)
    names = list_names(uri)
    if not names or MARKER_NAME in names and _is_marker(uri):
        return uri
    build = [name for name in names if name.startswith(f"{BUILD_DIR}/")]
    if build:
        raise ObjectStoreError(
            f"{uri.url(BUILD_DIR)}/ holds objects a dlm build did not write, and a build keeps its "
            "marker there",
            hint=f"move {uri.url(BUILD_DIR)}/ elsewhere, or choose a new prefix for the dataset",
        )
    if force or META_NAME in names and _is_dataset(uri):
        return uri
    raise ObjectStoreError(
        f"{uri} is not a prefix dlm wrote: it holds {_listing(names)}, and no {META_NAME} of a dlm dataset",
        hint="choose a new or empty prefix, or pass --force to let dlm replace the dataset files there "
        f"({META_NAME}, train/ and val/ shards; nothing else is removed)",
    )


def publish(folder: Path, uri: ObjectURI, *, force: bool = False) -> Published:
    """Upload the dataset built in ``folder`` under ``uri``, ``meta.json`` last (see the module docstring).

    Raises:
        DatasetFileError: ``folder`` holds no complete dataset.
        ObjectStoreError: the prefix may not be written (:func:`claim_prefix`),
            a file changed since it was built, or the store failed; no
            ``meta.json`` is left under the prefix then.
    """
    started = time.perf_counter()
    claim_prefix(str(uri), force=force)
    meta = load_meta(folder)
    if not meta.built:
        raise DatasetError(f"{folder / META_NAME} marks {meta.name} as not built; there is nothing to upload")
    commit = read_regular(folder / META_NAME, limit=MAX_META_BYTES)
    files = [
        LocalFile(entry.path, folder / entry.path, entry.bytes, entry.sha256)
        for entry in sorted(meta.files, key=lambda entry: entry.path)
    ]
    begin_upload(uri)
    with Task(f"uploading to {uri}", total=len(files), unit="files") as task:
        put_files(uri, files, sent=lambda _: task.advance())
    names = list_names(uri)
    removed = _commit(uri, {file.name for file in files}, names, commit, _spill_objects(names))
    return Published(
        url=str(uri),
        files=len(files) + 1,
        bytes=sum(file.bytes for file in files) + len(commit),
        removed=removed,
        seconds=time.perf_counter() - started,
    )


def begin_upload(uri: ObjectURI) -> None:
    """Steps 1 and 2 of an upload: the marker written, the remote ``meta.json`` deleted, a killed
    upload's multipart uploads aborted."""
    mark_upload(uri)
    delete_names(uri, [META_NAME])
    abort_incomplete(uri)


def mark_upload(uri: ObjectURI) -> None:
    """Step 1: the marker ``.build/dlm-build`` written (the prefix is dlm's, and incomplete).

    A Ray build whose tasks upload their own files writes it before its
    first task stores a spill object, so that a failed build's prefix is
    claimed again without ``--force``; the Ray engine does step 2 itself
    just before its first shard is uploaded, so an earlier dataset there
    keeps its ``meta.json`` while the input is tokenized.
    """
    put_bytes(uri, MARKER_NAME, FORMAT.encode())


def commit_uploaded(folder: Path, uri: ObjectURI, *, building: float) -> tuple[Published, dict[str, int]]:
    """End an upload whose files the build's tasks stored themselves under ``uri``
    (``dlm data build --engine ray --out s3://...``); ``folder`` holds its ``meta.json`` only.

    One listing checks that every file ``meta.json`` lists is there with
    the size the task that wrote it returned (each task checked its
    file's sha256 as it uploaded it); then steps 4 to 6 as
    :func:`publish` does, and the build's spill objects under
    ``.build/blocks/`` are deleted with the marker. Returns what was
    published and the objects' sizes, by name (the registration's check);
    its ``seconds`` are ``building`` (the build's, uploads included) and this commit's.

    Raises:
        ObjectStoreError: a listed object is missing or has another size
            (no ``meta.json`` is written then), or the store failed.
    """
    started = time.perf_counter() - building
    meta = load_meta(folder)
    commit = read_regular(folder / META_NAME, limit=MAX_META_BYTES)
    sizes = list_sizes(uri)
    for entry in sorted(meta.files, key=lambda entry: entry.path):
        if sizes.get(entry.path) != entry.bytes:
            found = "missing" if entry.path not in sizes else f"{sizes[entry.path]} bytes"
            raise ObjectStoreError(
                f"{uri.url(entry.path)} is {found} but the build wrote {entry.bytes} bytes there; "
                f"no {META_NAME} was written",
                hint="rerun the build (tokenized blocks are kept); leave the prefix alone while it runs",
            )
    removed = _commit(uri, {entry.path for entry in meta.files}, list(sizes), commit, _spill_objects(sizes))
    published = Published(
        url=str(uri),
        files=len(meta.files) + 1,
        bytes=sum(entry.bytes for entry in meta.files) + len(commit),
        removed=removed,
        seconds=time.perf_counter() - started,
    )
    return published, {entry.path: entry.bytes for entry in meta.files}


def _commit(
    uri: ObjectURI, written: set[str], names: list[str], commit: bytes, scratch: Sequence[str] = ()
) -> int:
    """Steps 4 to 6: stale dataset files deleted, ``meta.json`` stored (the commit), the marker and
    ``scratch`` deleted after it. Returns how many stale files were deleted."""
    stale = [name for name in names if _DATASET_FILE.fullmatch(name) and name not in written]
    delete_names(uri, stale)
    put_bytes(uri, META_NAME, commit)
    delete_names(uri, [*scratch, MARKER_NAME])
    return len(stale)


def default_store_dir() -> Path:
    """Where a dataset in object storage is registered unless ``--store`` says: ``<dlm home>/datasets``."""
    from dlmstore.home import dlm_home

    return dlm_home() / "datasets"


@contextmanager
def staging_for(uri: ObjectURI) -> Iterator[Path]:
    """The local folder a build for ``uri`` writes before the upload, held exclusively meanwhile.

    The folder is removed when the block ends normally or by an upload's
    failure (an :class:`ObjectStoreError`); any other failure leaves it for
    the next build to resume.

    Raises:
        ObjectStoreError: another build for ``uri`` holds it, or it cannot be made.
    """
    builds = staging_root()
    key = hashlib.sha256(str(uri).encode()).hexdigest()[:32]
    try:
        builds.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ObjectStoreError(
            f"cannot create {builds}, where a build for {uri} is staged: {exc.strerror or exc}",
            hint=f"set {STAGING_ENV} to a folder this user can write",
        ) from None
    lock = FileLock(builds / f"{key}.lock", required=True)
    if not lock.try_exclusive():
        lock.close()
        raise ObjectStoreError(
            f"another build for {uri} is running on this machine (it holds {builds / key})",
            hint="wait for it to finish, or build to another prefix",
        )
    folder = builds / key
    try:
        yield folder
        shutil.rmtree(folder, ignore_errors=True)
    except ObjectStoreError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        lock.close()


def staging_root() -> Path:
    """Where builds for object storage are staged: ``$DLM_BUILD_STAGING``, else ``<node cache>/builds``.

    The node cache is :func:`dlmstore.objstore.node_cache.cache_root`'s folder
    (``$DLM_OBJECT_CACHE``, else ``<dlm home>/cache/objects``); its entries are
    hex-named folders, so ``builds/`` is never taken for one.
    """
    import os

    from dlmstore.objstore.node_cache import cache_root

    staging = os.environ.get(STAGING_ENV)
    return Path(staging).expanduser().absolute() if staging else cache_root() / "builds"


def _spill_objects(names: Iterable[str]) -> list[str]:
    """The spill objects of a Ray build among ``names`` (``.build/blocks/...``), left by a failed one too."""
    return [name for name in names if name.startswith(f"{BUILD_DIR}/blocks/")]


def _is_marker(uri: ObjectURI) -> bool:
    return read_object(uri, MARKER_NAME, limit=len(FORMAT)) == FORMAT.encode()


def _is_dataset(uri: ObjectURI) -> bool:
    data = read_object(uri, META_NAME, limit=MAX_META_BYTES)
    if data is None:
        return False
    try:
        meta = load_json(data)
    except ValueError:
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def _listing(names: list[str]) -> str:
    """``notes.txt, train/ and 2 more``: the first names under a prefix, folders marked with ``/``."""
    tops = sorted({name.split("/", 1)[0] + ("/" if "/" in name else "") for name in names})
    shown = tops[:3]
    more = len(tops) - len(shown)
    if more:
        return ", ".join(shown) + f" and {more} more"
    return " and ".join([", ".join(shown[:-1]), shown[-1]]) if len(shown) > 1 else shown[0]

"""The node-local cache: a verified local copy of a dataset in a bucket, for the memory-mapped readers.

Training, ``dlm eval`` and ``dlm data validate`` read a dataset in object
storage through a local copy, made once per node and mapped as any local
dataset is. :func:`local_copy` gives one:

1. ``meta.json`` is fetched (it is small) and hashed; its sha256 is the
   entry's key, the same sha256 ``run_datasets`` and the lock record for a
   local copy of the dataset (the bytes are the same). The files it lists
   are checked to be plain relative names before anything is written.
2. The entry ``<root>/<hex>/`` is taken under its lock ``<root>/<hex>.lock``
   (``flock``): *shared* while the entry is complete and in use, *exclusive*
   while one process downloads it. The first process to ask downloads; every
   other (another rank of the same job, another training) waits for the
   shared lock, then finds the entry complete and reuses it.
3. Each file is downloaded by :func:`dlmstore.objstore.download.download_file`
   (``NAME.part``, resumed with a ``Range`` request, hashed while written,
   renamed only once its size and sha256 are meta.json's; a damaged or
   swapped object is refused by its URL). ``meta.json`` is written last:
   an entry without it is never used, so a crash never leaves one that
   looks complete.
4. The shared lock is kept until the process exits: an entry a training
   maps is never evicted under it.

**Where.** ``$DLM_OBJECT_CACHE``, else ``<dlm home>/cache/objects`` (a
node-local disk: the readers want one, and the locks need ``flock``; a
cache on a filesystem that refuses it is one error line, never an unlocked
cache).

**Size cap.** ``$DLM_OBJECT_CACHE_BYTES`` (``500G``, ``80GiB``, a number of
bytes); unset, 80% of what the cache could hold on its disk (its entries
plus the disk's free space), so the cache leaves a fifth of that free for
everything else. A dataset larger than the cap is refused before a byte is
fetched. Before a download, whole entries are evicted, least recently used
first (the mtime of an entry's lock file, touched at each use), until the
new one fits. Never evicted:

* an entry in use (another process holds its lock: a training mapping it,
  or a download filling it);
* the only copy of anything: an entry whose ``meta.json`` is no longer the
  one at the URL it was fetched from (the dataset was rebuilt or deleted
  there, or the server cannot say) holds bytes nowhere else has, so it
  stays until someone removes its folder.

When what may not be evicted leaves no room, the download is refused with
one line naming the cache and what to do. The disk filling up anyway
(another program, two downloads of different datasets at once) is one line
too, and the partial file is deleted.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmstore.errors import ObjectStoreError
from dlmstore.objstore.uri import ObjectURI
from dlmstore.store.flock import FileLock

ROOT_ENV = "DLM_OBJECT_CACHE"
CAP_ENV = "DLM_OBJECT_CACHE_BYTES"
META_NAME = "meta.json"
#: The ``format`` of a dlm token dataset's meta.json (``dlmstore.datasets.meta.FORMAT``, a layer above).
DATASET_FORMAT = "dlm-token-dataset/1"
#: The largest meta.json fetched (``dlmstore.datasets.meta.MAX_META_BYTES``).
MAX_META_BYTES = 256 << 20
#: Share of (entries + free disk) the cache may fill when ``DLM_OBJECT_CACHE_BYTES`` is unset.
DEFAULT_CAP_SHARE = 0.8
#: Files downloaded at once.
DOWNLOAD_THREADS = 4
#: The URL an entry was fetched from (eviction asks it whether the entry is the only copy).
SOURCE_NAME = ".source"
EVICT_LOCK = ".evict.lock"

_HEX = re.compile(r"[0-9a-f]{64}")
_SHA = re.compile(r"sha256:[0-9a-f]{64}")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)

#: Entries this process uses, their shared locks held until it exits: ``(root, hex) -> lock``.
_held: dict[tuple[str, str], FileLock] = {}


@dataclass(frozen=True)
class LocalCopy:
    """A dataset of a bucket, complete and verified on this node's disk.

    Attributes:
        path: The local dataset folder (meta.json beside the splits) the readers map.
        meta_sha256: ``sha256:<hex>`` of its meta.json (the same as any copy's).
        downloaded_bytes: Bytes this call fetched from the server (0 when the entry was there).
        url: The ``s3://`` URL it was read from.
    """

    path: Path
    meta_sha256: str
    downloaded_bytes: int
    url: str


def cache_root() -> Path:
    """The node cache's folder: ``$DLM_OBJECT_CACHE``, else ``<dlm home>/cache/objects`` (not created)."""
    override = os.environ.get(ROOT_ENV)
    if override:
        return Path(override).expanduser().absolute()
    from dlmstore.home import dlm_home

    return dlm_home() / "cache" / "objects"


def local_copy(uri: ObjectURI, *, where: str = "") -> LocalCopy:
    """The verified local copy of the dataset at ``uri``: from the cache, or downloaded into it now.

    Safe to call from many processes at once (see the module docstring): one
    downloads, the others wait for it and reuse the entry. The caller keeps
    the entry's shared lock until it exits.

    Args:
        uri: the dataset's URL.
        where: who asks (``training.datasets[0]``, ``--dataset``), put before
            the messages; ``""`` for none.

    Raises:
        ObjectStoreError: the server cannot be reached or refuses, ``meta.json``
            is missing or not a dlm dataset's, a file differs from meta.json
            (named by its URL), the dataset is larger than the cap, or the
            cache's disk is full.
    """
    try:
        return _local_copy(uri)
    except ObjectStoreError as exc:
        if not where:
            raise
        raise ObjectStoreError(f"{where}: {exc.message}", hint=exc.hint) from None


def _local_copy(uri: ObjectURI) -> LocalCopy:
    from dlmstore.objstore.client import s3_client

    client = s3_client()
    meta = fetch_meta(uri)
    files = listed_files(meta, uri)
    hexdigest = hashlib.sha256(meta).hexdigest()
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ObjectStoreError(
            f"cannot create the node cache {root}: {exc.strerror}",
            hint=f"set {ROOT_ENV} to a folder on a local disk this user can write",
        ) from None
    entry = root / hexdigest
    held = _held.get((str(root), hexdigest))
    if held is not None and _complete(entry, meta):
        _touch(root, hexdigest)
        return LocalCopy(entry, "sha256:" + hexdigest, 0, str(uri))
    downloaded = 0
    while True:
        lock = FileLock(root / f"{hexdigest}.lock", required=True)
        lock.shared()  # waits while another process downloads the entry
        if not lock.usable:  # flock refused (ENOLCK: a network filesystem): no process could share it safely
            raise ObjectStoreError(
                f"the node cache {root} is on a filesystem without file locks, so two processes could "
                "write one entry at once",
                hint=f"point {ROOT_ENV} at a folder on a local disk",
            )
        if _complete(entry, meta):
            break
        if lock.try_exclusive():
            try:
                if not _complete(entry, meta):
                    downloaded = _fill(client, uri, root, entry, meta, files)
            except BaseException:
                lock.close()
                raise
            lock.downgrade()
            break
        # another process holds it shared and is about to download it: let it, then look again
        lock.close()
        time.sleep(random.uniform(0.05, 0.25))
    previous = _held.pop((str(root), hexdigest), None)
    _held[(str(root), hexdigest)] = lock
    if previous is not None:
        previous.close()
    _touch(root, hexdigest)
    return LocalCopy(entry, "sha256:" + hexdigest, downloaded, str(uri))


def release_copies() -> None:
    """Let go of every entry this process holds (a long-lived process done with its datasets)."""
    while _held:
        _, lock = _held.popitem()
        lock.close()


def fetch_meta(uri: ObjectURI) -> bytes:
    """The bytes of ``uri``'s meta.json (at most :data:`MAX_META_BYTES`).

    Raises:
        ObjectStoreError: there is none (no dataset there, or its upload did
            not finish), or it cannot be fetched (no bucket, refused,
            unreachable), or it is too large.
    """
    from dlmstore.objstore.transfer import read_object

    data = read_object(uri, META_NAME, limit=MAX_META_BYTES)
    if data is None:
        raise ObjectStoreError(
            f"{uri.url(META_NAME)} does not exist: {uri} is not a dataset (or its upload did not finish)",
            hint="check the URL; `dlm data build ... --out s3://...` writes meta.json last",
        )
    return data


def listed_files(meta: bytes, uri: ObjectURI) -> list[tuple[str, int, str]]:
    """``(path, bytes, sha256)`` of each file meta.json lists, checked to be plain relative names.

    Raises:
        ObjectStoreError: meta.json is not a dlm dataset's, or a listed path
            would leave the dataset's folder.
    """
    from dlmstore.store.regular_files import load_json

    url = uri.url(META_NAME)
    try:
        data = load_json(meta)
    except (ValueError, RecursionError) as exc:
        raise ObjectStoreError(f"{url} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != DATASET_FORMAT:
        raise ObjectStoreError(
            f"{url} is not the meta.json of a dlm token dataset (no format {DATASET_FORMAT!r})",
            hint="point at a prefix `dlm data build ... --out s3://...` wrote",
        )
    entries = data.get("files")
    if not isinstance(entries, list):
        raise ObjectStoreError(f"{url}: field 'files' must be a list")
    out: list[tuple[str, int, str]] = []
    seen: set[str] = set()
    for index, item in enumerate(entries):
        name = item.get("path") if isinstance(item, dict) else None
        size = item.get("bytes") if isinstance(item, dict) else None
        sha = item.get("sha256") if isinstance(item, dict) else None
        if (
            not isinstance(name, str)
            or not isinstance(size, int)
            or isinstance(size, bool)
            or size < 0
            or not isinstance(sha, str)
            or not _SHA.fullmatch(sha)
        ):
            raise ObjectStoreError(f"{url}: files[{index}] needs a path, a size in bytes and a sha256")
        parts = name.split("/")
        if (
            name.startswith("/")
            or "\\" in name
            or any(part in ("", ".", "..") for part in parts)
            or parts[-1].endswith(".part")
            or name == META_NAME
            or name in seen
        ):
            raise ObjectStoreError(
                f"{url}: files[{index}] path {name!r} is not a plain relative file name of the dataset",
                hint="rebuild the dataset; meta.json is written by the builder, never by hand",
            )
        seen.add(name)
        out.append((name, size, sha))
    return out


def _fill(
    client: Any, uri: ObjectURI, root: Path, entry: Path, meta: bytes, files: list[tuple[str, int, str]]
) -> int:
    """Download every file of the entry (holding its lock exclusively), then write meta.json last."""
    from dlmstore.objstore.download import download_file
    from dlmstore.store.atomic import fsync_dir, write_bytes_atomic

    need = len(meta) + sum(size for _, size, _ in files)
    have = _tree_bytes(entry) if entry.is_dir() else 0
    make_room(root, need=max(0, need - have), keep=entry.name, url=str(uri))
    entry.mkdir(exist_ok=True)
    (entry / SOURCE_NAME).write_text(str(uri) + "\n", encoding="utf-8")
    for name, _, _ in files:
        (entry / name).parent.mkdir(parents=True, exist_ok=True)

    def one(item: tuple[str, int, str]) -> int:
        name, size, sha = item
        target = entry / name
        if target.is_file() and target.stat().st_size == size and _sha256(target) == sha:
            return 0  # a file an interrupted fill verified and named already
        return download_file(client, uri, name, target, size=size, sha256=sha)

    pool = ThreadPoolExecutor(max_workers=DOWNLOAD_THREADS)
    try:
        transferred = sum(future.result() for future in [pool.submit(one, item) for item in files])
    finally:  # on the first failure the files not started are not fetched; those started stop first
        pool.shutdown(wait=True, cancel_futures=True)
    for folder in {(entry / name).parent for name, _, _ in files}:
        fsync_dir(folder)
    try:
        write_bytes_atomic(entry / META_NAME, meta)  # last: the entry is complete from here on
    except OSError as exc:
        raise ObjectStoreError(
            f"cannot write {entry / META_NAME}: {exc.strerror}",
            hint=f"free space on that disk or move the node cache with {ROOT_ENV}",
        ) from None
    return transferred + len(meta)


def cache_cap(root: Path, used: int) -> int:
    """The bytes the cache may hold: ``$DLM_OBJECT_CACHE_BYTES``, else 80% of ``used`` + the disk's free bytes.

    Raises:
        ObjectStoreError: ``DLM_OBJECT_CACHE_BYTES`` is not a size.
    """
    text = os.environ.get(CAP_ENV, "").strip()
    if not text:
        return int(DEFAULT_CAP_SHARE * (used + shutil.disk_usage(root).free))
    match = _SIZE.match(text)
    if not match:
        raise ObjectStoreError(
            f"{CAP_ENV}={text!r} is not a size such as 500G, 80GiB or 1000000",
            hint=f"fix {CAP_ENV} or unset it (then the cache may fill 80% of its disk's room)",
        )
    number, unit, binary = match.groups()
    power = "kmgt".index(unit.lower()) + 1 if unit else 0
    return int(float(number) * ((1024 if binary else 1000) ** power))


def make_room(root: Path, *, need: int, keep: str, url: str) -> list[str]:
    """Evict least-recently-used entries until ``need`` more bytes fit under the cap.

    Args:
        root: the cache's folder.
        need: the bytes about to be written.
        keep: the entry being filled (never evicted).
        url: the dataset being fetched, for messages.

    Returns:
        The keys of the entries evicted.

    Raises:
        ObjectStoreError: the dataset alone is larger than the cap, or the
            entries that may not be evicted leave no room for it.
    """
    from dlmstore.plural import plural

    with FileLock(root / EVICT_LOCK, required=True) as guard:
        guard.exclusive()
        entries = _entries(root)
        used = sum(size for _, _, size in entries)
        cap = cache_cap(root, used)
        if need > cap:
            raise ObjectStoreError(
                f"{url}: the dataset needs {need} bytes, more than the node cache {root} may hold "
                f"({cap} bytes)",
                hint=f"raise {CAP_ENV}, or point {ROOT_ENV} at a larger local disk",
            )
        evicted: list[str] = []
        kept = 0
        for _, key, size in entries:  # oldest use first
            if used + need <= cap:
                break
            if key == keep:
                continue
            if _evict(root, key):
                used -= size
                evicted.append(key)
            else:
                kept += 1
        if used + need > cap:
            raise ObjectStoreError(
                f"{url}: the node cache {root} has no room for {need} more bytes: it holds {used} of "
                f"{cap}, in {plural(kept, 'entry', 'entries')} in use or kept as the only copy",
                hint=f"raise {CAP_ENV}, point {ROOT_ENV} at a larger disk, or remove entry folders "
                "there that you no longer need",
            )
    return evicted


def _evict(root: Path, key: str) -> bool:
    """Remove entry ``key`` unless it is in use or the only copy of its dataset; whether it was removed."""
    lock = FileLock(root / f"{key}.lock", required=True)
    try:
        if not lock.try_exclusive():
            return False  # a process maps it, or is downloading it
        entry = root / key
        meta = entry / META_NAME
        if meta.is_file() and not _on_server(entry, key):
            return False
        shutil.rmtree(entry, ignore_errors=True)
        return not entry.exists()
    finally:
        lock.close()


def _on_server(entry: Path, key: str) -> bool:
    """Whether the URL the entry came from still serves this very meta.json (else it is the only copy)."""
    try:
        text = (entry / SOURCE_NAME).read_text(encoding="utf-8").strip()
        uri = ObjectURI.parse(text)
        meta = fetch_meta(uri)
    except (OSError, ValueError, ObjectStoreError):
        return False  # gone, changed or unreachable: it cannot be told, so it is kept
    return hashlib.sha256(meta).hexdigest() == key


def _entries(root: Path) -> list[tuple[float, str, int]]:
    """``(last use, key, bytes)`` of every entry (complete or partial), least recently used first."""
    out = []
    for child in root.iterdir():
        if not _HEX.fullmatch(child.name) or not child.is_dir():
            continue
        try:
            used = (root / f"{child.name}.lock").stat().st_mtime
        except FileNotFoundError:
            used = 0.0
        out.append((used, child.name, _tree_bytes(child)))
    return sorted(out)


def _complete(entry: Path, meta: bytes) -> bool:
    """Whether the entry's meta.json (written last) is there, with exactly these bytes."""
    try:
        return (entry / META_NAME).read_bytes() == meta
    except OSError:
        return False


def _touch(root: Path, key: str) -> None:
    """Mark the entry used now (eviction goes by it)."""
    try:
        os.utime(root / f"{key}.lock")
    except OSError:
        pass  # a read-only cache still serves; its order of eviction is then older


def _tree_bytes(folder: Path) -> int:
    total = 0
    for directory, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except FileNotFoundError:
                continue
    return total


def _sha256(path: Path) -> str:
    from dlmstore.store.digests import file_sha256

    return file_sha256(path)

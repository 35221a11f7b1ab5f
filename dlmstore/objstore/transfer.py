"""Objects under one prefix: listed, read, deleted, and local files uploaded whole with their sha256 checked.

What a dataset upload needs from a bucket, with no knowledge of datasets
(``dlmstore.datasets.publish`` composes these into ``dlm data build --out
s3://...``). Every failure is one :class:`~dlmstore.errors.ObjectStoreError`
naming the object's URL (:func:`~.client.object_failure`).

Uploading a file (:func:`put_file`) reads it once, hashing as it reads,
and the object appears whole or not at all:

* a file up to :data:`MULTIPART_THRESHOLD` bytes is read into memory,
  hashed and checked *before* one ``PutObject`` sends it;
* a larger one goes as a multipart upload of :data:`PART_BYTES` parts,
  each hashed as it is read; the upload is completed (the object becomes
  visible, atomically) only when the size and sha256 of everything read
  match what was expected, and aborted otherwise, so a file changed under
  the upload is refused by name and never stored as if it were good.

:func:`put_files` runs :data:`UPLOAD_THREADS` uploads at once over the
process's one client, taking the files in the order given; when several
fail, the first of them in that order is reported, whatever thread
finished first, so the error is the same on every run. Multipart uploads
a killed process left behind are invisible (they are not objects) and
:func:`abort_incomplete` removes them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from dlmstore.errors import ObjectStoreError
from dlmstore.objstore.client import is_missing, object_failure, s3_client
from dlmstore.objstore.uri import ObjectURI

#: Files up to this size go in one PutObject; larger ones as a multipart upload.
MULTIPART_THRESHOLD = 32 << 20
#: Bytes per part of a multipart upload (S3 takes 5 MiB to 5 GiB, at most 10 000 parts: 160 GiB a file).
PART_BYTES = 16 << 20
#: Files uploaded at once.
UPLOAD_THREADS = 4
#: Keys per DeleteObjects request (S3's limit).
_DELETE_BATCH = 1000

#: Called on the calling thread with each file once it is stored, in the order given.
Sent = Callable[["LocalFile"], None]


@dataclass(frozen=True)
class LocalFile:
    """A file to upload: its name under the prefix, where it is, and what it must be.

    Attributes:
        name: Its ``/``-separated path under the prefix (the object key's tail).
        path: The local file.
        bytes: Its expected size.
        sha256: Its expected ``sha256:<hex>``.
    """

    name: str
    path: Path
    bytes: int
    sha256: str


def list_names(uri: ObjectURI) -> list[str]:
    """The names (keys without the prefix and its slash) of every object under ``uri``, sorted."""
    return sorted(list_sizes(uri))


def list_sizes(uri: ObjectURI) -> dict[str, int]:
    """The size of every object under ``uri``, by name (its key without the prefix and its slash)."""
    start = f"{uri.prefix}/" if uri.prefix else ""
    try:
        pages = s3_client().get_paginator("list_objects_v2").paginate(Bucket=uri.bucket, Prefix=start)
        items = [(item["Key"], int(item["Size"])) for page in pages for item in page.get("Contents", [])]
    except Exception as exc:
        raise object_failure(exc, str(uri)) from None
    return {key[len(start) :]: size for key, size in items}


def read_object(uri: ObjectURI, name: str, *, limit: int) -> bytes | None:
    """The bytes of object ``name`` under ``uri``; ``None`` when there is none.

    Raises:
        ObjectStoreError: it holds more than ``limit`` bytes, or the store failed.
    """
    url = uri.url(name)
    try:
        response = s3_client().get_object(Bucket=uri.bucket, Key=uri.key(name))
    except Exception as exc:
        if is_missing(exc):
            return None
        raise object_failure(exc, url) from None
    try:
        if int(response.get("ContentLength", 0)) > limit:
            raise ObjectStoreError(f"{url} holds more than {limit} bytes", hint="check the URL")
        data = bytes(response["Body"].read(limit + 1))
    except ObjectStoreError:
        raise
    except Exception as exc:
        raise object_failure(exc, url) from None
    finally:
        response["Body"].close()
    if len(data) > limit:
        raise ObjectStoreError(f"{url} holds more than {limit} bytes", hint="check the URL")
    return data


def put_bytes(uri: ObjectURI, name: str, data: bytes) -> None:
    """Store ``data`` as object ``name`` under ``uri``."""
    try:
        s3_client().put_object(Bucket=uri.bucket, Key=uri.key(name), Body=data, ContentLength=len(data))
    except Exception as exc:
        raise object_failure(exc, uri.url(name)) from None


def delete_names(uri: ObjectURI, names: Sequence[str]) -> None:
    """Delete objects ``names`` under ``uri`` (absent ones are no error)."""
    for start in range(0, len(names), _DELETE_BATCH):
        batch = names[start : start + _DELETE_BATCH]
        try:
            response = s3_client().delete_objects(
                Bucket=uri.bucket,
                Delete={"Objects": [{"Key": uri.key(name)} for name in batch], "Quiet": True},
            )
        except Exception as exc:
            raise object_failure(exc, str(uri)) from None
        errors = response.get("Errors") or []
        if errors:
            first = errors[0]
            key = str(first.get("Key", ""))
            raise ObjectStoreError(
                f"cannot delete s3://{uri.bucket}/{key}: {first.get('Code')}: {first.get('Message')}",
                hint="give these credentials permission to delete objects in the bucket",
            )


def abort_incomplete(uri: ObjectURI) -> int:
    """Abort the unfinished multipart uploads under ``uri`` (a killed upload's parts); returns how many."""
    start = f"{uri.prefix}/" if uri.prefix else ""
    client = s3_client()
    aborted = 0
    try:
        pages = client.get_paginator("list_multipart_uploads").paginate(Bucket=uri.bucket, Prefix=start)
        for page in pages:
            for upload in page.get("Uploads", []):
                client.abort_multipart_upload(
                    Bucket=uri.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
                aborted += 1
    except Exception as exc:
        raise object_failure(exc, str(uri)) from None
    return aborted


def put_files(
    uri: ObjectURI, files: Sequence[LocalFile], *, sent: Sent | None = None, threads: int = UPLOAD_THREADS
) -> None:
    """Upload ``files`` under ``uri``, :data:`UPLOAD_THREADS` at a time (see the module's docstring).

    Raises:
        ObjectStoreError: the first file, in the order given, that could not
            be stored or is not what was expected (the others that were
            still waiting are not started).
    """
    if not files:
        return
    with ThreadPoolExecutor(
        max_workers=max(1, min(threads, len(files))), thread_name_prefix="dlm-s3"
    ) as pool:
        futures: list[Future[None]] = [pool.submit(put_file, uri, file) for file in files]
        try:
            for file, future in zip(files, futures, strict=True):
                future.result()
                if sent is not None:
                    sent(file)
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def put_file(uri: ObjectURI, file: LocalFile) -> None:
    """Upload one file whole, its size and sha256 checked on the way (see the module's docstring).

    Raises:
        ObjectStoreError: the file cannot be read, is not the expected
            bytes, or the store failed; nothing is left visible under its name.
    """
    try:
        handle = open(file.path, "rb")
    except OSError as exc:
        raise ObjectStoreError(
            f"cannot read {file.path} to upload it to {uri.url(file.name)}: {exc.strerror or exc}",
            hint="rebuild the dataset; its files must stay in place until the upload ends",
        ) from None
    with handle:
        if file.bytes <= MULTIPART_THRESHOLD:
            data = handle.read(file.bytes + 1)
            _check(file, uri, len(data), "sha256:" + hashlib.sha256(data).hexdigest())
            put_bytes(uri, file.name, data)
            return
        _put_multipart(uri, file, handle)


def _put_multipart(uri: ObjectURI, file: LocalFile, handle: BinaryIO) -> None:
    url = uri.url(file.name)
    key = uri.key(file.name)
    client = s3_client()
    try:
        upload_id = client.create_multipart_upload(Bucket=uri.bucket, Key=key)["UploadId"]
    except Exception as exc:
        raise object_failure(exc, url) from None
    try:
        digest = hashlib.sha256()
        size = 0
        parts: list[dict[str, object]] = []
        while chunk := handle.read(PART_BYTES):
            digest.update(chunk)
            size += len(chunk)
            if size > file.bytes:
                break  # grown since it was built: refused below, without reading the rest
            number = len(parts) + 1
            try:
                etag = client.upload_part(
                    Bucket=uri.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=chunk
                )["ETag"]
            except Exception as exc:
                raise object_failure(exc, url) from None
            parts.append({"PartNumber": number, "ETag": etag})
        _check(file, uri, size, "sha256:" + digest.hexdigest())
        try:
            client.complete_multipart_upload(
                Bucket=uri.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except Exception as exc:
            raise object_failure(exc, url) from None
    except BaseException:
        try:  # best effort: the parts are invisible either way, abort_incomplete() finds them later
            client.abort_multipart_upload(Bucket=uri.bucket, Key=key, UploadId=upload_id)
        except Exception:  # the first failure is the one to report
            pass
        raise


def _check(file: LocalFile, uri: ObjectURI, size: int, sha256: str) -> None:
    """Refuse a file that is not the bytes that were built (it changed after it was written)."""
    if size != file.bytes:
        got = f"more than {file.bytes}" if size > file.bytes else str(size)
        raise ObjectStoreError(
            f"{file.path} has {got} bytes but {file.bytes} were built; it was not uploaded to "
            f"{uri.url(file.name)}",
            hint="rebuild the dataset, and leave its files alone until the upload ends",
        )
    if sha256 != file.sha256:
        raise ObjectStoreError(
            f"{file.path} has sha256 {sha256} but {file.sha256} was built; it was not uploaded to "
            f"{uri.url(file.name)}",
            hint="rebuild the dataset, and leave its files alone until the upload ends",
        )

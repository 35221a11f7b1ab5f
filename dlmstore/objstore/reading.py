"""Reading objects a piece at a time: the listing of a prefix and a seekable file over ranged GETs.

A Ray build's tasks read their own ranges of an input in a bucket
(``dlm data build --from s3://bucket/prefix``): :func:`listed_objects`
gives the driver each object's key, size and ETag (no byte of them read),
and :class:`ObjectReader` is the file a task reads: ``seek`` and ``read``
become ``GET`` requests with a ``Range`` header and ``If-Match`` the ETag
the build was planned with, so an object replaced during the build is an
error naming it, never half an old and half a new file. It is a plain
``io.RawIOBase``, so ``io.BufferedReader`` and pyarrow's Parquet reader
take it as they take an open file. The client is this process's
(:func:`~.client.s3_client`), made in the task, never sent to it.
"""

from __future__ import annotations

import io
import time
from typing import Any

from dlmstore.errors import ObjectStoreError
from dlmstore.objstore.client import object_failure, s3_client
from dlmstore.objstore.uri import ObjectURI

#: Bytes a buffered reader of an object asks for at least (one GET each): a larger read is one GET of
#: its size. Small, for a task that seeks to a range's edges, then reads the range in one GET.
READ_BYTES = 64 << 10
#: What a reader of a whole object in order asks for at a time: fewer GETs, each a round trip.
STREAM_BYTES = 8 << 20


def listed_objects(uri: ObjectURI) -> list[tuple[str, int, str]]:
    """``(key, size, etag)`` of every object under ``uri`` (the prefix as a folder), sorted by key.

    A prefix that is itself an object's key, with nothing under it as a
    folder, is that one object.
    """
    folder = f"{uri.prefix}/" if uri.prefix else ""
    try:
        client = s3_client()
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=uri.bucket, Prefix=folder)
        found = [
            (o["Key"], int(o["Size"]), str(o["ETag"])) for page in pages for o in page.get("Contents", [])
        ]
        if not found and uri.prefix:
            single = client.list_objects_v2(Bucket=uri.bucket, Prefix=uri.prefix, MaxKeys=1)
            found = [
                (o["Key"], int(o["Size"]), str(o["ETag"]))
                for o in single.get("Contents", [])
                if o["Key"] == uri.prefix
            ]
    except Exception as exc:
        raise object_failure(exc, str(uri)) from None
    return sorted(found)


class ObjectReader(io.RawIOBase):
    """One object, read by ranged GETs, as the object it was when listed (its ETag).

    Args:
        bucket, key: the object.
        size: its size when listed.
        etag: its ETag then; a GET that finds another is refused (HTTP 412).
        name: what errors call it (its ``s3://`` URL).
    """

    def __init__(self, bucket: str, key: str, size: int, etag: str, name: str) -> None:
        super().__init__()
        self.bucket, self.key, self.size, self.etag, self.name = bucket, key, size, etag, name
        self._at = 0
        self._client: Any = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self.size}[whence]
        self._at = max(0, base + offset)
        return self._at

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self.size - self._at)
        if want <= 0:
            return 0
        data = self._get(self._at, self._at + want)
        buffer[: len(data)] = data
        self._at += len(data)
        return len(data)

    def _get(self, start: int, end: int) -> bytes:
        """Bytes ``start .. end - 1``; a body cut mid-stream is asked for again after a backoff.

        botocore retries a request that fails to be sent or answered
        (adaptive mode); a response whose body stops part way is retried
        here, as the node cache's downloads are (0.5 s, 1 s, 2 s ... at most
        8 s, ``DLM_S3_MAX_ATTEMPTS`` times), then is one error naming the URL.
        """
        from botocore import exceptions as botocore_errors

        from dlmstore.objstore.client import max_attempts
        from dlmstore.objstore.download import BACKOFF_BASE_S, BACKOFF_CAP_S

        cut = (
            botocore_errors.ResponseStreamingError,
            botocore_errors.IncompleteReadError,
            botocore_errors.ReadTimeoutError,
            botocore_errors.ConnectionClosedError,
            ConnectionError,
        )
        attempts = max_attempts()
        for attempt in range(1, attempts + 1):
            try:
                if self._client is None:
                    self._client = s3_client()
                response = self._client.get_object(
                    Bucket=self.bucket, Key=self.key, Range=f"bytes={start}-{end - 1}", IfMatch=self.etag
                )
                with response["Body"] as body:
                    data = bytes(body.read())
                if len(data) == end - start:
                    return data
                reason = f"the response ended after {len(data)} of {end - start} bytes"
            except cut as exc:
                reason = str(exc) or type(exc).__name__
            except Exception as exc:
                if _precondition_failed(exc):
                    raise ObjectStoreError(
                        f"{self.name} changed while the build read it (another ETag)",
                        hint="rerun the build once the input no longer changes",
                    ) from None
                raise object_failure(exc, self.name) from None
            if attempt < attempts:
                time.sleep(min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (attempt - 1)))
        raise ObjectStoreError(
            f"reading {self.name} failed {attempts} times: {reason}",
            hint="check the object store's endpoint and network; rerun the build: finished ranges are kept",
        )


def _precondition_failed(exc: Exception) -> bool:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    code = str(response.get("Error", {}).get("Code", ""))
    return code in ("PreconditionFailed", "412")


def open_object(
    uri: ObjectURI, key: str, size: int, etag: str, *, buffer: int = READ_BYTES
) -> io.BufferedReader:
    """The object ``key`` of ``uri``'s bucket as a buffered binary file (GETs of ``buffer`` bytes at least)."""
    name = f"s3://{uri.bucket}/{key}"
    return io.BufferedReader(ObjectReader(uri.bucket, key, size, etag, name), buffer_size=buffer)

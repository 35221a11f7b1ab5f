"""``s3://bucket/prefix``: where a token dataset lives in object storage.

A dataset in a bucket is the same folder as on disk, its files stored as
objects under one prefix: ``s3://bucket/tokens/web`` holds
``tokens/web/meta.json``, ``tokens/web/train/shard_00000.bin`` and so on.
Parsing is strict, because a URL that means something other than what the
user typed would write or read another place: only the ``s3`` scheme, a
bucket name S3 accepts (3 to 63 lowercase letters, digits, dots and
hyphens), and a prefix of plain path segments (no empty, ``.`` or ``..``
segment, which some servers normalise and others do not). A leading or
trailing slash on the prefix is dropped. Nothing here imports boto3.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dlmstore.errors import ObjectStoreError

SCHEME = "s3://"
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def is_object_uri(text: str) -> bool:
    """Whether ``text`` names object storage (``s3://...``) rather than a local path."""
    return text.startswith(SCHEME)


@dataclass(frozen=True)
class ObjectURI:
    """A bucket and a key prefix (without leading or trailing slash; ``""`` for the bucket's root).

    Attributes:
        bucket: The bucket's name.
        prefix: The key prefix every file of the dataset is stored under.
    """

    bucket: str
    prefix: str

    @staticmethod
    def parse(text: str) -> ObjectURI:
        """Parse ``s3://bucket[/prefix]``.

        Raises:
            ObjectStoreError: another scheme, no bucket, a bucket name S3
                refuses, or an empty, ``.`` or ``..`` segment in the prefix.
        """
        if not is_object_uri(text):
            raise ObjectStoreError(f"{text!r} is not an s3:// URL", hint="write it as s3://bucket/prefix")
        bucket, _, prefix = text[len(SCHEME) :].partition("/")
        if not bucket:
            raise ObjectStoreError(f"{text!r} names no bucket", hint="write it as s3://bucket/prefix")
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise ObjectStoreError(
                f"{text!r}: {bucket!r} is not a bucket name (3 to 63 lowercase letters, digits, dots "
                "and hyphens, starting and ending with a letter or digit)",
                hint="write it as s3://bucket/prefix",
            )
        prefix = prefix.strip("/")
        if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
            raise ObjectStoreError(
                f"{text!r}: the prefix {prefix!r} has an empty, '.' or '..' segment",
                hint="write the prefix as plain names separated by single slashes",
            )
        return ObjectURI(bucket, prefix)

    def key(self, name: str) -> str:
        """The object key of the dataset file ``name`` (a ``/``-separated relative path)."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def url(self, name: str) -> str:
        """``s3://bucket/<key of name>``: one object's URL, for messages."""
        return f"{SCHEME}{self.bucket}/{self.key(name)}"

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{self.bucket}"

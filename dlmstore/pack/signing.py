"""Ed25519 signatures of packs, through ``cryptography``.

``dlm pack --sign KEY`` signs the bytes of ``CHECKSUMS.sha256``, which
name every other member with its sha256 (the header and the manifest
included), so the signature covers the whole pack. The signature travels
as ``SIGNATURE.ed25519``: a small JSON object holding the algorithm, the
signer's public key and the signature (base64). ``dlm verify --key PUB``
checks the signature with the key the person trusts, not the one the pack
carries: a pack signed with another key fails.

Keys are read as PEM (``openssl genpkey -algorithm ed25519``; public:
``openssl pkey -pubout``) or OpenSSH (``ssh-keygen -t ed25519``, the
private key without a passphrase, the public key's ``.pub`` line).
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmstore.errors import PackError
from dlmstore.pack.layout import SIGNATURE

ALGORITHM = "ed25519"


@dataclass(frozen=True)
class Signature:
    """A parsed ``SIGNATURE.ed25519``.

    Attributes:
        public_key: The signer's raw 32-byte public key.
        signature: The raw 64-byte signature.
    """

    public_key: bytes
    signature: bytes

    @property
    def fingerprint(self) -> str:
        """``SHA256:<base64>`` of the public key, as ``ssh-keygen -l`` shows keys."""
        return fingerprint(self.public_key)


def fingerprint(public_key: bytes) -> str:
    digest = hashlib.sha256(public_key).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PackError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None


def _raw_public(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def sign(checksums: bytes, key_file: Path) -> bytes:
    """The ``SIGNATURE.ed25519`` member signing ``checksums`` with the private key in ``key_file``.

    Raises:
        PackError: the file cannot be read, or holds no unencrypted Ed25519 private key.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    data = _read(key_file, "signing key")
    key: Any = None
    for load in (serialization.load_pem_private_key, serialization.load_ssh_private_key):
        try:
            key = load(data, password=None)
            break
        except (ValueError, TypeError):
            continue
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise PackError(
            f"{key_file} holds no Ed25519 private key without a passphrase",
            hint="make one with `openssl genpkey -algorithm ed25519 -out KEY` or `ssh-keygen -t ed25519 -N ''`",
        )
    body = {
        "algorithm": ALGORITHM,
        "public_key": base64.b64encode(_raw_public(key.public_key())).decode(),
        "signature": base64.b64encode(key.sign(checksums)).decode(),
    }
    return (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()


def parse(data: bytes) -> Signature:
    """The signature member, checked for shape.

    Raises:
        PackError: it is not the JSON object :func:`sign` writes.
    """
    try:
        body = json.loads(data)
        if body.get("algorithm") != ALGORITHM:
            raise ValueError
        public = base64.b64decode(body["public_key"], validate=True)
        signature = base64.b64decode(body["signature"], validate=True)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        raise PackError(f"pack member {SIGNATURE} is not an Ed25519 signature: the pack is damaged") from None
    if len(public) != 32 or len(signature) != 64:
        raise PackError(f"pack member {SIGNATURE} is not an Ed25519 signature: the pack is damaged")
    return Signature(public, signature)


def load_public_key(key_file: Path) -> bytes:
    """The raw Ed25519 public key in ``key_file`` (PEM, or an OpenSSH ``.pub`` line).

    Raises:
        PackError: the file cannot be read or holds no Ed25519 public key.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    data = _read(key_file, "public key")
    key: Any = None
    for load in (serialization.load_pem_public_key, serialization.load_ssh_public_key):
        try:
            key = load(data)
            break
        except (ValueError, TypeError, Exception):  # cryptography raises UnsupportedAlgorithm too
            continue
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise PackError(
            f"{key_file} holds no Ed25519 public key",
            hint="give the signer's public key: `openssl pkey -in KEY -pubout` or the `.pub` of ssh-keygen",
        )
    return _raw_public(key)


def check(signature: Signature, checksums: bytes, trusted: bytes) -> None:
    """Refuse unless ``signature`` is ``trusted``'s signature of ``checksums``.

    Raises:
        PackError: the pack was signed with another key, or the signature does not verify.
    """
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric import ed25519

    if signature.public_key != trusted:
        raise PackError(
            f"the pack is signed by key {signature.fingerprint}, not by the key given ({fingerprint(trusted)})"
        )
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(trusted).verify(signature.signature, checksums)
    except InvalidSignature:
        raise PackError(
            f"the pack's signature does not verify with key {fingerprint(trusted)}: it was altered after signing"
        ) from None

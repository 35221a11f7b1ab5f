"""``CHECKSUMS.sha256``: one ``<sha256>  <member>`` line per member, sorted, the format ``sha256sum`` reads.

Every member of a dlmstore pack is listed but this file itself (and the
signature, which signs it), ``manifest.json`` included. A reader compares
the list with what it found in the stream, member by member, before it
installs anything: a member listed and not found, found and not listed,
or whose bytes hash otherwise is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping

from dlmstore.errors import PackError
from dlmstore.pack.layout import CHECKSUMS

_HEX = frozenset("0123456789abcdef")


def render(checksums: Mapping[str, str]) -> bytes:
    """The file's bytes: ``<hex>  <member>\\n`` per member, sorted by name (bytes of its UTF-8)."""
    names = sorted(checksums, key=lambda name: name.encode())
    return "".join(f"{checksums[name]}  {name}\n" for name in names).encode()


def parse(data: bytes) -> dict[str, str]:
    """Member -> sha256 hex, from the file's bytes.

    Raises:
        PackError: a line is not ``<64 hex>  <member>``, or names a member twice.
    """
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise PackError(f"{CHECKSUMS} is not UTF-8 text: the pack is damaged") from None
    listed: dict[str, str] = {}
    for number, line in enumerate(text.split("\n"), 1):
        if not line:
            continue
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not set(digest) <= _HEX or not name:
            raise PackError(f"{CHECKSUMS} line {number} is not '<sha256>  <member>': the pack is damaged")
        if name in listed:
            raise PackError(f"{CHECKSUMS} lists {name} twice: the pack is damaged")
        listed[name] = digest
    return listed


def check(
    listed: Mapping[str, str], found: Mapping[str, str], *, unlisted: frozenset[str] = frozenset()
) -> None:
    """Refuse unless ``found`` (member -> sha256 hex of the bytes read) is exactly what ``listed`` says.

    ``unlisted`` names members that may be found without being listed
    (``CHECKSUMS.sha256`` itself, the signature).

    Raises:
        PackError: the first member missing, extra or changed, in name order.
    """
    for name in sorted(set(listed) | set(found), key=lambda item: item.encode()):
        if name in unlisted:
            continue
        if name not in found:
            raise PackError(f"pack member {name} is listed in {CHECKSUMS} but missing: the pack is damaged")
        if name not in listed:
            raise PackError(
                f"pack member {name} is not listed in {CHECKSUMS}: refused (a pack installs only checked members)"
            )
        if found[name] != listed[name]:
            raise PackError(
                f"pack member {name} is damaged: its sha256 is {found[name][:16]}…, "
                f"{CHECKSUMS} says {listed[name][:16]}…"
            )

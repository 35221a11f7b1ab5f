"""What a ``.dlm.pack`` holds and where: member names, the format version, the caps a reader applies.

A pack is one zstd-compressed tar. Its layout follows DocumentLanguageModel's
pack format 1 where it can, so a person who knows one knows the other::

    PACK_HEADER.json           what wrote it: format version, tool, content type
    manifest.json              the document's id, base, adapter versions, every member's size
    CHECKSUMS.sha256           "<sha256>  <member>" for every other member, sorted
    SIGNATURE.ed25519          optional: an Ed25519 signature over CHECKSUMS.sha256
    dlm/<name>.dlm             the document, as it is on disk
    store/store.db             a consistent snapshot of the store's database
    store/high-water.json      the high-water mark that matches the snapshot
    store/dlm.lock             the store's lock file
    store/adapter/versions/vNNNN/   the adapter versions packed
    store/tokens/...           --include-cache: the token segments
    store/exports/...          --include-exports
    sources/<path>             --include-sources: each training.sources file as trained
    base/<kind>/...            --include-base: the base model's weights and tokenizer

Unlike DLM's, ``manifest.json`` is listed in ``CHECKSUMS.sha256`` (the id
in it chooses where the pack installs), and no member goes unchecked: a
member that CHECKSUMS does not list is refused, not installed.
"""

from __future__ import annotations

#: The pack format this dlmstore writes and the newest it reads (DLM's is 1 too).
PACK_FORMAT_VERSION = 1

#: What the header's ``tool`` says in a pack dlmstore wrote (DLM's headers have no ``tool``).
TOOL = "dlmstore"

#: The suffix of a pack file.
PACK_SUFFIX = ".pack"

HEADER = "PACK_HEADER.json"
MANIFEST = "manifest.json"
CHECKSUMS = "CHECKSUMS.sha256"
SIGNATURE = "SIGNATURE.ed25519"

DOCUMENT_DIR = "dlm"
STORE_DIR = "store"
SOURCES_DIR = "sources"
BASE_DIR = "base"

#: The members every dlmstore pack holds.
REQUIRED = (HEADER, MANIFEST, CHECKSUMS)

#: The zstd level of the stream (DLM's).
ZSTD_LEVEL = 3

#: Caps a reader applies before writing anything: a member's size, the whole
#: pack's unpacked size, and unpacked bytes per compressed byte once past
#: :data:`RATIO_FLOOR` (a bomb of zeros compresses by far more).
MAX_MEMBER_BYTES = 16 * 1024**3
MAX_TOTAL_BYTES = 64 * 1024**3
MAX_RATIO = 200
RATIO_FLOOR = 256 * 1024**2
#: The largest zstd window a reader accepts (a stream asking for more is refused).
MAX_WINDOW_BYTES = 1 << 27
#: The most members a pack may hold.
MAX_MEMBERS = 1_000_000

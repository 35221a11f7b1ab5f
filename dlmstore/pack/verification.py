"""``dlm verify PACK``: every member checked, the adapters against store.db and the lock, the signature, a retrain.

Verifying extracts the pack into a scratch folder (never the home) and
checks, in order, stopping at the first failure with one line:

* every member against ``CHECKSUMS.sha256`` (missing, extra, changed),
  the manifest against the members and the document;
* each packed adapter's weights against the sha256 ``store.db`` recorded
  when it was trained, and the lock record of the run that trained the
  newest against the packed document (``document_matches``: false when
  the document was edited after that run, which a retrain then shows);
* with ``--key``, the signature: the pack must be signed, by that key;
* with ``--retrain``, the pack is unpacked into a scratch home, its
  document trained there from the packed sources and base, and the new
  adapter's sha256 compared with the packed newest's. The document
  retrained unchanged draws the same replay rows from the packed history,
  so a reproducible run publishes the same bytes.
"""

from __future__ import annotations

import hashlib
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dlmstore.errors import PackError
from dlmstore.home import home_at
from dlmstore.pack import layout
from dlmstore.pack.install import stage, unpack
from dlmstore.pack.manifest import PackManifest
from dlmstore.store.connection import DB_NAME, read_only


@dataclass(frozen=True)
class AdapterCheck:
    """One packed adapter version, checked.

    Attributes:
        version: Its version.
        sha256: Its weights' sha256, as packed and as store.db recorded it.
        run_id: The run that trained it.
    """

    version: int
    sha256: str
    run_id: int


@dataclass(frozen=True)
class Retrain:
    """What ``--retrain`` found.

    Attributes:
        adapter_version: The version the retrain published in its scratch home.
        sha256: Its weights' sha256.
        packed_version: The packed version it is compared with (the newest).
        packed_sha256: That version's sha256.
        reproduced: Whether the two are the same bytes.
        steps: Optimizer steps the retrain took.
    """

    adapter_version: int
    sha256: str
    packed_version: int
    packed_sha256: str
    reproduced: bool
    steps: int


@dataclass(frozen=True)
class VerifyReport:
    """What ``dlm verify`` checked (``--json``); it exits 1 unless ``ok``.

    Attributes:
        pack: The pack.
        format: ``dlmstore`` or ``dlm``.
        dlm_id: The document's id.
        members: Members checked against CHECKSUMS.sha256.
        bytes: Their sizes together.
        adapters: The packed adapters, each checked against store.db.
        document_matches: Whether the packed document is the one the newest
            adapter's run trained (its lock record's sha256); null when unknown.
        signed_by: The signing key's fingerprint; null when unsigned.
        signature_checked: Whether the signature was checked against ``--key``.
        retrain: What ``--retrain`` found; null without it.
        ok: Everything asked for holds (a retrain that did not reproduce is not ok).
    """

    pack: str
    format: str
    dlm_id: str
    members: int
    bytes: int
    adapters: list[AdapterCheck]
    document_matches: bool | None
    signed_by: str | None
    signature_checked: bool
    retrain: Retrain | None
    ok: bool


def verify_pack(pack: Path, *, key: Path | None = None, retrain: bool = False) -> VerifyReport:
    """Check ``pack`` (see the module docstring).

    Raises:
        PackError: a check fails (the first, with why).
    """
    from dlmstore.pack.signing import check, load_public_key, parse

    trusted = load_public_key(key) if key is not None else None
    with tempfile.TemporaryDirectory(prefix="dlm-verify-") as scratch:
        staged = stage(pack, Path(scratch))
        root = staged.root
        signed_by: str | None = None
        if (root / layout.SIGNATURE).is_file():
            signature = parse((root / layout.SIGNATURE).read_bytes())
            signed_by = signature.fingerprint
            if trusted is not None:
                check(signature, (root / layout.CHECKSUMS).read_bytes(), trusted)
        elif trusted is not None:
            raise PackError(
                f"{pack} is not signed: --key cannot be checked", hint="ask for a pack made with --sign"
            )
        adapters, matches = _check_adapters(staged.store, staged.adapters, staged.document)
        if retrain and staged.manifest is not None:
            _can_retrain(staged.document, staged.manifest)
    found = _retrain(pack, adapters) if retrain else None
    return VerifyReport(
        pack=str(pack),
        format=staged.format,
        dlm_id=staged.dlm_id,
        members=staged.members,
        bytes=staged.bytes,
        adapters=adapters,
        document_matches=matches,
        signed_by=signed_by,
        signature_checked=trusted is not None,
        retrain=found,
        ok=found is None or found.reproduced,
    )


def _check_adapters(
    store: Path, versions: list[int], document: Path
) -> tuple[list[AdapterCheck], bool | None]:
    checks: list[AdapterCheck] = []
    try:
        with read_only(store / DB_NAME) as conn:
            rows = {
                row[0]: row
                for row in conn.execute("SELECT version, path, sha256, run_id FROM adapters ORDER BY version")
            }
            newest_run: int | None = None
            for version in versions:
                if version not in rows:
                    raise PackError(
                        f"the pack carries adapter v{version:04d}, which its store.db does not register"
                    )
                _, path, recorded, run_id = rows[version]
                weights = store / path / "adapter_model.safetensors"
                found = _sha256(weights)
                if found != recorded:
                    raise PackError(
                        f"adapter v{version:04d} is damaged: its weights' sha256 is {found[:23]}…, store.db "
                        f"recorded {recorded[:23]}… when it was trained"
                    )
                checks.append(AdapterCheck(version, recorded, run_id))
                newest_run = run_id
            matches = _document_matches(conn, newest_run, document)
    except sqlite3.Error as exc:
        raise PackError(f"the pack's store.db cannot be read: {exc}") from None
    return checks, matches


def _sha256(path: Path) -> str:
    try:
        from dlmstore.store.digests import file_sha256

        return file_sha256(path)
    except OSError as exc:
        raise PackError(f"cannot read {path.name} of a packed adapter: {exc.strerror or exc}") from None


def _document_matches(conn: sqlite3.Connection, run_id: int | None, document: Path) -> bool | None:
    if run_id is None:
        return None
    row = conn.execute(
        "SELECT dlm_sha256 FROM lock_records WHERE run_id = ? ORDER BY id DESC LIMIT 1", (run_id,)
    ).fetchone()
    if row is None:
        return None
    digest = hashlib.sha256(document.read_bytes()).hexdigest()
    return str(row[0]).removeprefix("sha256:") == digest


def _can_retrain(document: Path, manifest: PackManifest) -> None:
    """Refuse a retrain that could not train what was trained: the sources or a local base left out."""
    from dlmstore.document.parser import parse_document

    settings = parse_document(document).frontmatter
    if settings.training.sources and not manifest.sources:
        raise PackError(
            "the pack carries no training.sources files, so --retrain cannot train what was trained",
            hint="verify a pack made with --include-sources (and --include-base)",
        )


def _retrain(pack: Path, adapters: list[AdapterCheck]) -> Retrain:
    """Unpack into a scratch home, train the document there, compare with the packed newest adapter.

    A document of named adapters (``training.adapters``) trains every adapter: the retrain
    reproduces when each adapter's new weights are the packed newest version of that adapter's
    (the summary names the last adapter trained, and the pack's newest version).
    """
    from dlmstore.train.named.adapter_runs import train
    from dlmstore.train.summary import NamedTrainSummary

    if not adapters:
        raise PackError("the pack carries no adapter to compare a retrain with")
    newest = adapters[-1]
    with tempfile.TemporaryDirectory(prefix="dlm-retrain-") as folder, home_at(Path(folder) / "home"):
        scratch = Path(folder)
        installed = unpack(pack, to=scratch / "document")
        trained = train(str(installed.document))
    runs = trained.adapters if isinstance(trained, NamedTrainSummary) else [trained]
    packed = {adapter.sha256 for adapter in adapters}
    summary = runs[-1]
    return Retrain(
        adapter_version=summary.adapter_version,
        sha256=summary.adapter_sha256,
        packed_version=newest.version,
        packed_sha256=newest.sha256,
        reproduced=summary.adapter_sha256 == newest.sha256
        and all(run.adapter_sha256 in packed for run in runs),
        steps=sum(part.steps for run in runs for part in run.phases),
    )

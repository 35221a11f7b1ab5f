"""Recipes: what ``dlm data build pretrain|sft`` and ``dlm data build-all`` run.

A recipe loads the base model's tokenizer, streams its input into a
builder, and registers the result in a store database; each returns a
frozen dataclass the CLI renders. ``build_all`` lays out a cache
directory the way the spec does::

    <cache-dir>/store.db                  the registry (sqlite3-queryable)
    <cache-dir>/tokenizer/                the tokenizer's files + meta.json (its sha256)
    <cache-dir>/pretrain/fineweb_edu/     train/ val/ meta.json
    <cache-dir>/pretrain/{wikitext,roam,gutenberg}/
    <cache-dir>/sft/{dolly15k,oasst1}/    {train,val}_{tokens.bin,idx.npy,mask.bin} meta.json

Sources are independent: one that fails (unreachable offline, a bad local
file) is recorded with its one-line reason and the others still build.
roam is built only from a local folder; gutenberg is a stub (directories
and a meta.json with ``"built": false``) unless given a local folder.

This is the layer that composes builders and engines: ``--engine`` becomes
an engine here (:func:`engine_for`, which imports :mod:`.ray_build` only
when Ray is asked for) and is handed to the builders.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlmstore.datasets.build import catalog as src
from dlmstore.datasets.build.encoding import TextEncoder
from dlmstore.datasets.build.engines import Engine, engine_session
from dlmstore.datasets.build.local import (
    LocatedInput,
    data_files,
    iter_local_records,
    iter_local_texts,
    read_text_file,
)
from dlmstore.datasets.build.output import BuildResult, ProgressFn, claim_out_dir, listing
from dlmstore.datasets.build.pretrain import DEFAULT_SHARD_BYTES, build_pretrain_cache
from dlmstore.datasets.build.sft import DEFAULT_VAL_FRAC, build_sft_cache
from dlmstore.datasets.meta import FORMAT, REQUIRED, write_meta
from dlmstore.datasets.publish import (
    Published,
    claim_prefix,
    commit_uploaded,
    default_store_dir,
    mark_upload,
    publish,
    staging_for,
)
from dlmstore.datasets.registry import RegisteredDataset, register_dataset, register_in
from dlmstore.errors import DatasetError
from dlmstore.objstore.uri import ObjectURI, is_object_uri
from dlmstore.store.atomic import publish_dir
from dlmstore.store.flock import FileLock, store_lock

DEFAULT_BASE = "smollm2-135m"
DEFAULT_PRETRAIN_VAL_FRAC = 0.01
ROAM_VAL_FRAC = 0.10


@dataclass(frozen=True)
class DatasetBuild:
    """A dataset built from local files and registered (``dlm data build ... --json``).

    Attributes:
        build: What the builder wrote.
        registered: How it was registered in a store.db.
        uploaded: The upload to object storage (``--out s3://...``); ``null`` for a local ``--out``.
    """

    build: BuildResult
    registered: RegisteredDataset
    uploaded: Published | None = None


@dataclass(frozen=True)
class BuildAllOptions:
    """Every default of build-all, each a CLI flag."""

    fineweb_dataset: str = src.FINEWEB_DATASET
    fineweb_config: str = src.FINEWEB_CONFIG
    fineweb_train_tokens: int = src.FINEWEB_TRAIN_TOKENS
    fineweb_val_tokens: int = src.FINEWEB_VAL_TOKENS
    shuffle_buffer: int = src.FINEWEB_SHUFFLE_BUFFER
    wikitext_dataset: str = src.WIKITEXT_DATASET
    wikitext_config: str = src.WIKITEXT_CONFIG
    dolly_dataset: str = src.DOLLY_DATASET
    oasst_dataset: str = src.OASST_DATASET
    oasst_lang: str | None = None
    sft_val_frac: float = DEFAULT_VAL_FRAC
    roam_val_frac: float = ROAM_VAL_FRAC
    shard_bytes: int = DEFAULT_SHARD_BYTES
    chat_format: str = "auto"


@dataclass(frozen=True)
class SourceOutcome:
    """What happened to one source: built, failed, skipped or not built (a stub).

    Attributes:
        name: The source (``fineweb-edu``, ``wikitext``, ``roam``, ``gutenberg``, ``dolly-15k``,
            ``oasst1``).
        kind: ``pretrain`` or ``sft``.
        status: ``built``, ``failed``, ``skipped`` or ``not built`` (a stub).
        path: Its dataset folder.
        message: Why it failed, was skipped or was not built; empty when built.
        tokens: Tokens per split; empty unless built.
        docs: Documents or examples per split; empty unless built.
        seconds: Time spent building it.
    """

    name: str
    kind: str
    status: str
    path: str
    message: str = ""
    tokens: dict[str, int] = field(default_factory=dict)
    docs: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass(frozen=True)
class BuildAllResult:
    """The JSON shape of ``dlm data build-all --json``.

    Attributes:
        cache_dir: The cache folder (``--cache-dir``).
        db_path: The store.db the datasets are registered in.
        seed: Seed of every split and shuffle.
        base: The base model whose tokenizer was used.
        tokenizer_sha256: Fingerprint of that tokenizer.
        sources: What happened to each source.
    """

    cache_dir: str
    db_path: str
    seed: int
    base: str
    tokenizer_sha256: str
    sources: list[SourceOutcome]

    @property
    def failed(self) -> list[str]:
        return [s.name for s in self.sources if s.status == "failed"]


def encoder_for_base(base: str) -> TextEncoder:
    """The tokenizer of a base model, with the fingerprint ``dlm`` records everywhere."""
    from dlmstore.bases import load_tokenizer, resolve_base
    from dlmstore.fingerprint import tokenizer_sha256

    ref = resolve_base(base)
    encoder = TextEncoder(load_tokenizer(ref), tokenizer_sha256=tokenizer_sha256(ref))
    encoder.name = base
    return encoder


def engine_for(engine: str, *, ray_address: str | None = None, workers: int | None = None) -> Engine | None:
    """The engine for a ``--engine`` value: ``None`` (this process) for ``local``, else a Ray engine.

    Raises:
        DatasetError: ``ray`` without Ray installed (checked here, before
            anything is loaded or written).
    """
    if engine == "local":
        return None
    from dlmstore.datasets.build.ray_build import RayEngine, import_ray

    import_ray()
    return RayEngine(address=ray_address, workers=workers)


def build_pretrain_from(
    source: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    base: str = DEFAULT_BASE,
    store_dir: str | os.PathLike[str] | None = None,
    text_field: str = "text",
    val_frac: float | None = None,
    train_tokens: int | None = None,
    val_tokens: int | None = None,
    progress: ProgressFn | None = None,
    engine: Engine | None = None,
    force: bool = False,
    **options: Any,
) -> DatasetBuild:
    """Build a pretrain dataset from local files and register it (in ``out_dir`` by default).

    Without ``val_frac`` or both budgets, 1% of documents go to val.
    ``engine``: build on Ray (``None``: in this process). Registration
    happens once, here on the driver, after every file and meta.json is written.
    ``force``: write into a folder that is not a dataset dlm wrote
    (:func:`~.output.claim_out_dir`); an ``out_dir`` that is, holds or sits
    inside ``source`` is refused either way.
    """
    remote = _claim(out_dir, source, force=force, options=options)  # before Ray, the tokenizer or any write
    with engine_session(engine):  # an unreachable cluster fails before the tokenizer loads
        encoder = encoder_for_base(base)
        if val_frac is None and (train_tokens is None or val_tokens is None):
            val_frac = DEFAULT_PRETRAIN_VAL_FRAC
        texts = LocatedInput(os.fspath(source), text_field)  # a Ray build's workers read it by range
        texts.files()  # a missing path or an empty prefix fails before the output directory is touched
        store = _store_for(out_dir, store_dir, remote)
        _check_store(store)
        with _destination(out_dir, remote) as folder, _store_held(store):
            engine = _uploader(engine, remote)
            result = build_pretrain_cache(
                texts,
                folder,
                tokenizer=encoder,
                val_frac=val_frac,
                train_tokens=train_tokens,
                val_tokens=val_tokens,
                source=_input_meta(source),
                tokenizer_name=base,
                progress=progress,
                engine=engine,
                force=force,
                **options,
            )
            return _finish(result, folder, store, remote, engine, force=force)


def _claim(
    out_dir: str | os.PathLike[str], source: str | os.PathLike[str], *, force: bool, options: dict[str, Any]
) -> ObjectURI | None:
    """Claim the output before anything loads: a folder (:func:`~.output.claim_out_dir`), or a prefix
    of object storage (:func:`~dlmstore.datasets.publish.claim_prefix`), whose last name becomes the
    dataset's default name (the staging folder's is a hash)."""
    if not is_object_uri(os.fspath(out_dir)):
        claim_out_dir(out_dir, force=force, inputs=() if is_object_uri(os.fspath(source)) else (source,))
        return None
    remote = claim_prefix(os.fspath(out_dir), force=force)
    if not options.get("name"):
        options["name"] = remote.prefix.rsplit("/", 1)[-1] or remote.bucket
    return remote


def _input_meta(source: str | os.PathLike[str]) -> dict[str, Any]:
    """What meta.json records of ``--from``: a local path, resolved, or an ``s3://`` prefix."""
    if is_object_uri(os.fspath(source)):
        return {"type": "s3", "url": os.fspath(source)}
    return {"type": "local", "path": str(Path(source).resolve())}


def _store_for(
    out_dir: str | os.PathLike[str], store_dir: str | os.PathLike[str] | None, remote: ObjectURI | None
) -> Path:
    """The store a build registers in: ``--store``, else the dataset folder, else (a bucket) the home's."""
    if store_dir is not None:
        return Path(store_dir)
    return default_store_dir() if remote is not None else Path(out_dir)


@contextmanager
def _destination(out_dir: str | os.PathLike[str], remote: ObjectURI | None) -> Iterator[Path]:
    """The folder the builder writes: ``out_dir``, or the staging folder of an upload to ``remote``."""
    if remote is None:
        yield Path(out_dir)
        return
    with staging_for(remote) as folder:
        yield folder


def _uploader(engine: Engine | None, remote: ObjectURI | None) -> Engine | None:
    """``engine``; for a Ray build to ``remote``, a copy whose tasks upload the files they write there
    themselves, the prefix marked as being built first. The local engine's build to ``remote`` is
    staged and uploaded by :func:`_finish`."""
    if remote is None or engine is None:
        return engine
    from dlmstore.datasets.build.ray_build import RayEngine

    if not isinstance(engine, RayEngine):
        return engine
    mark_upload(remote)
    return dataclasses.replace(engine, upload_to=str(remote))


def _finish(
    result: BuildResult,
    folder: Path,
    store: Path,
    remote: ObjectURI | None,
    engine: Engine | None,
    *,
    force: bool,
) -> DatasetBuild:
    """Register the dataset built in ``folder``; first upload it to ``remote``, registered by its URL.

    When ``engine``'s tasks uploaded the files themselves (:func:`_uploader`),
    ``folder`` holds ``meta.json`` only: the upload is committed and the
    dataset registered from the objects' sizes.
    """
    if remote is None:
        return DatasetBuild(result, register_in(store, folder))
    if getattr(engine, "upload_to", None) is not None:
        uploaded, sizes = commit_uploaded(folder, remote, building=result.seconds)
        registered = register_in(store, folder, location=str(remote), sizes=sizes)
    else:
        uploaded = publish(folder, remote, force=force)
        registered = register_in(store, folder, location=str(remote))
    return DatasetBuild(dataclasses.replace(result, path=str(remote)), registered, uploaded)


def _check_store(directory: str | os.PathLike[str]) -> None:
    """Open the store.db the build will register in, if there is one, before the build writes.

    A database that cannot be registered in (damaged, newer, another
    document's) is refused here, while the dataset folder is as it was.
    """
    from dlmstore.store.connection import DB_NAME
    from dlmstore.store.database import open_store_at

    if (Path(directory) / DB_NAME).exists():
        open_store_at(Path(directory)).close()


def _store_held(directory: str | os.PathLike[str]) -> FileLock:
    """The store lock of the store the build registers in, held shared while it writes.

    Building writes temp files long before the store is opened to register
    them; holding the lock meanwhile keeps ``dlm cache verify --repair`` on
    that store from taking them for a killed build's leftovers.
    """
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # not a directory, not writable: the build says so in its own words; no lock is needed
    return store_lock(Path(directory))


def build_sft_from(
    source: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    base: str = DEFAULT_BASE,
    store_dir: str | os.PathLike[str] | None = None,
    progress: ProgressFn | None = None,
    engine: Engine | None = None,
    force: bool = False,
    **options: Any,
) -> DatasetBuild:
    """Build an SFT dataset from local JSONL/Parquet conversations and register it.

    A record is ``{"messages": [...]}``, or a dolly-style
    ``{"instruction", "context", "response"}``. ``force``: as for
    :func:`build_pretrain_from`.
    """
    remote = _claim(out_dir, source, force=force, options=options)  # before Ray, the tokenizer or any write
    with engine_session(engine):  # an unreachable cluster fails before the tokenizer loads
        encoder = encoder_for_base(base)
        examples = LocatedInput(os.fspath(source), text_field=None)  # dolly_messages of each record
        examples.files()
        store = _store_for(out_dir, store_dir, remote)
        _check_store(store)
        with _destination(out_dir, remote) as folder, _store_held(store):
            engine = _uploader(engine, remote)
            result = build_sft_cache(
                examples,
                folder,
                tokenizer=encoder,
                tokenizer_name=base,
                source=_input_meta(source),
                progress=progress,
                engine=engine,
                force=force,
                **options,
            )
            return _finish(result, folder, store, remote, engine, force=force)


def build_all(
    cache_dir: str | os.PathLike[str],
    *,
    seed: int = 42,
    base: str = DEFAULT_BASE,
    options: BuildAllOptions = BuildAllOptions(),
    local: dict[str, str] | None = None,
    only: Sequence[str] | None = None,
    progress: ProgressFn | None = None,
    engine: Engine | None = None,
    force: bool = False,
) -> BuildAllResult:
    """Build every source of the spec into ``cache_dir`` and register each there.

    ``cache_dir`` must be absent, empty or a cache dlm wrote (its
    ``tokenizer/`` folder holds dlm's ``meta.json``), unless ``force``; each
    source's dataset folder is claimed as :func:`~.output.claim_out_dir`
    says (a folder that fails is that source's failure), and none may
    overlap the local folder it is built from.

    Raises:
        DatasetError: an unknown source name in ``local`` or ``only``, or a
            ``cache_dir`` that is not dlm's (a failing source does not
            raise; see ``BuildAllResult.failed``).
    """
    from dlmstore.store.database import open_store_at

    local = dict(local or {})
    for name in [*local, *(only or [])]:
        if name not in src.SOURCES:
            raise DatasetError(f"unknown source {name!r}", hint=f"sources: {', '.join(src.SOURCES)}")
    root = Path(cache_dir).resolve()
    _claim_cache_dir(root, force=force)
    with engine_session(engine):  # one Ray for every source, reached before anything is written
        root.mkdir(parents=True, exist_ok=True)
        encoder = encoder_for_base(base)
        _save_tokenizer(root / "tokenizer", encoder)
        recipes: dict[str, Callable[[Path, str | None], BuildResult]] = {
            "fineweb-edu": lambda out, path: _fineweb(
                out, path, encoder, seed, options, progress, engine, force
            ),
            "wikitext": lambda out, path: _wikitext(
                out, path, encoder, seed, options, progress, engine, force
            ),
            "roam": lambda out, path: _local_folder(
                "roam", out, path, encoder, seed, options, progress, engine, force
            ),
            "gutenberg": lambda out, path: _local_folder(
                "gutenberg", out, path, encoder, seed, options, progress, engine, force
            ),
            "dolly-15k": lambda out, path: _sft(
                "dolly-15k", out, path, encoder, seed, options, progress, engine, force
            ),
            "oasst1": lambda out, path: _sft(
                "oasst1", out, path, encoder, seed, options, progress, engine, force
            ),
        }
        outcomes = []
        with open_store_at(root) as store:
            for name, spec in src.SOURCES.items():
                out = root / spec.directory
                if only and name not in only:
                    outcomes.append(
                        SourceOutcome(name, spec.kind, "skipped", str(out), "not selected (--only)")
                    )
                    continue
                try:
                    if name in ("roam", "gutenberg") and name not in local:
                        outcomes.append(_absent_local(name, out, encoder, seed, force))
                        continue
                    claim_out_dir(out, force=force, inputs=[local[name]] if name in local else [])
                    result = recipes[name](out, local.get(name))
                    register_dataset(store, out)
                except DatasetError as exc:
                    outcomes.append(SourceOutcome(name, spec.kind, "failed", str(out), exc.message))
                    continue
                outcomes.append(
                    SourceOutcome(
                        name,
                        spec.kind,
                        "built",
                        result.path,
                        tokens={s: t.tokens for s, t in result.splits.items()},
                        docs={s: t.docs for s, t in result.splits.items()},
                        seconds=round(result.seconds, 3),
                    )
                )
            db_path = str(store.db_path)
        return BuildAllResult(str(root), db_path, seed, base, encoder.tokenizer_sha256, outcomes)


def _fineweb(
    out: Path,
    path: str | None,
    encoder: TextEncoder,
    seed: int,
    o: BuildAllOptions,
    progress: ProgressFn | None,
    engine: Engine | None,
    force: bool,
) -> BuildResult:
    common: dict[str, Any] = {
        "tokenizer": encoder,
        "train_tokens": o.fineweb_train_tokens,
        "val_tokens": o.fineweb_val_tokens,
        "shard_bytes": o.shard_bytes,
        "seed": seed,
        "name": "fineweb-edu",
        "config": o.fineweb_config,
        "tokenizer_name": encoder.name,
        "progress": progress,
        "engine": engine,
        "force": force,
    }
    if path is not None:
        return build_pretrain_cache(
            iter_local_texts(path),
            out,
            shuffle_buffer=o.shuffle_buffer,
            streaming=False,
            source={"type": "local", "path": str(Path(path).resolve())},
            **common,
        )
    rows = src.hf_rows("fineweb-edu", o.fineweb_dataset, o.fineweb_config, "train")
    rows = rows.shuffle(seed=seed, buffer_size=o.shuffle_buffer)
    texts = src.field(
        src.guarded("fineweb-edu", o.fineweb_dataset, o.fineweb_config, rows), "text", "fineweb-edu"
    )
    source = {
        "type": "huggingface",
        "id": o.fineweb_dataset,
        "config": o.fineweb_config,
        "split": "train",
        "shuffle": {"by": "datasets.IterableDataset.shuffle", "seed": seed, "buffer_size": o.shuffle_buffer},
    }
    return build_pretrain_cache(texts, out, streaming=True, source=source, **common)


def _wikitext(
    out: Path,
    path: str | None,
    encoder: TextEncoder,
    seed: int,
    o: BuildAllOptions,
    progress: ProgressFn | None,
    engine: Engine | None,
    force: bool,
) -> BuildResult:
    name, config = "wikitext", o.wikitext_config
    train: Iterable[str]
    val: Iterable[str]
    if path is not None:
        train_files, val_files = src.split_by_name(data_files(path), lambda n: "valid" in n or "val" in n)
        train = src.wikitext_articles(t for f in train_files for t in iter_local_texts(f))
        val = src.wikitext_articles(t for f in val_files for t in iter_local_texts(f))
        source: dict[str, Any] = {"type": "local", "path": str(Path(path).resolve())}
    else:
        splits = {s: src.hf_rows(name, o.wikitext_dataset, config, s) for s in ("train", "validation")}
        train, val = (
            src.wikitext_articles(
                src.field(src.guarded(name, o.wikitext_dataset, config, splits[s]), "text", name)
            )
            for s in ("train", "validation")
        )
        source = {
            "type": "huggingface",
            "id": o.wikitext_dataset,
            "config": config,
            "splits": {"train": "train", "val": "validation"},
        }
    return build_pretrain_cache(
        train,
        out,
        val_texts=val,
        tokenizer=encoder,
        shard_bytes=o.shard_bytes,
        seed=seed,
        name=name,
        config=config,
        streaming=path is None,
        source=source,
        tokenizer_name=encoder.name,
        progress=progress,
        engine=engine,
        force=force,
    )


def _local_folder(
    name: str,
    out: Path,
    path: str | None,
    encoder: TextEncoder,
    seed: int,
    o: BuildAllOptions,
    progress: ProgressFn | None,
    engine: Engine | None,
    force: bool,
) -> BuildResult:
    """A folder of text files, split by file list: a seeded permutation, the first files to val."""
    from dlmstore.datasets.build.routing import seeded_permutation

    assert path is not None
    files = data_files(path)
    order = seeded_permutation(len(files), seed)  # torch.randperm's order, without loading torch
    n_val = round(len(files) * o.roam_val_frac) if len(files) > 1 else 0
    val_set = set(order[:n_val])
    val_files = [f for i, f in enumerate(files) if i in val_set]
    train_files = [f for i, f in enumerate(files) if i not in val_set]
    result = build_pretrain_cache(
        (read_text_file(f) for f in train_files),
        out,
        val_texts=(read_text_file(f) for f in val_files),
        tokenizer=encoder,
        shard_bytes=o.shard_bytes,
        seed=seed,
        name=name,
        tokenizer_name=encoder.name,
        source={
            "type": "local",
            "path": str(Path(path).resolve()),
            "files": len(files),
            "split": f"by file list: seeded torch permutation, {n_val} of {len(files)} files to val",
        },
        progress=progress,
        engine=engine,
        force=force,
    )
    return result


def _sft(
    name: str,
    out: Path,
    path: str | None,
    encoder: TextEncoder,
    seed: int,
    o: BuildAllOptions,
    progress: ProgressFn | None,
    engine: Engine | None,
    force: bool,
) -> BuildResult:
    dataset_id = o.dolly_dataset if name == "dolly-15k" else o.oasst_dataset
    source: dict[str, Any]
    if path is not None:
        rows: Iterable[dict[str, Any]] = iter_local_records(path)
        source = {"type": "local", "path": str(Path(path).resolve())}
    else:
        split_rows = [
            src.guarded(name, dataset_id, None, src.hf_rows(name, dataset_id, None, s))
            for s in (("train",) if name == "dolly-15k" else ("train", "validation"))
        ]
        rows = (row for part in split_rows for row in part)
        source = {"type": "huggingface", "id": dataset_id}
    examples: Iterable[Any]
    if name == "dolly-15k":
        examples = (src.dolly_messages(r) for r in rows)
    else:
        examples = src.oasst_threads(rows, lang=o.oasst_lang)
        source["thread"] = "top-ranked reply at each turn" + (
            f", lang={o.oasst_lang}" if o.oasst_lang else ""
        )
    return build_sft_cache(
        examples,
        out,
        tokenizer=encoder,
        val_frac=o.sft_val_frac,
        seed=seed,
        chat_format=o.chat_format,
        name=name,
        streaming=path is None,
        source=source,
        tokenizer_name=encoder.name,
        progress=progress,
        engine=engine,
        force=force,
    )


def _absent_local(name: str, out: Path, encoder: TextEncoder, seed: int, force: bool) -> SourceOutcome:
    if name == "roam":
        return SourceOutcome(
            name, "pretrain", "skipped", str(out), f"roam: no folder given; {src.local_hint('roam')}"
        )
    claim_out_dir(out, force=force)  # the stub's meta.json goes only where dlm may write
    for split in ("train", "val"):
        (out / split).mkdir(parents=True, exist_ok=True)
    stub: dict[str, Any] = dict.fromkeys(REQUIRED)
    stub.update(
        {
            "format": FORMAT,
            "kind": "pretrain",
            "built": False,
            "dataset_name": name,
            "seed": seed,
            "files": [],
            "totals": {},
            "special_token_ids": {},
            "streaming": False,
            "tokenizer_sha256": encoder.tokenizer_sha256,
            "vocab_size": encoder.vocab_size,
            "note": "stub: not built; build it from local text files with --local gutenberg=PATH",
        }
    )
    write_meta(out, stub)
    return SourceOutcome(
        name, "pretrain", "not built", str(out), "stub written (meta.json says built: false)"
    )


def _claim_cache_dir(root: Path, *, force: bool) -> None:
    """Refuse a ``--cache-dir`` that is not a cache dlm wrote (unless ``force``), and always a
    ``tokenizer/`` folder there that dlm did not write (it is replaced whole)."""
    try:
        names = [name for name in os.listdir(root) if name not in (".store.lock", ".migrate.lock")]
    except FileNotFoundError:
        return
    except OSError as exc:
        raise DatasetError(
            f"cannot use {root} as the cache folder: {exc.strerror or exc}",
            hint="choose a new folder for --cache-dir",
        ) from None
    tokenizer = root / "tokenizer"
    ours = _is_tokenizer_dir(tokenizer)
    if "tokenizer" in names and not ours:
        raise DatasetError(
            f"{tokenizer} is not a tokenizer folder dlm wrote, and build-all replaces that folder whole",
            hint=f"move {tokenizer} elsewhere, or choose a new folder for --cache-dir",
        )
    if names and not ours and not force:
        raise DatasetError(
            f"{root} is not a cache folder dlm wrote: it holds {listing(root, names)}, "
            "and no tokenizer/ of a dlm cache",
            hint="choose a new or empty folder for --cache-dir, or pass --force to build there "
            "(only the dataset files dlm writes are replaced)",
        )


def _is_tokenizer_dir(path: Path) -> bool:
    """Whether ``path`` holds the ``meta.json`` :func:`_save_tokenizer` writes."""
    from dlmstore.store.regular_files import load_json, read_regular

    try:
        meta = load_json(read_regular(path / "meta.json", limit=1 << 20))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and isinstance(meta.get("tokenizer_sha256"), str) and "base" in meta


def _save_tokenizer(target: Path, encoder: TextEncoder) -> None:
    """``<cache-dir>/tokenizer``: the tokenizer's files and its identity, replaced whole."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with publish_dir(target, existing="replace") as staging:
        encoder.tokenizer.save_pretrained(staging)
        write_meta(
            staging,
            {
                "base": encoder.name,
                "tokenizer_sha256": encoder.tokenizer_sha256,
                "vocab_size": encoder.vocab_size,
                "special_token_ids": encoder.special_token_ids(),
            },
        )

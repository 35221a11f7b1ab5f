"""The store.db schema as SQLAlchemy Core tables: the models side.

The database itself is only ever created or changed by the numbered Alembic
revisions in ``dlmstore.migrations.versions``; these tables describe the
head of that chain, and a test checks that models and migrations agree
(``compare_metadata`` is empty). Library code does not build queries from
them: it writes plain SQL over ``sqlite3`` (``dlmstore.store.database``
says why), so SQLAlchemy is imported only by migrations and schema tests.

Conventions, so ``sqlite3 store.db`` is pleasant to use:

* plural snake_case table names, readable column names, no abbreviations;
* timestamps are ISO-8601 UTC text with a ``Z`` suffix, e.g.
  ``2026-11-21T08:15:03.123Z`` (they sort as text and read as dates);
* ids that must never be reused (runs) are ``INTEGER PRIMARY KEY
  AUTOINCREMENT``;
* column comments below are the schema documentation: ``docs/schema.md`` is
  generated from a freshly migrated database plus these comments.
"""

from __future__ import annotations

from sqlalchemy import (
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
)

from dlmstore.store.revisions import HEAD_REVISION, REVISIONS

__all__ = ["HEAD_REVISION", "REVISIONS", "metadata"]

metadata = MetaData()


store_info = Table(
    "store_info",
    metadata,
    Column("id", Integer, primary_key=True, comment="Always 1: this table has one row."),
    Column("dlm_id", Text, nullable=False, comment="The document id (ULID) this store belongs to."),
    Column("created_at", Text, nullable=False, comment="When the store was created."),
    Column(
        "dlmstore_version",
        Text,
        nullable=False,
        comment="Version of the newest dlmstore that migrated this database.",
    ),
    CheckConstraint("id = 1", name="store_info_single_row"),
    comment="Identity of the store: one row.",
)

runs = Table(
    "runs",
    metadata,
    Column(
        "id",
        Integer,
        primary_key=True,
        comment="Run id; AUTOINCREMENT so an id is never reused, even after a crash.",
    ),
    Column(
        "command",
        Text,
        nullable=False,
        comment="What ran: tokenize, train, eval, or gate (the learned gate fitted after named adapters).",
    ),
    Column(
        "status",
        Text,
        nullable=False,
        comment="running while in progress, then completed or failed.",
    ),
    Column("started_at", Text, nullable=False, comment="When the run started."),
    Column("finished_at", Text, comment="When the run ended; NULL while running."),
    Column("dlm_path", Text, nullable=False, comment="Absolute path of the .dlm document."),
    Column("dlm_sha256", Text, nullable=False, comment="sha256 of the document bytes at run time."),
    Column("dlmstore_version", Text, nullable=False, comment="dlmstore version that ran it."),
    Column("pid", Integer, comment="Process id of the dlm process that ran it."),
    Column("error", Text, comment="One-line reason when status is failed."),
    Column(
        "world_size",
        Integer,
        nullable=False,
        server_default="1",
        comment="Processes the run trained on (`dlm train --nproc`); 1 for everything else.",
    ),
    Column("resumed_from", Integer, comment="The interrupted train run this run continued (`--resume`)."),
    Column(
        "adapter",
        Text,
        comment="The named adapter a train run trained (training.adapters); NULL for a document's one adapter.",
    ),
    CheckConstraint("status IN ('running', 'completed', 'failed')", name="runs_status"),
    comment="Every tokenize or train run, newest has the largest id.",
    sqlite_autoincrement=True,
)

token_segments = Table(
    "token_segments",
    metadata,
    Column("id", Integer, primary_key=True, comment="Segment id."),
    Column(
        "path",
        Text,
        nullable=False,
        unique=True,
        comment="Segment file relative to the store directory, e.g. tokens/segment-....bin.",
    ),
    Column("dtype", Text, nullable=False, comment="Token dtype of every entry in it: uint16 or uint32."),
    Column("bytes", Integer, nullable=False, comment="Size of the complete file."),
    Column(
        "live_bytes",
        Integer,
        nullable=False,
        server_default="0",
        comment="Bytes still referenced by cache_entries (kept by triggers); 0 means removable.",
    ),
    Column("created_at", Text, nullable=False, comment="When the segment was registered."),
    Column("run_id", Integer, ForeignKey("runs.id"), comment="The run that wrote it."),
    CheckConstraint("dtype IN ('uint16', 'uint32')", name="token_segments_dtype"),
    comment="Append-only files of concatenated token arrays; entries point into them.",
    sqlite_autoincrement=True,
)

cache_entries = Table(
    "cache_entries",
    metadata,
    Column("id", Integer, primary_key=True, comment="Entry id."),
    Column("row_key", Text, nullable=False, comment="Content key of the row (sha256:...)."),
    Column(
        "tokenizer_sha256",
        Text,
        nullable=False,
        comment="Identity of the tokenizer that produced the tokens (sha256:...).",
    ),
    Column("sequence_len", Integer, nullable=False, comment="training.sequence_len of the run."),
    Column(
        "segment_id",
        Integer,
        ForeignKey("token_segments.id"),
        nullable=False,
        comment="Segment holding the tokens.",
    ),
    Column("byte_offset", Integer, nullable=False, comment="Where the tokens start in the segment."),
    Column("token_count", Integer, nullable=False, comment="Number of tokens (input_ids length)."),
    Column("dtype", Text, nullable=False, comment="uint16 or uint32, never inferred from sizes."),
    Column("bytes", Integer, nullable=False, comment="token_count x itemsize."),
    Column("checksum", Text, nullable=False, comment="crc32 of the token bytes, e.g. crc32:1a2b3c4d."),
    Column("created_at", Text, nullable=False, comment="When the entry was stored."),
    Column("last_access_at", Text, nullable=False, comment="Last run that read or wrote it (LRU order)."),
    Column(
        "last_run_id",
        Integer,
        ForeignKey("runs.id"),
        comment="Id of that run; its entries are never evicted by it.",
    ),
    UniqueConstraint("row_key", "tokenizer_sha256", "sequence_len", name="cache_entries_key"),
    Index("cache_entries_lru", "last_access_at", "last_run_id"),
    Index("cache_entries_segment_id", "segment_id"),
    comment="The tokenized cache: one row per (row_key, tokenizer_sha256, sequence_len).",
)

cache_totals = Table(
    "cache_totals",
    metadata,
    Column("id", Integer, primary_key=True, comment="Always 1."),
    Column("entry_count", Integer, nullable=False, server_default="0", comment="Rows in cache_entries."),
    Column("bytes", Integer, nullable=False, server_default="0", comment="Sum of cache_entries.bytes."),
    Column(
        "changes",
        Integer,
        nullable=False,
        server_default="0",
        comment="Entries deleted or moved so far (a pass snapshot is stale once it moves).",
    ),
    CheckConstraint("id = 1", name="cache_totals_single_row"),
    comment="Running totals of the cache, kept by triggers so size checks never scan entries.",
)

cache_uses = Table(
    "cache_uses",
    metadata,
    Column("id", Integer, primary_key=True, comment="Log row id (log order)."),
    Column("run_id", Integer, ForeignKey("runs.id"), nullable=False, comment="The run whose pass used them."),
    Column("used_at", Text, nullable=False, comment="When (the last_access_at the entries get)."),
    Column("entries", Integer, nullable=False, comment="How many entries it used."),
    Column(
        "entry_ids",
        LargeBinary,
        nullable=False,
        comment="Their cache_entries ids, as little-endian 64-bit integers.",
    ),
    comment="Cache entries each pass used, not yet folded into their LRU marks (dlmstore.cache.uses).",
)

tokenization_events = Table(
    "tokenization_events",
    metadata,
    Column("id", Integer, primary_key=True, comment="Event id."),
    Column(
        "run_id",
        Integer,
        ForeignKey("runs.id", ondelete="CASCADE"),
        nullable=False,
        unique=True,
        comment="The run this pass belonged to.",
    ),
    Column("total_sections", Integer, nullable=False, comment="Sections in the document, sources included."),
    Column(
        "total_rows", Integer, nullable=False, comment="Rows tokenized or fetched (preference rows excluded)."
    ),
    Column("cache_hits", Integer, nullable=False, comment="Rows whose tokens came from the cache."),
    Column("cache_misses", Integer, nullable=False, comment="Rows that went through the tokenizer."),
    Column("total_tokenize_seconds", Float, nullable=False, comment="Wall time of the whole pass."),
    Column("cache_bytes_after", Integer, nullable=False, comment="Cache size after the pass and eviction."),
    Column(
        "cache_mode",
        Text,
        nullable=False,
        comment="on, off (training.cache.enabled: false) or bypassed (--no-cache).",
    ),
    Column("tokenizer_sha256", Text, nullable=False, comment="Tokenizer identity used by the pass."),
    Column("sequence_len", Integer, nullable=False, comment="sequence_len used by the pass."),
    Column("created_at", Text, nullable=False, comment="When the event was recorded."),
    Column(
        "cache_shared",
        Integer,
        nullable=False,
        server_default="0",
        comment="Of the hits, rows whose tokens were taken from another store of the home (entry_origins).",
    ),
    CheckConstraint("cache_mode IN ('on', 'off', 'bypassed')", name="tokenization_events_cache_mode"),
    comment="One tokenization pass per run: hits, misses, time and cache size.",
)

datasets = Table(
    "datasets",
    metadata,
    Column("id", Integer, primary_key=True, comment="Dataset id."),
    Column("name", Text, nullable=False, comment="Dataset name, e.g. fineweb-edu or dolly-15k."),
    Column(
        "kind", Text, nullable=False, comment="pretrain (token shards) or sft (tokens, offsets, loss mask)."
    ),
    Column("path", Text, nullable=False, unique=True, comment="Absolute path of the dataset directory."),
    Column("tokenizer_sha256", Text, nullable=False, comment="Identity of the tokenizer that built it."),
    Column("token_dtype", Text, nullable=False, comment="uint16 or uint32, as in meta.json."),
    Column("vocab_size", Integer, nullable=False, comment="Vocabulary size of that tokenizer."),
    Column("seed", Integer, comment="Seed of the split and shuffles."),
    Column("meta_json", Text, nullable=False, comment="The dataset's meta.json, verbatim."),
    Column("registered_at", Text, nullable=False, comment="When it was (last) registered."),
    CheckConstraint("kind IN ('pretrain', 'sft')", name="datasets_kind"),
    CheckConstraint("token_dtype IN ('uint16', 'uint32')", name="datasets_token_dtype"),
    comment="Token datasets built by `dlm data`; registering is idempotent.",
    sqlite_autoincrement=True,
)

dataset_files = Table(
    "dataset_files",
    metadata,
    Column("id", Integer, primary_key=True, comment="File id."),
    Column(
        "dataset_id",
        Integer,
        ForeignKey("datasets.id", ondelete="CASCADE"),
        nullable=False,
        comment="The dataset the file belongs to.",
    ),
    Column("split", Text, nullable=False, comment="train or val."),
    Column("role", Text, nullable=False, comment="tokens, doc_index, offsets or loss_mask."),
    Column("path", Text, nullable=False, comment="File path relative to the dataset directory."),
    Column(
        "shard_index", Integer, nullable=False, comment="Position of the shard within its split (0-based)."
    ),
    Column("token_offset", Integer, nullable=False, comment="Tokens in earlier shards of the split."),
    Column("token_count", Integer, nullable=False, comment="Tokens in this file (0 for index files)."),
    Column("doc_count", Integer, nullable=False, comment="Documents or examples covered by this file."),
    Column("bytes", Integer, nullable=False, comment="File size."),
    Column("sha256", Text, nullable=False, comment="sha256 of the file (sha256:...)."),
    UniqueConstraint("dataset_id", "path", name="dataset_files_path"),
    comment="Every shard and index file of a dataset, with token counts and offsets.",
)

source_stats = Table(
    "source_stats",
    metadata,
    Column("path", Text, nullable=False, comment="Absolute path of the file as read."),
    Column("relpath", Text, nullable=False, comment="Its path relative to the directive root."),
    Column("size", Integer, nullable=False, comment="st_size when it was read."),
    Column("mtime_ns", Integer, nullable=False, comment="st_mtime_ns when it was read."),
    Column("ctime_ns", Integer, nullable=False, comment="st_ctime_ns when it was read."),
    Column("inode", Integer, nullable=False, comment="st_ino when it was read."),
    Column("status", Text, nullable=False, comment="ok, binary or encoding (skipped kinds)."),
    Column("digest", Text, comment="Section digest (sha256 hex) when status is ok."),
    Column(
        "checked_ns",
        Integer,
        nullable=False,
        comment="When it was read (ns since the epoch), for the racy check.",
    ),
    Column(
        "row_key", Text, comment="Key of its text row (sha256:...) when status is ok; NULL in old records."
    ),
    PrimaryKeyConstraint("path", "relpath", name="source_stats_pk"),
    CheckConstraint("status IN ('ok', 'binary', 'encoding')", name="source_stats_status"),
    comment="What each source file looked like when last read, so unchanged files are not read again.",
)

pass_snapshots = Table(
    "pass_snapshots",
    metadata,
    Column("id", Integer, primary_key=True, comment="Snapshot id."),
    Column("document", Text, nullable=False, unique=True, comment="Real path of the .dlm file."),
    Column(
        "context",
        Text,
        nullable=False,
        comment="What the expansion depended on besides the tree (JSON: dlmstore version, roots, policy, home).",
    ),
    Column("dlm_sha256", Text, nullable=False, comment="sha256 of the document's bytes."),
    Column("tokenizer_sha256", Text, nullable=False, comment="The tokenizer the entries belong to."),
    Column("sequence_len", Integer, nullable=False, comment="training.sequence_len of the pass."),
    Column("run_id", Integer, ForeignKey("runs.id"), nullable=False, comment="The pass that took it."),
    Column("created_at", Text, nullable=False, comment="When (ISO 8601 UTC)."),
    Column("dir_paths", LargeBinary, nullable=False, comment="Folders the walk listed, NUL-separated."),
    Column(
        "dir_stamps",
        LargeBinary,
        nullable=False,
        comment="Their mtime_ns, ctime_ns and inode, as little-endian 64-bit integers.",
    ),
    Column("file_paths", LargeBinary, nullable=False, comment="Files the pass examined, NUL-separated."),
    Column(
        "file_stamps",
        LargeBinary,
        nullable=False,
        comment="Their size, mtime_ns, ctime_ns and inode, as little-endian 64-bit integers.",
    ),
    Column(
        "cache_changes", Integer, nullable=False, comment="cache_totals.changes when the entries were found."
    ),
    Column(
        "segment_reach",
        Text,
        nullable=False,
        comment="JSON: how many bytes of each segment the entries need.",
    ),
    Column("entry_ids", LargeBinary, nullable=False, comment="The cache entries used, as 64-bit integers."),
    Column(
        "result", Text, nullable=False, comment="JSON: the pass's counts and each directive's provenance."
    ),
    comment="What a document's last all-hits tokenize pass found, and the stat fields that prove it still holds.",
)

adapters = Table(
    "adapters",
    metadata,
    Column("id", Integer, primary_key=True, comment="Adapter row id."),
    Column("version", Integer, nullable=False, unique=True, comment="N of adapter/versions/vNNNN."),
    Column("run_id", Integer, ForeignKey("runs.id"), nullable=False, comment="The train run that wrote it."),
    Column(
        "phase",
        Text,
        nullable=False,
        server_default="sft",
        comment="sft, or preference for an adapter trained on preference pairs after SFT.",
    ),
    Column("method", Text, comment="dpo or orpo for a preference adapter; NULL for sft."),
    Column(
        "parent_version",
        Integer,
        ForeignKey("adapters.version"),
        comment="The SFT adapter version a preference adapter started from; NULL for sft.",
    ),
    Column("path", Text, nullable=False, comment="Folder relative to the store directory."),
    Column("sha256", Text, nullable=False, comment="sha256 of adapter_model.safetensors (sha256:...)."),
    Column("bytes", Integer, nullable=False, comment="Size of adapter_model.safetensors."),
    Column("base_model", Text, nullable=False, comment="base_model it was trained on."),
    Column("steps", Integer, nullable=False, comment="Optimizer steps taken in its phase."),
    Column("final_loss", Float, comment="Training loss at the last logged step of its phase."),
    Column("created_at", Text, nullable=False, comment="When it was registered."),
    Column(
        "name",
        Text,
        comment="The named adapter it is a version of (training.adapters); NULL for a document's one adapter.",
    ),
    UniqueConstraint("run_id", "phase", name="adapters_run_phase"),
    CheckConstraint("phase IN ('sft', 'preference')", name="adapters_phase"),
    CheckConstraint(
        "(phase = 'sft' AND method IS NULL AND parent_version IS NULL) OR "
        "(phase = 'preference' AND method IS NOT NULL AND method IN ('dpo', 'orpo') "
        "AND parent_version IS NOT NULL)",
        name="adapters_preference_origin",
    ),
    comment="LoRA adapter versions, registered only after their files are complete; one per run and phase.",
)
Index("adapters_name_version", adapters.c.name, adapters.c.version)

gates = Table(
    "gates",
    metadata,
    Column("id", Integer, primary_key=True, comment="Gate id; AUTOINCREMENT, never reused."),
    Column(
        "run_id",
        Integer,
        ForeignKey("runs.id"),
        nullable=False,
        comment="The gate run that fitted it (runs.command = 'gate', after the invocation's adapters).",
    ),
    Column("path", Text, nullable=False, unique=True, comment="Folder relative to the store directory."),
    Column(
        "mode", Text, nullable=False, comment="trained, or uniform (fewer prompts than the cold-start floor)."
    ),
    Column("sha256", Text, comment="sha256 of gate.safetensors (sha256:...); NULL in uniform mode."),
    Column("bytes", Integer, comment="Size of gate.safetensors; NULL in uniform mode."),
    Column(
        "adapters",
        Text,
        nullable=False,
        comment="JSON: the adapters it routes between, in output order, each with the version it chose for.",
    ),
    Column("input_dim", Integer, nullable=False, comment="The base's hidden size (the gate's input)."),
    Column("hidden_proj_dim", Integer, nullable=False, comment="training.gate.hidden_proj_dim."),
    Column("steps", Integer, nullable=False, comment="Optimizer steps it trained (0 in uniform mode)."),
    Column("lr", Float, nullable=False, comment="training.gate.lr."),
    Column("entropy_lambda", Float, nullable=False, comment="training.gate.entropy_lambda."),
    Column("seed", Integer, nullable=False, comment="The seed of its initialisation and batches."),
    Column("prompts", Integer, nullable=False, comment="Tagged prompts it trained on."),
    Column("final_loss", Float, comment="Its loss at the last step; NULL in uniform mode."),
    Column(
        "mean_weights",
        Text,
        nullable=False,
        comment="JSON: its mean output over the training prompts, by adapter (dlm export's static mix).",
    ),
    Column("note", Text, comment="Why it is uniform, when it is."),
    Column("created_at", Text, nullable=False, comment="When it was registered."),
    CheckConstraint("mode IN ('trained', 'uniform')", name="gates_mode"),
    CheckConstraint(
        "(mode = 'trained' AND sha256 IS NOT NULL AND bytes IS NOT NULL) OR "
        "(mode = 'uniform' AND sha256 IS NULL AND bytes IS NULL)",
        name="gates_weights",
    ),
    comment="Learned gates over a document's named adapters (training.gate), one per train invocation.",
    sqlite_autoincrement=True,
)

train_steps = Table(
    "train_steps",
    metadata,
    Column(
        "run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False, comment="The train run."
    ),
    Column("phase", Text, nullable=False, server_default="sft", comment="Training phase: sft or preference."),
    Column("step", Integer, nullable=False, comment="Optimizer step, counted from 1 in each phase."),
    Column("epoch", Float, comment="Fractional epoch at that step."),
    Column("loss", Float, comment="Training loss logged at that step."),
    Column("learning_rate", Float, comment="Learning rate at that step."),
    Column("tokens_per_second", Float, comment="Training throughput since the previous log."),
    Column("recorded_at", Text, nullable=False, comment="When it was logged."),
    PrimaryKeyConstraint("run_id", "phase", "step", name="train_steps_pk"),
    CheckConstraint("phase IN ('sft', 'preference')", name="train_steps_phase"),
    comment="Loss and learning rate per logged training step, per phase.",
)

train_step_metrics = Table(
    "train_step_metrics",
    metadata,
    Column(
        "run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False, comment="The train run."
    ),
    Column("phase", Text, nullable=False, comment="Training phase: sft or preference."),
    Column("step", Integer, nullable=False, comment="Optimizer step (a row of train_steps)."),
    Column(
        "name",
        Text,
        nullable=False,
        comment="The key as TRL logs it, e.g. rewards/margins, rewards/accuracies, grad_norm.",
    ),
    Column("value", Float, comment="Its value at that step (NULL for NaN)."),
    PrimaryKeyConstraint("run_id", "phase", "step", "name", name="train_step_metrics_pk"),
    CheckConstraint("phase IN ('sft', 'preference')", name="train_step_metrics_phase"),
    comment="Every other number the trainer logs at a step (preference rewards, margins, accuracies, ...).",
    sqlite_with_rowid=False,
)

run_datasets = Table(
    "run_datasets",
    metadata,
    Column(
        "run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False, comment="The train run."
    ),
    Column("position", Integer, nullable=False, comment="Order of the input in the run's mixture, from 0."),
    Column("path", Text, nullable=False, comment="Absolute path of the dataset directory."),
    Column("kind", Text, nullable=False, comment="pretrain (packed windows) or sft (masked conversations)."),
    Column("name", Text, nullable=False, comment="The dataset's name from its meta.json."),
    Column("split", Text, nullable=False, comment="The split trained on: train or val."),
    Column("weight", Float, nullable=False, comment="Mixture weight; the document's rows weigh 1."),
    Column("meta_sha256", Text, nullable=False, comment="sha256 of the dataset's meta.json: its identity."),
    Column("tokenizer_sha256", Text, nullable=False, comment="Tokenizer the dataset was built with."),
    Column("tokens_available", Integer, nullable=False, comment="Tokens the split holds."),
    Column("samples_used", Integer, nullable=False, server_default="0", comment="Items the run trained on."),
    Column("tokens_used", Integer, nullable=False, server_default="0", comment="Tokens of those items."),
    PrimaryKeyConstraint("run_id", "position", name="run_datasets_pk"),
    CheckConstraint("kind IN ('pretrain', 'sft')", name="run_datasets_kind"),
    comment="The token datasets a train run mixed in, and how much of each it used.",
)

run_ranks = Table(
    "run_ranks",
    metadata,
    Column(
        "run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False, comment="The train run."
    ),
    Column("phase", Text, nullable=False, comment="Training phase: sft or preference."),
    Column("rank", Integer, nullable=False, comment="Process rank, 0 to world_size - 1."),
    Column("samples", Integer, nullable=False, comment="Items this rank trained on."),
    Column("tokens", Integer, nullable=False, comment="Tokens of those items (padding excluded)."),
    Column(
        "samples_path",
        Text,
        comment="The .npy of the item indices this rank trained on, relative to the store.",
    ),
    PrimaryKeyConstraint("run_id", "phase", "rank", name="run_ranks_pk"),
    comment="What each process of a training phase trained on.",
)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("run_id", Integer, ForeignKey("runs.id"), nullable=False, comment="The train run that wrote it."),
    Column("phase", Text, nullable=False, comment="Training phase: sft or preference."),
    Column("step", Integer, nullable=False, comment="Optimizer steps done when it was written."),
    Column("path", Text, nullable=False, unique=True, comment="Folder relative to the store."),
    Column("dlm_sha256", Text, nullable=False, comment="sha256 of the document it was trained from."),
    Column(
        "base_model",
        Text,
        nullable=False,
        comment="The base model: its name (a local base's folder) @ its revision or sha256.",
    ),
    Column(
        "inputs_sha256",
        Text,
        nullable=False,
        comment="sha256 over the identities of the token datasets and their weights.",
    ),
    Column("world_size", Integer, nullable=False, comment="Processes the run trained on."),
    Column("micro_batch_size", Integer, nullable=False, comment="Items per rank per forward pass."),
    Column("grad_accum", Integer, nullable=False, comment="Micro-batches per optimizer step."),
    Column("seed", Integer, nullable=False, comment="The run's seed."),
    Column("created_at", Text, nullable=False, comment="When the checkpoint was registered."),
    Column(
        "files",
        Text,
        comment="JSON object: each file of the folder (relative path) -> its sha256, taken when the "
        "checkpoint was registered and checked before it is resumed; NULL before revision 0011.",
    ),
    Column(
        "rows_sha256",
        Text,
        comment="sha256 over the keys of the rows the run trains on (sources included); NULL before 0011.",
    ),
    Column(
        "plan_sha256",
        Text,
        comment="sha256 over every training setting that changes the adapter, overrides included; "
        "NULL before 0011.",
    ),
    CheckConstraint("phase IN ('sft', 'preference')", name="checkpoints_phase"),
    comment="Complete checkpoints of interrupted or running train runs (`dlm train --resume`).",
)

document_paths = Table(
    "document_paths",
    metadata,
    Column(
        "path", Text, primary_key=True, comment="Absolute, resolved path of a document that used this store."
    ),
    Column("first_seen_at", Text, nullable=False, comment="When a run first read the document there."),
    Column("last_seen_at", Text, nullable=False, comment="When a run last read the document there."),
    Column("last_run_id", Integer, ForeignKey("runs.id"), comment="The newest run that read it there."),
    comment="Every path a document that used this store was read at; `dlm stores gc` removes a store only "
    "when every one of them is gone.",
)

lock_records = Table(
    "lock_records",
    metadata,
    Column("id", Integer, primary_key=True, comment="Lock record id."),
    Column("run_id", Integer, ForeignKey("runs.id"), comment="The train run it was captured for."),
    Column("created_at", Text, nullable=False, comment="When it was recorded."),
    Column(
        "decision",
        Text,
        nullable=False,
        comment="written (validated), updated (--update-lock) or ignored (--ignore-lock).",
    ),
    Column("lock_version", Integer, nullable=False, comment="Format version of the lock."),
    Column("dlm_sha256", Text, nullable=False, comment="sha256 of the .dlm document."),
    Column("base_model_revision", Text, comment="Revision of the base model (hub commit or content hash)."),
    Column("base_model_sha256", Text, comment="sha256 of the base model weights, when known."),
    Column("hardware_tier", Text, nullable=False, comment="cpu, cuda, mps or rocm."),
    Column("determinism_class", Text, nullable=False, comment="strong, best-effort or advisory."),
    Column("seed", Integer, nullable=False, comment="Training seed."),
    Column("lock_json", Text, nullable=False, comment="The whole lock, as written to dlm.lock."),
    CheckConstraint("decision IN ('written', 'updated', 'ignored')", name="lock_records_decision"),
    comment="Every reproducibility lock captured by dlm train (dlm.lock is the latest written one).",
    sqlite_autoincrement=True,
)

exports = Table(
    "exports",
    metadata,
    Column("id", Integer, primary_key=True, comment="Export id; AUTOINCREMENT, never reused."),
    Column(
        "adapter_version",
        Integer,
        ForeignKey("adapters.version"),
        nullable=False,
        comment="The adapter version exported.",
    ),
    Column("target", Text, nullable=False, comment="What it was exported for: hf, ollama or llama-server."),
    Column(
        "quant",
        Text,
        comment="The GGUF files' quantisation: Q4_K_M, Q5_K_M, Q6_K, Q8_0 or F16; NULL for hf (no GGUF).",
    ),
    Column("path", Text, nullable=False, comment="The export folder (absolute)."),
    Column(
        "files",
        Text,
        nullable=False,
        comment="JSON object: each file of the export (relative path) -> {sha256, bytes}, taken as it "
        "was written; `dlm prompt --backend llama.cpp` checks the GGUF against it.",
    ),
    Column("manifest_sha256", Text, nullable=False, comment="sha256 of the folder's dlm-export.json."),
    Column(
        "tool_versions",
        Text,
        nullable=False,
        comment="JSON object: the versions of llama_cpp (llama-cpp-python), gguf, transformers, peft "
        "and torch that wrote it.",
    ),
    Column("seconds", Float, nullable=False, comment="How long the export took."),
    Column("created_at", Text, nullable=False, comment="When it was recorded."),
    Column(
        "mix",
        Text,
        comment="JSON object for an export of named adapters mixed into one (`--adapter-mix`): parts "
        "[{name, version, sha256, weight}], combination (PEFT's combination_type) and gate_id (the gate "
        "whose mean output gave the weights, else null); NULL for an export of one adapter.",
    ),
    CheckConstraint("target IN ('hf', 'ollama', 'llama-server')", name="exports_target"),
    CheckConstraint(
        "(target = 'hf' AND quant IS NULL) OR quant IN ('Q4_K_M', 'Q5_K_M', 'Q6_K', 'Q8_0', 'F16')",
        name="exports_quant",
    ),
    comment="Every `dlm export` of an adapter: its folder, files and their sha256, the tools that wrote them.",
    sqlite_autoincrement=True,
)

entry_origins = Table(
    "entry_origins",
    metadata,
    Column(
        "entry_id",
        Integer,
        ForeignKey("cache_entries.id", ondelete="CASCADE"),
        primary_key=True,
        comment="The cache entry (goes with it: entry ids are reused).",
    ),
    Column("from_store", Text, nullable=False, comment="The document id of the store it was taken from."),
    Column("from_entry_id", Integer, nullable=False, comment="Its cache_entries.id there."),
    Column(
        "how",
        Text,
        nullable=False,
        comment="link (that store's segment hard-linked beside this store.db) or copy (its bytes copied "
        "into a segment of this store).",
    ),
    Column("run_id", Integer, ForeignKey("runs.id"), comment="The run whose pass took it."),
    Column("created_at", Text, nullable=False, comment="When it was taken."),
    CheckConstraint("how IN ('link', 'copy')", name="entry_origins_how"),
    comment="Cache entries taken from another store of the home instead of tokenized (dlmstore.cache.share).",
)

row_signatures = Table(
    "row_signatures",
    metadata,
    Column("row_key", Text, primary_key=True, comment="The text row's key (sha256:...)."),
    Column(
        "scheme",
        Text,
        nullable=False,
        comment="How the signature was made (shingle words, permutations, seed), e.g. minhash-v1:w5:p128:s1; "
        "a signature of another scheme is made again.",
    ),
    Column(
        "content_sha256",
        Text,
        nullable=False,
        comment="sha256 of the row's text (a source file's without its # source header): exact duplicates.",
    ),
    Column(
        "shingles", Integer, nullable=False, comment="Distinct word shingles the signature was made from."
    ),
    Column(
        "minhash",
        LargeBinary,
        nullable=False,
        comment="The MinHash signature, one little-endian uint32 per permutation.",
    ),
    Column("created_at", Text, nullable=False, comment="When it was made (or taken from another store)."),
    comment="Content hash and MinHash signature of each text row, so duplicates are found without hashing again.",
)

dedup_runs = Table(
    "dedup_runs",
    metadata,
    Column(
        "run_id",
        Integer,
        ForeignKey("runs.id", ondelete="CASCADE"),
        primary_key=True,
        comment="The tokenize or train run.",
    ),
    Column(
        "mode",
        Text,
        nullable=False,
        comment="training.dedup of the run: off (report only), exact or near (what was dropped).",
    ),
    Column(
        "scheme",
        Text,
        nullable=False,
        comment="The signature scheme and threshold the clusters were found with.",
    ),
    Column(
        "corpus_sha256",
        Text,
        nullable=False,
        comment="sha256 of the text rows' keys and paths, in order: a corpus with the same value has the "
        "same clusters.",
    ),
    Column(
        "members_run_id",
        Integer,
        nullable=False,
        comment="The run whose dedup_members rows list the clusters: this run, or an earlier one with "
        "the same corpus_sha256 (a warm pass records no members again).",
    ),
    Column("rows", Integer, nullable=False, comment="Text rows compared."),
    Column("clusters", Integer, nullable=False, comment="Clusters of two or more duplicate rows."),
    Column("duplicate_rows", Integer, nullable=False, comment="Rows in clusters besides each kept row."),
    Column(
        "dropped_rows",
        Integer,
        nullable=False,
        comment="Rows the run left out of training (0 when mode is off).",
    ),
    Column(
        "signatures_computed", Integer, nullable=False, comment="Rows whose signature was made by this run."
    ),
    Column("seconds", Float, nullable=False, comment="Time spent finding the clusters."),
    Column("created_at", Text, nullable=False, comment="When it was recorded."),
    CheckConstraint("mode IN ('off', 'exact', 'near')", name="dedup_runs_mode"),
    comment="What each run's duplicate search found among its text rows (dlmstore.corpus.dedup).",
)

dedup_members = Table(
    "dedup_members",
    metadata,
    Column(
        "run_id",
        Integer,
        ForeignKey("dedup_runs.run_id", ondelete="CASCADE"),
        nullable=False,
        comment="The run.",
    ),
    Column("cluster", Integer, nullable=False, comment="The cluster's number in the run, from 1."),
    Column("row_key", Text, nullable=False, comment="The member row's key."),
    Column(
        "path",
        Text,
        nullable=False,
        comment="Where the row comes from: a source file (under its directive's path), or :LINE for a prose "
        "section of the document's body (shown as document:LINE).",
    ),
    Column(
        "similarity",
        Float,
        nullable=False,
        comment="Estimated Jaccard similarity to the cluster's kept row (1.0: the same text).",
    ),
    Column("drop_exact", Integer, nullable=False, comment="1 when training.dedup: exact leaves it out."),
    Column(
        "drop_near",
        Integer,
        nullable=False,
        comment="1 when training.dedup: near leaves it out (every member but the kept row).",
    ),
    PrimaryKeyConstraint("run_id", "row_key", name="dedup_members_pk"),
    comment="The members of each run's duplicate clusters.",
)

val_steps = Table(
    "val_steps",
    metadata,
    Column(
        "run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False, comment="The train run."
    ),
    Column(
        "phase", Text, nullable=False, comment="Training phase: sft (the one that validates during training)."
    ),
    Column("step", Integer, nullable=False, comment="Optimizer step the val split was evaluated after."),
    Column(
        "loss", Float, comment="Val loss: mean negative log-likelihood per target token (NULL if not finite)."
    ),
    Column("perplexity", Float, comment="exp(loss) (NULL when it overflows)."),
    Column(
        "rows",
        Integer,
        nullable=False,
        comment="Val items evaluated (the document's val rows, datasets' val items).",
    ),
    Column("tokens", Integer, nullable=False, comment="Target tokens the loss is the mean over."),
    Column("recorded_at", Text, nullable=False, comment="When it was evaluated."),
    PrimaryKeyConstraint("run_id", "phase", "step", name="val_steps_pk"),
    CheckConstraint("phase IN ('sft', 'preference')", name="val_steps_phase"),
    comment="Val loss and perplexity at each evaluation step of a training phase (dlmstore.eval).",
)

evaluations = Table(
    "evaluations",
    metadata,
    Column("id", Integer, primary_key=True, comment="Evaluation id."),
    Column(
        "run_id",
        Integer,
        ForeignKey("runs.id", ondelete="CASCADE"),
        nullable=False,
        comment="The train run (after a phase) or eval run (`dlm eval`).",
    ),
    Column(
        "phase", Text, nullable=False, comment="sft or preference (after that phase of a train run), or eval."
    ),
    Column(
        "model", Text, nullable=False, comment="What was evaluated: base, or the adapter version as v0003."
    ),
    Column("adapter_version", Integer, comment="The adapter version evaluated; NULL for the base."),
    Column("val_loss", Float, comment="Val loss of the model (NULL without val rows, or not finite)."),
    Column("val_perplexity", Float, comment="exp(val_loss)."),
    Column("val_rows", Integer, nullable=False, comment="Val items evaluated."),
    Column("val_tokens", Integer, nullable=False, comment="Target tokens of those items."),
    Column("probes", Integer, nullable=False, comment="Probes asked (rows of probe_results)."),
    Column("probe_nll", Float, comment="Mean over the probes of the reference answer's mean token NLL."),
    Column("probe_exact", Integer, nullable=False, comment="Probes answered exactly (normalised)."),
    Column("probe_f1", Float, comment="Mean token-F1 of the answers against the references."),
    Column("eval_interval", Integer, comment="Train runs' adapter: steps between val evaluations."),
    Column("best_step", Integer, comment="Train runs' adapter: the step of the best val loss."),
    Column("best_val_loss", Float, comment="Train runs' adapter: the best val loss during the phase."),
    Column("stopped_early", Integer, comment="Train runs' adapter: 1 when early stopping ended the phase."),
    Column("stop_reason", Text, comment="Train runs' adapter: why the phase ended where it did."),
    Column("seconds", Float, nullable=False, comment="Time spent evaluating it (val loss and probes)."),
    Column("created_at", Text, nullable=False, comment="When it was recorded."),
    Column(
        "retained_probes",
        Integer,
        nullable=False,
        server_default="0",
        comment="Probes of earlier versions the document no longer holds, asked too (probe_results.retained).",
    ),
    Column(
        "retained_exact", Integer, nullable=False, server_default="0", comment="Of those, answered exactly."
    ),
    Column("retained_nll", Float, comment="Their mean reference NLL; NULL without such probes."),
    Column("retained_f1", Float, comment="Their mean token-F1; NULL without such probes."),
    Column(
        "retention_loss",
        Float,
        comment="Loss on the frozen retention slice's rows the document no longer holds (NULL: none).",
    ),
    Column(
        "retention_rows", Integer, nullable=False, server_default="0", comment="Rows of that slice evaluated."
    ),
    Column(
        "retention_tokens",
        Integer,
        nullable=False,
        server_default="0",
        comment="Target tokens of those rows.",
    ),
    Column(
        "retention_previous_loss",
        Float,
        comment="Train runs' adapter: the previous adapter's loss on the same rows (NULL: none).",
    ),
    Column(
        "retention_delta",
        Float,
        comment="retention_loss less retention_previous_loss: above 0, the new adapter forgot some.",
    ),
    UniqueConstraint("run_id", "phase", "model", name="evaluations_run_phase_model"),
    CheckConstraint("phase IN ('sft', 'preference', 'eval')", name="evaluations_phase"),
    CheckConstraint(
        "(model = 'base' AND adapter_version IS NULL) OR model = printf('v%04d', adapter_version)",
        name="evaluations_model",
    ),
    comment="One model evaluated by a run: its val loss and probe scores (dlmstore.eval).",
    sqlite_autoincrement=True,
)

probe_results = Table(
    "probe_results",
    metadata,
    Column(
        "evaluation_id",
        Integer,
        ForeignKey("evaluations.id", ondelete="CASCADE"),
        nullable=False,
        comment="The evaluation.",
    ),
    Column("position", Integer, nullable=False, comment="The probe's place in the run's list, from 0."),
    Column("row_key", Text, nullable=False, comment="The key of the probe's Q/A row."),
    Column("marked", Integer, nullable=False, comment="1 for a `### Q !probe` pair, 0 for a sampled one."),
    Column("question", Text, nullable=False, comment="The question asked."),
    Column("reference", Text, nullable=False, comment="The document's answer."),
    Column("answer", Text, nullable=False, comment="The model's greedy answer."),
    Column("answer_tokens", Integer, nullable=False, comment="Tokens generated."),
    Column("nll", Float, comment="Mean negative log-likelihood of the reference's tokens (teacher-forced)."),
    Column("exact", Integer, nullable=False, comment="1 when the answer is the reference, once normalised."),
    Column("f1", Float, nullable=False, comment="Token-F1 of the answer against the reference."),
    Column(
        "retained",
        Integer,
        nullable=False,
        server_default="0",
        comment="1 for a probe an earlier version held and the document no longer holds (replay history).",
    ),
    PrimaryKeyConstraint("evaluation_id", "row_key", name="probe_results_pk"),
    comment="Each probe's answer and scores, per evaluation (dlmstore.eval.probes).",
)

val_splits = Table(
    "val_splits",
    metadata,
    Column(
        "run_id",
        Integer,
        ForeignKey("runs.id", ondelete="CASCADE"),
        primary_key=True,
        comment="The train run that drew the split.",
    ),
    Column(
        "mode",
        Text,
        nullable=False,
        comment="training.dedup of the run: off (contaminated rows held out) or exact, near (kept out).",
    ),
    Column("seed", Integer, nullable=False, comment="The seed the split was drawn with."),
    Column("val_rows", Integer, nullable=False, comment="Rows of the document held out for validation."),
    Column(
        "contaminated_rows",
        Integer,
        nullable=False,
        comment="Validation rows, as drawn, that duplicate a training row (rows of val_contamination).",
    ),
    Column(
        "kept_out_rows",
        Integer,
        nullable=False,
        comment="Of those, rows training.dedup kept out of the split (they train instead).",
    ),
    Column(
        "from_run_id",
        Integer,
        comment="The earlier run over the same clusters, seed and mode whose rows these were read from; "
        "NULL when the run found them.",
    ),
    Column("seconds", Float, nullable=False, comment="Time spent finding them."),
    Column("created_at", Text, nullable=False, comment="When it was recorded."),
    CheckConstraint("mode IN ('off', 'exact', 'near')", name="val_splits_mode"),
    comment="The validation split each train run drew, and how many of its rows duplicated training rows.",
)

val_contamination = Table(
    "val_contamination",
    metadata,
    Column(
        "run_id",
        Integer,
        ForeignKey("val_splits.run_id", ondelete="CASCADE"),
        nullable=False,
        comment="The run.",
    ),
    Column("row_key", Text, nullable=False, comment="The validation row's key."),
    Column(
        "path",
        Text,
        nullable=False,
        comment="Where it comes from, as dlm show lists cluster members (a source file, or document:LINE).",
    ),
    Column("train_row_key", Text, nullable=False, comment="The training row it is most like."),
    Column("train_path", Text, nullable=False, comment="Where that row comes from."),
    Column("kind", Text, nullable=False, comment="exact (the same text) or near."),
    Column(
        "similarity",
        Float,
        nullable=False,
        comment="Estimated Jaccard similarity of the two rows' 5-word shingles (1.0 when exact).",
    ),
    Column(
        "kept_out",
        Integer,
        nullable=False,
        comment="1 when training.dedup kept it out of the split (it trained); 0 when it was held out.",
    ),
    PrimaryKeyConstraint("run_id", "row_key", name="val_contamination_pk"),
    CheckConstraint("kind IN ('exact', 'near')", name="val_contamination_kind"),
    comment="Validation rows that duplicate training rows, per train run (dlmstore.corpus.holdout).",
)

history_generations = Table(
    "history_generations",
    metadata,
    Column(
        "generation",
        Integer,
        primary_key=True,
        comment="1, 2, ...: a version of the document as trained (a run that trains another row set opens the next).",
    ),
    Column(
        "rows_sha256",
        Text,
        nullable=False,
        comment="sha256: of the sorted row keys its runs trained (what decides whether a run joins it).",
    ),
    Column("rows", Integer, nullable=False, comment="How many rows its runs trained."),
    Column("first_run_id", Integer, nullable=False, comment="The run that opened it."),
    Column("created_at", Text, nullable=False, comment="When that run published."),
    comment="The versions of the document as trained: what the replay draw weighs recency by (dlmstore.replay).",
)

history_runs = Table(
    "history_runs",
    metadata,
    Column(
        "run_id",
        Integer,
        ForeignKey("runs.id", ondelete="CASCADE"),
        primary_key=True,
        comment="A completed train run.",
    ),
    Column("generation", Integer, nullable=False, comment="The generation it trained (history_generations)."),
    comment="Which generation each completed train run belongs to.",
)

history_content = Table(
    "history_content",
    metadata,
    Column("id", Integer, primary_key=True, comment="The content's id (history_rows.content_id)."),
    Column(
        "content",
        LargeBinary,
        nullable=False,
        comment='zlib (level 6) of the canonical JSON {"kind": ..., "data": ...} of the row.',
    ),
    comment="The content of each history row, compressed, apart so scans of history_rows stay small "
    "(removed with its row by the trigger history_rows_delete).",
)

history_rows = Table(
    "history_rows",
    metadata,
    Column(
        "key",
        LargeBinary,
        primary_key=True,
        comment="The row key's 32-byte sha256 digest (the key is 'sha256:' and its hex; the view history shows it).",
    ),
    Column("kind", Integer, nullable=False, comment="0 text, 1 messages, 2 preference."),
    Column(
        "supersede",
        Integer,
        comment="What an edit of the row replaces: the first 8 bytes (signed, never 0) of a sha256 of its "
        "first user message, its preference prompt or its training.sources path; NULL for body prose.",
    ),
    Column(
        "source", Text, comment="The training.sources file it came from (directive/relpath); NULL: the body."
    ),
    Column("probe", Integer, nullable=False, comment="1 when the row is a ### Q !probe pair."),
    Column(
        "retention",
        Integer,
        nullable=False,
        comment="1 when the row is in the frozen retention slice (decided once, when it entered; never drawn).",
    ),
    Column("first_generation", Integer, nullable=False, comment="The generation of its first run."),
    Column("last_generation", Integer, nullable=False, comment="The generation of its latest run."),
    Column("bytes", Integer, nullable=False, comment="Size of its canonical JSON content, uncompressed."),
    Column(
        "checksum",
        Integer,
        nullable=False,
        comment="CRC-32 of the key digest then that content, less 2**31 (dlm cache verify checks it).",
    ),
    Column("content_id", Integer, nullable=False, comment="Its content (history_content.id)."),
    CheckConstraint("length(key) = 32", name="history_rows_key"),
    CheckConstraint("kind IN (0, 1, 2)", name="history_rows_kind"),
    sqlite_with_rowid=False,
    comment="Every row a completed train run trained on: the replay history (dlmstore.replay.history). "
    "Its runs are those of its generations (history_runs; the view history names them).",
)

replay_runs = Table(
    "replay_runs",
    metadata,
    Column(
        "run_id",
        Integer,
        ForeignKey("runs.id", ondelete="CASCADE"),
        primary_key=True,
        comment="A completed train run.",
    ),
    Column("generation", Integer, nullable=False, comment="The generation it trained (history_generations)."),
    Column("sft_candidates", Integer, nullable=False, comment="History rows it could replay in SFT."),
    Column("preference_candidates", Integer, nullable=False, comment="Preference triples it could replay."),
    Column("sft_new", Integer, nullable=False, comment="SFT rows it trained that history did not hold."),
    Column("preference_new", Integer, nullable=False, comment="Preference triples new to history."),
    Column("sft_drawn", Integer, nullable=False, comment="SFT rows replayed (replay_draws)."),
    Column("preference_drawn", Integer, nullable=False, comment="Preference triples replayed."),
    Column(
        "draw_sha256",
        Text,
        nullable=False,
        comment="The draw's identity: sha256 of the generation, then each phase's drawn keys.",
    ),
    Column(
        "skipped",
        Text,
        comment="Why it did not replay: --no-replay, or training.replay.enabled: false; NULL: it drew.",
    ),
    comment="What each completed train run replayed from history (dlmstore.replay.run_plan).",
)

replay_draws = Table(
    "replay_draws",
    metadata,
    Column(
        "run_id",
        Integer,
        ForeignKey("runs.id", ondelete="CASCADE"),
        nullable=False,
        comment="The train run.",
    ),
    Column("key", LargeBinary, nullable=False, comment="The replayed row's key digest (history_rows.key)."),
    Column("phase", Text, nullable=False, comment="sft or preference: the phase it trained in."),
    Column("weight", Float, nullable=False, comment="Its weight in the draw (recency, at least the floor)."),
    Column(
        "last_generation", Integer, nullable=False, comment="The latest generation whose document held it."
    ),
    PrimaryKeyConstraint("run_id", "key", name="replay_draws_pk"),
    CheckConstraint("length(key) = 32", name="replay_draws_key"),
    CheckConstraint("phase IN ('sft', 'preference')", name="replay_draws_phase"),
    sqlite_with_rowid=False,
    comment="Each history row a train run replayed: train-only, never in val.",
)

"""The YAML frontmatter of a .dlm document, as validated pydantic models.

Every model forbids unknown keys so a typo (``trainig:``) is an error naming
the key instead of a silently ignored setting. Every field except ``dlm_id``
has a default, so a minimal document is just an id. ``dlmstore.document``
turns pydantic's validation errors into ``DocumentError`` with the file and
line of the offending key.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dlmstore.ulid import is_valid_ulid

#: The newest document format this dlmstore understands.
CURRENT_DLM_VERSION = 1

DEFAULT_BASE_MODEL = "smollm2-135m"

GIB = 1024**3


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceDirective(_Strict):
    """One ``training.sources`` entry: a folder (or file) of training text."""

    path: str
    include: list[str] = Field(default_factory=lambda: ["**/*"])
    exclude: list[str] = Field(default_factory=list)
    max_bytes_per_file: int | None = Field(default=None, gt=0)
    max_files: int | None = Field(default=None, gt=0)
    #: Set false to walk VCS dirs, virtualenvs, build output, secrets, ...
    default_excludes: bool = True


class CacheSettings(_Strict):
    """``training.cache``: the tokenized-section cache knobs."""

    enabled: bool = True
    max_bytes: int = Field(default=10 * GIB, gt=0)
    prune_older_than_days: int = Field(default=90, ge=0)


class TrainingSettings(_Strict):
    """``training``: tokenization, LoRA and optimizer knobs, and sources."""

    sequence_len: int = Field(default=2048, ge=64, le=32768)
    seed: int = 42
    r: int = Field(default=8, gt=0)
    alpha: int = Field(default=16, gt=0)
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0)
    learning_rate: float = Field(default=2e-4, gt=0.0)
    epochs: int = Field(default=1, gt=0)
    max_steps: int | None = Field(default=None, gt=0)
    batch_size: int = Field(default=2, gt=0)
    sources: list[SourceDirective] = Field(default_factory=list)
    sources_policy: Literal["permissive", "strict"] = "permissive"
    cache: CacheSettings = Field(default_factory=CacheSettings)


class Frontmatter(_Strict):
    """The whole frontmatter block of a .dlm document."""

    dlm_id: str
    dlm_version: int = Field(default=CURRENT_DLM_VERSION, ge=1)
    base_model: str = DEFAULT_BASE_MODEL
    system_prompt: str | None = None
    training: TrainingSettings = Field(default_factory=TrainingSettings)

    @field_validator("dlm_id")
    @classmethod
    def _ulid(cls, value: str) -> str:
        if not is_valid_ulid(value):
            raise ValueError(
                "must be a 26-character Crockford base32 ULID (run `dlm init` to mint one)"
            )
        return value

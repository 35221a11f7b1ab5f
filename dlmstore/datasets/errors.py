"""The errors of token datasets, all under :class:`dlmstore.errors.DlmError`.

Every message names the file (or source) that is wrong and says what to do,
so ``dlm data`` can print it as ``error: ...`` / ``hint: ...`` without a
traceback. Programming mistakes against the readers' API (a rank outside
the world size, a negative batch size) are reported the same way: in a
training script they are configuration errors a person fixes.
"""

from __future__ import annotations

from dlmstore.errors import DlmError


class DatasetError(DlmError):
    """A token dataset, its input or its reader configuration cannot be used."""


class DatasetFileError(DatasetError):
    """A file of a built dataset is missing, truncated or disagrees with meta.json."""


class SourceUnavailableError(DatasetError):
    """A data source of ``dlm data build-all`` cannot be reached or read."""


class ResumeError(DatasetError):
    """A loader checkpoint does not match the loader it is being loaded into."""

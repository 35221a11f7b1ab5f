"""One error hierarchy for everything dlm reports to a person.

Library code raises a subclass of :class:`DlmError` with a message that says
what is wrong (naming the file, line or field) and, where there is one, a
``hint`` saying what to do next. The CLI turns these into ``error: ...`` +
``hint: ...`` on stderr and exit code 1, in exactly one place
(``dlmstore.cli.main``). Anything else escaping is a bug.

Every subclass lives in this module, so the whole hierarchy reads in one
place. Dataset errors also cover programming mistakes against the readers'
API (a rank outside the world size, a negative batch size): in a training
script those are configuration errors a person fixes.
"""

from __future__ import annotations


class DlmError(Exception):
    """Base class: a problem a person can fix, reported without a traceback (exit ``exit_code``)."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message

    def reports(self) -> list[tuple[str, str | None]]:
        """``(message, hint)`` of each problem, for the CLI's ``error:`` lines."""
        return [(self.message, self.hint)]


class DocumentError(DlmError):
    """A .dlm document is missing, unreadable or malformed."""

    def __init__(
        self, path: object, message: str, *, line: int | None = None, hint: str | None = None
    ) -> None:
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {message}", hint=hint)
        self.path = str(path)
        self.line = line


class DocumentProblems(DocumentError):
    """Several problems in one document, reported together (each with its line)."""

    def __init__(self, problems: list[DocumentError]) -> None:
        first = problems[0]
        super().__init__(first.path, "", line=first.line, hint=first.hint)
        self.problems = problems
        self.message = "\n".join(problem.message for problem in problems)

    @staticmethod
    def of(problems: list[DocumentError]) -> DocumentError:
        """One error for ``problems`` in line order: the problem itself when it is alone."""
        ordered = sorted(problems, key=lambda p: p.line if p.line is not None else 0)
        return ordered[0] if len(ordered) == 1 else DocumentProblems(ordered)

    def reports(self) -> list[tuple[str, str | None]]:
        return [(problem.message, problem.hint) for problem in self.problems]


class SourceError(DlmError):
    """A training.sources directive cannot be expanded as written."""


class StoreError(DlmError):
    """A store directory or its database cannot be used."""


class StoreVersionError(StoreError):
    """The store database was written by a newer dlmstore than this one."""


class StoreDamagedError(StoreError):
    """The store database is damaged: SQLite finds it malformed, truncated or not a database."""

    def __init__(self, path: object, reason: str, *, hint: str | None = None) -> None:
        super().__init__(f"{path} is damaged: {reason}", hint=hint)
        self.path = str(path)
        self.reason = reason


class BaseModelError(DlmError):
    """A base model name cannot be resolved to a tokenizer or model."""


class AdapterChoiceError(DlmError):
    """A command's ``--adapter`` does not fit the document: a named adapter asked of a document
    that declares none, an undeclared name, or none asked where the document declares several.
    A usage error (exit 2), as in DLM."""

    exit_code = 2


class TemplateError(DlmError):
    """A template of the gallery is unknown, or its files are missing or malformed."""


class TorchUnavailableError(DlmError):
    """Work that runs a model needs torch, and torch cannot be loaded in this process."""


class TrainingError(DlmError):
    """A document cannot be trained as written."""


class RankError(TrainingError):
    """What a rank of ``dlm train --nproc`` reported to its launcher, raised there as the rank raised it."""

    def __init__(self, reports: list[tuple[str, str | None]]) -> None:
        super().__init__(reports[0][0], hint=reports[0][1])
        self.problems = reports

    def reports(self) -> list[tuple[str, str | None]]:
        return list(self.problems)


class ReportError(DlmError):
    """The store report cannot be written where it was asked for."""


class DurationError(DlmError):
    """A duration such as ``30d`` or ``12h`` could not be read."""


class LockError(DlmError):
    """A ``dlm.lock`` file or lock record cannot be read or used."""


class LockValidationError(DlmError):
    """This run's lock differs from ``dlm.lock`` in a way the mode does not accept."""


class ExportError(DlmError):
    """An adapter cannot be exported as asked (dlm export), or an export cannot be used."""


class DatasetError(DlmError):
    """A token dataset, its input or its reader configuration cannot be used."""


class DatasetFileError(DatasetError):
    """A file of a built dataset is missing, truncated or disagrees with meta.json."""


class SourceUnavailableError(DatasetError):
    """A data source of ``dlm data build-all`` cannot be reached or read."""


class ResumeError(DatasetError):
    """A loader checkpoint does not match the loader it is being loaded into."""


class ObjectStoreError(DlmError):
    """An object-store URL (``s3://bucket/prefix``) is malformed, or the store refused or did not answer."""


class PackError(DlmError):
    """A ``.dlm.pack`` cannot be written, read, installed or verified (``dlm pack``/``unpack``/``verify``)."""


class Terminated(KeyboardInterrupt):
    """A signal asked the process to stop (SIGTERM): raised where Ctrl-C raises KeyboardInterrupt.

    Being a KeyboardInterrupt, it runs the cleanup Ctrl-C runs (a run is
    recorded as failed, partial output removed, ranks and Ray stopped);
    ``dlmstore.cli.main`` turns it into one ``error:`` line and exit 128 + the signal.
    """

    def __init__(self, signum: int, detail: str | None = None) -> None:
        import signal

        self.signum = signum
        words = f"terminated by {signal.Signals(signum).name}"
        super().__init__(f"{words}: {detail}" if detail else words)

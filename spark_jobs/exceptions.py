"""Every error bucketindex raises on purpose, rooted at :class:`BucketIndexError`.

Each branch tells a caller what to do next, and carries the CLI's exit status for it as the
class attribute ``exit_code`` -- the one place the statuses are written: the CLI exits with it,
and the Airflow hook's ``EXIT_*`` constants (the operators' retry decisions) are read from it:

* :class:`BadInputError` -- fix the input: exit 2, one line, nothing written;
* :class:`RetryableError` -- try again (a conflict, a live writer): exit 3, nothing written,
  safe to rerun with the same batch id;
* :class:`StorageUnavailableError` -- the store did not answer (unreachable, throttled, a
  conditional put left undecided): exit 3, nothing committed, a scheduler retries;
* :class:`MissingDependencyError` -- install what is named: exit 1, one line;
* :class:`TableCorruptError` -- repair the table (a damaged or missing file of its own, a path
  recorded outside its root): exit 1, one line naming the file; :class:`IndexCorruptError`
  when the file is a record-index file, which a command rebuilds from the data.

This module imports nothing of the package but :mod:`spark_jobs.redaction` (which imports
nothing of it), so every layer (io, table, jobs, cli, the provider) can raise and catch the
same types without an import cycle. A message may quote a URI as the user gave it, credentials
in its query included: :class:`BucketIndexError` passes its message through
:func:`spark_jobs.redaction.redact_uri`, so no error of ours -- printed, logged, or kept by a
caller -- carries a secret.
"""

from __future__ import annotations

import shlex
from typing import ClassVar

from spark_jobs.redaction import redact_uri

__all__ = [
    "BucketIndexError",
    "BadInputError",
    "ConfigConflictError",
    "TableNotFoundError",
    "EngineUnsupportedError",
    "RetryableError",
    "ConflictError",
    "WriterAliveError",
    "InstantRolledBackError",
    "TableCorruptError",
    "IndexCorruptError",
    "PathEscapeError",
    "UnsupportedStorageError",
    "StorageUnavailableError",
    "MissingDependencyError",
    "exit_code_of",
]


class BucketIndexError(Exception):
    """The root: an error bucketindex raised knowing what it means.

    ``exit_code`` is the CLI's exit status for it (the README's exit-status table): each branch
    below sets its own, and the CLI (``spark_jobs.cli``) and the Airflow hook read it from here,
    so a new error class cannot be left without one."""

    #: the CLI's exit status: 1 the table, its store or the environment is at fault
    exit_code: ClassVar[int] = 1

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact_uri(a) if isinstance(a, str) else a for a in args))


class BadInputError(BucketIndexError, ValueError):
    """Bad usage or input: reported as one line, exit status 2, nothing written."""

    exit_code: ClassVar[int] = 2


class ConfigConflictError(BadInputError):
    """A write's options contradict the table's fixed options."""


class TableNotFoundError(BadInputError):
    """No table at the given location (no ``.bucketindex/table.json``)."""


class EngineUnsupportedError(BadInputError):
    """The engine asked for cannot run this work with the table's rules (e.g. ``--engine arrow``
    on a key type whose text form only Spark defines). ``--engine auto`` picks the other engine
    instead; asked for explicitly, it is bad input (exit 2, nothing written)."""


class UnsupportedStorageError(BadInputError):
    """A table on a store this release cannot commit to safely (no create-if-absent primitive:
    HDFS through pyarrow, GCS, Azure): refused when the table is opened, before anything is
    written, never as a ``NotImplementedError`` at the first commit (format.md §10)."""


class MissingDependencyError(BucketIndexError, RuntimeError):
    """A package or connector this run needs is not installed: exit 1, one line naming it.

    Not bad input: the command and the data are fine, and the same command works once the
    package is installed."""

    exit_code: ClassVar[int] = 1


class RetryableError(BucketIndexError, RuntimeError):
    """Nothing was written and the same call may succeed later: exit status 3, a scheduler retries."""

    exit_code: ClassVar[int] = 3


class ConflictError(RetryableError):
    """Concurrent writes conflicted and the bounded retries ran out."""


class WriterAliveError(RetryableError):
    """A pending instant still has a live writer: the table (or that instant) is busy."""


class StorageUnavailableError(RetryableError):
    """The store did not answer or could not decide (a connection refused, a timeout, a conditional
    put that kept conflicting): nothing was committed, and the same call may succeed later.
    Never bad input: the batch is fine."""


class InstantRolledBackError(RetryableError):
    """Another process rolled this writer's instant back (``rollback --force``) before it completed."""


class TableCorruptError(BucketIndexError, RuntimeError):
    """The table's own files are damaged or gone: a metadata file that does not parse, a
    data file a committed snapshot reads that is missing, or a record-index file that is
    missing or unreadable (:class:`IndexCorruptError`). Exit status 1, one line naming the
    file and what to do.

    Not bad input (exit 2): the command and the batch are fine, and the same command works
    once the table is repaired; not retryable (exit 3): running again fails the same way.
    It is what ``validate`` reports with exit 1 as a finding, so the two agree.
    """

    exit_code: ClassVar[int] = 1

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        #: the damaged or missing file
        self.path = path

    @classmethod
    def damaged(cls, path: str, *, what: str, why: str) -> "TableCorruptError":
        """A metadata file the commit protocol wrote atomically that does not parse: damaged
        outside bucketindex (a copy tool, a full disk, a hand edit)."""
        return cls(f"{what} {path} is damaged ({why}): restore it from a backup of the table's .bucketindex "
                   f"directory; the table cannot be read or written until then", path=path)


#: how a damaged record-index bucket is rebuilt from the table's data (format.md §6.2)
REBUILD_INDEX_COMMAND = "bucketindex compact {table} --rebuild-index --bucket {bucket}"


class IndexCorruptError(TableCorruptError):
    """A record-index file a committed snapshot reads is missing or unreadable (deleted,
    truncated or overwritten outside bucketindex). Exit status 1, one line naming the file
    and the command that repairs it.

    Unlike a damaged data file, nothing is lost: the index is derived from the data, and
    ``bucketindex compact TABLE --rebuild-index --bucket N`` rebuilds the bucket from the
    snapshot's rows as one compaction commit. Until then every verb that reads the bucket
    (upsert, compact, rehash, shadow-compare) stops with this error; ``validate`` reports it
    as the finding ``index_files_unreadable`` and checks the rest; ``read`` does not use the
    index and keeps working. Not retryable: running again fails the same way.
    """

    def __init__(self, path: str, *, table: str, bucket: int, why: str) -> None:
        self.table = table
        self.bucket = bucket
        self.why = why
        super().__init__(f"index file {path} of bucket {bucket} is {why}: rebuild the bucket from the table's data "
                         f"with `{self.repair_command}`; the table cannot be written until then", path=path)

    @property
    def repair_command(self) -> str:
        """The command line that rebuilds the damaged bucket."""
        return REBUILD_INDEX_COMMAND.format(table=shlex.quote(self.table), bucket=self.bucket)


class PathEscapeError(TableCorruptError):
    """A write or delete named a path outside the table root (or a data path inside its
    metadata): refused, whatever bug or input built it (format.md §1, "Paths").

    Names from users are validated before anything is planned (bad input, exit 2), so this
    one means a path recorded by an older release or a bug: the table's problem, exit 1.
    """


def exit_code_of(error: BaseException) -> int | None:
    """The CLI's exit status for ``error``: its class's ``exit_code`` when it is one of ours,
    None for anything else (the CLI then diagnoses it: a resource, a lost server, or a bug)."""
    return error.exit_code if isinstance(error, BucketIndexError) else None

"""Errors that tell a caller what to do next: fix the input (exit 2) or try again (exit 3)."""

from __future__ import annotations

from spark_jobs.table.config import BadInputError

__all__ = ["BadInputError", "RetryableError", "ConflictError", "WriterAliveError", "InstantRolledBackError"]


class RetryableError(RuntimeError):
    """Nothing was written and the same call may succeed later: exit status 3, a scheduler retries."""


class ConflictError(RetryableError):
    """Concurrent writes conflicted and the bounded retries ran out."""


class WriterAliveError(RetryableError):
    """A pending instant still has a live writer: the table (or that instant) is busy."""


class InstantRolledBackError(RetryableError):
    """Another process rolled this writer's instant back (``rollback --force``) before it completed."""

"""The table format: config, timeline, file-system view, actions, and the table facade."""

from spark_jobs.exceptions import (
    BadInputError,
    ConfigConflictError,
    ConflictError,
    InstantRolledBackError,
    RetryableError,
    TableNotFoundError,
    WriterAliveError,
)
from spark_jobs.table.config import TableConfig
from spark_jobs.table.dataset import dataset
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action, Instant, InstantConflictError, State, Timeline
from spark_jobs.table.view import FileSlice, FileSystemView

__all__ = [
    "Action",
    "BadInputError",
    "ConfigConflictError",
    "ConflictError",
    "FileSlice",
    "FileSystemView",
    "Instant",
    "InstantConflictError",
    "InstantRolledBackError",
    "RetryableError",
    "State",
    "Table",
    "TableConfig",
    "TableNotFoundError",
    "Timeline",
    "WriterAliveError",
    "dataset",
]

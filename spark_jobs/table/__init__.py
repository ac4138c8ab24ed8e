"""The table format: config, timeline, file-system view, actions, and the table facade."""

from spark_jobs.table.config import BadInputError, ConfigConflictError, TableConfig
from spark_jobs.table.errors import ConflictError, InstantRolledBackError, RetryableError, WriterAliveError
from spark_jobs.table.table import Table, TableNotFoundError
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
]

"""The table format: config, timeline, file-system view, and the table facade."""

from spark_jobs.table.config import BadInputError, ConfigConflictError, TableConfig
from spark_jobs.table.table import Table, TableNotFoundError, WriterAliveError
from spark_jobs.table.timeline import Action, Instant, InstantConflictError, State, Timeline
from spark_jobs.table.view import FileSlice, FileSystemView

__all__ = [
    "Action",
    "BadInputError",
    "ConfigConflictError",
    "FileSlice",
    "FileSystemView",
    "Instant",
    "InstantConflictError",
    "State",
    "Table",
    "TableConfig",
    "TableNotFoundError",
    "Timeline",
    "WriterAliveError",
]

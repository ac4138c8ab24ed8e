"""Filesystem access for the table format: one small interface, one implementation per backend."""

from spark_jobs.io.filesystem import FileIO, InstantExistsError, resolve

__all__ = ["FileIO", "InstantExistsError", "resolve"]

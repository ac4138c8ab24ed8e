"""Triggers for bucketindex tables: what the deferrable sensors wait on in the triggerer, and the
AssetWatcher trigger that reports every commit (:class:`TableCommitEventTrigger`)."""

from airflow_provider_bucketindex.triggers.table_commits import TableCommitEventTrigger
from airflow_provider_bucketindex.triggers.table_state import (
    CompactionDueTrigger,
    NoPendingWritesTrigger,
    TableCommitTrigger,
    TableStateTrigger,
)

__all__ = ["CompactionDueTrigger", "NoPendingWritesTrigger", "TableCommitEventTrigger", "TableCommitTrigger",
           "TableStateTrigger"]

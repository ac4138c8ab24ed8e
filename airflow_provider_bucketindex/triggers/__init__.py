"""Triggers for bucketindex tables (what the deferrable sensors wait on in the triggerer)."""

from airflow_provider_bucketindex.triggers.table_state import (
    CompactionDueTrigger,
    NoPendingWritesTrigger,
    TableCommitTrigger,
    TableStateTrigger,
)

__all__ = ["CompactionDueTrigger", "NoPendingWritesTrigger", "TableCommitTrigger", "TableStateTrigger"]

"""Sensors on bucketindex table state (metadata only, no Spark)."""

from airflow_provider_bucketindex.sensors.table_state import (
    CompactionDueSensor,
    NoPendingWritesSensor,
    TableCommitSensor,
    TableStateSensor,
)

__all__ = ["CompactionDueSensor", "NoPendingWritesSensor", "TableCommitSensor", "TableStateSensor"]

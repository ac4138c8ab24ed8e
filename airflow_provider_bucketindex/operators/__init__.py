"""Operators for bucketindex tables."""

from airflow_provider_bucketindex.operators.bootstrap import BootstrapTableOperator
from airflow_provider_bucketindex.operators.clean import CleanTableOperator
from airflow_provider_bucketindex.operators.compaction import AsyncIndexCompactionOperator
from airflow_provider_bucketindex.operators.rehash import RehashOperator
from airflow_provider_bucketindex.operators.rollback import RollbackBatchOperator
from airflow_provider_bucketindex.operators.shadow_compare import IndexShadowCompareOperator
from airflow_provider_bucketindex.operators.upsert import UpsertWithIndexOperator
from airflow_provider_bucketindex.operators.validate import ValidateTableOperator

__all__ = [
    "AsyncIndexCompactionOperator",
    "BootstrapTableOperator",
    "CleanTableOperator",
    "IndexShadowCompareOperator",
    "RehashOperator",
    "RollbackBatchOperator",
    "UpsertWithIndexOperator",
    "ValidateTableOperator",
]

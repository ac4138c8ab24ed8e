"""bucketindex: upsertable lake tables with a record-level or bucket hash index.

The Python API (README, "Python API")::

    from spark_jobs import Table

    t = Table.create("/data/orders", arrow_table, record_key="order_id", precombine_field="updated_at")
    t.upsert(pandas_or_polars_frame)
    t.delete(["A-1", "A-2"])
    t.read(as_of=t.history()[-1].instant)

Curated as ``deltalake``'s package root: the table handle, its result types and the exceptions
a caller catches. The names are loaded on first use (PEP 562), so ``import spark_jobs`` -- which
every module of the package, a Spark task's included, implies -- stays as light as it was: it
imports neither pyarrow nor pyspark nor airflow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_jobs.api import (
        AlterResult,
        CleanResult,
        CompactResult,
        HistoryEntry,
        Ignored,
        MirrorResult,
        RehashResult,
        RollbackResult,
        ShadowCompareReport,
        Table,
        ValidationReport,
        WriteResult,
    )
    from spark_jobs.table.action.alter import AlterOptions
    from spark_jobs.table.action.bootstrap import BootstrapOptions
    from spark_jobs.table.action.clean import CleanOptions
    from spark_jobs.table.action.compact import CompactOptions
    from spark_jobs.table.action.mirror import MirrorOptions
    from spark_jobs.table.action.rehash import RehashOptions
    from spark_jobs.table.action.rollback import RollbackOptions
    from spark_jobs.table.action.shadow_compare import ShadowCompareOptions
    from spark_jobs.table.action.upsert import UpsertOptions
    from spark_jobs.table.action.validate import ValidateOptions
    from spark_jobs.exceptions import (
        BadInputError,
        BucketIndexError,
        ConfigConflictError,
        ConflictError,
        EngineUnsupportedError,
        MissingDependencyError,
        RetryableError,
        StorageUnavailableError,
        TableCorruptError,
        TableNotFoundError,
        WriterAliveError,
    )

#: where each public name lives
_EXPORTS = {
    **{name: "spark_jobs.api" for name in (
        "Table", "WriteResult", "Ignored", "HistoryEntry", "ValidationReport", "ShadowCompareReport",
        "CompactResult", "CleanResult", "RehashResult", "AlterResult", "RollbackResult", "MirrorResult")},
    # each verb's options: the dataclasses the CLI builds from its flags (Table's methods take them)
    "UpsertOptions": "spark_jobs.table.action.upsert",
    "ValidateOptions": "spark_jobs.table.action.validate",
    "ShadowCompareOptions": "spark_jobs.table.action.shadow_compare",
    "CompactOptions": "spark_jobs.table.action.compact",
    "CleanOptions": "spark_jobs.table.action.clean",
    "AlterOptions": "spark_jobs.table.action.alter",
    "RollbackOptions": "spark_jobs.table.action.rollback",
    "MirrorOptions": "spark_jobs.table.action.mirror",
    "RehashOptions": "spark_jobs.table.action.rehash",
    "BootstrapOptions": "spark_jobs.table.action.bootstrap",
    **{name: "spark_jobs.exceptions" for name in (
        "BucketIndexError", "BadInputError", "ConfigConflictError", "TableNotFoundError", "EngineUnsupportedError",
        "MissingDependencyError", "RetryableError", "ConflictError", "WriterAliveError", "StorageUnavailableError",
        "TableCorruptError")},
}

__all__ = ["__version__", *_EXPORTS]

#: the distribution this package ships in
_DISTRIBUTION = "airflow-provider-bucketindex"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version(_DISTRIBUTION)
        except PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
            value = "0+unknown"
    elif name in _EXPORTS:
        from importlib import import_module

        value = getattr(import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'spark_jobs' has no attribute {name!r}")
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS, "__version__"])

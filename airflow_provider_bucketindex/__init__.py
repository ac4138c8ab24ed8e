"""Airflow provider for bucketindex tables: hooks, operators, sensors and the example DAGs.

Importing this package must stay cheap and free of side effects: Airflow imports it
through the ``apache_airflow_provider`` entry point whenever it discovers providers
(every ``airflow`` command, every task process). So this module imports neither Airflow
nor the Spark provider nor ``pyspark``; hooks and operators live in submodules::

    from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook
    from airflow_provider_bucketindex.operators import (
        UpsertWithIndexOperator, ValidateTableOperator, RollbackBatchOperator,
        AsyncIndexCompactionOperator, CleanTableOperator, IndexShadowCompareOperator,
        RehashOperator, BootstrapTableOperator,
    )
    from airflow_provider_bucketindex.notifications import IndexMismatchNotifier

and the TaskFlow decorator ``@task.bucketindex_upsert`` (``decorators.upsert``, registered below).
"""

from __future__ import annotations

from typing import Any

__all__ = ["__version__", "get_provider_info"]

__version__ = "0.1.0"

#: The distribution name (``[metadata] name`` in setup.cfg). Airflow keys providers by it.
PACKAGE_NAME = "airflow-provider-bucketindex"
CONN_TYPE = "bucketindex"
DEFAULT_CONN_ID = "bucketindex_default"

_HOOK = "airflow_provider_bucketindex.hooks.bucketindex.BucketIndexHook"

CONFIG_SECTION = "bucketindex"

#: option -> (description, example): every option is a string, empty by default (not set)
CONFIG_OPTIONS: dict[str, tuple[str, str]] = {
    "engine": (
        "Where operators that take an ``engine`` run their work when neither the task nor its connection "
        "says: auto (a batch that fits the memory budget runs in the task on Arrow, a larger one on Spark), "
        "spark or arrow. Empty: auto.", "auto"),
    "memory_budget": (
        "Bytes the in-task Arrow engine may plan to hold, e.g. 4g, when neither the task nor its connection "
        "sets it. Empty: $BUCKETINDEX_ARROW_MEMORY_BUDGET, else a quarter of the worker's physical memory.",
        "4g"),
    "driver_memory": (
        "The JVM heap of a spark-submit with a local master (local[*]) when the task and the connection's "
        "conf do not set spark.driver.memory. Empty: $BUCKETINDEX_DRIVER_MEMORY, else about a third of the "
        "worker's physical memory (1-32 GiB).", "8g"),
    "index": (
        "Index type of tables an upsert creates when neither the task nor its connection says: record, "
        "bucket or global_simple. Empty: the core's default.", "record"),
    "num_buckets": (
        "Bucket count of tables an upsert creates when neither the task nor its connection says. Empty: the "
        "core's default.", "64"),
    "table_type": (
        "Table type of tables an upsert creates when neither the task nor its connection says: "
        "copy_on_write or merge_on_read. Empty: merge_on_read (copy_on_write with a mirror).", "merge_on_read"),
    "source_format": (
        "Source format of upserts when neither the task nor its connection says: parquet, json or csv. "
        "Empty: parquet.", "parquet"),
}

def provider_config() -> dict[str, Any]:
    """The ``config`` entry of the provider info: the ``[bucketindex]`` section (read by
    :mod:`airflow_provider_bucketindex.config`)."""
    return {
        CONFIG_SECTION: {
            "description": (
                "Worker-wide defaults of the bucketindex provider, under a task's arguments and its "
                "bucketindex connection's extras; empty options change nothing.\n"),
            "options": {
                name: {"description": description + "\n", "version_added": __version__, "type": "string",
                       "example": example, "default": ""}
                for name, (description, example) in CONFIG_OPTIONS.items()
            },
        }
    }


def get_provider_info() -> dict[str, Any]:
    """Provider metadata for Airflow's ProvidersManager (``airflow providers list``, the connection form).

    The connection form is declared here (``conn-fields`` / ``ui-field-behaviour``), the
    Airflow 3.2+ way: the UI builds it without importing the hook.
    """
    return {
        "package-name": PACKAGE_NAME,
        "name": "Bucket Index",
        "description": (
            "Upsertable lake tables with a record-level or bucket hash index: PySpark jobs "
            "scheduled by Airflow, data + index in one atomic commit."
        ),
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Bucket Index",
                "external-doc-url": "https://github.com/bucketindex/bucketindex",
            }
        ],
        "operators": [
            {
                "integration-name": "Bucket Index",
                "python-modules": [
                    "airflow_provider_bucketindex.operators.upsert",
                    "airflow_provider_bucketindex.operators.validate",
                    "airflow_provider_bucketindex.operators.rollback",
                    "airflow_provider_bucketindex.operators.compaction",
                    "airflow_provider_bucketindex.operators.clean",
                    "airflow_provider_bucketindex.operators.rehash",
                    "airflow_provider_bucketindex.operators.bootstrap",
                    "airflow_provider_bucketindex.operators.shadow_compare",
                ],
            }
        ],
        # @task.bucketindex_upsert: upsert what a TaskFlow function returns
        "task-decorators": [
            {
                "class-name": "airflow_provider_bucketindex.decorators.upsert.bucketindex_upsert_task",
                "name": "bucketindex_upsert",
            }
        ],
        "notifications": ["airflow_provider_bucketindex.notifications.shadow_compare.IndexMismatchNotifier"],
        "sensors": [
            {
                "integration-name": "Bucket Index",
                "python-modules": ["airflow_provider_bucketindex.sensors.table_state"],
            }
        ],
        "hooks": [
            {
                "integration-name": "Bucket Index",
                "python-modules": ["airflow_provider_bucketindex.hooks.bucketindex"],
            }
        ],
        "triggers": [
            {
                "integration-name": "Bucket Index",
                "python-modules": ["airflow_provider_bucketindex.triggers.table_state",
                                   "airflow_provider_bucketindex.triggers.table_commits"],
            }
        ],
        # a table's Asset identity: bucketindex:<storage location>, one Asset per table whatever
        # its spelling (s3a:// and s3://, a trailing /, storage options in the query)
        "asset-uris": [
            {
                "schemes": ["bucketindex"],
                "handler": "airflow_provider_bucketindex.assets.sanitize_uri",
                "factory": "airflow_provider_bucketindex.assets.create_asset",
                "to_openlineage_converter": "airflow_provider_bucketindex.assets.convert_asset_to_openlineage",
            }
        ],
        # [bucketindex]: worker-wide defaults under the tasks' arguments and the connections' extras
        "config": provider_config(),
        "connection-types": [
            {
                "hook-class-name": _HOOK,
                "hook-name": "Bucket Index (Spark)",
                "connection-type": CONN_TYPE,
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login", "password"],
                    "relabeling": {"host": "Spark master", "port": "Master port"},
                    "placeholders": {
                        "host": "local[*] | spark://host | yarn | k8s://https://host",
                        "port": "7077 (only for spark://host without a port)",
                        "extra": '{"conf": {"spark.executor.memory": "2g"}}',
                    },
                },
                "conn-fields": {
                    "spark_conn_id": {
                        "label": "Spark connection",
                        "description": (
                            "Take master, deploy mode, queue, Kerberos settings from this Spark "
                            "connection (type spark) instead of the Spark master field."
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "deploy_mode": {
                        "label": "Deploy mode",
                        "description": "client or cluster",
                        "schema": {"type": ["string", "null"], "enum": ["client", "cluster", None], "default": "client"},
                    },
                    "spark_binary": {
                        "label": "Spark binary",
                        "description": (
                            "spark-submit, spark2-submit or spark3-submit; looked up in the Airflow "
                            "worker's own environment bin/ first, then PATH"
                        ),
                        "schema": {"type": ["string", "null"], "default": "spark-submit"},
                    },
                    "python": {
                        "label": "Python for Spark",
                        "description": (
                            "PYSPARK_PYTHON for driver and executors; empty = the Airflow worker's interpreter"
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "conf": {
                        "label": "Spark conf (JSON)",
                        "description": 'Extra Spark properties, e.g. {"spark.executor.memory": "2g"}',
                        "schema": {"type": ["object", "string", "null"]},
                    },
                    "index": {
                        "label": "Default index type",
                        "description": "record, bucket or global_simple; used when an upsert creates a table",
                        "schema": {"type": ["string", "null"], "enum": ["record", "bucket", "global_simple", None]},
                    },
                    "num_buckets": {
                        "label": "Default bucket count",
                        "description": "Used when an upsert creates a table",
                        "schema": {"type": ["integer", "null"], "minimum": 1},
                    },
                    "table_type": {
                        "label": "Default table type",
                        "description": (
                            "copy_on_write or merge_on_read (upserts append logs and fold the due ones); "
                            "used when an upsert creates a table; unset: merge_on_read (copy_on_write with a "
                            "mirror)"
                        ),
                        "schema": {"type": ["string", "null"], "enum": ["copy_on_write", "merge_on_read", None]},
                    },
                    "source_format": {
                        "label": "Default source format",
                        "description": "parquet, json or csv",
                        "schema": {"type": ["string", "null"], "enum": ["parquet", "json", "csv", None]},
                    },
                    "engine": {
                        "label": "Default engine",
                        "description": (
                            "auto (default): a batch that fits the memory budget runs inside the Airflow task "
                            "(in-process Arrow, no spark-submit), a larger one is submitted to Spark; spark: "
                            "always spark-submit; arrow: always in the task"
                        ),
                        "schema": {"type": ["string", "null"], "enum": ["auto", "spark", "arrow", None]},
                    },
                    "memory_budget": {
                        "label": "In-task memory budget",
                        "description": (
                            "Bytes the in-task engine may plan to hold, e.g. 4g (default: [bucketindex] "
                            "memory_budget, else $BUCKETINDEX_ARROW_MEMORY_BUDGET, else a quarter of the worker's "
                            "physical memory)"
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "storage_conn_id": {
                        "label": "Storage connection",
                        "description": (
                            "An Amazon Web Services (aws) connection for s3:// tables and sources, resolved by the "
                            "Amazon provider's hook when it is installed (keys, role_arn, profile_name), else read "
                            "as login = access key id, password = secret access key, extras endpoint_url, "
                            "region_name (empty: the worker's AWS_* environment / instance role)"
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "location": {
                        "label": "Location to test",
                        "description": (
                            "A folder or table the Test button lists with the storage settings, e.g. "
                            "s3://lake/tables or /data/tables (unset: the settings are resolved, nothing is listed)"
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "storage_options": {
                        "label": "Storage options (JSON)",
                        "description": (
                            'Object-store settings over the storage connection, e.g. {"endpoint_url": '
                            '"http://minio:9000", "region": "eu-west-1", "addressing_style": "path"}; keys: '
                            "endpoint_url, region, access_key_id, secret_access_key, session_token, profile, "
                            "addressing_style (prefer the storage connection for keys)"
                        ),
                        "schema": {"type": ["object", "string", "null"]},
                    },
                },
            }
        ],
    }

"""A bucketindex table as an Airflow Asset and as an OpenLineage dataset.

* :func:`table_asset` -- the table as an ``Asset`` (``file:///abs/path`` for a local path,
  the URI itself otherwise), so a DAG can be scheduled on "table X was updated"::

      with DAG(..., schedule=[table_asset("s3://lake/events")]): ...

* :data:`TABLE_UPDATES` -- the ``AssetAlias`` every table-writing operator declares as its
  outlet by default. Why an alias: ``table_uri`` is usually templated (a DAG param), so the
  concrete Asset is known only when the task runs; the task then attaches the event to
  ``table_asset(<rendered uri>)`` through the alias, with the commit's instant and batch id
  as the event's extra, and Airflow queues every DAG scheduled on that Asset.

* :func:`openlineage_dataset` -- ``(namespace, name)`` after the OpenLineage naming spec
  (``file`` + absolute path; ``s3://bucket`` + key; ``hdfs://host:port`` + path).

Imports no Airflow at module level beyond the Task SDK's asset definitions.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from airflow.sdk import Asset, AssetAlias

from spark_jobs.io.storage import redact_uri

__all__ = ["TABLE_UPDATES", "TABLE_UPDATES_ALIAS", "openlineage_dataset", "table_asset", "table_asset_uri"]

#: name of the alias table-writing operators emit their table's Asset events through
TABLE_UPDATES_ALIAS = "bucketindex_table_updates"
TABLE_UPDATES = AssetAlias(name=TABLE_UPDATES_ALIAS)


def table_asset_uri(table_uri: str) -> str:
    """The Asset URI of a table: ``file://`` + absolute path for a local path, else the URI
    (trailing ``/`` dropped, so ``s3://b/t/`` and ``s3://b/t`` are one Asset), credentials in its
    query redacted: an Asset's URI is stored in the metadata DB and shown in the UI."""
    uri = redact_uri(str(table_uri).strip())
    if "://" not in uri:
        return "file://" + os.path.abspath(uri)
    if uri.startswith("file://"):
        path = uri[len("file://"):]
        return "file://" + (os.path.abspath(path) if path.startswith("/") else path)
    return uri.rstrip("/") or uri


def table_asset(table_uri: str) -> Asset:
    """The table as an Airflow Asset (schedule a DAG on it, or list it as a task's outlet)."""
    return Asset(uri=table_asset_uri(table_uri))


def openlineage_dataset(uri: str) -> tuple[str, str]:
    """``(namespace, name)`` of a path or URI, after the OpenLineage dataset naming spec."""
    uri = str(uri).strip()
    if "://" not in uri:
        return "file", os.path.abspath(uri)
    parts = urlsplit(uri)
    if parts.scheme == "file":
        return "file", parts.path
    path = parts.path.rstrip("/")
    if parts.scheme in ("s3", "s3a", "s3n", "gs", "gcs", "wasbs", "abfss"):
        scheme = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}.get(parts.scheme, parts.scheme)
        return f"{scheme}://{parts.netloc.rpartition('@')[2]}", path.lstrip("/")  # no user part: lineage is stored
    return redact_uri(f"{parts.scheme}://{parts.netloc}"), path or "/"

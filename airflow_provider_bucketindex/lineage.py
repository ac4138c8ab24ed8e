"""A bucketindex table as an Airflow Asset and as an OpenLineage dataset.

* :func:`table_asset` -- the table as an ``Asset`` of the registered ``bucketindex`` scheme
  (``bucketindex:s3://lake/events``, ``bucketindex:file:///abs/path``: one Asset per table,
  whatever the spelling; :mod:`airflow_provider_bucketindex.assets`), so a DAG can be scheduled
  on "table X was updated"::

      with DAG(..., schedule=[table_asset("s3://lake/events")]): ...

* :func:`watched_table_asset` -- the same Asset with an ``AssetWatcher`` whose trigger
  (:class:`~airflow_provider_bucketindex.triggers.table_commits.TableCommitEventTrigger`)
  records an event for every commit to the table, whoever made it (the CLI, the Python API,
  another scheduler), not only the operators' own::

      with DAG(..., schedule=[watched_table_asset("s3://lake/events")]): ...

* :data:`TABLE_UPDATES` -- the ``AssetAlias`` every table-writing operator declares as its
  outlet by default. Why an alias: ``table_uri`` is usually templated (a DAG param), so the
  concrete Asset is known only when the task runs; the task then attaches the event to
  ``table_asset(<rendered uri>)`` through the alias, with the commit's instant and batch id
  as the event's extra, and Airflow queues every DAG scheduled on that Asset.

* :func:`openlineage_dataset` -- ``(namespace, name)`` after the OpenLineage naming spec
  (``file`` + absolute path; ``s3://bucket`` + key; ``hdfs://host:port`` + path), the same
  naming the ``bucketindex`` scheme's OpenLineage converter gives a table's Asset.

Imports no Airflow at module level beyond the Task SDK's asset definitions.
"""

from __future__ import annotations

import os

from typing import Any

from airflow.sdk import Asset, AssetAlias, AssetWatcher

from airflow_provider_bucketindex import assets

__all__ = ["TABLE_UPDATES", "TABLE_UPDATES_ALIAS", "WATCHER_NAME", "openlineage_dataset", "table_asset",
           "table_asset_uri", "watched_table_asset"]

#: the default name of the AssetWatcher of :func:`watched_table_asset`
WATCHER_NAME = "bucketindex_commits"

#: name of the alias table-writing operators emit their table's Asset events through
TABLE_UPDATES_ALIAS = "bucketindex_table_updates"
TABLE_UPDATES = AssetAlias(name=TABLE_UPDATES_ALIAS)


def table_asset_uri(table_uri: str) -> str:
    """The Asset URI of a table: ``bucketindex:`` + its normalised location
    (:func:`airflow_provider_bucketindex.assets.asset_uri`: ``s3a://b/t`` and ``s3://b/t/`` are one
    Asset, storage options and user parts are not part of it, a relative path is refused)."""
    return assets.asset_uri(table_uri)


def table_asset(table_uri: str) -> Asset:
    """The table as an Airflow Asset (schedule a DAG on it, or list it as a task's outlet)."""
    return assets.create_asset(table_uri=table_uri)


def watched_table_asset(table_uri: str, *, watcher_name: str = WATCHER_NAME, **trigger_kwargs: Any) -> Asset:
    """The table's Asset (:func:`table_asset`) watched for commits: an ``AssetWatcher`` whose
    :class:`~airflow_provider_bucketindex.triggers.table_commits.TableCommitEventTrigger` records
    one Asset event per commit, in commit order, made by anyone (``trigger_kwargs``: its
    ``actions``, ``start``, ``poke_interval``, ``conn_id``, ``storage_conn_id``, ...).

    Every DAG file that names this table's Asset must give it the same watchers: Airflow keeps
    an Asset's watchers as the DAG file parsed last declared them, so a file naming the bare
    ``table_asset(uri)`` would remove the watcher another file added (and the next parse of that
    file would add it back). Building the Asset here, in each file, with the same arguments
    keeps them equal. The trigger is built, not run, at parse time (no I/O)."""
    from airflow_provider_bucketindex.triggers.table_commits import TableCommitEventTrigger

    uri = assets.asset_uri(table_uri)
    trigger = TableCommitEventTrigger(table_uri=str(table_uri), **trigger_kwargs)
    return Asset(name=uri, uri=uri, watchers=[AssetWatcher(name=watcher_name, trigger=trigger)])


def openlineage_dataset(uri: str) -> tuple[str, str]:
    """``(namespace, name)`` of a path or URI a task read or wrote, after the OpenLineage dataset
    naming spec (:func:`airflow_provider_bucketindex.assets.openlineage_dataset`). A relative path
    is the worker's: the task that used it resolves it (a source may hold glob characters: a
    plain path is named as it is, not as a URI)."""
    uri = str(uri).strip()
    if "://" not in uri and not uri.lower().startswith(("file:", assets.SCHEME + ":")):
        return "file", os.path.normpath(os.path.abspath(uri))
    return assets.openlineage_dataset(uri)

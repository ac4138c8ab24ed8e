"""bucketindex_table_updated: runs whenever an upsert commits to the events table (Asset-scheduled).

Every table-writing bucketindex operator records an Asset event for its table when it
commits (through its default outlet, the ``bucketindex_table_updates`` alias), with the
commit's instant and batch id in the event's extra. This DAG is scheduled on that table's
Asset -- ``table_asset(BUCKETINDEX_TABLE_URI)``, the table the ``bucketindex_ingest`` DAG
writes -- so it runs after each ingest commit, with no sensor and no polling::

    bucketindex_ingest.upsert ──(Asset event: instant, batch id)──> describe_commit

``describe_commit`` reads the event(s) that triggered the run and the commit they name
from the table (pure Python: the table's metadata, no Spark), and returns a small summary.
Put the work that must follow an update here: refresh an extract, notify a team, run a
check on the new snapshot (read it as of ``instant``).

Parsing this file does no I/O beyond reading one environment variable.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_bucketindex.lineage import table_asset

TABLE_URI = os.environ.get("BUCKETINDEX_TABLE_URI", "/tmp/bucketindex/tables/events")
EVENTS_TABLE = table_asset(TABLE_URI)

with DAG(
    dag_id="bucketindex_table_updated",
    doc_md=__doc__,  # the module's docstring: what the DAG does, shown in the UI
    description="Runs after every commit to the events table (scheduled on its Asset)",
    schedule=[EVENTS_TABLE],
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    tags=["bucketindex", "example"],
) as dag:

    @task(inlets=[EVENTS_TABLE])
    def describe_commit(*, triggering_asset_events=None, inlet_events=None) -> dict:  # type: ignore[no-untyped-def]
        """The commit(s) behind this run: from the triggering events, or (a manual run) the
        table's latest event."""
        from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook

        events = list((triggering_asset_events or {}).get(EVENTS_TABLE, []))
        if not events and inlet_events is not None:
            events = list(inlet_events[EVENTS_TABLE])[-1:]
        hook = BucketIndexHook()
        commits = []
        for event in events:
            extra = event.extra or {}
            commit = hook.commit_for_batch(TABLE_URI, extra["batch_id"]) if extra.get("batch_id") else None
            commits.append({
                "instant": extra.get("instant"),
                "batch_id": extra.get("batch_id"),
                "inserted": commit["inserted"] if commit else extra.get("inserted"),
                "updated": commit["updated"] if commit else extra.get("updated"),
                "deleted": commit["deleted"] if commit else extra.get("deleted"),
            })
        print(f"{len(commits)} commit(s) to {TABLE_URI}: {commits}")
        return {"table_uri": TABLE_URI, "commits": commits[-10:]}  # small: XCom lives in the DB

    describe_commit()

"""bucketindex_table_updated: runs after every commit to the events table, whoever made it (Asset-scheduled, watched).

The DAG is scheduled on the table's Asset -- ``watched_table_asset(BUCKETINDEX_TABLE_URI)``,
the table the ``bucketindex_ingest`` DAG writes -- which gets an Asset event from two sources:

* an ``AssetWatcher`` in the triggerer (:class:`TableCommitEventTrigger`) that polls the
  table's commit sequence and records one event per commit, in commit order, **whoever made
  it**: the ``bucketindex`` CLI, the Python API, another scheduler, an Airflow task. Its
  extra is ``{"from_trigger": true, "payload": {"seq", "instant", "action", "batch_id",
  "counts", "table_uri"}}``; its watermark (the last commit reported) is kept in the Asset's
  state store, so a triggerer restart neither repeats nor skips a commit;
* every table-writing bucketindex operator, when it commits (its default outlet, the
  ``bucketindex_table_updates`` alias), with ``{"instant", "batch_id", ...}`` as the extra::

    bucketindex upsert (CLI) ──┐
    Table(...).upsert(...)  ───┼──(commit)──> watcher ──(Asset event: seq, instant, batch id)──┐
    bucketindex_ingest.upsert ─┴──────────────────────────(Asset event: instant, batch id)─────┴──> describe_commit

So a commit an operator makes has two events (the operator's at once, the watcher's within a
poll interval); ``describe_commit`` reports each commit once: it keeps the sequence position
of the last commit it reported in the Asset's state store (key
``bucketindex_table_updated.last_seq``) and skips what is not after it. It reads the commit
from the table (pure Python: its metadata, no Spark) and returns a small summary. Put the
work that must follow an update here: refresh an extract, notify a team, run a check on the
new snapshot (read it as of ``instant``).

Airflow runs the watcher only while this DAG is unpaused, in ``airflow triggerer``.
Parsing this file does no I/O beyond reading environment variables (the trigger is built,
not run).
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_bucketindex.lineage import watched_table_asset

TABLE_URI = os.environ.get("BUCKETINDEX_TABLE_URI", "/tmp/bucketindex/tables/events")
#: seconds between two looks of the watcher at the table
POKE_INTERVAL = float(os.environ.get("BUCKETINDEX_WATCH_INTERVAL", "30"))
EVENTS_TABLE = watched_table_asset(TABLE_URI, poke_interval=POKE_INTERVAL)
#: the Asset state store key of the last commit reported (its sequence position)
LAST_SEQ_KEY = "bucketindex_table_updated.last_seq"

with DAG(
    dag_id="bucketindex_table_updated",
    doc_md=__doc__,  # the module's docstring: what the DAG does, shown in the UI
    description="Runs after every commit to the events table, by anyone (scheduled on its watched Asset)",
    schedule=[EVENTS_TABLE],
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # one run at a time: the state store's last_seq is read, then written
    tags=["bucketindex", "example"],
) as dag:

    @task(inlets=[EVENTS_TABLE])
    def describe_commit(*, triggering_asset_events=None, inlet_events=None,  # type: ignore[no-untyped-def]
                        asset_state_store=None) -> dict:
        """The commit(s) behind this run, each once: from the triggering events (the watcher's
        or an operator's), or (a manual run) the table's latest event."""
        from airflow_provider_bucketindex.hooks.bucketindex import BucketIndexHook

        events = list((triggering_asset_events or {}).get(EVENTS_TABLE, []))
        if not events and inlet_events is not None:
            events = list(inlet_events[EVENTS_TABLE])[-1:]
        store = None
        try:
            store = asset_state_store[EVENTS_TABLE] if asset_state_store is not None else None
            last_seq = store.get(LAST_SEQ_KEY, default=0) if store is not None else 0
        except Exception as e:  # no store (Airflow before 3.3, a test context): report what came
            print(f"no asset state store ({type(e).__name__}: {e}); every event's commit is reported")
            store, last_seq = None, 0
        hook = BucketIndexHook()
        commits: dict[int | str, dict] = {}
        for event in events:
            extra = event.extra or {}
            payload = extra.get("payload") if extra.get("from_trigger") else None
            if payload:  # the watcher's: the commit as the table's sequence has it
                seq, instant, batch_id = payload.get("seq"), payload.get("instant"), payload.get("batch_id")
                counts = payload.get("counts") or {}
            else:  # an operator's: the commit it made, found by its batch id
                commit = hook.find_commit(TABLE_URI, batch_id=extra["batch_id"]) if extra.get("batch_id") else None
                seq, instant, batch_id = (commit or {}).get("seq"), extra.get("instant"), extra.get("batch_id")
                counts = (commit or {}).get("counts") or extra
            if isinstance(seq, int) and seq <= int(last_seq or 0):
                print(f"commit {instant} (seq {seq}) was reported by an earlier run")
                continue
            commits[seq if isinstance(seq, int) else str(instant)] = {
                "instant": instant, "batch_id": batch_id,
                "inserted": counts.get("inserted"), "updated": counts.get("updated"), "deleted": counts.get("deleted"),
            }
        seqs = [s for s in commits if isinstance(s, int)]
        if store is not None and seqs and max(seqs) > int(last_seq or 0):
            store.set(LAST_SEQ_KEY, max(seqs))
        ordered = [commits[k] for k in sorted(commits, key=lambda k: (0, k, "") if isinstance(k, int) else (1, 0, k))]
        print(f"{len(ordered)} commit(s) to {TABLE_URI}: {ordered}")
        return {"table_uri": TABLE_URI, "commits": ordered[-10:]}  # small: XCom lives in the DB

    describe_commit()

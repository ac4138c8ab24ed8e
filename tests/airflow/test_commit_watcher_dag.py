"""The AssetWatcher of ``bucketindex_table_updated`` over Airflow's own parts: the DAG synced to
a real SQLite metadata DB (the Asset, its watcher, the Trigger row Airflow derives from it), the
trigger re-created from that row as the triggerer re-creates it, its asset state store the
one the triggerer gives a watcher (``AssetStateStoreAccessors`` over the watched Asset, each
message handled by the Execution API's own route functions on the metadata DB), each event
submitted with ``Trigger.submit_event`` as the supervisor does. Left out: the triggerer's
processes (its supervisor and runner subprocess) and the HTTP hop.

Commits: the ``bucketindex`` CLI in its own process (Arrow engine) and the Python API, on a
table whose path has spaces and non-ASCII."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from tests.unit.test_provider_commit_watcher import Running, _rows, _source, api_upsert, cli_upsert

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(600)]

DAG_ID = "bucketindex_table_updated"


class TriggererComms:
    """What the triggerer's supervisor does with a trigger's asset state store messages, minus
    HTTP: the Execution API's own route functions on a metadata DB session (the in-process
    HTTP transport the supervisor uses never answered when called from a test's event loop
    thread pool here, so the routes are called directly)."""

    def send(self, msg: Any) -> Any:
        from airflow.api_fastapi.execution_api.datamodels.asset_state_store import AssetStateStorePutBody
        from airflow.api_fastapi.execution_api.routes import asset_state_store as routes
        from airflow.sdk.api.datamodels._generated import AssetStateStoreResponse
        from airflow.sdk.execution_time.comms import AssetStateStoreResult, ErrorResponse, ErrorType
        from airflow.utils.session import create_session
        from fastapi import HTTPException

        kind = type(msg).__name__
        by = {"name": msg.name} if kind.endswith("ByName") else {"uri": msg.uri}
        suffix = "by_name" if kind.endswith("ByName") else "by_uri"
        token = type("Token", (), {"id": routes.NULL_UUID})()  # the triggerer's: no task instance
        with create_session() as session:
            try:
                if kind.startswith("Get"):
                    got = getattr(routes, f"get_asset_state_store_{suffix}")(**by, key=msg.key, session=session)
                    return AssetStateStoreResult.from_asset_state_store_response(
                        AssetStateStoreResponse(value=got.value))
                if kind.startswith("Set"):
                    getattr(routes, f"set_asset_state_store_{suffix}")(
                        **by, key=msg.key, body=AssetStateStorePutBody(value=msg.value), session=session, token=token)
                    return None
            except HTTPException as e:
                if kind.startswith("Get") and e.status_code == 404:
                    return ErrorResponse(error=ErrorType.ASSET_STORE_NOT_FOUND, detail={"key": msg.key})
                raise
        raise AssertionError(f"a message the watcher should not send: {kind}")

    async def asend(self, msg: Any) -> Any:
        return await asyncio.to_thread(self.send, msg)


def _synced(table: str, monkeypatch: Any) -> Any:
    """The DAG parsed and synced with the table's watcher, unpaused; its Asset's row."""
    from airflow.models.asset import AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from airflow_provider_bucketindex.demo import sandbox
    from airflow_provider_bucketindex.lineage import table_asset_uri

    monkeypatch.setenv("BUCKETINDEX_TABLE_URI", table)  # read when the DAG file is parsed
    monkeypatch.setenv("BUCKETINDEX_WATCH_INTERVAL", "0.2")
    sandbox.unpause(DAG_ID)
    sandbox.unpause(DAG_ID)  # Airflow keeps watchers of Assets of unpaused DAGs only: sync again
    with create_session() as session:
        asset = session.scalars(select(AssetModel).where(AssetModel.uri == table_asset_uri(table))).one()
        (trigger,) = asset.triggers
        return {"asset_id": asset.id, "name": asset.name, "uri": asset.uri, "trigger_id": trigger.id,
                "classpath": trigger.classpath, "kwargs": dict(trigger.kwargs)}


def _trigger(row: dict[str, Any]) -> Any:
    """The trigger as the triggerer makes it from its row, with the store it gives a watcher."""
    from airflow.sdk import Asset
    from airflow.sdk.execution_time.context import AssetStateStoreAccessors
    from airflow.serialization.decoders import smart_decode_trigger_kwargs
    from airflow.jobs.triggerer_job_runner import import_string

    cls = import_string(row["classpath"])
    trigger = cls(**{k: smart_decode_trigger_kwargs(v) for k, v in row["kwargs"].items()})
    trigger.asset_state_store = AssetStateStoreAccessors(inlets=[Asset(name=row["name"], uri=row["uri"])])
    return trigger


def _watcher_events(asset_id: int) -> list[dict[str, Any]]:
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return [e.extra for e in session.scalars(select(AssetEvent).where(AssetEvent.asset_id == asset_id)
                                                 .order_by(AssetEvent.id)) if e.extra.get("from_trigger")]


def _queued(asset_id: int) -> list[str]:
    from airflow.models.asset import AssetDagRunQueue
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return session.scalars(select(AssetDagRunQueue.target_dag_id).where(
            AssetDagRunQueue.asset_id == asset_id)).all()


def _stored(uri: str, key: str) -> Any:
    from airflow.sdk.execution_time.context import AssetStateStoreAccessor

    return AssetStateStoreAccessor(uri=uri).get(key)


@pytest.mark.asyncio
async def test_cli_and_api_commits_reach_the_dag_through_the_watcher_once_each(tmp_path, airflow_db, monkeypatch):  # type: ignore
    from airflow.models.trigger import Trigger
    from airflow.sdk.execution_time import task_runner

    from airflow_provider_bucketindex.demo import sandbox
    from airflow_provider_bucketindex.triggers.table_commits import WATERMARK_KEY, TableCommitEventTrigger
    from spark_jobs.table import state

    table = str(tmp_path / "lac été" / "commandes 1")
    cli_upsert(table, _source(tmp_path, "b0", _rows(0)), "before the watcher")  # history, not news
    row = _synced(table, monkeypatch)
    assert row["classpath"].endswith("TableCommitEventTrigger") and row["kwargs"]["table_uri"] == table
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", TriggererComms(), raising=False)

    first = _trigger(row)
    assert isinstance(first, TableCommitEventTrigger) and first.poke_interval == 0.2
    first.watermark_delay_s = 0.3
    run = Running(first)
    for _ in range(300):  # its first look sets the watermark at the table's end (start="latest")
        if _stored(row["uri"], WATERMARK_KEY) is not None:
            break
        await asyncio.sleep(0.1)
    assert _stored(row["uri"], WATERMARK_KEY) == {"seq": 1, "instant": state.find_commit(
        table, batch_id="before the watcher")["instant"]}
    await run.quiet(0.5)
    cli_upsert(table, _source(tmp_path, "b1", _rows(1)), "la CLI é")
    (event,) = await run.take(1)
    Trigger.submit_event(trigger_id=row["trigger_id"], event=event)  # what the supervisor does with it
    await run.quiet(1.5)  # the watermark follows
    await run.stop()  # the triggerer restarts
    cli_commit = state.find_commit(table, batch_id="la CLI é")
    assert event.payload["seq"] == cli_commit["seq"] and event.payload["instant"] == cli_commit["instant"]
    assert _stored(row["uri"], WATERMARK_KEY)["seq"] >= cli_commit["seq"]
    assert _queued(row["asset_id"]) == [DAG_ID], "the scheduler would now start the DAG"

    instant = api_upsert(table, _rows(2))  # while no triggerer runs
    second = _trigger(row)
    run = Running(second)
    (again,) = await run.take(1)
    Trigger.submit_event(trigger_id=row["trigger_id"], event=again)
    await run.quiet(1.5)
    await run.stop()
    assert again.payload["instant"] == instant  # the API's commit; the CLI's is not repeated
    payloads = [e["payload"] for e in _watcher_events(row["asset_id"])]
    assert [(p["instant"], p["batch_id"]) for p in payloads] == [
        (cli_commit["instant"], "la CLI é"), (instant, again.payload["batch_id"])]
    assert all(p["action"] == "commit" and p["table_uri"] == table for p in payloads)

    # the consumer (a manual run reads the Asset's latest event): the API's commit, once
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", None, raising=False)
    consumer = sandbox.run_dag(sandbox.load_dag(DAG_ID))
    assert consumer.state == "success", consumer
    out = consumer.xcom("describe_commit")
    assert [(c["instant"], c["updated"]) for c in out["commits"]] == [(instant, 6)], out
    again_run = sandbox.run_dag(sandbox.load_dag(DAG_ID))
    assert again_run.xcom("describe_commit")["commits"] == [], "reported by the earlier run"


def _watermark_in_db(asset_id: int) -> Any:
    import json

    from airflow._shared.state import AssetScope
    from airflow.state import get_state_backend
    from airflow.utils.session import create_session

    from airflow_provider_bucketindex.triggers.table_commits import WATERMARK_KEY

    with create_session() as session:
        value = get_state_backend().get(AssetScope(asset_id=asset_id), WATERMARK_KEY, session=session)
    return None if value is None else json.loads(value)


def _wait(what: str, check: Any, limit: float) -> Any:
    import time

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {limit:g} s")


@pytest.mark.slow  # two triggerer starts: 71 s at load 8 (each start ~25 s before the watcher's first look)
def test_a_real_triggerer_turns_a_cli_commit_into_an_asset_event(tmp_path, airflow_db, monkeypatch):  # type: ignore
    """``airflow triggerer`` itself (its supervisor, its runner subprocess, the Execution API):
    the watcher's first look stores the watermark in the Asset's state store, a CLI commit
    becomes one Asset event queuing the DAG; stopped (SIGTERM) and started again, the triggerer
    reports the commit made meanwhile and nothing twice."""
    import signal
    import subprocess
    import sys
    import time


    table = str(tmp_path / "réel" / "t 2")
    cli_upsert(table, _source(tmp_path, "b0", _rows(0)), "avant")
    row = _synced(table, monkeypatch)
    log = open(tmp_path / "triggerer.log", "w")

    def triggerer() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "airflow", "triggerer", "--capacity", "10"],
                                stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ), start_new_session=True)

    def stop(proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    proc = triggerer()
    try:
        first = _wait("the watcher's first look", lambda: _watermark_in_db(row["asset_id"]), 90)
        assert first["seq"] == 1
        cli_upsert(table, _source(tmp_path, "b1", _rows(1)), "par la CLI")
        (event,) = _wait("the CLI commit's Asset event", lambda: _watcher_events(row["asset_id"]), 30)
        assert event["payload"]["batch_id"] == "par la CLI" and event["payload"]["table_uri"] == table
        assert _queued(row["asset_id"]) == [DAG_ID]
        _wait("its watermark", lambda: (_watermark_in_db(row["asset_id"]) or {}).get("seq", 0)
              >= event["payload"]["seq"], 30)
    finally:
        stop(proc)
    instant = api_upsert(table, _rows(2))  # while no triggerer runs
    proc = triggerer()
    try:
        _wait("the API commit's Asset event", lambda: _watcher_events(row["asset_id"])[1:], 90)
        time.sleep(3)  # a few more looks: nothing else may come
        events = _watcher_events(row["asset_id"])
    finally:
        stop(proc)
        log.close()
    assert [e["payload"]["batch_id"] for e in events][:1] == ["par la CLI"]
    assert [e["payload"]["instant"] for e in events][1:] == [instant], "the API's commit, once; nothing repeated"

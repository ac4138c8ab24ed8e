"""Sensors on table state and their triggers: the pure-Python state queries on real tables
(hand-made commits, merge-on-read logs, live and dead writers; no Spark), poke / reschedule /
deferrable execution, the trigger's event loop, and every way a deferred sensor resumes."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from airflow_provider_bucketindex import get_provider_info
from airflow_provider_bucketindex.demo import sandbox
from spark_jobs.table import Action, BadInputError, Table, TableConfig, state
from spark_jobs.table.action.compact import (
    DEFAULT_DELTA_RATIO,
    DEFAULT_LOG_RATIO,
    DEFAULT_MIN_DELTAS,
    DEFAULT_MIN_LOGS,
    CompactionPolicy,
    plan_compaction,
)
from spark_jobs.table.action.service import schedule
from spark_jobs.table.heartbeat import Heartbeat, owner_info

pytestmark = pytest.mark.unit

#: batch ids as Airflow and users make them: slashes, colons, plus, spaces, percent, non-ASCII
BATCH = "ingest/scheduled__2024-01-31T00:00:00+00:00/upsert"
ODD_BATCH = "lot 7 / Zürich 100% ✓"
#: Hive-style partition directories with URL-encoded values, as the writers name them
P_SAO = "city=S%C3%A3o+Paulo"
P_ODD = "city=a%2Fb+c%25+%C3%BC"


@pytest.fixture(scope="module")
def sensors():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex.sensors import table_state

    return table_state


@pytest.fixture(scope="module")
def triggers():  # type: ignore[no-untyped-def]
    sandbox.isolate_before_import()
    from airflow_provider_bucketindex.triggers import table_state

    return table_state


@pytest.fixture(autouse=True)
def _default_heartbeat_timeout(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("BUCKETINDEX_HEARTBEAT_TIMEOUT_S", raising=False)


# -- building tables without Spark ---------------------------------------------------------


def new_table(tmp_path, table_type: str = "copy_on_write") -> Table:  # type: ignore[no-untyped-def]
    t = Table.open(str(tmp_path / "lake" / "ventes été"))
    t.create(TableConfig(record_key_fields=["id"], partition_fields=["city"], table_type=table_type))
    return t


def commit(t: Table, batch_id: str, file_groups: list[dict[str, Any]], action: str = Action.COMMIT) -> str:
    """A completed write with hand-made metadata (what a Spark job commits)."""
    tl = t.timeline
    inst = tl.transition_to_inflight(tl.create_requested(action, {"batch_id": batch_id, "owner": owner_info()}))
    tl.complete(inst, {"batch_id": batch_id, "file_groups": file_groups, "counts": {"inserted": len(file_groups)}})
    return inst.timestamp


def base(partition: str, file_id: str, size: int = 10_000) -> dict[str, Any]:
    return {"partition": partition, "file_id": file_id, "path": f"{partition}/{file_id}_0-0-0_base.parquet",
            "num_rows": 100, "size": size}


def log(partition: str, file_id: str, n: int, size: int) -> dict[str, Any]:
    """One merge-on-read log on a file group (the entry ``FileSystemView.apply`` reads as ``fg["log"]``)."""
    return {"partition": partition, "file_id": file_id, "row_delta": 1,
            "log": {"path": f"{partition}/.{file_id}.log.{n}", "num_rows": 1, "size": size}}


def mor_table(tmp_path) -> Table:  # type: ignore[no-untyped-def]
    """Three file groups: one due by log count, one due by log bytes, one not due."""
    t = new_table(tmp_path, "merge_on_read")
    commit(t, "initial load", [base(P_SAO, "fg-count"), base(P_SAO, "fg-small"), base(P_ODD, "fg-bytes")])
    for n in range(DEFAULT_MIN_LOGS):  # fg-count: min_logs small logs
        commit(t, f"{ODD_BATCH} #{n}", [log(P_SAO, "fg-count", n, 10)])
    commit(t, "one big log", [log(P_ODD, "fg-bytes", 0, 5_000), log(P_SAO, "fg-small", 0, 100)])
    return t


def pending_commit(t: Table, batch_id: str, owner: dict[str, Any] | None, *, inflight: bool = True) -> str:
    tl = t.timeline
    plan: dict[str, Any] = {"batch_id": batch_id}
    if owner is not None:
        plan["owner"] = owner
    inst = tl.create_requested(Action.COMMIT, plan)
    if inflight:
        tl.transition_to_inflight(inst)
    return inst.timestamp


def beat_at(t: Table, instant: str, at: float, host: str = "worker-7") -> None:
    """A heartbeat file as another machine's writer leaves it."""
    t.io.write_atomic(t.layout.heartbeat_file(instant), json.dumps({"host": host, "pid": 4242, "at": at}).encode())


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def timeline_files(t: Table) -> list[str]:
    return sorted(os.listdir(os.path.join(t.root, ".bucketindex", "timeline")))


# -- compaction_due --------------------------------------------------------------------------


def test_compaction_due_is_what_plan_compaction_would_fold(tmp_path):
    t = mor_table(tmp_path)
    before = timeline_files(t)

    due = state.compaction_due(t.uri, min_logs=DEFAULT_MIN_LOGS, log_ratio=DEFAULT_LOG_RATIO)

    plan = plan_compaction(t, t.view(), CompactionPolicy())
    assert plan is not None
    assert {(g["partition"], g["file_id"]) for g in plan["file_groups"]} == {(P_SAO, "fg-count"), (P_ODD, "fg-bytes")}
    assert due == {"due": True, "file_groups": 2, "logs": DEFAULT_MIN_LOGS + 1,
                   "log_bytes": 10 * DEFAULT_MIN_LOGS + 5_000, "index_buckets": 0, "index_deltas": 0,
                   "reason": due["reason"], "pending_plans": []}
    assert due["reason"].startswith("2 file group(s) due (min_logs=4, log_ratio=0.2)")
    json.dumps(due)  # an event payload / XCom value
    assert timeline_files(t) == before  # nothing scheduled


def test_compaction_due_follows_the_policy(tmp_path):
    t = mor_table(tmp_path)
    only_count = state.compaction_due(t.uri, min_logs=4, log_ratio=1.0)
    assert (only_count["due"], only_count["file_groups"], only_count["logs"]) == (True, 1, 4)
    nothing = state.compaction_due(t.uri, min_logs=5, log_ratio=1.0)
    assert nothing["due"] is False and (nothing["file_groups"], nothing["logs"], nothing["log_bytes"]) == (0, 0, 0)
    assert nothing["reason"].startswith("3 file group(s) have logs, none is due (min_logs=5, log_ratio=1); ")
    with pytest.raises(BadInputError, match="at least 1"):
        state.compaction_due(t.uri, min_logs=0, log_ratio=0.2)


def test_compaction_due_without_logs_and_on_copy_on_write(tmp_path):
    mor = new_table(tmp_path / "mor", "merge_on_read")
    commit(mor, BATCH, [base(P_SAO, "fg1")])
    assert state.compaction_due(mor.uri)["reason"].startswith("no file group has logs; no index bucket is due")

    cow = new_table(tmp_path / "cow")
    commit(cow, BATCH, [base(P_SAO, "fg1")])
    out = state.compaction_due(cow.uri)
    assert out["due"] is False and out["file_groups"] == 0
    assert "copy_on_write" in out["reason"] and "no logs" in out["reason"]


def test_groups_in_a_pending_compaction_plan_are_not_due_again(tmp_path):
    t = mor_table(tmp_path)
    plan = plan_compaction(t, t.view(), CompactionPolicy())
    assert plan is not None
    scheduled = schedule(t, Action.COMPACTION, plan).timestamp

    out = state.compaction_due(t.uri)

    assert out["due"] is False and out["pending_plans"] == [scheduled]
    assert out["reason"].startswith(f"every due file group is in a pending compaction plan ({scheduled}): "
                                    "execute it instead; ")
    # a log committed after the plan makes the third group due on its own
    for n in range(1, DEFAULT_MIN_LOGS + 1):
        commit(t, f"later {n}", [log(P_SAO, "fg-small", n, 10)])
    again = state.compaction_due(t.uri)
    assert (again["due"], again["file_groups"], again["logs"]) == (True, 1, DEFAULT_MIN_LOGS + 1)


# -- pending_writes --------------------------------------------------------------------------


def test_a_live_writer_is_pending_and_a_dead_one_is_ignored(tmp_path):
    t = new_table(tmp_path)
    commit(t, BATCH, [base(P_SAO, "fg1")])
    pending_commit(t, "killed on this host", {"host": socket.gethostname(), "pid": dead_pid(), "at": time.time()})
    stale = pending_commit(t, "crashed elsewhere", {"host": "worker-7", "pid": 4242, "at": time.time() - 7200})
    beat_at(t, stale, time.time() - 3600)
    pending_commit(t, "no owner, no heartbeat", None)
    assert state.pending_writes(t.uri) == []

    live = pending_commit(t, ODD_BATCH, owner_info())
    hb = Heartbeat(t.io, t.layout, live).start()
    try:
        (w,) = state.pending_writes(t.uri)
    finally:
        hb.stop()
    assert {k: w[k] for k in ("instant", "action", "state", "batch_id", "host", "pid")} == {
        "instant": live, "action": "commit", "state": "inflight", "batch_id": ODD_BATCH,
        "host": socket.gethostname(), "pid": os.getpid()}
    assert w["last_heartbeat"] and w["last_heartbeat"].endswith("Z")
    json.dumps(w)


def test_a_writer_between_its_plan_and_its_first_beat_is_pending(tmp_path):
    t = new_table(tmp_path)
    starting = pending_commit(t, BATCH, owner_info(), inflight=False)
    (w,) = state.pending_writes(t.uri)
    assert (w["instant"], w["state"], w["last_heartbeat"]) == (starting, "requested", None)


def test_heartbeat_timeout_decides_when_a_quiet_writer_is_abandoned(tmp_path):
    t = new_table(tmp_path)
    ts = pending_commit(t, BATCH, {"host": "worker-7", "pid": 4242, "at": time.time() - 40})
    beat_at(t, ts, time.time() - 30)
    assert [w["instant"] for w in state.pending_writes(t.uri)] == [ts]  # default 60 s
    assert state.pending_writes(t.uri, heartbeat_timeout_s=10) == []


def test_scheduled_compaction_is_not_a_write_until_a_live_process_executes_it(tmp_path):
    t = mor_table(tmp_path)
    plan = plan_compaction(t, t.view(), CompactionPolicy())
    assert plan is not None
    inst = schedule(t, Action.COMPACTION, plan)  # scheduled_by: this (live) process
    assert state.pending_writes(t.uri) == []

    t.timeline.transition_to_inflight(inst)  # an executor started ...
    hb = Heartbeat(t.io, t.layout, inst.timestamp).start()
    try:
        (w,) = state.pending_writes(t.uri)
        assert (w["instant"], w["action"], w["state"]) == (inst.timestamp, "compaction", "inflight")
    finally:
        hb.stop()
    beat_at(t, inst.timestamp, time.time() - 3600)  # ... and crashed: waits for the next --execute
    assert state.pending_writes(t.uri) == []


def test_a_pending_rollback_is_not_a_write(tmp_path):
    t = new_table(tmp_path)
    t.timeline.create_requested(Action.ROLLBACK, {"target": "20240101000000000", "files": []})
    assert [i.action for i in t.timeline.reload().pending()] == ["rollback"]
    assert state.pending_writes(t.uri) == []


# -- find_commit -----------------------------------------------------------------------------


def test_find_commit_by_batch_id(tmp_path):
    t = new_table(tmp_path)
    first = commit(t, BATCH, [base(P_SAO, "fg1")])
    odd = commit(t, ODD_BATCH, [base(P_ODD, "fg2")])
    pending_commit(t, "still writing", owner_info())

    got = state.find_commit(t.uri, batch_id=ODD_BATCH)
    assert got == {"instant": odd, "action": "commit", "seq": 2, "batch_id": ODD_BATCH, "counts": {"inserted": 1}}
    assert state.find_commit(t.uri, batch_id=BATCH)["instant"] == first  # type: ignore[index]
    assert state.find_commit(t.uri, batch_id="lot 7") is None  # exact, not a prefix
    assert state.find_commit(t.uri, batch_id="still writing") is None  # pending is not committed
    json.dumps(got)


def test_find_commit_after_an_instant_is_the_first_in_commit_order(tmp_path):
    t = new_table(tmp_path)
    tl = t.timeline
    c1 = commit(t, "b1", [base(P_SAO, "fg1")])
    slow = tl.transition_to_inflight(tl.create_requested(Action.COMMIT, {"batch_id": "slow"}))
    fast = commit(t, "fast", [base(P_SAO, "fg2")])  # started later, completes first
    tl.complete(slow, {"batch_id": "slow", "file_groups": []})
    assert slow.timestamp < fast

    assert state.find_commit(t.uri, after_instant=c1)["batch_id"] == "fast"  # type: ignore[index]
    assert state.find_commit(t.uri, after_instant="0")["instant"] == c1  # type: ignore[index]
    assert state.find_commit(t.uri, after_instant=c1[:8])["instant"] == c1  # type: ignore[index] # a day prefix
    assert state.find_commit(t.uri, after_instant=fast) is None
    # a compaction after the last commit is not a commit
    comp = tl.transition_to_inflight(tl.create_requested(Action.COMPACTION, {"file_groups": []}))
    tl.complete(comp, {"file_groups": []})
    assert state.find_commit(t.uri, after_instant=fast) is None


def test_find_commit_needs_exactly_one_question(tmp_path):
    t = new_table(tmp_path)
    with pytest.raises(BadInputError, match="exactly one"):
        state.find_commit(t.uri)
    with pytest.raises(BadInputError, match="exactly one"):
        state.find_commit(t.uri, batch_id=BATCH, after_instant="20240101000000000")
    with pytest.raises(BadInputError, match="instant time"):
        state.find_commit(t.uri, after_instant="2024-01-31")


@pytest.mark.parametrize("call", [
    lambda uri: state.compaction_due(uri),
    lambda uri: state.pending_writes(uri),
    lambda uri: state.find_commit(uri, batch_id=BATCH),
    lambda uri: state.find_commit(uri, after_instant="0"),
])
def test_every_query_reports_a_missing_table_in_one_line(tmp_path, call):  # type: ignore[no-untyped-def]
    uri = str(tmp_path / "no such table")
    with pytest.raises(BadInputError) as info:
        call(uri)
    assert "\n" not in str(info.value) and f"no bucketindex table at {uri}" in str(info.value)
    assert not (tmp_path / "no such table").exists()


# -- sensors: construction -------------------------------------------------------------------


def test_constructors_are_keyword_only_and_do_no_work(sensors, tmp_path):  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError):
        sensors.CompactionDueSensor("c", "/t")  # type: ignore[misc]
    nowhere = str(tmp_path / "nowhere")
    made = [
        sensors.CompactionDueSensor(task_id="c", table_uri=nowhere),
        sensors.NoPendingWritesSensor(task_id="n", table_uri=nowhere),
        sensors.TableCommitSensor(task_id="t", table_uri=nowhere, batch_id=BATCH),
    ]
    assert all(s.deferrable is False for s in made)  # [operators] default_deferrable
    assert not os.path.exists(nowhere)


def test_template_fields_are_the_constructor_arguments_verbatim(sensors):  # type: ignore[no-untyped-def]
    c = sensors.CompactionDueSensor(task_id="c", table_uri="{{ params.t }}", min_logs="{{ params.n }}", log_ratio=0.5)
    assert {f: getattr(c, f) for f in c.template_fields} == {
        "table_uri": "{{ params.t }}", "min_logs": "{{ params.n }}", "log_ratio": 0.5, "min_deltas": 10,
        "delta_ratio": 0.5, "storage_conn_id": None, "storage_options": None}
    n = sensors.NoPendingWritesSensor(task_id="n", table_uri="{{ params.t }}", heartbeat_timeout_s=90)
    assert {f: getattr(n, f) for f in n.template_fields} == {"table_uri": "{{ params.t }}", "heartbeat_timeout_s": 90,
                                                             "storage_conn_id": None, "storage_options": None}
    t = sensors.TableCommitSensor(task_id="t", table_uri="/t", after_instant="{{ ti.xcom_pull(key='instant') }}")
    assert {f: getattr(t, f) for f in t.template_fields} == {
        "table_uri": "/t", "batch_id": None, "after_instant": "{{ ti.xcom_pull(key='instant') }}",
        "storage_conn_id": None, "storage_options": None}
    c.render_template_fields({"params": {"t": "/lake/t", "n": "6"}})
    assert (c.table_uri, c.min_logs) == ("/lake/t", "6")
    assert c.trigger().min_logs == 6


def test_defaults_are_the_compact_commands(sensors, triggers):  # type: ignore[no-untyped-def]
    c = sensors.CompactionDueSensor(task_id="c", table_uri="/t")
    assert (c.min_logs, c.log_ratio, c.min_deltas, c.delta_ratio) == (
        DEFAULT_MIN_LOGS, DEFAULT_LOG_RATIO, DEFAULT_MIN_DELTAS, DEFAULT_DELTA_RATIO)
    tr = triggers.CompactionDueTrigger(table_uri="/t")
    assert (tr.min_logs, tr.log_ratio, tr.min_deltas, tr.delta_ratio) == (
        DEFAULT_MIN_LOGS, DEFAULT_LOG_RATIO, DEFAULT_MIN_DELTAS, DEFAULT_DELTA_RATIO)


def test_table_commit_sensor_needs_exactly_one_of_batch_and_instant(sensors, tmp_path):  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="exactly one of batch_id and after_instant \\(neither given\\)"):
        sensors.TableCommitSensor(task_id="t", table_uri="/t")
    with pytest.raises(ValueError, match="both given"):
        sensors.TableCommitSensor(task_id="t", table_uri="/t", batch_id=BATCH, after_instant="20240101000000000")
    # a template that rendered empty is caught at execute, before the table is read
    t = sensors.TableCommitSensor(task_id="t", table_uri=str(tmp_path / "nowhere"), batch_id="{{ params.b }}")
    t.render_template_fields({"params": {"b": ""}})
    with pytest.raises(ValueError, match="neither given"):
        t.execute({})


# -- sensors: poke, reschedule, defer --------------------------------------------------------


class FakeTI:
    """What reschedule mode asks of the task instance."""

    def get_first_reschedule_date(self, context):  # type: ignore[no-untyped-def]
        return None


def test_compaction_due_sensor_pokes(sensors, tmp_path):  # type: ignore[no-untyped-def]
    due = mor_table(tmp_path / "due")
    quiet = new_table(tmp_path / "quiet", "merge_on_read")
    commit(quiet, BATCH, [base(P_SAO, "fg1")])

    yes = sensors.CompactionDueSensor(task_id="c", table_uri=due.uri).poke({})
    assert yes.is_done and yes.xcom_value["file_groups"] == 2  # type: ignore[index]
    no = sensors.CompactionDueSensor(task_id="c", table_uri=quiet.uri).poke({})
    assert not no.is_done and no.xcom_value is None


def test_no_pending_writes_sensor_pokes(sensors, tmp_path):  # type: ignore[no-untyped-def]
    t = new_table(tmp_path)
    op = sensors.NoPendingWritesSensor(task_id="n", table_uri=t.uri, heartbeat_timeout_s="30")
    assert op.poke({}).is_done
    ts = pending_commit(t, BATCH, owner_info())
    hb = Heartbeat(t.io, t.layout, ts).start()
    try:
        assert not op.poke({}).is_done
    finally:
        hb.stop()
    beat_at(t, ts, time.time() - 45)  # quiet for longer than this sensor's 30 s
    assert op.poke({}).is_done


def test_table_commit_sensor_pokes(sensors, tmp_path):  # type: ignore[no-untyped-def]
    t = new_table(tmp_path)
    op = sensors.TableCommitSensor(task_id="t", table_uri=t.uri, batch_id=ODD_BATCH)
    assert not op.poke({}).is_done
    ts = commit(t, ODD_BATCH, [base(P_ODD, "fg1")])
    got = op.poke({})
    assert got.is_done and got.xcom_value["instant"] == ts  # type: ignore[index]
    after = sensors.TableCommitSensor(task_id="t", table_uri=t.uri, after_instant=int(ts) - 1)  # XCom as a number
    assert after.poke({}).xcom_value["instant"] == ts  # type: ignore[index]
    assert not sensors.TableCommitSensor(task_id="t", table_uri=t.uri, after_instant=ts).poke({}).is_done


def test_missing_table_fails_without_retries_or_skips_with_soft_fail(sensors, tmp_path):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    uri = str(tmp_path / "nowhere")
    for deferrable in (False, True):
        with pytest.raises(AirflowFailException, match="no bucketindex table"):
            sensors.NoPendingWritesSensor(task_id="n", table_uri=uri, deferrable=deferrable).execute({})
        with pytest.raises(AirflowSkipException):
            sensors.NoPendingWritesSensor(task_id="n", table_uri=uri, deferrable=deferrable,
                                          soft_fail=True).execute({})


def test_poke_mode_returns_the_xcom_value_and_times_out(sensors, tmp_path):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException

    t = mor_table(tmp_path)
    out = sensors.CompactionDueSensor(task_id="c", table_uri=t.uri, poke_interval=0).execute({})
    assert out["due"] is True and out["file_groups"] == 2
    # a night with nothing due: the timeout fails the run, or skips the compaction with soft_fail
    strict = sensors.CompactionDueSensor(task_id="c", table_uri=t.uri, min_logs=99, log_ratio=99,
                                         poke_interval=0, timeout=0)
    with pytest.raises(AirflowSensorTimeout):
        strict.execute({})
    lenient = sensors.CompactionDueSensor(task_id="c", table_uri=t.uri, min_logs=99, log_ratio=99,
                                          poke_interval=0, timeout=0, soft_fail=True)
    with pytest.raises(AirflowSkipException):
        lenient.execute({})


def test_reschedule_mode(sensors, tmp_path):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowRescheduleException

    t = new_table(tmp_path)
    op = sensors.TableCommitSensor(task_id="t", table_uri=t.uri, batch_id=BATCH, mode="reschedule", poke_interval=300)
    with pytest.raises(AirflowRescheduleException):
        op.execute({"ti": FakeTI()})
    ts = commit(t, BATCH, [base(P_SAO, "fg1")])
    assert op.execute({"ti": FakeTI()})["instant"] == ts


def test_deferrable_sensor_defers_when_the_condition_does_not_hold(sensors, triggers, tmp_path):  # type: ignore
    from airflow.sdk.exceptions import TaskDeferred

    t = new_table(tmp_path)
    cases = [
        (sensors.TableCommitSensor(task_id="t", table_uri=t.uri, batch_id=BATCH, deferrable=True, poke_interval=30,
                                   timeout=3600),
         triggers.TableCommitTrigger, {"batch_id": BATCH, "after_instant": None}),
        (sensors.CompactionDueSensor(task_id="c", table_uri=t.uri, deferrable=True, poke_interval=30, timeout=3600),
         triggers.CompactionDueTrigger, {"min_logs": 4, "log_ratio": 0.2, "min_deltas": 10, "delta_ratio": 0.5}),
    ]
    live = pending_commit(t, ODD_BATCH, owner_info())
    hb = Heartbeat(t.io, t.layout, live).start()
    try:
        cases.append((sensors.NoPendingWritesSensor(task_id="n", table_uri=t.uri, deferrable=True, poke_interval=30,
                                                    timeout=3600),
                      triggers.NoPendingWritesTrigger, {"heartbeat_timeout_s": None}))
        for op, cls, own in cases:
            with pytest.raises(TaskDeferred) as info:
                op.execute({})
            d = info.value
            assert (d.method_name, d.timeout) == ("execute_complete", timedelta(seconds=3600))
            assert type(d.trigger) is cls
            assert d.trigger.serialize()[1] == {"table_uri": t.uri, **own, "poke_interval": 30.0, "timeout_s": None}
    finally:
        hb.stop()


def test_deferrable_sensor_does_not_defer_when_the_condition_holds(sensors, tmp_path):  # type: ignore[no-untyped-def]
    t = mor_table(tmp_path)
    ts = commit(t, ODD_BATCH, [log(P_ODD, "fg-bytes", 9, 1)])
    assert sensors.TableCommitSensor(task_id="t", table_uri=t.uri, batch_id=ODD_BATCH,
                                     deferrable=True).execute({})["instant"] == ts
    assert sensors.CompactionDueSensor(task_id="c", table_uri=t.uri, deferrable=True).execute({})["due"] is True
    assert sensors.NoPendingWritesSensor(task_id="n", table_uri=t.uri, deferrable=True).execute({}) is None


# -- resuming from the trigger's event -------------------------------------------------------


def test_execute_complete_maps_every_event(sensors):  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSensorTimeout

    op = sensors.TableCommitSensor(task_id="t", table_uri="/t", batch_id=BATCH)
    value = {"instant": "20240131000000000", "batch_id": BATCH}
    assert op.execute_complete({}, {"status": "success", "table_uri": "/t", "value": value, "message": "m"}) == value
    with pytest.raises(AirflowSensorTimeout, match="still waiting after 5 s"):
        op.execute_complete({}, {"status": "timeout", "message": "still waiting after 5 s: no commit"})
    with pytest.raises(AirflowFailException, match="no bucketindex table at /t"):
        op.execute_complete({}, {"status": "error", "message": "no bucketindex table at /t", "bad_input": True})
    with pytest.raises(AirflowException, match="OSError: storage down") as info:
        op.execute_complete({}, {"status": "error", "message": "OSError: storage down", "bad_input": False})
    assert not isinstance(info.value, AirflowFailException)  # retried
    with pytest.raises(AirflowException, match="no event"):
        op.execute_complete({}, None)
    with pytest.raises(AirflowException, match="unknown trigger event"):
        op.execute_complete({}, {"status": "sideways"})


def test_resuming_with_soft_fail_skips_on_timeout_and_error(sensors):  # type: ignore[no-untyped-def]
    """BaseSensorOperator.resume_execution (Airflow 3.3) turns a failure of the resumed method,
    and Airflow's own deferral timeout, into a skip when soft_fail is set."""
    from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException

    strict = sensors.CompactionDueSensor(task_id="c", table_uri="/t")
    lenient = sensors.CompactionDueSensor(task_id="c", table_uri="/t", soft_fail=True)
    ok = {"status": "success", "value": {"due": True}}
    assert lenient.resume_execution("execute_complete", {"event": ok}, {}) == {"due": True}
    for event in ({"status": "timeout", "message": "m"}, {"status": "error", "message": "m", "bad_input": True}):
        with pytest.raises(AirflowSkipException):
            lenient.resume_execution("execute_complete", {"event": event}, {})
    with pytest.raises(AirflowSensorTimeout):
        strict.resume_execution("execute_complete", {"event": {"status": "timeout", "message": "m"}}, {})
    # the deferral's timeout (defer(timeout=...)), enforced by Airflow
    with pytest.raises(AirflowSensorTimeout):
        strict.resume_execution("__fail__", {"error": "Trigger timeout"}, {})
    with pytest.raises(AirflowSkipException):
        lenient.resume_execution("__fail__", {"error": "Trigger timeout"}, {})


# -- triggers --------------------------------------------------------------------------------


def test_triggers_serialize_to_json_and_round_trip(triggers):  # type: ignore[no-untyped-def]
    made = [
        triggers.CompactionDueTrigger(table_uri="s3://lake/ventes été", min_logs=6, log_ratio=0.5, poke_interval=30),
        triggers.NoPendingWritesTrigger(table_uri="/lake/t", heartbeat_timeout_s=90, timeout_s=600),
        triggers.NoPendingWritesTrigger(table_uri="/lake/t"),
        triggers.TableCommitTrigger(table_uri="/lake/t", batch_id=ODD_BATCH),
        triggers.TableCommitTrigger(table_uri="/lake/t", after_instant="20240131000000000", poke_interval=5),
    ]
    for trig in made:
        path, kwargs = trig.serialize()
        assert path == f"airflow_provider_bucketindex.triggers.table_state.{type(trig).__name__}"
        assert json.loads(json.dumps(kwargs)) == kwargs
        assert all(v is None or type(v) in (str, int, float) for v in kwargs.values())
        module, _, name = path.rpartition(".")
        again = getattr(importlib.import_module(module), name)(**kwargs)
        assert again.serialize() == (path, kwargs)


async def _events(trigger, limit: float = 20.0) -> list[Any]:  # type: ignore[no-untyped-def]
    async def collect() -> list[Any]:
        return [e async for e in trigger.run()]

    return await asyncio.wait_for(collect(), limit)


def _later(delay: float, fn) -> threading.Thread:  # type: ignore[no-untyped-def]
    def run() -> None:
        time.sleep(delay)
        fn()

    th = threading.Thread(target=run)
    th.start()
    return th


@pytest.mark.asyncio
async def test_trigger_fires_once_when_the_commit_lands(triggers, tmp_path):  # type: ignore[no-untyped-def]
    t = new_table(tmp_path)
    committed: list[str] = []
    writer = _later(0.4, lambda: committed.append(commit(Table.load(t.uri), ODD_BATCH, [base(P_ODD, "fg1")])))
    trig = triggers.TableCommitTrigger(table_uri=t.uri, batch_id=ODD_BATCH, poke_interval=0.05)
    try:
        (event,) = await _events(trig)
    finally:
        writer.join()
    assert event.payload["status"] == "success" and event.payload["table_uri"] == t.uri
    assert event.payload["value"]["instant"] == committed[0]
    assert event.payload["value"]["batch_id"] == ODD_BATCH


@pytest.mark.asyncio
async def test_trigger_fires_when_the_last_writer_finishes(triggers, tmp_path):  # type: ignore[no-untyped-def]
    t = new_table(tmp_path)
    ts = pending_commit(t, BATCH, owner_info())
    hb = Heartbeat(t.io, t.layout, ts, interval_s=0.1).start()

    def finish() -> None:
        tl = Table.load(t.uri).timeline
        tl.complete(tl.reload().find(ts), {"batch_id": BATCH, "file_groups": []})  # type: ignore[arg-type]
        hb.stop()

    writer = _later(0.4, finish)
    try:
        (event,) = await _events(triggers.NoPendingWritesTrigger(table_uri=t.uri, poke_interval=0.05))
    finally:
        writer.join()
        hb.stop()
    assert event.payload == {"status": "success", "table_uri": t.uri, "value": None, "message": "no write in progress"}
    assert t.timeline.reload().is_completed(ts)


@pytest.mark.asyncio
async def test_compaction_trigger_fires_at_once_when_due(triggers, tmp_path):  # type: ignore[no-untyped-def]
    t = mor_table(tmp_path)
    (event,) = await _events(triggers.CompactionDueTrigger(table_uri=t.uri, poke_interval=0.05))
    assert event.payload["status"] == "success" and event.payload["value"]["file_groups"] == 2


@pytest.mark.asyncio
async def test_trigger_reports_a_missing_table_as_an_error(triggers, tmp_path):  # type: ignore[no-untyped-def]
    uri = str(tmp_path / "nowhere")
    (event,) = await _events(triggers.CompactionDueTrigger(table_uri=uri, poke_interval=0.05))
    assert event.payload == {"status": "error", "table_uri": uri, "bad_input": True,
                             "message": f"no bucketindex table at {uri} (no .bucketindex/table.json)"}


@pytest.mark.asyncio
async def test_trigger_reports_an_unreadable_table_as_a_retryable_error(sensors, triggers, tmp_path):  # type: ignore
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    t = new_table(tmp_path)
    with open(os.path.join(t.root, ".bucketindex", "table.json"), "w") as f:
        f.write('{"record_key_fields": ["id"], ')  # torn by a broken copy
    (event,) = await _events(triggers.NoPendingWritesTrigger(table_uri=t.uri, poke_interval=0.05))
    assert event.payload["status"] == "error" and event.payload["bad_input"] is False
    msg = event.payload["message"]
    assert msg.startswith("TableCorruptError: ") and "\n" not in msg
    assert f"{t.root}/.bucketindex/table.json is damaged" in msg  # names the file to restore
    op = sensors.NoPendingWritesSensor(task_id="n", table_uri=t.uri)
    with pytest.raises(AirflowException) as info:
        op.execute_complete({}, event.payload)
    assert not isinstance(info.value, AirflowFailException)


@pytest.mark.asyncio
async def test_trigger_times_out_with_its_own_timeout(triggers, tmp_path):  # type: ignore[no-untyped-def]
    t = new_table(tmp_path)
    started = time.monotonic()
    (event,) = await _events(triggers.TableCommitTrigger(table_uri=t.uri, after_instant="0", poke_interval=5,
                                                         timeout_s=0.3))
    assert time.monotonic() - started < 4  # the last sleep is cut to the time left
    assert event.payload == {"status": "timeout", "table_uri": t.uri,
                             "message": "still waiting after 0.3 s: no commit after 0 yet"}


# -- registration ----------------------------------------------------------------------------


def test_provider_info_lists_the_sensor_and_trigger_modules(sensors, triggers):  # type: ignore[no-untyped-def]
    info = get_provider_info()
    (s,) = info["sensors"]
    (tr,) = info["triggers"]
    assert s["python-modules"] == ["airflow_provider_bucketindex.sensors.table_state"]
    assert tr["python-modules"] == ["airflow_provider_bucketindex.triggers.table_state",
                                    "airflow_provider_bucketindex.triggers.table_commits"]  # the AssetWatcher's
    assert s["integration-name"] == tr["integration-name"] == info["integrations"][0]["integration-name"]
    assert importlib.import_module(s["python-modules"][0]) is sensors
    assert importlib.import_module(tr["python-modules"][0]) is triggers


def test_importing_the_sensors_imports_neither_pyspark_nor_the_table_core(tmp_path):
    """DAG files import the sensors at every parse: the table core (pyarrow, numpy) is imported
    only when a sensor or trigger first reads a table, and pyspark never."""
    code = (
        "import sys\n"
        "from airflow_provider_bucketindex.sensors import CompactionDueSensor\n"
        "from airflow_provider_bucketindex.triggers import CompactionDueTrigger\n"
        "CompactionDueSensor(task_id='c', table_uri='/t', soft_fail=True, deferrable=True)\n"
        "bad = sorted(m for m in sys.modules\n"
        "             if m.split('.')[0] in ('pyspark', 'pyarrow', 'numpy') or m.startswith('spark_jobs.table'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(AIRFLOW_HOME=str(tmp_path / "home"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{tmp_path / 'home' / 'airflow.db'}")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_an_object_storage_path_table_is_polled_and_deferred_at_its_plain_location(sensors, triggers, tmp_path):  # type: ignore[no-untyped-def]
    """A sensor on ``ObjectStoragePath`` tables: poked at the path's location, and the trigger it
    defers to stores that location (a plain string), not the path object or its ``str()``."""
    from airflow.sdk import ObjectStoragePath
    from airflow.sdk.exceptions import TaskDeferred

    t = new_table(tmp_path / "t é 1%")
    path = ObjectStoragePath("file://" + t.uri)
    ts = commit(t, ODD_BATCH, [base(P_ODD, "fg1")])
    assert sensors.TableCommitSensor(task_id="t", table_uri=path, batch_id=ODD_BATCH).execute({})["instant"] == ts
    waiting = sensors.TableCommitSensor(task_id="t", table_uri=ObjectStoragePath("file://" + t.uri), batch_id=BATCH,
                                        deferrable=True, poke_interval=30, timeout=60)
    with pytest.raises(TaskDeferred) as info:
        waiting.execute({})
    args = info.value.trigger.serialize()[1]
    assert args["table_uri"] == t.uri and type(args["table_uri"]) is str

"""Merge-on-read tables: upserts append logs instead of rewriting bases, every reader merges
them (Arrow, Spark, time travel, validate, global_simple tagging), and data compaction folds
them -- scheduled and executed apart, beside upserts, after a crash -- without changing what
readers see.

Compaction executes in Spark tasks, so its tests are here; their upserts (setup, not the
subject) run on the Arrow engine. A log writer killed before its commit point runs on Arrow
in tests/unit/test_arrow_merge_on_read.py (with ``compact``'s bad input, which needs no
engine); here, once, killed inside a Spark task.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
from spark_jobs.arrow_engine.validate import run_validate as arrow_validate
from spark_jobs.jobs import read as read_module
from spark_jobs.jobs.compact import run_compact
from spark_jobs.jobs.read import read_table
from spark_jobs.jobs.upsert import UpsertOptions, run_upsert
from spark_jobs.jobs.validate import run_validate
from spark_jobs.table.action.compact import CompactionPolicy
from spark_jobs.table.action.rollback import rollback
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.describe import describe
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches, rows_by_identity
from tests.spark.conftest import write_batch
from tests.spark.test_upsert_oracle import _dedupe_ties, make_batches
from tests.unit.test_arrow_merge_on_read import (
    killed_log_writer_leaves_old_snapshot_and_next_run_repairs,
)

pytestmark = pytest.mark.spark

EVERY_GROUP = CompactionPolicy(min_logs=1)


def _options(uri, src, i, index="record", **kw):  # type: ignore[no-untyped-def]
    """Automatic compaction off: each test here compacts when it says, and checks the logs
    between (automatic compaction: tests/spark/test_auto_compact_spark.py)."""
    kw.setdefault("auto_compact", "off")
    return UpsertOptions(
        table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region", index=index,
        num_buckets=4, delete_field="is_deleted", batch_id=f"b{i}", target_file_rows=60,
        table_type="merge_on_read", **kw)


def _upsert(spark, uri, src, i, index="record", **kw):  # type: ignore[no-untyped-def]
    """A Spark writer, or the Arrow engine's with ``spark`` None."""
    opts = _options(uri, src, i, index, **kw)
    return arrow_upsert(opts) if spark is None else run_upsert(spark, opts)


def _spark_rows(spark, uri, as_of=None):  # type: ignore[no-untyped-def]
    return [r.asDict() for r in read_table(spark, uri, as_of).collect()]


def _spark_rows_both_ways(spark, uri, monkeypatch, as_of=None, *, by_position=True):  # type: ignore[no-untyped-def]
    """Spark's read of a table with logs, by position (files through Spark's reader) and, forced,
    by whole-slice merges in Python: both must give the same rows. The bucket index names
    file groups by bucket number in every partition, so its file names repeat across
    partition directories and rows cannot be named by file name: it reads the second way."""
    df = read_table(spark, uri, as_of)
    plan = (df._jdf.queryExecution().optimizedPlan().toString() if hasattr(df, "_jdf")
            else df._explain_string(extended=True))  # Spark Connect
    assert ("LeftAnti" in plan) == by_position
    native = [r.asDict() for r in df.collect()]
    with monkeypatch.context() as m:
        m.setattr(read_module, "NATIVE_MERGE_MAX_LOG_ROWS", -1)
        whole = _spark_rows(spark, uri, as_of)
    assert sorted(native, key=repr) == sorted(whole, key=repr)
    return native


@pytest.mark.parametrize("index", ["record", "bucket", "global_simple"])
def test_logs_not_rewrites_and_every_reader_merges_them(spark, tmp_path, monkeypatch, index):
    part = "region" if index == "bucket" else None
    batches = make_batches(seed={"record": 11, "bucket": 12, "global_simple": 13}[index], n_batches=4)
    _dedupe_ties(batches, part is not None)
    uri = str(tmp_path / "t")
    instants, first_bases = [], {}
    for i, rows in enumerate(batches):
        res = _upsert(spark, uri, write_batch(tmp_path / f"b{i}.parquet", rows), i, index)
        instants.append(res["instant"])
        expected = reduce_batches(batches[: i + 1], partition=part)
        assert rows_by_identity(read_arrow(uri).to_pylist(), partition=part) == expected, f"arrow, batch {i}"
        view = Table.load(uri).view()
        spark_rows = (_spark_rows_both_ways(spark, uri, monkeypatch, by_position=index != "bucket")
                      if any(s.logs for s in view.slices())
                      else _spark_rows(spark, uri))
        assert rows_by_identity(spark_rows, partition=part) == expected, f"spark, batch {i}"
        if i == 0:
            first_bases = {k: s.path for k, s in view.file_groups.items()}
            assert not any(s.logs for s in view.file_groups.values())
        else:  # no base of the first commit was rewritten: updates and deletes went to logs
            assert {k: view.file_groups[k].path for k in first_bases} == first_bases
            assert any(s.logs for s in view.file_groups.values())
        assert view.num_rows == len(expected)  # row counts kept exact without reading the groups
    report = run_validate(spark, uri)
    assert report["ok"], report
    # time travel sees each snapshot merged as of its commit
    for i, inst in enumerate(instants):
        expected = reduce_batches(batches[: i + 1], partition=part)
        assert rows_by_identity(read_arrow(uri, as_of=inst).to_pylist(), partition=part) == expected
    assert rows_by_identity(_spark_rows_both_ways(spark, uri, monkeypatch, instants[1],
                                                                 by_position=index != "bucket"), partition=part) == \
        reduce_batches(batches[:2], partition=part)

    done = run_compact(spark, uri, policy=EVERY_GROUP)
    assert done["executed"] and done["counts"]["logs_folded"] > 0
    view = Table.load(uri).view()
    assert not any(s.logs for s in view.file_groups.values())
    expected = reduce_batches(batches, partition=part)
    assert rows_by_identity(read_arrow(uri).to_pylist(), partition=part) == expected
    # what compaction replaced is still there for time travel: every instant, as before
    for i, inst in enumerate(instants):
        assert rows_by_identity(read_arrow(uri, as_of=inst).to_pylist(), partition=part) == reduce_batches(
            batches[: i + 1], partition=part), f"as of commit {i}, after compaction"
    assert run_validate(spark, uri)["ok"]


def test_compaction_beside_upserts_folds_only_its_plan(spark, tmp_path):
    """Upserts on Arrow; the plan executed by Spark."""
    batches = make_batches(seed=21, n_batches=3)
    _dedupe_ties(batches, False)
    uri = str(tmp_path / "t")
    srcs = [write_batch(tmp_path / f"b{i}.parquet", rows) for i, rows in enumerate(batches)]
    _upsert(None, uri, srcs[0], 0)
    _upsert(None, uri, srcs[1], 1)
    planned = run_compact(None, uri, policy=EVERY_GROUP, schedule_only=True)
    assert planned["scheduled"] and not planned["executed"]
    # a second schedule finds every due group already planned: nothing written
    assert run_compact(None, uri, policy=EVERY_GROUP, schedule_only=True)["instant"] is None
    # an upsert runs while the plan waits: not blocked, not rolled back, its logs stay on top
    third = _upsert(None, uri, srcs[2], 2)
    t = Table.load(uri)
    assert [i.timestamp for i in t.timeline.pending()] == [planned["instant"]]
    (w,) = describe(t)["writers"]  # `show` lists the plan as scheduled, not as an abandoned write
    assert w["instant"] == planned["instant"] and w["scheduled"] and not w["alive"]
    logs = describe(t)["logs"]
    assert logs["files"] == sum(len(s.logs) for s in t.view().file_groups.values()) > 0
    assert logs["largest"][0]["log_bytes"] > 0
    third_logs = {fg["log"]["path"] for fg in t.timeline.read_metadata(t.timeline.find(third["instant"]))["file_groups"]
                  if fg.get("log")}
    assert third_logs
    done = run_compact(spark, uri, instant=planned["instant"])
    assert done["executed"] and not done["noop"]
    view = Table.load(uri).view()
    left = {lf.path for s in view.file_groups.values() for lf in s.logs}
    assert left == third_logs  # exactly the logs committed after the plan
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert arrow_validate(uri)["ok"]
    again = run_compact(spark, uri, instant=planned["instant"])
    assert again["noop"] and not again["executed"]


def _crash_compaction(uri: str, instant: str, spark_args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "BUCKETINDEX_FAULT": "after_data_file"}
    cmd = [sys.executable, "-m", "spark_jobs.cli", "compact", uri, "--execute", instant, "--heartbeat-timeout", "2",
           *spark_args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, start_new_session=True)


def test_killed_compaction_leaves_the_snapshot_and_resumes(spark, spark_cli_args, tmp_path):
    """Killed inside a Spark compaction task (a Python worker); resumed by Spark."""
    batches = make_batches(seed=31, n_batches=2)
    _dedupe_ties(batches, False)
    uri = str(tmp_path / "t")
    for i, rows in enumerate(batches):
        _upsert(None, uri, write_batch(tmp_path / f"b{i}.parquet", rows), i)
    before = read_arrow(uri).to_pylist()
    planned = run_compact(None, uri, policy=EVERY_GROUP, schedule_only=True)["instant"]

    p = _crash_compaction(uri, planned, spark_cli_args)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr[-2000:])
    t = Table.load(uri)
    assert t.marked_files(planned), "the dead attempt should have left a new base"
    assert read_arrow(uri).to_pylist() == before  # readers: the old snapshot
    # a writer's automatic repair leaves a scheduled plan alone: it is resumed, not abandoned
    assert rollback(t, timeout_s=2) == []
    assert [i.timestamp for i in t.timeline.pending()] == [planned]

    import time

    time.sleep(2.5)  # the dead attempt's heartbeat expires
    done = run_compact(spark, uri, instant=planned, heartbeat_timeout_s=2)
    assert done["executed"]
    t = Table.load(uri)
    assert t.timeline.pending() == [] and not t.marked_files(planned)
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert arrow_validate(uri)["ok"]
    # the crashed attempt's base is gone: every file on disk is referenced by a completed action
    referenced = set()
    for inst in t.timeline.completed():
        for fg in t.timeline.read_metadata(inst).get("file_groups", []):
            referenced |= {fg.get("path"), (fg.get("log") or {}).get("path")}
    on_disk = {str(q.relative_to(tmp_path / "t")) for q in (tmp_path / "t").rglob("*.parquet")}
    assert on_disk <= referenced


@pytest.mark.parametrize("point", ["after_data_file", "before_complete"])
def test_killed_log_writer_leaves_old_snapshot_and_next_run_repairs(spark_cli_args, tmp_path, point):
    """Killed after its first log (written in a Spark task; the others unwritten) and, in the
    extended tier, after every log and index delta, before its commit point. The table before
    and the repair are written on Arrow: the subject is the Spark writer's crash."""
    killed_log_writer_leaves_old_snapshot_and_next_run_repairs(arrow_upsert, arrow_validate, spark_cli_args, tmp_path,
                                                               point)

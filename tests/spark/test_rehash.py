"""Rehash by multiples and divisors, for both indexes, against the oracle.

Upserts, rehashes 2 -> 8 -> 16 -> 4, more upserts (deletes, re-inserts, partition moves)
after each: after every step the table equals the batches reduced by key and every row or
index entry sits in bucket ``hash(key) mod M``; ``validate`` passes; a read as of an
instant before a rehash still sees the old layout. Then: a split has no shuffle stage,
bad counts leave the table untouched, a SIGKILL anywhere leaves the old or the new layout
and the next run finishes, and an upsert racing a rehash re-plans under the new count.

Rehash (on Spark) is the subject: the upserts that feed and race it, and ``validate``, run on the
in-process Arrow engine. The bad-count checks need no Spark at all:
tests/unit/test_arrow_oracle_rehash.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.table.commit import parse
from spark_jobs.jobs.compact import run_compact
from spark_jobs.jobs.rehash import run_rehash
from spark_jobs.table.action.compact import CompactionPolicy
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from spark_jobs.table.view import FileSystemView
from tests.oracle import reduce_batches, rows_by_identity
from tests.spark.conftest import write_batch
from tests.unit.test_arrow_oracle_rehash import ODD_REGIONS, _batches, _upsert, assert_layout  # noqa: F401

pytestmark = pytest.mark.spark

#: (new count, batches upserted after it)
STEPS = [(8, 1), (16, 1), (4, 1)]


@pytest.mark.parametrize("index,table_type", [("bucket", "merge_on_read"), ("record", "copy_on_write")])
def test_rehash_by_multiples_and_divisors_matches_the_oracle(spark, tmp_path, index, table_type):
    per_partition = index == "bucket"
    ident = "region" if per_partition else None
    batches = _batches(seed=11, per_partition=per_partition)
    uri = str(tmp_path / "t")

    def expect(n: int) -> dict:
        return reduce_batches(batches[:n], partition=ident)

    def check(n: int, buckets: int) -> None:
        assert rows_by_identity(read_arrow(uri).to_pylist(), partition=ident) == expect(n)
        assert_layout(uri, buckets)

    _upsert(uri, tmp_path, batches, 0, index=index, num_buckets=2, table_type=table_type)
    _upsert(uri, tmp_path, batches, 1)
    check(2, 2)
    n, history = 2, []
    for m, after in STEPS:
        history.append((Table.load(uri).timeline.last_completed().timestamp, expect(n), Table.load(uri).num_buckets()))
        res = run_rehash(spark, uri, m)
        assert not res["noop"] and res["num_buckets"] == m
        check(n, m)
        for _ in range(after):
            _upsert(uri, tmp_path, batches, n)
            n += 1
            check(n, m)
    assert n == len(batches)
    report = run_validate(uri)
    assert report["ok"], report
    # time travel: as of an instant before each rehash, the old layout and the old rows
    for instant, state, buckets in history:
        assert rows_by_identity(read_arrow(uri, instant).to_pylist(), partition=ident) == state
        assert Table.load(uri).view(instant).num_buckets == buckets
    # running the last rehash again changes nothing (an Airflow retry)
    assert run_rehash(spark, uri, 4)["noop"]


def _stages_of_group(spark, group: str) -> list:
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    return [tracker.getStageInfo(s) for j in tracker.getJobIdsForGroup(group)
            for s in tracker.getJobInfo(j).stageIds]


def test_split_of_bucket_index_has_no_shuffle(spark, tmp_path):
    batches = _batches(seed=5, per_partition=True)
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, batches, 0, index="bucket", num_buckets=4)
    groups = len(Table.load(uri).view().file_groups)
    spark.sparkContext.setJobGroup("rehash-split", "rehash 4 -> 16")
    try:
        run_rehash(spark, uri, 16)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    stages = _stages_of_group(spark, "rehash-split")
    # one job, one stage (no exchange: a shuffle would add a stage); the old file groups dealt
    # to at most 4 waves of tasks on local[2]
    assert len(stages) == 1, [(s.name, s.numTasks) for s in stages]
    assert stages[0].numTasks == min(groups, 4 * 2) and groups > 8
    assert_layout(uri, 16)
    assert rows_by_identity(read_arrow(uri).to_pylist(), partition="region") == reduce_batches(
        batches[:1], partition="region")


def _cli(args: list[str], env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "spark_jobs.cli", *args], env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


@pytest.mark.parametrize("index,point", [
    ("bucket", "after_data_file"),  # some children written (the pending instant's plan came before)
    ("record", "after_index_file"),
    ("record", "after_conflict_check"),  # everything written and checked, commit point not claimed
    ("bucket", "after_complete"),  # committed, markers not cleaned
])
def test_killed_rehash_leaves_old_or_new_layout_and_next_run_finishes(spark, spark_cli_args, tmp_path, index, point):
    per_partition = index == "bucket"
    ident = "region" if per_partition else None
    batches = _batches(seed=21, per_partition=per_partition)
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, batches, 0, index=index, num_buckets=2,
            table_type="merge_on_read" if per_partition else "copy_on_write")
    _upsert(uri, tmp_path, batches, 1)
    expected = reduce_batches(batches[:2], partition=ident)

    p = _cli(["rehash", uri, "--num-buckets", "8", "--engine", "spark", *spark_cli_args], {"BUCKETINDEX_FAULT": point})
    _, err = p.communicate(timeout=300)
    assert p.returncode == -signal.SIGKILL, (p.returncode, err[-2000:])
    # readers see one layout or the other, never a mix, and the same rows
    committed = point == "after_complete"
    assert rows_by_identity(read_arrow(uri).to_pylist(), partition=ident) == expected
    assert_layout(uri, 8 if committed else 2)
    pending = Table.load(uri).timeline.pending()
    assert [i.action for i in pending] == ([] if committed else ["rehash"])

    # the next run rolls the dead one back (its heartbeat is old) and finishes, or has nothing to do
    time.sleep(0.2)
    res = run_rehash(spark, uri, 8, heartbeat_timeout_s=0.1)
    assert res["noop"] == committed
    table = Table.load(uri)
    assert not table.timeline.pending()
    assert rows_by_identity(read_arrow(uri).to_pylist(), partition=ident) == expected
    assert_layout(uri, 8)
    report = run_validate(uri)
    assert report["ok"], report
    # nothing the dead attempt wrote is left on disk outside the snapshots
    assert not table.io.list_names(table.layout.markers)
    on_disk = {str(p.relative_to(uri)) for p in Path(uri).rglob("*.parquet")}
    on_disk |= {str(p.relative_to(uri)) for p in Path(uri).rglob("*.arrow")}
    tl = table.timeline
    referenced = set()
    for seq in range(1, tl.last_seq + 1):
        referenced |= FileSystemView.at_seq(tl, seq).all_files()
    # and the upserts' ``read`` files (the conflict check's fingerprints): no snapshot reads them,
    # their commits name them (CommitMetadata.referenced_files) and clean deletes them with them
    referenced |= {f for i in tl.completed() for f in parse(tl.read_metadata(i)).referenced_files()}
    assert on_disk <= referenced, sorted(on_disk - referenced)[:5]


def test_upsert_racing_a_rehash_replans_under_the_new_count(spark, spark_cli_args, tmp_path):
    """An upsert that planned under 2 buckets is held before its commit point while a rehash
    to 8 commits; it then conflicts, re-tags and writes under 8 buckets, never the old layout."""
    batches = _batches(seed=9, per_partition=True)
    uri = str(tmp_path / "t")
    _upsert(uri, tmp_path, batches, 0, index="bucket", num_buckets=2, table_type="merge_on_read")
    signals = tmp_path / "signals"
    src = write_batch(tmp_path / "b1.parquet", batches[1])
    writer = _cli(["upsert", uri, src, "--record-key", "id", "--precombine-field", "ts", "--partition-field", "region",
                   "--delete-field", "is_deleted", "--batch-id", "b1", "--num-buckets", "2", "--engine", "arrow"],
                  {"BUCKETINDEX_PAUSE": "before_complete=12", "BUCKETINDEX_PAUSE_SIGNAL": str(signals)})
    try:
        deadline = time.time() + 240
        while not (signals / "before_complete").exists():
            assert writer.poll() is None, writer.communicate()[1][-2000:]
            assert time.time() < deadline, "the upsert never reached its commit point"
            time.sleep(0.5)
        res = run_rehash(spark, uri, 8)  # the upsert is alive and holds only a pending commit
        assert not res["noop"]
        out, err = writer.communicate(timeout=300)
    finally:
        if writer.poll() is None:
            os.killpg(writer.pid, signal.SIGKILL)
    assert writer.returncode == 0, err[-2000:]
    result = json.loads(out.strip().splitlines()[0])
    table = Table.load(uri)
    meta = table.timeline.read_metadata(table.timeline.find(result["instant"]))
    assert meta["num_buckets"] == 8
    assert meta["conflicts"] and meta["conflicts"][0]["with_action"] == "rehash"
    assert rows_by_identity(read_arrow(uri).to_pylist(), partition="region") == reduce_batches(
        batches[:2], partition="region")
    assert_layout(uri, 8)
    assert run_validate(uri)["ok"]


def test_rehash_cancels_compaction_plans_of_the_old_layout(spark, tmp_path):
    batches = _batches(seed=13, per_partition=False)
    uri = str(tmp_path / "t")
    for i in range(3):
        _upsert(uri, tmp_path, batches, i, **({"index": "record", "num_buckets": 2} if i == 0 else {}))
    planned = run_compact(None, uri, policy=CompactionPolicy(min_deltas=2), schedule_only=True)
    assert planned["instant"]
    res = run_rehash(spark, uri, 4)
    assert res["cancelled_plans"] == [planned["instant"]]
    assert not Table.load(uri).timeline.pending()
    # the next nightly compaction has nothing stale to trip over
    out = run_compact(spark, uri, policy=CompactionPolicy(min_deltas=2))
    assert out["noop"] or out["executed"]
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches[:3])
    assert run_validate(uri)["ok"]

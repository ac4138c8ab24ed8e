"""Index compaction (RFC-08): a record-index bucket's base and oldest deltas folded into a new
base, tombstones dropped, scheduled and executed apart, beside upserts, after a crash --
without changing what any lookup, reader or time-travel read sees."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_jobs.index.record_index import TOMBSTONE, IndexFile
from spark_jobs.jobs.compact import run_compact
from spark_jobs.jobs.upsert import UpsertOptions, run_upsert
from spark_jobs.jobs.validate import run_validate
from spark_jobs.table.action.compact import CompactionPolicy
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from spark_jobs.table.view import is_index_delta
from tests.oracle import reduce_batches, rows_by_identity
from tests.spark.conftest import tree_digest, write_batch
from tests.spark.test_upsert_oracle import _dedupe_ties, make_batches

pytestmark = pytest.mark.spark

INDEX_ONLY = CompactionPolicy(min_deltas=2, data=False)


def _upsert(spark, uri, src, i, table_type):  # type: ignore[no-untyped-def]
    return run_upsert(spark, UpsertOptions(
        table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region", index="record",
        num_buckets=4, delete_field="is_deleted", batch_id=f"b{i}", target_file_rows=60, table_type=table_type))


def _entries(t: Table, rel: str) -> tuple[int, int]:
    """(entries, tombstones) of one index file."""
    with IndexFile(t.io, t.abs(rel)) as f:
        e = f.entries()
    return len(e), int((e.loc == TOMBSTONE).sum())


@pytest.mark.parametrize("table_type", ["copy_on_write", "merge_on_read"])
def test_index_compaction_beside_upserts_matches_the_oracle(spark, tmp_path, table_type):
    batches = make_batches(seed=51, n_batches=6)  # deletes, re-inserts after delete, partition moves
    _dedupe_ties(batches, False)
    uri = str(tmp_path / "t")
    srcs = [write_batch(tmp_path / f"b{i}.parquet", rows) for i, rows in enumerate(batches)]
    instants = [_upsert(spark, uri, srcs[i], i, table_type)["instant"] for i in range(3)]
    assert any(_entries(Table.load(uri), f)[1] for fs in Table.load(uri).view().index_files.values() for f in fs), \
        "the batches should have written tombstones"

    planned = run_compact(None, uri, policy=INDEX_ONLY, schedule_only=True)
    assert planned["scheduled"] and planned["index_buckets"] > 0 and planned["file_groups"] == 0
    plan = Table.load(uri).timeline.read_plan(Table.load(uri).timeline.find(planned["instant"]))
    assert all(len(b["files"]) == b["deltas"] >= 2 for b in plan["index_buckets"])
    # planned buckets are not planned twice
    assert run_compact(None, uri, policy=INDEX_ONLY, schedule_only=True)["instant"] is None
    # an upsert between schedule and execute: its deltas stay above the new bases
    instants.append(_upsert(spark, uri, srcs[3], 3, table_type)["instant"])
    t = Table.load(uri)
    fourth = {f["bucket"]: f["path"] for f in t.timeline.read_metadata(t.timeline.find(instants[3]))["index"]["added"]}

    done = run_compact(spark, uri, instant=planned["instant"])
    assert done["executed"] and done["counts"]["index_buckets"] == len(plan["index_buckets"])
    t = Table.load(uri)
    view = t.view()
    for b in plan["index_buckets"]:
        files = view.index_files[b["bucket"]]
        assert not is_index_delta(files[0]) and planned["instant"] in files[0]
        assert files[1:] == ([fourth[b["bucket"]]] if b["bucket"] in fourth else [])
        assert _entries(t, files[0])[1] == 0, "tombstones are dropped from a new base"
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches[:4])
    assert run_validate(spark, uri)["ok"]

    # lookups after compaction: updates, deletes, re-inserts and moves of compacted keys
    for i in (4, 5):
        instants.append(_upsert(spark, uri, srcs[i], i, table_type)["instant"])
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(spark, uri)["ok"]

    # schedule and execute at once, every delta: one base per bucket holding exactly the live keys
    again = run_compact(spark, uri, policy=CompactionPolicy(min_deltas=1, data=False))
    assert again["executed"]
    t = Table.load(uri)
    files = t.view().index_files
    assert all(len(fs) == 1 and not is_index_delta(fs[0]) for fs in files.values())
    live = sum(_entries(t, fs[0])[0] for fs in files.values())
    assert live == len(reduce_batches(batches))
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(spark, uri)["ok"]
    # time travel: what compaction replaced is still there for older snapshots
    for i, inst in enumerate(instants):
        assert rows_by_identity(read_arrow(uri, as_of=inst).to_pylist()) == reduce_batches(batches[: i + 1]), i
    # one more upsert finds every key through the compacted bases alone
    extra = [{**r, "ts": 10**6 + j, "amount": 7.0, "is_deleted": False} for j, r in enumerate(batches[0][:40])]
    _dedupe_ties([extra], False)
    _upsert(spark, uri, write_batch(tmp_path / "extra.parquet", extra), 6, table_type)
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches([*batches, extra])
    assert run_validate(spark, uri)["ok"]


def _cli(args: list[str], env: dict[str, str] | None = None, spark_args: list[str] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spark_jobs.cli", "compact", *args, *spark_args],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=300,
                          start_new_session=True)


def test_killed_index_compaction_leaves_the_snapshot_and_resumes(spark, spark_cli_args, tmp_path):
    batches = make_batches(seed=52, n_batches=3)
    _dedupe_ties(batches, False)
    uri = str(tmp_path / "t")
    for i, rows in enumerate(batches):
        _upsert(spark, uri, write_batch(tmp_path / f"b{i}.parquet", rows), i, "copy_on_write")
    before = read_arrow(uri).to_pylist()
    digest = tree_digest(tmp_path / "t")
    bad = _cli([uri, "--min-deltas", "0"])
    assert bad.returncode == 2 and "--min-deltas must be at least 1" in bad.stderr and bad.stderr.strip().count("\n") == 0
    assert tree_digest(tmp_path / "t") == digest

    p = _cli([uri, "--schedule-only", "--only", "index", "--min-deltas", "2"])
    assert p.returncode == 0, p.stderr
    planned = p.stdout.strip().splitlines()[-1]  # the last line: the plan's instant
    assert Table.load(uri).timeline.find(planned) is not None

    p = _cli([uri, "--execute", planned, "--heartbeat-timeout", "2"], {"BUCKETINDEX_FAULT": "after_index_file"},
             spark_cli_args)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr[-2000:])
    t = Table.load(uri)
    assert t.marked_files(planned), "the dead attempt should have left a new index base"
    assert read_arrow(uri).to_pylist() == before
    assert run_validate(spark, uri)["ok"]  # the index in force is the old one, whole
    time.sleep(2.5)  # the dead attempt's heartbeat expires

    p = _cli([uri, "--execute", planned, "--heartbeat-timeout", "2"], spark_args=spark_cli_args)
    assert p.returncode == 0, p.stderr[-2000:]
    t = Table.load(uri)
    assert t.timeline.pending() == [] and not t.marked_files(planned)
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(spark, uri)["ok"]
    # the crashed attempt's base is gone: every index file on disk was added by a completed action
    added = {f["path"] for i in t.timeline.completed()
             for f in (t.timeline.read_metadata(i).get("index") or {}).get("added", [])}
    on_disk = {str(q.relative_to(Path(t.root))) for q in Path(t.root).rglob("*.arrow")}
    assert on_disk <= added

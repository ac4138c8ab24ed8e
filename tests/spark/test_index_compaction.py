"""Index compaction (RFC-08): a record-index bucket's base and oldest deltas folded into a new
base, tombstones dropped, scheduled and executed apart, beside upserts, after a crash --
without changing what any lookup, reader or time-travel read sees.

The compactions (scheduled in-process, executed by Spark, in-process or as a CLI process) are the
subject; the upserts that feed and race them, and ``validate``, run on the in-process Arrow engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert
from spark_jobs.arrow_engine.validate import run_validate
from spark_jobs.index.record_index import TOMBSTONE, IndexFile
from spark_jobs.jobs.compact import run_compact
from spark_jobs.table.action.compact import CompactionPolicy
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.commit import parse
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from spark_jobs.table.view import is_index_delta
from tests.oracle import reduce_batches, rows_by_identity
from tests.spark.conftest import tree_digest, write_batch
from tests.unit.test_arrow_oracle_upsert import _dedupe_ties, make_batches

pytestmark = pytest.mark.spark

INDEX_ONLY = CompactionPolicy(min_deltas=2, data=False)


def _upsert(uri, src, i, table_type):  # type: ignore[no-untyped-def]
    """An upsert on the Arrow engine, in this process. Automatic compaction off: the tests
    compact explicitly, and since it folds due index buckets too it would leave them nothing due."""
    return run_upsert(UpsertOptions(
        table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region", index="record",
        num_buckets=4, delete_field="is_deleted", batch_id=f"b{i}", target_file_rows=60, table_type=table_type,
        auto_compact="off"))


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
    instants = [_upsert(uri, srcs[i], i, table_type)["instant"] for i in range(3)]
    assert any(_entries(Table.load(uri), f)[1] for fs in Table.load(uri).view().index_files.values() for f in fs), \
        "the batches should have written tombstones"

    planned = run_compact(None, uri, policy=INDEX_ONLY, schedule_only=True)
    assert planned["scheduled"] and planned["index_buckets"] > 0 and planned["file_groups"] == 0
    plan = Table.load(uri).timeline.read_plan(Table.load(uri).timeline.find(planned["instant"]))
    assert all(len(b["files"]) == b["deltas"] >= 2 for b in plan["index_buckets"])
    # planned buckets are not planned twice
    assert run_compact(None, uri, policy=INDEX_ONLY, schedule_only=True)["instant"] is None
    # an upsert between schedule and execute: its deltas stay above the new bases
    instants.append(_upsert(uri, srcs[3], 3, table_type)["instant"])
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
    assert run_validate(uri)["ok"]

    # lookups after compaction: updates, deletes, re-inserts and moves of compacted keys
    for i in (4, 5):
        instants.append(_upsert(uri, srcs[i], i, table_type)["instant"])
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(uri)["ok"]

    # schedule and execute at once, every delta: one base per bucket holding exactly the live keys
    again = run_compact(spark, uri, policy=CompactionPolicy(min_deltas=1, data=False))
    assert again["executed"]
    t = Table.load(uri)
    files = t.view().index_files
    assert all(len(fs) == 1 and not is_index_delta(fs[0]) for fs in files.values())
    live = sum(_entries(t, fs[0])[0] for fs in files.values())
    assert live == len(reduce_batches(batches))
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(uri)["ok"]
    # time travel: what compaction replaced is still there for older snapshots
    for i, inst in enumerate(instants):
        assert rows_by_identity(read_arrow(uri, as_of=inst).to_pylist()) == reduce_batches(batches[: i + 1]), i
    # one more upsert finds every key through the compacted bases alone
    extra = [{**r, "ts": 10**6 + j, "amount": 7.0, "is_deleted": False} for j, r in enumerate(batches[0][:40])]
    _dedupe_ties([extra], False)
    _upsert(uri, write_batch(tmp_path / "extra.parquet", extra), 6, table_type)
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches([*batches, extra])
    assert run_validate(uri)["ok"]


def _cli(args: list[str], env: dict[str, str] | None = None, spark_args: list[str] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spark_jobs.cli", "compact", *args, *spark_args],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=300,
                          start_new_session=True)


def test_killed_index_compaction_leaves_the_snapshot_and_resumes(spark, spark_cli_args, tmp_path):
    batches = make_batches(seed=52, n_batches=3)
    _dedupe_ties(batches, False)
    uri = str(tmp_path / "t")
    for i, rows in enumerate(batches):
        _upsert(uri, write_batch(tmp_path / f"b{i}.parquet", rows), i, "copy_on_write")
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
    assert run_validate(uri)["ok"]  # the index in force is the old one, whole
    time.sleep(2.5)  # the dead attempt's heartbeat expires

    p = _cli([uri, "--execute", planned, "--heartbeat-timeout", "2"], spark_args=spark_cli_args)
    assert p.returncode == 0, p.stderr[-2000:]
    t = Table.load(uri)
    assert t.timeline.pending() == [] and not t.marked_files(planned)
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(uri)["ok"]
    # the crashed attempt's base is gone: every index file on disk was written by a completed action
    # (added index files, and the upserts' ``read`` files of the conflict check, which their
    # commits name too: CommitMetadata.referenced_files)
    added = {f for i in t.timeline.completed() for f in parse(t.timeline.read_metadata(i)).referenced_files()}
    on_disk = {str(q.relative_to(Path(t.root))) for q in Path(t.root).rglob("*.arrow")}
    assert on_disk <= added


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"process ended (rc {proc.returncode}) before reaching {path.name}: "
                                 f"{proc.stderr.read()[-3000:] if proc.stderr else ''}")
        assert time.monotonic() < deadline, f"process never reached {path.name}"
        time.sleep(0.1)


def _seq(t: Table, instant: str) -> int:
    inst = t.timeline.find(instant)
    assert inst is not None and inst.seq is not None, instant
    return inst.seq


@pytest.mark.parametrize("held", ["compaction", "upsert"])
def test_upsert_and_index_compaction_overlap_in_two_processes(spark, spark_cli_args, tmp_path, held):
    """One process is held inside its work (a pause at a fault point) while the other runs to
    completion on the same buckets: ``compaction`` -- a CLI compaction paused after writing its
    new bases, an upsert commits meanwhile, then the compaction commits below it; ``upsert`` --
    a CLI upsert paused with its data and delta written, a compaction schedules (its live
    write holds nothing back: the upsert's delta is not committed) and commits meanwhile,
    then the upsert commits on top. Both complete; the upsert's deltas stay above the new
    bases; the table is the oracle's."""
    batches = make_batches(seed=53, n_batches=3)
    _dedupe_ties(batches, False)
    uri = str(tmp_path / "t")
    srcs = [write_batch(tmp_path / f"b{i}.parquet", rows) for i, rows in enumerate(batches)]
    for i in range(2):
        _upsert(uri, srcs[i], i, "copy_on_write")
    signals = tmp_path / "signals"
    env = {**os.environ, "BUCKETINDEX_PAUSE_SIGNAL": str(signals)}
    if held == "compaction":
        planned = run_compact(None, uri, policy=INDEX_ONLY, schedule_only=True)["instant"]
        point = "after_index_file"  # in the bucket tasks: every new base written (one pause per task)
        other = subprocess.Popen([sys.executable, "-m", "spark_jobs.cli", "compact", uri, "--execute", planned,
                                  *spark_cli_args], env={**env, "BUCKETINDEX_PAUSE": f"{point}=15"},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        _wait_for(signals / point, other)
        upsert = _upsert(uri, srcs[2], 2, "copy_on_write")["instant"]
        assert other.poll() is None, "the compaction was still inside its work while the upsert committed"
        _, err = other.communicate(timeout=300)
        assert other.returncode == 0, err[-3000:]
    else:
        point = "before_complete"  # data files and index deltas written, the commit not yet tried
        other = subprocess.Popen([sys.executable, "-m", "spark_jobs.cli", "upsert", uri, srcs[2], "--record-key",
                                  "id", "--precombine-field", "ts", "--partition-field", "region", "--delete-field",
                                  "is_deleted", "--batch-id", "b2", "--engine", "arrow"],
                                 env={**env, "BUCKETINDEX_PAUSE": f"{point}=30"},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        _wait_for(signals / point, other)
        done = run_compact(spark, uri, policy=INDEX_ONLY)
        assert done["executed"], done
        planned = done["instant"]
        assert other.poll() is None, "the upsert was still inside its work while the compaction committed"
        _, err = other.communicate(timeout=300)
        assert other.returncode == 0, err[-3000:]
        upsert = Table.load(uri).commit_for_batch("b2").timestamp  # type: ignore[union-attr]
    t = Table.load(uri)
    assert t.timeline.pending() == []
    first, second = sorted([(_seq(t, planned), "compaction"), (_seq(t, upsert), "upsert")])
    assert second[1] == held, "the held process committed last: the two overlapped"
    plan = t.timeline.read_plan(t.timeline.find(planned))
    fresh = {f["bucket"]: f["path"] for f in t.timeline.read_metadata(t.timeline.find(upsert))["index"]["added"]}
    view = t.view()
    assert plan["index_buckets"] and set(fresh) & {b["bucket"] for b in plan["index_buckets"]}
    for b in plan["index_buckets"]:
        files = view.index_files[b["bucket"]]
        assert not is_index_delta(files[0]) and planned in files[0]
        assert files[1:] == ([fresh[b["bucket"]]] if b["bucket"] in fresh else []), "the upsert's delta stays on top"
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(uri)["ok"]


@pytest.mark.parametrize("point", ["schedule_after_plan", "schedule_after_requested"])
def test_killed_while_scheduling_then_the_next_compact_folds_each_delta_once(spark, tmp_path, point):
    """SIGKILL inside scheduling: before the plan is written (nothing on disk changes), or after
    it is written but before its instant was reported (an orphan plan, which holds its buckets
    out of every new plan). Readers see the old table; the next ``compact`` executes the orphan
    plan, or schedules anew, and folds every delta exactly once."""
    batches = make_batches(seed=54, n_batches=2)
    _dedupe_ties(batches, False)
    uri = str(tmp_path / "t")
    for i, rows in enumerate(batches):
        _upsert(uri, write_batch(tmp_path / f"b{i}.parquet", rows), i, "copy_on_write")
    before = read_arrow(uri).to_pylist()
    digest = tree_digest(tmp_path / "t")
    deltas = {f for fs in Table.load(uri).view().index_files.values() for f in fs}

    p = _cli([uri, "--only", "index", "--min-deltas", "2"], {"BUCKETINDEX_FAULT": point})
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr[-2000:])
    t = Table.load(uri)
    orphans = t.timeline.pending()
    if point == "schedule_after_plan":
        assert orphans == [] and tree_digest(tmp_path / "t") == digest, "nothing was written"
    else:
        assert [i.action for i in orphans] == ["compaction"]
        orphan = t.timeline.read_plan(orphans[0])
        assert sorted(f for b in orphan["index_buckets"] for f in b["files"]) == sorted(deltas)
        # its buckets are in a pending plan: scheduling alone finds nothing more to plan
        assert run_compact(None, uri, policy=INDEX_ONLY, schedule_only=True)["instant"] is None
    assert read_arrow(uri).to_pylist() == before
    assert run_validate(uri)["ok"]

    done = run_compact(spark, uri, policy=INDEX_ONLY)
    assert done["executed"]
    if orphans:
        assert [r["instant"] for r in done["resumed"]] == [orphans[0].timestamp]
        assert done["instant"] == orphans[0].timestamp, "nothing else was due: no second plan"
    else:
        assert done["resumed"] == [] and done["scheduled"]
    t = Table.load(uri)
    assert t.timeline.pending() == []
    compactions = t.timeline.completed(["compaction"])
    assert len(compactions) == 1
    removed = t.timeline.read_metadata(compactions[0])["index"]["removed"]
    assert sorted(removed) == sorted(deltas), "every delta folded, once"
    assert all(len(fs) == 1 and not is_index_delta(fs[0]) for fs in t.view().index_files.values())
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches(batches)
    assert run_validate(uri)["ok"]
    # nothing left: the next compact has nothing to do and writes nothing
    assert run_compact(spark, uri, policy=INDEX_ONLY)["noop"]

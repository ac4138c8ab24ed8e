"""Retries are idempotent; a writer killed at any step leaves the previous snapshot visible,
and the next run (or ``rollback``) repairs the table -- on the Arrow engine (no JVM).

tests/unit/test_arrow_engine.py has the Arrow crash matrix over index and table types; this
file runs tests/spark/test_retry_and_crash.py's scenarios on Arrow where they add to it: its
data (a ``__NULL__`` partition, a CJK partition directory of more than 200 bytes), the points
that matrix leaves out (``after_conflict_check`` on a copy-on-write record table, a crash in
a bucket-index copy-on-write data write, ``after_complete``: killed past its commit point),
marked files gone after a rollback, and a rollback that is itself killed half-way. Spark keeps
the crashes inside its tasks (the data and the index write in a Python worker) in
tests/spark/test_retry_and_crash.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
from spark_jobs.arrow_engine.validate import run_validate as arrow_validate
from spark_jobs.table.action.rollback import rollback
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.harness.cli import run_cli
from tests.oracle import reduce_batches, rows_by_identity
from tests.unit.test_arrow_concurrent_writers import ARROW, write_batch

pytestmark = pytest.mark.unit

Upsert = Callable[[UpsertOptions], Any]
Validate = Callable[[str], dict]

#: users' data: keys and partition values with spaces, /, %, + and non-ASCII; null and "" (two
#: directories, format.md §1); the literal "__NULL__" (a directory of its own since format.md §1
#: step 2); a CJK address whose
#: directory name passes 200 bytes (shortened, with hashed markers) -- the crash matrix
#: covers the names a killed writer leaves behind and a rollback deletes
KEY = "k{:03d} /%+é"
B1 = [{"id": KEY.format(i), "region": ["eu west/1", "sã%o+paulo", "", None][i % 4], "ts": i, "amount": float(i),
       "is_deleted": False} for i in range(120)]
B2 = ([{"id": KEY.format(i), "region": ["__NULL__", "東京都千代田区千代田一丁目一番一号皇居東御苑内", None, ""][i % 4],
        "ts": 1000 + i, "amount": -1.0, "is_deleted": i % 7 == 0} for i in range(60, 180)])


def options(uri: str, src: str, index: str, batch_id: str) -> UpsertOptions:
    return UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region",
                         index=index, num_buckets=4, delete_field="is_deleted", batch_id=batch_id,
                         # the matrix's fault points are a copy-on-write writer's (data files); the
                         # merge-on-read writer's are run by tests/unit/test_arrow_engine.py's matrix
                         target_file_rows=50, table_type="copy_on_write")


def crash_upsert(uri: str, src: str, index: str, point: str, engine: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "BUCKETINDEX_FAULT": point}
    cmd = [sys.executable, "-m", "spark_jobs.cli", "upsert", uri, src, "--record-key", "id", "--precombine-field", "ts",
           "--partition-field", "region", "--delete-field", "is_deleted", "--batch-id", "batch-2", *engine]
    # its own process group, like a job on a node: SIGKILL takes the driver, JVM and Python workers
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, start_new_session=True)


def same_batch_id_twice_is_one_commit(upsert: Upsert, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    src = write_batch(tmp_path / "b1.parquet", B1)
    first = upsert(options(uri, src, "record", "batch-1"))
    second = upsert(options(uri, src, "record", "batch-1"))
    assert not first["noop"] and second["noop"]
    assert second["instant"] == first["instant"]
    assert len(Table.load(uri).timeline.completed(["commit"])) == 1
    assert rows_by_identity(read_arrow(uri).to_pylist()) == reduce_batches([B1])


def test_same_batch_id_twice_is_one_commit(tmp_path):
    same_batch_id_twice_is_one_commit(arrow_upsert, tmp_path)


def killed_writer_leaves_old_snapshot_and_next_run_repairs(upsert: Upsert, validate: Validate, engine: list[str],
                                                          tmp_path: Path, index: str, point: str, repair: str) -> None:
    uri = str(tmp_path / "t")
    upsert(options(uri, write_batch(tmp_path / "b1.parquet", B1), index, "batch-1"))
    before = read_arrow(uri).to_pylist()
    src2 = write_batch(tmp_path / "b2.parquet", B2)

    p = crash_upsert(uri, src2, index, point, engine)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr[-2000:])
    t = Table.load(uri)
    pending = t.timeline.pending()
    assert len(pending) == 1 and pending[0].action == "commit"
    # readers see the previous snapshot, whatever files the dead writer left behind
    assert read_arrow(uri).to_pylist() == before
    if point != "after_requested":
        assert t.marked_files(pending[0].timestamp), "the writer should have left marked files"

    if repair == "rollback":
        assert rollback(t) == [pending[0].timestamp]
        assert read_arrow(uri).to_pylist() == before
        assert not t.marked_files(pending[0].timestamp)
    res = upsert(options(uri, src2, index, "batch-2"))
    assert not res["noop"]
    t = Table.load(uri)
    assert t.timeline.pending() == []
    partition = "region" if index == "bucket" else None
    assert rows_by_identity(read_arrow(uri).to_pylist(), partition=partition) == reduce_batches([B1, B2], partition=partition)
    assert validate(uri)["ok"]
    # the dead attempt's files are gone: every data file on disk belongs to the snapshot or an older one
    on_disk = {str(p.relative_to(tmp_path / "t")) for p in (tmp_path / "t").rglob("*.parquet")}
    referenced = set()
    for inst in t.timeline.completed(["commit"]):
        referenced |= {fg["path"] for fg in t.timeline.read_metadata(inst)["file_groups"] if fg["path"]}
    assert on_disk <= referenced


#: the Spark matrix's points (tests/spark/test_retry_and_crash.py) that tests/unit/test_arrow_engine.py's
#: Arrow matrix does not run on the same index and table type, on this file's data
@pytest.mark.parametrize(
    "index,point,repair",
    [
        ("record", "after_conflict_check", "rerun"),  # checked, commit point not yet claimed
        ("record", "after_index_file", "rollback"),  # the rollback leaves no marked file
        ("bucket", "after_data_file", "rerun"),
    ],
)
def test_killed_writer_leaves_old_snapshot_and_next_run_repairs(tmp_path, index, point, repair):
    killed_writer_leaves_old_snapshot_and_next_run_repairs(arrow_upsert, arrow_validate, ARROW, tmp_path, index,
                                                           point, repair)


def test_crash_during_rollback_resumes(tmp_path):
    uri = str(tmp_path / "t")
    arrow_upsert(options(uri, write_batch(tmp_path / "b1.parquet", B1), "record", "batch-1"))
    before = read_arrow(uri).to_pylist()
    src2 = write_batch(tmp_path / "b2.parquet", B2)
    assert crash_upsert(uri, src2, "record", "before_complete", ARROW).returncode == -signal.SIGKILL
    target = Table.load(uri).timeline.pending()[0].timestamp
    env = {**os.environ, "BUCKETINDEX_FAULT": "rollback_after_delete"}
    p = subprocess.run([sys.executable, "-m", "spark_jobs.cli", "rollback", uri], env=env, capture_output=True,
                       text=True, timeout=120, start_new_session=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    t = Table.load(uri)
    # the rollback decided (its sequence entry aborts the target) and died while deleting
    assert t.timeline.pending() == []
    assert [i.timestamp for i in t.timeline.aborted_leftovers()] == [target]
    assert t.marked_files(target), "the crash should have left marked files to delete"
    assert read_arrow(uri).to_pylist() == before
    p = run_cli("rollback", uri, timeout=120)
    assert p.returncode == 0, p.stderr
    t = Table.load(uri)
    assert t.timeline.pending() == [] and t.timeline.aborted_leftovers() == []
    assert not t.marked_files(target) and not os.path.exists(t.layout.heartbeat_file(target))
    rb = t.timeline.completed(["rollback"])
    assert len(rb) == 1 and t.timeline.read_metadata(rb[0])["rolled_back"] == target
    assert read_arrow(uri).to_pylist() == before
    assert arrow_validate(uri)["ok"]


def test_killed_after_its_commit_point_the_batch_is_in_and_the_rerun_clears_what_it_left(tmp_path):
    """``after_complete``: the crash matrix's last upsert point. The commit point was claimed, so
    readers see the new snapshot and a rerun is a no-op; the markers and heartbeat the writer
    could not clean are cleared by the rerun (and ``rollback`` then rolls nothing back)."""
    uri = str(tmp_path / "t")
    arrow_upsert(options(uri, write_batch(tmp_path / "b1.parquet", B1), "record", "batch-1"))
    src2 = write_batch(tmp_path / "b2.parquet", B2)
    p = crash_upsert(uri, src2, "record", "after_complete", ARROW)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr[-2000:])
    t = Table.load(uri)
    assert t.timeline.pending() == []
    *_, done = t.timeline.completed(["commit"])
    assert t.timeline.read_metadata(done)["batch_id"] == "batch-2"
    after = rows_by_identity(read_arrow(uri).to_pylist())
    assert after == reduce_batches([B1, B2])
    assert t.marked_files(done.timestamp), "the writer died before cleaning its markers"
    assert arrow_validate(uri)["ok"]
    again = arrow_upsert(options(uri, src2, "record", "batch-2"))
    assert again["noop"] and again["instant"] == done.timestamp
    # the rerun repaired what the killed writer left (markers, heartbeat); rollback finds nothing
    t = Table.load(uri)
    assert not t.marked_files(done.timestamp) and not os.path.exists(t.layout.heartbeat_file(done.timestamp))
    rb = run_cli("rollback", uri, timeout=120)
    assert rb.returncode == 0, rb.stderr
    t = Table.load(uri)
    assert t.timeline.completed(["rollback"]) == []
    assert not t.marked_files(done.timestamp) and not os.path.exists(t.layout.heartbeat_file(done.timestamp))
    assert rows_by_identity(read_arrow(uri).to_pylist()) == after
    on_disk = {str(q.relative_to(tmp_path / "t")) for q in (tmp_path / "t").rglob("*.parquet")}
    referenced = set()
    for inst in t.timeline.completed(["commit"]):
        referenced |= {fg["path"] for fg in t.timeline.read_metadata(inst)["file_groups"] if fg["path"]}
    assert on_disk <= referenced
    assert arrow_validate(uri)["ok"]

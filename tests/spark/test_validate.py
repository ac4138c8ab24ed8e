"""``validate`` must catch every kind of index/data disagreement, with counts and sample keys."""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from spark_jobs.index.record_index import IndexEntries, write_index_file
from spark_jobs.jobs.upsert import UpsertOptions, run_upsert
from spark_jobs.jobs.validate import run_validate
from spark_jobs.table.table import Table
from spark_jobs.table.timeline import Action
from tests.spark.conftest import write_batch

pytestmark = pytest.mark.spark

ROWS = [{"id": f"k{i:02d}", "region": ["eu", "us"][i % 2], "ts": i} for i in range(40)]


def make_table(spark, tmp_path, index="record") -> Table:
    uri = str(tmp_path / "t")
    run_upsert(spark, UpsertOptions(table=uri, source=write_batch(tmp_path / "b.parquet", ROWS), record_key=["id"],
                                    precombine_field="ts", partition_field="region", index=index, num_buckets=2))
    return Table.load(uri)


def tamper_commit(t: Table, metadata: dict) -> None:
    inst = t.timeline.transition_to_inflight(t.timeline.create_requested(Action.COMMIT, {"batch_id": "tamper"}))
    t.timeline.complete(inst, {"batch_id": "tamper", **metadata})


def add_index_delta(t: Table, bucket: int, keys: list[str], targets: list) -> None:
    path = t.layout.index_file(bucket, "delta", "29990101000000000")
    write_index_file(t.io, path, IndexEntries.from_keys(keys, targets))
    tamper_commit(t, {"index": {"added": [{"bucket": bucket, "path": t.layout.rel(path), "kind": "delta"}]}})


def bucket_of_key(t: Table, key: str) -> int:
    from spark_jobs.index.hashing import bucket_of

    return bucket_of(key, t.num_buckets())


def test_clean_table_passes(spark, tmp_path):
    report = run_validate(spark, make_table(spark, tmp_path).uri)
    assert report["ok"] and report["rows"] == 40 and report["index_entries"] == 40
    assert report["rows_expected"] == 40 and "row_count_mismatch" not in report["problems"]


@pytest.mark.parametrize("index", ["record", "global_simple"])
def test_data_file_with_fewer_rows_than_its_commit(spark, tmp_path, index):
    """Rows validate cannot read must not pass silently: a file replaced by one holding fewer
    rows (same schema), and one holding none, are each a row count mismatch."""
    t = make_table(spark, tmp_path, index=index)
    short, empty = t.view().slices()[:2]
    rows = pq.read_table(t.abs(short.path))
    pq.write_table(rows.slice(0, rows.num_rows // 2), t.abs(short.path))
    pq.write_table(rows.schema.empty_table(), t.abs(empty.path))
    report = run_validate(spark, t.uri)
    assert not report["ok"]
    mismatch = report["problems"]["row_count_mismatch"]
    assert mismatch["count"] == 2
    assert sorted(mismatch["samples"]) == sorted([
        f"{short.partition}/{short.file_id}: expected {short.num_rows}, read {rows.num_rows // 2}",
        f"{empty.partition}/{empty.file_id}: expected {empty.num_rows}, read 0",
    ])
    assert report["rows_expected"] == t.view().num_rows
    assert report["rows"] == report["rows_expected"] - (short.num_rows - rows.num_rows // 2) - empty.num_rows


def test_key_missing_from_index(spark, tmp_path):
    t = make_table(spark, tmp_path)
    add_index_delta(t, bucket_of_key(t, "k07"), ["k07"], [None])  # a tombstone for a live key
    report = run_validate(spark, t.uri)
    assert not report["ok"]
    assert report["problems"]["keys_missing_from_index"] == {"count": 1, "samples": ["k07"]}


def test_index_points_to_wrong_file_and_orphan_entry(spark, tmp_path):
    t = make_table(spark, tmp_path)
    b = bucket_of_key(t, "k03")
    ghost = next(k for k in (f"ghost{i}" for i in range(100)) if bucket_of_key(t, k) == b)
    add_index_delta(t, b, ["k03", ghost], [("region=us", "no-such-file"), ("region=eu", "x")])
    p = run_validate(spark, t.uri)["problems"]
    assert p["index_points_to_wrong_file"] == {"count": 1, "samples": ["k03"]}
    assert p["index_entries_without_row"]["count"] == 1


def test_entry_in_wrong_bucket(spark, tmp_path):
    t = make_table(spark, tmp_path)
    right = bucket_of_key(t, "k05")
    loc = next(fg for fg in t.view().slices() if "k05" in pq.read_table(t.abs(fg.path)).column("_bi_key").to_pylist())
    add_index_delta(t, 1 - right, ["k05"], [(loc.partition, loc.file_id)])
    p = run_validate(spark, t.uri)["problems"]
    assert p["index_entries_in_wrong_bucket"]["samples"] == ["k05"]


def test_duplicate_key_and_bucket_placement(spark, tmp_path):
    t = make_table(spark, tmp_path, index="bucket")
    s = t.view().slices("region=eu")[0]
    rows = pq.read_table(t.abs(s.path))
    # the same rows again in a file group of another bucket: duplicates, and in the wrong bucket
    other = next(f"{b:08d}" for b in range(2) if f"{b:08d}" != s.file_id)
    rel = f"region=eu/{other}_9-9-9_29990101000000000.parquet"
    pq.write_table(rows, t.abs(rel))
    tamper_commit(t, {"file_groups": [{"partition": "region=eu", "file_id": other, "path": rel,
                                       "num_rows": rows.num_rows}]})
    p = run_validate(spark, t.uri)["problems"]
    assert p["duplicate_keys"]["count"] == rows.num_rows
    assert p["rows_in_wrong_bucket"]["count"] == rows.num_rows


def test_cli_validate_exits_1_on_mismatch(spark, tmp_path):
    t = make_table(spark, tmp_path)
    add_index_delta(t, bucket_of_key(t, "k11"), ["k11"], [None])
    p = subprocess.run([sys.executable, "-m", "spark_jobs.cli", "validate", t.uri, "--master", "local[1]"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr
    assert '"keys_missing_from_index"' in p.stdout and "k11" in p.stdout
    assert p.stderr.strip().splitlines()[-1] == "bucketindex: validate found problems: keys_missing_from_index"

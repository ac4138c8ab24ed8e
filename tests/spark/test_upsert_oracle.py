"""Random batches with updates, inserts, in-batch duplicates, deletes, re-inserts and partition
moves: afterwards the table equals the batches reduced by key and ``validate`` passes.

This is the Spark upsert's own oracle test. The record index runs in the default tier; the same
test on the in-process Arrow engine, for all three indexes, is
tests/unit/test_arrow_oracle_upsert.py, and tests/spark/test_engine_equivalence.py holds Spark's
``bucket`` and ``global_simple`` tagging to Arrow and the oracle (both table types) in the default
tier, so their Spark cases here are in the extended tier (``-m slow``; over Spark Connect too)."""

from __future__ import annotations

import pytest

from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
from spark_jobs.jobs.upsert import UpsertOptions, run_upsert
from spark_jobs.jobs.validate import run_validate
from spark_jobs.table.reader import read_arrow
from spark_jobs.table.table import Table
from tests.oracle import reduce_batches, rows_by_identity
from tests.spark.conftest import write_batch

# the batch generators, free of pyspark: other test modules import them from here
from tests.unit.test_arrow_oracle_upsert import REGIONS, _dedupe_ties, make_batches  # noqa: F401

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("index", ["record", pytest.param("bucket", marks=pytest.mark.slow),
                                   pytest.param("global_simple", marks=pytest.mark.slow)])
def test_random_batches_match_oracle(spark, tmp_path, index):
    per_partition = index == "bucket"
    batches = make_batches(seed={"record": 1, "bucket": 2, "global_simple": 3}[index],
                           n_batches=3 if index == "global_simple" else 4)
    _dedupe_ties(batches, per_partition)
    uri = str(tmp_path / "table")
    for i, rows in enumerate(batches):
        src = write_batch(tmp_path / f"batch{i}.parquet", rows)
        res = run_upsert(spark, UpsertOptions(
            table=uri, source=src, record_key=["id"], precombine_field="ts", partition_field="region",
            index=index, num_buckets=4, delete_field="is_deleted", batch_id=f"b{i}", target_file_rows=60,
        ))
        assert not res["noop"]
        expected = reduce_batches(batches[: i + 1], partition="region" if per_partition else None)
        actual = rows_by_identity(read_arrow(uri).to_pylist(), partition="region" if per_partition else None)
        assert actual == expected, f"after batch {i}: table differs from the oracle"
    report = run_validate(spark, uri)
    assert report["ok"], report
    assert report["rows"] == len(expected)
    if index == "record":
        assert report["index_entries"] == len(expected)
    # every commit is on the timeline with its counts
    t = Table.load(uri)
    assert [i.timestamp for i in t.timeline.completed()] == sorted(i.timestamp for i in t.timeline.completed())
    assert len(t.timeline.completed(["commit"])) == len(batches)


def test_time_travel_reads_each_snapshot(spark, tmp_path):
    batches = make_batches(seed=7, n_batches=3)
    _dedupe_ties(batches, False)
    uri = str(tmp_path / "table")
    instants = []
    for i, rows in enumerate(batches):  # written by the Arrow engine: the subject is the reads as of each instant
        src = write_batch(tmp_path / f"b{i}.parquet", rows)
        instants.append(arrow_upsert(UpsertOptions(table=uri, source=src, record_key=["id"], precombine_field="ts",
                                                   partition_field="region", delete_field="is_deleted",
                                                   num_buckets=2))["instant"])
    for i, inst in enumerate(instants):
        assert rows_by_identity(read_arrow(uri, as_of=inst).to_pylist()) == reduce_batches(batches[: i + 1])
    from spark_jobs.jobs.read import read_table

    df = read_table(spark, uri, as_of=instants[0])
    assert df.count() == len(reduce_batches(batches[:1]))
    assert "_bi_key" not in df.columns


def test_composite_key_and_unpartitioned(spark, tmp_path):
    rows = [{"a": "x,y", "b": "z", "v": 1}, {"a": "x", "b": "y,z", "v": 2}, {"a": "x", "b": "y,z", "v": 3}]
    uri = str(tmp_path / "t")
    src = write_batch(tmp_path / "b.parquet", rows)
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    run_upsert(spark, UpsertOptions(table=uri, source=src, record_key=["a", "b"], precombine_field="v", num_buckets=2))
    assert spark.conf.get("spark.sql.shuffle.partitions") == "3"  # the caller's session settings survive
    got = sorted((r["a"], r["b"], r["v"]) for r in read_arrow(uri).to_pylist())
    assert got == [("x", "y,z", 3), ("x,y", "z", 1)]  # two distinct records, despite equal naive joins
    assert run_validate(spark, uri)["ok"]

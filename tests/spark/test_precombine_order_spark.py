"""The Spark engine orders precombine values as the Arrow engine does (issue 36 item 2; format.md §8).

The same batches -- NaN, +-inf, -0.0 and 0.0, nulls, deletes and partition moves against a
stored NaN, NaN ties across batches and inside one batch -- go through Spark into one table and
through Arrow into another, for both table types; every snapshot and a compaction's result
must be equal. The Arrow results are held to the oracle path by path in
tests/unit/test_precombine_order.py, so this is the Spark engine held to the oracle too.

Bootstrap's choice among duplicates (an Arrow function run in Spark's tasks) is checked
without a JVM.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_jobs.arrow_engine.compact import run_compact as arrow_compact
from spark_jobs.arrow_engine.upsert import run_upsert as arrow_upsert
from spark_jobs.jobs.bootstrap import check_bucket
from spark_jobs.jobs.compact import run_compact as spark_compact
from spark_jobs.jobs.upsert import run_upsert as spark_upsert
from spark_jobs.table.action.compact import CompactionPolicy
from spark_jobs.table.action.upsert import UpsertOptions
from spark_jobs.table.reader import read_arrow
from tests.oracle import precombine_order
from tests.unit.test_precombine_order import B1, B2, B3, NAN, comparable, row, write

pytestmark = pytest.mark.spark

#: a fourth batch: ties inside one batch (both NaN; 0.0 and -0.0), decided by the rest of the row
TIES = [row("tie a", NAN, "x"), row("tie a", NAN, "y"), row("tie b", NAN, "y"), row("tie b", NAN, "x"),
        row("zero tie", 0.0, "x"), row("zero tie", -0.0, "y"), row("nan then nan %", NAN, "c-third")]
#: (table type, index, precombine type): both table types, the three indexes, double and float
CASES = [("copy_on_write", "global_simple", pa.float64()), ("merge_on_read", "record", pa.float64()),
         ("merge_on_read", "bucket", pa.float32())]


def _rows(uri: str) -> dict:
    return comparable({(r["region"], r["k"]): r for r in read_arrow(uri).to_pylist()})


def test_spark_orders_nan_and_signed_zero_precombine_values_as_arrow(spark, tmp_path):
    for table_type, index, typ in CASES:
        uris = {name: str(tmp_path / f"{table_type}-{index}-{name}") for name in ("spark", "arrow")}
        for i, rows in enumerate([B1, B2, B3, TIES], start=1):
            src = write(tmp_path / f"{table_type}-{index}-b{i}.parquet", rows, typ)
            for name, uri in uris.items():
                opts = UpsertOptions(table=uri, source=src, record_key=["k"], precombine_field="pc",
                                     partition_field="region", delete_field="del", index=index,
                                     table_type=table_type, batch_id=f"b{i}", num_buckets=2)
                spark_upsert(spark, opts) if name == "spark" else arrow_upsert(opts)
            assert _rows(uris["spark"]) == _rows(uris["arrow"]), (table_type, index, f"after batch {i}")
        assert _rows(uris["arrow"])[("eu west", "nan then 5 ü")]["v"] == "a-nan"
        if table_type == "merge_on_read":
            policy = CompactionPolicy(min_logs=1, min_deltas=2)
            spark_compact(spark, uris["spark"], policy=policy)
            arrow_compact(uris["arrow"], policy=policy)
            assert _rows(uris["spark"]) == _rows(uris["arrow"]), (table_type, index, "after compaction")


def test_bootstrap_keeps_the_duplicate_with_the_highest_value_in_section_8s_order():
    """check_bucket (Arrow in a Spark task): of a key's rows the one with the highest
    precombine value stays -- NaN above every number, null lowest -- and ties go to the later
    file, then the later row. Before, an Arrow sort put NaN below every number."""
    pre = [5.0, NAN, None, -0.0, 0.0, 7.0, NAN, None]
    keys = ["a/ü", "a/ü", "a/ü", "zero", "zero", "b", "b", "c"]
    rows = pa.table({"_bi_key": keys, "fno": pa.array([0, 1, 2, 0, 1, 0, 0, 1], pa.int32()),
                     "row": pa.array([0, 0, 0, 1, 1, 2, 3, 0], pa.int64()),
                     "problem": pa.nulls(len(keys), pa.string()), "pre": pa.array(pre, pa.float64())})
    out = check_bucket((), rows, precombine="pre").to_pylist()
    losers = {(r["fno"], r["row"]) for r in out if r["kind"] == "loser"}
    kept = {k: max((i for i in range(len(keys)) if keys[i] == k),
                   key=lambda i: (precombine_order(pre[i]), rows["fno"][i].as_py(), rows["row"][i].as_py()))
            for k in set(keys)}
    want = {(rows["fno"][i].as_py(), rows["row"][i].as_py()) for i in range(len(keys)) if kept[keys[i]] != i}
    assert losers == want
    assert (1, 0) not in losers  # the NaN row of "a/ü" stays
